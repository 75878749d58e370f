"""The screens: a composed chain runs on the CPU, small, before it is emitted.

The sandbox rejects a task whose output is NaN or Inf, past a magnitude bound, or different
in float32 and float64 by more than a share of the verification tolerance. Each such
candidate the composer emits costs a worker a compile and a timing run for nothing, so the
template composer redraws a chain that fails here.

The chain runs on real seeded inputs at a small batch (about SCREEN_ELEMENTS input
elements), once in float32 and once in float64 with the same weights and inputs cast up.
Outputs that jump under an ulp of input (floor of a computed value) are not tested here: at
a small batch too few elements lie near a jump to show it, so the composer keeps such ops
off computed values by placement (operators/roles.py, DISCONTINUOUS).

The checks screen (`checks_fault`) runs the sandbox's own value checks (the ones the timing
check's chosen size is held to: determinism, purity, input dependence, per-element movement,
nothing dead) on the CPU at a task's small problem, timing and compiling left out.
On the H200 they rejected 231 of 512 template candidates after each had cost a worker a CUDA
start, a re-sizing search and its timing (docs/benchmarks-history.md, session 22); at the screen's
size they find most of them in tens of ms. A chain that fails here might pass at its own size
on the GPU: the screen only redraws, it is no verdict, and every emitted task still passes
every check in the sandbox.

The reference screen (`ReferenceScreen`) turns down a chain too close to a task of the run's
reference benchmark (KernelBench) by decontamination's own score: its text, and its op
sequence traced here at its small problem (filters/checks/harness.py, read). On the H200,
16% of the ops6k recipe's candidates were rejected `kernelbench_similar` only after a
worker had proved every other check on them (issue 48). Decontamination still decides, on
the sandbox's trace at the accepted size on the checks' device.

All are pure functions of the chain: the weights and inputs are seeded, so composition
stays a pure function of (run seed, index, earlier rounds). The code they run is our own
rendering of crawled ops (operators/task.py), never a candidate's code.
"""
from __future__ import annotations

import contextlib
import math
import warnings

import torch

from filters.checks.base import TaskUnderTest
from filters.checks.order import AT_THE_CHOSEN_SIZE
from filters.checks.timing import EXECUTES
from filters.checks.registry import DEFAULTS as CHECK_DEFAULTS
from filters.checks.measure.execution import GpuGate, Reject
from filters.checks.measure.resize import small_problem
from filters.checks.harness import read
from filters.similarity.decontaminate import SimilarityIndex
from filters.similarity.score import fingerprint
from operators.layouts import Layout
from operators.task import BoundOp, render_task

# The sandbox's own thresholds (filters/checks/registry.py), so that what passes here is what
# its numerics check passes. The magnitude bound keeps headroom below the check's: the screen
# draws a small batch, and the full-size task's extremes lie further out.
MAGNITUDE_BOUND = CHECK_DEFAULTS["max_output_abs"] / 4
ATOL, RTOL = CHECK_DEFAULTS["atol"], CHECK_DEFAULTS["rtol"]  # the verification tolerance
TOLERANCE_SHARE = CHECK_DEFAULTS["max_tolerance_share"]  # float32 may use this share of it against float64
SCREEN_ELEMENTS = 1 << 14  # input elements the screen runs on: the batch is cut to about this
MAX_SCREEN_STATE = 1 << 24  # weights past this (64 MB in float32) are left to the sandbox: too slow to build here
MAX_PRECISION_ELEMENTS = 1 << 20  # a larger output (torch.kron's) skips the float64 run: seconds here
SEED = 0

NON_FINITE, MAGNITUDE, PRECISION = "non_finite", "magnitude", "precision"


def screen(chain: list[BoundOp], layout: Layout) -> str | None:
    """Why this chain's output is numerically unfit ('non_finite', 'magnitude' or
    'precision', with a detail), or None when it passes or cannot be run here."""
    return screen_task(render_task(chain, layout, screen_sizes(layout)))


# What only the GPU at the task's own size can say: a CPU without a kernel, memory. The screen
# passes such a chain; the sandbox decides.
NOT_DECIDED_HERE = frozenset({"eager_error", "out_of_memory", "unmeasured"})
# The checks the screen runs: all the value checks but the numerics check, whose nudge of a few
# ulps read 0.146 and under 0.1 of the tolerance for one chain in two runs in one process here
# (which algorithm a CPU convolution took), and which stopped none of the H200's rejects that
# the others let through. The numeric screen above holds float32 against float64.
SCREENED_CHECKS = (EXECUTES, *(check for check in AT_THE_CHOSEN_SIZE if check.stage != "numerics"))


def checks_fault(code: str) -> str | None:
    """The sandbox's value checks on a task at its small problem (a task's trace's:
    filters/checks/measure/resize.py, small_problem) as 'stage/reason: detail', or None when they
    pass or cannot run here. On the H200's verdicts of 512 candidates, the numeric screen's
    size (every width kept) turned down 7 tasks the GPU accepted and cost 0.4 s a candidate
    here; the small problem, 1 (docs/benchmarks-history.md, session 22)."""
    return checks_fault_of(small_problem(code)[0])


