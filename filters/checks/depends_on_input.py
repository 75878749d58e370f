"""The output depends on the input: whole (`DependsOnInput`, the degenerate stage) and
element by element (`MovesPerElement`, the sensitivity stage), from the outputs for two
independent inputs."""
from __future__ import annotations

import torch

from filters.checks.base import Check, TaskUnderTest
from filters.checks.measure.execution import forward, identical, make_inputs, max_diff, tolerance_share
from filters.checks.verdicts import DependsOnInputRule, MovesPerElementRule


class DependsOnInput(DependsOnInputRule, Check):
    """get_inputs() draws fresh inputs, and the output changes with them."""

    def run(self, t: TaskUnderTest) -> None:
        gate = t.gate
        other_inputs = gate.call(make_inputs, t.task, t.device)
        tensors = [(a, b) for a, b in zip(t.inputs, other_inputs) if isinstance(a, torch.Tensor)]
        t.metrics["inputs_fresh"] = not (tensors and gate.call(lambda: all(identical(a, b) for a, b in tensors)))
        self.stop_if_failed(t)
        t.other_out = gate.call(forward, t.model, other_inputs)
        t.metrics["input_sensitivity"] = gate.call(max_diff, t.out, t.other_out)
        t.metrics["input_tolerance_share"] = gate.call(tolerance_share, t.out, t.other_out, t.cfg["atol"],
                                                       t.cfg["rtol"])
        self.stop_if_failed(t)


class MovesPerElement(MovesPerElementRule, Check):
    """Most of the output moves with the input, element by element, and no one value takes
    most of it. The whole-tensor comparison of DependsOnInput calls an output "input-dependent"
    when one element of half a million moves, or when a clamp floor above the data holds
    99.8% of it: an agent matches those without computing them.

    Three shares, each the worst over the outputs, from the outputs for two independent
    inputs. `identical_share`, the elements exactly equal in both, at most
    `max_identical_share` = 0.5: an element no input moves is a constant, a copy of a weight
    or a saturated value, and a kernel writes it without computing anything (a red team's
    task, three quarters a copied weight table and a quarter computed, was accepted when only
    the tolerance was asked). `changed_share`, the elements that differ beyond the
    verification tolerance, at least `min_changed_share` = 0.25: an output that moves by less
    than the tolerance is one a constant kernel matches. It cannot be asked of half: averages
    and reductions of independent random inputs concentrate, and a conv then an average pool
    moves 40% at the tolerance while every element depends on the input. `dominant_share`,
    the elements (of both outputs together, sampled) equal to the most common value, at most
    `max_dominant_share` = 0.75. Measured on legitimate tasks (this CPU): a ReLU after a
    layer moves 60% (uniform inputs) to 74% (normal inputs) and a quarter of it is zero in
    both; a causal (triangular) mask holds half zeros. The broken ones move 0.2% or one
    element in 524,288. Comparisons of computed values are refused by the numerics check.
    A scalar output (a loss) is two values over two inputs: 0.5."""

    SAMPLE = 1 << 16  # elements sampled per output for the most common value

    def run(self, t: TaskUnderTest) -> None:
        atol, rtol = t.cfg["atol"], t.cfg["rtol"]
        pairs = list(zip(t.out, t.other_out))
        t.metrics["identical_share"] = max((t.gate.call(identical_share, a, b) for a, b in pairs), default=0.0)
        t.metrics["changed_share"] = min((t.gate.call(changed_share, a, b, atol, rtol) for a, b in pairs), default=1.0)
        t.metrics["dominant_share"] = max((t.gate.call(dominant_share, a, b, self.SAMPLE) for a, b in pairs),
                                          default=0.0)
        self.stop_if_failed(t)


def identical_share(a: torch.Tensor, b: torch.Tensor) -> float:
    """The share of elements exactly equal in `a` and `b` (1.0 where they cannot be compared
    element by element)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return 1.0
    return float((a == b).double().mean()) if a.numel() else 0.0


def changed_share(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> float:
    """The share of elements of `a` and `b` that differ beyond the tolerance (exactly, for
    integer and bool outputs)."""
    if a.shape != b.shape or a.dtype != b.dtype or not a.numel():
        return 1.0 if a.shape != b.shape or a.dtype != b.dtype else 0.0
    if a.is_floating_point() or a.is_complex():
        return float((~torch.isclose(a, b, rtol=rtol, atol=atol)).double().mean())
    return float((a != b).double().mean())


def dominant_share(a: torch.Tensor, b: torch.Tensor, sample: int) -> float:
    """The share of the most common value among the elements of both outputs (a fixed random
    sample of each past `sample` elements). Both outputs together, so a scalar output is two
    values, not one value taking all of it."""
    values = torch.cat([_sample(a, sample), _sample(b, sample)])
    if values.is_complex():
        values = torch.view_as_real(values)
        _, counts = torch.unique(values, dim=0, return_counts=True)
    else:
        _, counts = torch.unique(values, return_counts=True)
    return float(counts.max()) / len(values) if len(values) else 0.0


def _sample(x: torch.Tensor, size: int) -> torch.Tensor:
    flat = x.reshape(-1)
    if flat.numel() <= size:
        return flat
    generator = torch.Generator(device="cpu").manual_seed(0)
    return flat[torch.randint(flat.numel(), (size,), generator=generator).to(flat.device)]
