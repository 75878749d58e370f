"""What a task computes, whatever its spelling: the ordered ATen ops of one forward call.

Run inside the sandbox (it executes the task): a dispatch mode records every ATen op one
forward call runs, and which op made each tensor it reads. Python-level spelling is gone by
then: aliases, helper methods, nn.Sequential or explicit calls, module or functional form,
size constants written as products or moved into get_init_inputs all trace to the same ops.
The model and inputs are built on the meta device (no memory, no arithmetic); a task whose
control flow depends on its data has no value to decide by there, and is traced again on
the CPU with real tensors at a batch size of at most 4 (harness.trace), so the branch it
takes is recorded.

A composite op a task calls is recorded by its name (`gelu`, `layer_norm`); a run of ops
that is exactly a composite's decomposition (torch's own, `COMPOSITES`) is named as that
composite (`named_composites`): a task that writes an activation out by hand
(`0.5 * x * (1 + erf(x / sqrt 2))`) and one that calls `F.gelu` both read `gelu`, while
tasks that only share generic arithmetic do not look alike. The trace is canonicalised:
- what does not reach the output is dropped (dead code: a condition's arithmetic);
- a cat or stack of the same computation on parts of one tensor is that computation once
  (the batch in two halves, a Python loop over samples);
- layout-only ops (views, reshapes, transposes, copies, casts) and allocations are dropped,
  and so are selection ops (comparisons, where, masked_fill): decompositions add them to
  guard edge cases a hand-written form leaves out;
- identity arithmetic is dropped (x * 1, x / 1, x + 0, x - 0, x ** 1);
- one name for each family a rewrite moves between: subtraction is addition, division and
  negation are multiplication, a mean is a sum and a multiplication, clamp at 0 is relu;
- fused forms are split into their parts (addmm -> mm add), every matrix product is mm;
- names lose their overload, in-place and internal spellings (`_softmax`, `relu_`).
Shapes and constant values are abstracted: the result is a sequence of op names.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.utils._pytree

from filters.computation.equivalences import _Equivalences
from filters.computation.names import _name, _primitives, canonical, named_composites
from filters.computation.record import _Op, _Recorder, _constant_leaves, _writes_its_own
from filters.computation.values import close

MAX_OP_GRAPH = 20_000  # characters of a traced op sequence a child may send: a level-3 network has a few thousand


def op_graph(model: torch.nn.Module, inputs: list, generic: list | None = None) -> list[str]:
    """The canonical op sequence of `model(*inputs)`. On real tensors, what each op computed
    is compared with what came before it (`_Equivalences`); on the meta device there are no
    values, and only the spelling rules and torch's decompositions apply. `generic`: other
    inputs to compare values on (signed: a relu of all-positive inputs looks like nothing;
    see op_graph_and_drops)."""
    return op_graph_and_drops(model, inputs, generic)[0]


class ReadingsDisagree(ValueError):
    """Neither reading reads all the task computes: its own values and generic ones each
    leave unspelled an op the other spells, it runs other ops on the generic values, or a
    value taken for an earlier one changes what it returns (`_aliases_hold`)."""


class ValuesThroughPython(ValueError):
    """A task's Python data (an op's numbers, shapes and flags, a tensor made from Python
    values) changed with the values of its inputs: they left torch and came back where no op
    links them. A red team rebuilt a Linear's output from `float(h[i, j])` into `torch.full`,
    and from `str(h)` parsed back; each read as a constant, and the layer was gone."""


def op_graph_and_drops(model: torch.nn.Module, inputs: list, generic: list | None = None,
                       spread=None, python_may_read_values: bool = False) -> tuple[list[str], list[str]]:
    """(op_graph's sequence, the ops it leaves unspelled): the named ops the outputs depend
    on that the sequence does not spell as themselves, because a value was equal to an
    earlier one or the same whatever the inputs, or because the op was read as part of a
    composite the sequence names. A value can depend on the sizes (`x * (x.shape[1] - 16)`
    is zero at a width of 16; a layer scaled by `1e-6 ** (16 / width)` vanishes inside a
    composite): a sequence read at smaller sizes than the task's own stands only where it
    leaves nothing unspelled (filters/checks/harness.py).

    Read on `generic` inputs, after `spread(model)` gives constant weights a spread, where
    that reading leaves unspelled no op, by position, that its own values spell: a gate of
    `relu(x.min())` is zero on signed inputs, `relu(w.min() - 0.99)` of a weight of ones is
    zero once spread, and a gate of `sigmoid(6 x.min())` is small enough on them for a
    composite to take the layer in. Where each reading leaves unspelled an op the other
    spells, or the task runs other ops on the generic values: ReadingsDisagree. Where its
    Python data differs between the readings, ValuesThroughPython, unless
    `python_may_read_values` (a reference task: nothing it could gain by hiding an op)."""
    own = _Reading(model, inputs)
    if own.symbolic or (generic is None and spread is None):
        return own.sequence, own.unspelled_names
    if spread is not None:
        spread(model, own.kernels)
    other = _Reading(model, generic if generic is not None else inputs)
    if other.targets != own.targets:
        # the task's control flow reads its data (a branch on the size of `x[x < 0]`): a red
        # team's ran other ops on signed inputs, and its own draw, recognised by a literal of
        # its first element, hid its GEMM
        raise ReadingsDisagree("it runs other ops on other values of its inputs")
    if not python_may_read_values and generic is not None and own.python_data != other.python_data:
        raise ValuesThroughPython("what Python and the ops handed each other (arguments, results, shapes, tensors "
                                  "made from Python values) changed with the values of its inputs")
    if own.constant != other.constant:  # the reading on which the outputs vary reads what the task computes
        varying = other if own.constant else own
        return varying.sequence, varying.unspelled_names
    if other.unspelled <= own.unspelled:
        return other.sequence, other.unspelled_names
    if own.unspelled <= other.unspelled:
        return own.sequence, own.unspelled_names
    raise ReadingsDisagree(f"its own values leave {own.unspelled_names[:4]} unspelled, generic ones "
                           f"{other.unspelled_names[:4]}")


class _Reading:
    """One recorded forward call read from its values: its sequence, the ops that ran (and the
    shape of what each made), and the positions and names of the named ops it leaves unspelled."""

    def __init__(self, model: torch.nn.Module, inputs: list):
        recorder, outputs = _recorded(model, inputs)
        self.targets = [op.target for op in recorder.ops]
        self.shapes = [tuple(op.value.shape) if isinstance(op.value, torch.Tensor) else None for op in recorder.ops]
        self.kernels = _kernels(recorder, outputs)
        self.python_data = recorder.python_data
        self.symbolic = not outputs or any(t.device.type == "meta" for t in outputs)
        self.constant = False
        if self.symbolic:
            self.sequence, self.unspelled, self.unspelled_names = named_composites(_primitives(recorder, outputs)), \
                frozenset(), []
            return
        values = _Equivalences(recorder)
        if not _aliases_hold(model, inputs, values, outputs):
            raise ReadingsDisagree("a value taken for an earlier one, put in its place, changes what it returns")
        # outputs the same whatever the inputs (a degenerate task: KernelBench's
        # Gemm_Max_Subtract_GELU is zero everywhere) are read through: what made them
        self.constant = values.through_constants = values.constant(outputs)
        unspelled = values.unspelled(outputs)
        self.sequence = values.sequence(outputs)
        self.unspelled = frozenset(op.index for op in unspelled)
        self.unspelled_names = [name for op in unspelled for name in canonical(op)]


def _kernels(recorder: "_Recorder", outputs: list) -> "Kernels":
    """The storages of the leaves (weights, buffers) whose value is part of what the task
    computes even where it is uniform, through any ops of constants (`w / k ** 2`, a repeat, a
    cat, a transpose): a convolution's kernel with a window (a uniform one is a pooling, a
    depthwise convolution by 1 / k^2) and a matrix product's operand (a uniform one is a sum:
    an adversary summed channels as `y @ ones(C, 1)` of a buffer, and spread, the buffer read
    as a layer). These keep their value in the generic reading, where a uniform gain or bias is
    given a spread, or its op reads as nothing (a (1, C, H, W) gain of ones kept its value as a
    kernel would). A kernel something else reads too is still a kernel: spread, a pooling
    written as a constant-kernel convolution read as a convolution (a red team's second reader,
    `* w.sum().sign()`, did that). A product's operand keeps its value only where the product
    reaches the outputs and nothing else of the inputs reads it: a red team's products thrown
    away (`_ = p @ self.mu`) had kept a norm's mean, variance, weight and bias buffers of 0 and 1,
    and its arithmetic read as nothing."""
    windows, operands, read_otherwise = set(), set(), set()
    reaching = set(recorder.reaching(outputs))
    leaves_of: dict = {}  # a constant many ops read (a mask, a scale) is walked once

    def leaves(constant: _Op) -> set:
        if constant not in leaves_of:
            leaves_of[constant] = _constant_leaves(constant)
        return leaves_of[constant]

    for op in recorder.ops:
        if not op.variable:
            continue
        name = _name(op)
        if name == "convolution" and len(op.args) > 1 and isinstance(op.args[1], _Op) \
                and any(n > 1 for n in op.args[1].value.shape[2:]):
            windows |= leaves(op.args[1])
        taken = op.args[_PRODUCT_OPERANDS[name]] if name in _PRODUCT_OPERANDS and op in reaching else ()
        for arg in torch.utils._pytree.tree_leaves(list(op.args)):
            if isinstance(arg, _Op) and not arg.variable:
                (operands if any(arg is a for a in taken) else read_otherwise).update(leaves(arg))
    return Kernels(frozenset(windows), frozenset(operands - read_otherwise))


class Kernels(NamedTuple):
    """`_kernels`: a convolution's with a window, a matrix product's operands. A parameter
    is a layer's weight, which training moves off any uniform value: only a buffer or a
    constant keeps its value as a product's operand (a Linear's weight of ones is a layer)."""
    windows: frozenset = frozenset()
    operands: frozenset = frozenset()


_PRODUCT_OPERANDS = {"mm": slice(0, 2), "bmm": slice(0, 2), "addmm": slice(1, 3), "baddbmm": slice(1, 3),
                     "addbmm": slice(1, 3), "mv": slice(0, 2), "addmv": slice(1, 3), "dot": slice(0, 2)}


def _aliases_hold(model: torch.nn.Module, inputs: list, values: "_Equivalences", outputs: list) -> bool:
    """Whether the task returns what it returned with every value taken for an earlier one
    (`_Equivalences._same`) put in that one's place. Values are compared at their own
    magnitude, and what matters is what reaches the outputs: a red team's `t = x + 4000`,
    `y = t + 0.25 relu(linear(x))`, `y - 4000` had `y` taken for `t` (4 an element apart is
    equal at 4,000) and traced as `add`, though the layer moved its outputs by 0.5."""
    replace = {op.index: _in_place_of(op.value, same.value) for op, same in values.alias.items()
               if _writes_its_own(op.target)}
    if not replace:  # none, or views alone: a view's value is its base's already
        return True
    _, replayed = _recorded(model, inputs, replace)
    return len(replayed) == len(outputs) and all(
        a.shape == b.shape and (close(a, b) if a.is_floating_point() else torch.equal(a, b))
        for a, b in zip(replayed, outputs))


def _in_place_of(value: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
    """`same` in the shape `_same` found `value` equal to it: reshaped, repeated along the
    batch, or its first block."""
    if value.numel() == same.numel():
        return same.reshape(value.shape).to(value.dtype)
    if value.shape[0] > same.shape[0]:
        return same.repeat(value.shape[0] // same.shape[0], *[1] * (same.dim() - 1)).to(value.dtype)
    return same[:value.shape[0]].to(value.dtype)


def _recorded(model: torch.nn.Module, inputs: list, replace: dict | None = None) -> tuple["_Recorder", list]:
    variables = [t for t in torch.utils._pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    recorder = _Recorder(variables=variables, replace=replace, weights=[*model.parameters(), *model.buffers()])
    with torch.no_grad(), recorder:
        out = model(*inputs)
    outputs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    recorder.read_at_the_end(outputs)
    return recorder, outputs