def checks_fault_of(code: str) -> str | None:
    """`checks_fault` on a task's code as it stands (its own sizes)."""
    cfg = {**CHECK_DEFAULTS, "device": "cpu"}
    t = TaskUnderTest(code, cfg, torch.device("cpu"), GpuGate(None))
    # the checks draw their second inputs from the global generator: seeded here, so that the
    # verdict is the chain's alone, and restored after
    with warnings.catch_warnings(), _one_thread(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        torch.manual_seed(SEED)
        try:
            for check in SCREENED_CHECKS:
                if check.enabled(cfg):
                    check.run(t)
        except Reject as reject:
            return None if reject.reason in NOT_DECIDED_HERE else f"{reject.stage}/{reject.reason}: {reject.detail}"
        except Exception:  # the task's own error in a later check: the sandbox says which
            return None
    return None


def screen_task(code: str, seed: int = SEED) -> str | None:
    """`screen` on a task's code as it stands (its own sizes): weights seeded with `seed`,
    inputs with `seed + 1`."""
    with torch.no_grad(), warnings.catch_warnings(), _one_thread():
        warnings.simplefilter("ignore")
        try:
            model, inputs = _build(code, seed)
        except Exception:  # the sandbox says why a chain does not build; shapes were already checked on meta
            return None
        if model is None:
            return None
        try:
            out32 = _output(model(*inputs))
        except Exception:
            return None
        fault = _range_fault(out32)
        if fault or out32.numel() > MAX_PRECISION_ELEMENTS:
            return fault
        try:
            out64 = _output(model.double()(*[_double(value) for value in inputs]))
        except Exception:  # an op without float64 kernels (or one that builds float32 tensors inside)
            return None
    return _range_fault(out64) or _precision_fault(out32, out64)


@contextlib.contextmanager
def _one_thread():
    """Tensors this small run 5 to 15 times faster on one thread than on a pool of threads
    that the run's other processes share (measured on this 2-core host under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def screen_sizes(layout: Layout) -> tuple[int, ...]:
    """The layout's sizes with the batch cut so the input holds about SCREEN_ELEMENTS."""
    per_sample = math.prod(layout.sizes[1:])
    batch = max(1, min(layout.sizes[0], SCREEN_ELEMENTS // per_sample))
    return (batch, *layout.sizes[1:])


def _build(code: str, seed: int):
    """(model, inputs) seeded as the harness seeds them, or (None, None) past MAX_SCREEN_STATE."""
    namespace = {"__name__": "opsynth_screen"}
    exec(compile(code, "<screen>", "exec"), namespace)
    with torch.device("meta"):
        try:
            state = _state(namespace["Model"](*namespace["get_init_inputs"]()))
        except Exception:  # an __init__ that reads values builds on the CPU only
            state = 0
    if state > MAX_SCREEN_STATE:
        return None, None
    torch.manual_seed(seed)
    model = namespace["Model"](*namespace["get_init_inputs"]()).eval()
    if _state(model) > MAX_SCREEN_STATE:
        return None, None
    torch.manual_seed(seed + 1)
    return model, namespace["get_inputs"]()


def _state(model) -> int:
    return sum(t.numel() for t in (*model.parameters(), *model.buffers()))


def _output(value) -> torch.Tensor:
    if isinstance(value, (tuple, list)):
        value = value[0]
    return value.detach()


def _double(value):
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _range_fault(out: torch.Tensor) -> str | None:
    if not out.is_floating_point():
        return None
    if not torch.isfinite(out).all():
        return f"{NON_FINITE}: {int((~torch.isfinite(out)).sum())} of {out.numel()} elements"
    peak = out.abs().max().item() if out.numel() else 0.0
    if peak > MAGNITUDE_BOUND:
        return f"{MAGNITUDE}: |output| reaches {peak:.3g} (bound {MAGNITUDE_BOUND:g})"
    return None


def _precision_fault(out32: torch.Tensor, out64: torch.Tensor) -> str | None:
    """float32 against float64: the share of the tolerance the worst element uses."""
    if not out32.is_floating_point() or out32.shape != out64.shape:
        return None
    share = _worst_share(out32.double(), out64)
    if share > TOLERANCE_SHARE:
        return f"{PRECISION}: float32 uses {share:.2f} of the tolerance against float64 (at most {TOLERANCE_SHARE})"
    return None


def _worst_share(value: torch.Tensor, reference: torch.Tensor) -> float:
    allowed = ATOL + RTOL * reference.abs()
    return ((value - reference).abs() / allowed).max().item() if reference.numel() else 0.0


class ReferenceScreen:
    """Why a task is too close to the reference, or None: the decontamination's score against
    every reference fingerprint, by the task's text first (no run), then with its op sequence
    traced here as a trusted task (the trace's values drawn from a fixed seed, so that
    composition stays a pure function of the chain)."""

    def __init__(self, reference, threshold: float):
        self.index, self.threshold = SimilarityIndex(list(reference)), threshold

    def fault(self, code: str) -> str | None:
        match = self.index.match(fingerprint(code, "candidate"), self.threshold)
        if not match.too_close(self.threshold) and self.index.graphs:
            with warnings.catch_warnings(), _one_thread(), torch.random.fork_rng(devices=[]):
                warnings.simplefilter("ignore")
                try:
                    graph = read(code, untrusted=False, small_only=True).graph
                except Exception:  # untraced here: decontamination decides on the sandbox's trace
                    graph = None
            if graph:
                match = self.index.match(fingerprint(code, "candidate", graph), self.threshold)
        if match.too_close(self.threshold):
            return f"kernelbench_similar: {match.similarity:.3f} similar to {match.nearest}"
        return None
