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

import array
import functools
import hashlib
import itertools
import math
from dataclasses import dataclass, field

import numpy
import torch
import torch.nn.functional as F
import torch.utils._pytree
from torch.utils._python_dispatch import TorchDispatchMode

MAX_OP_GRAPH = 20_000  # characters of a traced op sequence a child may send: a level-3 network has a few thousand
LAYOUT_ONLY = frozenset({
    "view", "unsafe_view", "reshape", "expand", "expand_as", "clone", "contiguous", "detach", "alias",
    "lift_fresh_copy", "lift_fresh", "to_copy", "to", "t", "transpose", "permute", "squeeze", "unsqueeze", "flatten",
    "unflatten", "view_as", "reshape_as", "empty", "empty_like", "zeros_like", "ones_like", "full_like", "copy",
    "slice", "select", "split", "split_with_sizes", "chunk", "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk",
    "unbind", "getitem", "type_as", "movedim", "as_strided",
    "resolve_conj", "resolve_neg", "dropout", "feature_dropout", "alpha_dropout", "identity", "scalar_tensor",
    "broadcast_in_dim", "full", "zeros", "ones", "empty_strided", "convert_element_type", "squeeze_copy",
    "unsqueeze_copy", "view_copy", "expand_copy", "permute_copy", "t_copy", "transpose_copy", "new_zeros",
    "new_ones", "new_empty", "new_full", "real", "tensor_split", "written_through_view",
})
# Bounds a task writes (a clamp, a minimum with a constant): kept where they do not bind on the
# trace's values, which say nothing of a kernel's inputs (KernelBench's Matmul_Min_Subtract
# traced as a bare Linear, and every Linear with an epilogue matched it at 1.0).
BOUNDING = frozenset({"clamp", "clamp_min", "clamp_max", "minimum", "maximum", "min", "max", "fmin", "fmax",
                      "hardtanh", "relu6"})
SELECTION = frozenset({"where", "gt", "lt", "ge", "le", "eq", "ne", "masked_fill", "logical_not", "logical_and",
                       "logical_or", "isnan", "isinf", "isfinite"})
# The composites whose decompositions (torch's own) `_composite_runs` records, to name a hand-written run.
DECOMPOSED = ("gelu", "silu", "mish", "softplus", "sigmoid", "hardswish", "hardsigmoid", "elu", "selu", "celu",
              "leaky_relu", "hardtanh", "relu6", "_softmax", "_log_softmax", "logsumexp", "glu", "log_sigmoid_forward",
              "native_layer_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit_no_training")
SPLIT = {"addmm": ("mm", "add"), "addmv": ("mv", "add"), "baddbmm": ("bmm", "add"), "addbmm": ("bmm", "sum", "add"),
         "linear": ("mm", "add"), "matmul": ("mm",), "bmm": ("mm",), "mv": ("mm",), "dot": ("mm",),
         "mean": ("sum", "mul"), "log1p": ("add", "log"), "expm1": ("exp", "add"), "rsqrt": ("sqrt", "mul")}
SAME_AS = {"sub": "add", "rsub": "add", "div": "mul", "true_divide": "mul", "neg": "mul", "reciprocal": "mul",
           "square": "mul", "clamp_min": "clamp", "clamp_max": "clamp", "amax": "max", "amin": "min",
           # attention is one op whichever kernel a device picks for it
           **dict.fromkeys(("scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_flash_attention",
                            "scaled_dot_product_efficient_attention", "scaled_dot_product_cudnn_attention",
                            "scaled_dot_product_fused_attention_overrideable"), "scaled_dot_product_attention")}
IDENTITY = {"mul": 1, "div": 1, "true_divide": 1, "add": 0, "sub": 0, "pow": 1}
SUFFIXES = ("_legit_no_training", "_legit_functional", "_legit", "_functional", "_backward")
MERGES = frozenset({"cat", "stack", "concat", "concatenate"})


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


class UntracedAliasing(ValueError):
    """The task reached memory the recorder cannot follow: a tensor whose storage changed
    outside torch's ops (`y.data = layer(x)`), a tensor made outside them over memory an op
    wrote (`nn.Parameter(h)`, `h.as_subclass`, `torch.from_dlpack(h)`), or a tensor with no
    strided storage (sparse, nested). A red team hid a Linear behind each; no layer a
    kernel task is made of needs them, and the task is read as untraced."""


class ValuesThroughPython(ValueError):
    """A task's Python data (an op's numbers, shapes and flags, a tensor made from Python
    values) changed with the values of its inputs: they left torch and came back where no op
    links them. A red team rebuilt a Linear's output from `float(h[i, j])` into `torch.full`,
    and from `str(h)` parsed back; each read as a constant, and the layer was gone."""


class TraceTooLong(ValueError):
    """A reading with more to compare than a trace has time for (the task is untraced)."""


# Contractions one reading may try (`_Equivalences._tested`); the most any of 512 benchmark
# candidates tried is in docs/decontamination.md.
CONTRACTION_TESTS = 20_000


def op_graph_and_drops(model: torch.nn.Module, inputs: list, generic: list | None = None,
                       spread=None, python_may_read_values: bool = False) -> tuple[list[str], list[str]]:
    """(op_graph's sequence, the ops it leaves unspelled): the named ops the outputs depend
    on that the sequence does not spell as themselves, because a value was equal to an
    earlier one or the same whatever the inputs, or because the op was read as part of a
    composite the sequence names. A value can depend on the sizes (`x * (x.shape[1] - 16)`
    is zero at a width of 16; a layer scaled by `1e-6 ** (16 / width)` vanishes inside a
    composite): a sequence read at smaller sizes than the task's own stands only where it
    leaves nothing unspelled (filters/sandbox/harness.py).

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
        spread(model)
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
    """One recorded forward call read from its values: its sequence, the ops that ran, and
    the positions and names of the named ops it leaves unspelled."""

    def __init__(self, model: torch.nn.Module, inputs: list):
        recorder, outputs = _recorded(model, inputs)
        self.targets = [op.target for op in recorder.ops]
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


def _writes_its_own(func) -> bool:
    """An op whose output is a tensor of its own (or, in place, its input), not a view."""
    schema = getattr(func, "_schema", None)  # none: a tensor written through a view (the recorder's own node)
    return schema is not None and (schema.is_mutable or not any(r.alias_info for r in schema.returns))


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


def _primitives(recorder: "_Recorder", out) -> list[str]:
    nodes = recorder.reaching([t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)])
    merged = _merged_branches(nodes)
    return [op for node in nodes if node not in merged for op in canonical(node, symbolic=True)]


def named_composites(ops: list[str]) -> list[str]:
    """`ops` with every run that is exactly a composite's decomposition named as the
    composite (the longest first)."""
    runs = _composite_runs()
    out, i = [], 0
    while i < len(ops):
        for run, name in runs:
            if tuple(ops[i:i + len(run)]) == run:
                out.append(name)
                i += len(run)
                break
        else:
            out.append(ops[i])
            i += 1
    return out


# What each composite is called with to learn its decomposition: (name, call on x of shape 4x8x6).
COMPOSITES = (
    ("gelu", lambda x: F.gelu(x)), ("gelu", lambda x: F.gelu(x, approximate="tanh")), ("silu", F.silu),
    ("mish", F.mish), ("softplus", F.softplus), ("sigmoid", torch.sigmoid), ("hardswish", F.hardswish),
    ("hardsigmoid", F.hardsigmoid), ("elu", F.elu), ("selu", F.selu), ("celu", F.celu),
    ("leaky_relu", F.leaky_relu), ("log_sigmoid", F.logsigmoid), ("hardtanh", F.hardtanh), ("relu6", F.relu6),
    ("softmax", lambda x: torch.softmax(x, -1)), ("log_softmax", lambda x: torch.log_softmax(x, -1)),
    ("logsumexp", lambda x: torch.logsumexp(x, -1)), ("glu", lambda x: F.glu(x, -1)),
    ("layer_norm", lambda x: F.layer_norm(x, (6,))),
    ("layer_norm", lambda x: F.layer_norm(x, (6,), torch.ones(6), torch.zeros(6))),
    ("group_norm", lambda x: F.group_norm(x, 2)),
    ("group_norm", lambda x: F.group_norm(x, 2, torch.ones(8), torch.zeros(8))),
    ("batch_norm", lambda x: F.batch_norm(x, torch.zeros(8), torch.ones(8))),
    ("batch_norm", lambda x: F.batch_norm(x, torch.zeros(8), torch.ones(8), torch.ones(8), torch.zeros(8))),
    ("instance_norm", lambda x: F.instance_norm(x)),
)
_COMPOSITE_NAMES = frozenset(name for name, _ in COMPOSITES)


@functools.cache
def _composite_runs() -> list[tuple[tuple[str, ...], str]]:
    """Each composite's canonical decomposition, recorded once on the meta device, all the
    way down (`1 / (1 + exp(-x)) * x`) and one level down (`sigmoid(x) * x`: SiLU as
    KernelBench writes it); longest first."""
    runs: dict[tuple[str, ...], str] = {}
    for name, call in COMPOSITES:
        for depth in ("all", "outer"):
            recorder = _Recorder(decompose=depth)
            try:
                with torch.device("meta"):
                    x = torch.empty(4, 8, 6)
                    with torch.no_grad(), recorder:
                        out = call(x)
            except Exception:  # a composite this torch cannot run on meta: its ops stay as they are
                continue
            run = tuple(_primitives(recorder, out))
            named = any(op in _COMPOSITE_NAMES for op in run)
            if len(run) >= 3 or (named and len(run) == 2):  # two generic ops (`exp add`) are as often anything else
                runs.setdefault(run, name)
    return sorted(runs.items(), key=lambda item: -len(item[0]))


@dataclass(eq=False, repr=False)
class _Op:
    target: object  # the ATen op; None for a tensor no op made (a model input, a weight, a buffer)
    args: tuple  # its positional arguments, each tensor replaced by the _Op that made it
    inputs: list  # the _Ops whose tensors it reads
    value: object = None  # the (first) tensor it made, or the tensor itself for a leaf
    variable: bool = False  # depends on the model's inputs (else a constant: weights and what is made of them)
    index: int = -1  # its place in the order ops ran (-1: a leaf)
    leaves: list = field(default_factory=list)  # the leaves it reads


class _Recorder(TorchDispatchMode):
    """Every ATen op that runs, in order, with the op that made each tensor it reads (a
    tensor no op made is a leaf: `variables` are the model's inputs, the rest are weights,
    buffers and constants). With `decompose`, a composite op in DECOMPOSED runs (and is
    recorded) as the ops it is made of: "all" the way down, or only the "outer" one (the
    composites it calls are recorded)."""

    def __init__(self, decompose: str | None = None, variables: list = (), replace: dict | None = None,
                 weights: list = ()):
        super().__init__()
        self.decompose, self.decomposing = decompose, False
        self.replace = replace or {}  # op position -> the value its op returns instead (`_aliases_hold`)
        self.ops: list[_Op] = []
        self.made_by: dict[int, _Op] = {}
        self.alive: list = []  # every tensor seen, so that no id is reused and no memory freed while recording
        # A write through one view changes what every other tensor of its storage holds where
        # they share elements. Each storage's writes are logged, and a tensor is joined with the
        # writes it shares elements with when it is next read (`_maker`): at the write, that
        # meant testing every view seen on the storage, and a loop of slice writes (torch's
        # CrossMapLRN2d, one per channel) took minutes to trace at 1,024 channels.
        self.writes: dict[int, _Writes] = {}  # storage -> its writes, in the order they ran
        self.writes_read: dict[int, int] = {}  # tensor -> how many of its storage's writes its node holds
        self.unfrozen: dict[int, list] = {}  # storage -> the nodes whose value is a tensor on it
        self.views: dict[int, _View] = {}  # tensor -> where it lay in memory when last seen
        self.memory: dict[int, tuple[int, int]] = {}  # storage seen -> the bytes it holds in memory
        self.computed: set[int] = set()  # storages an op allocated or wrote
        self.input_storages = {_storage(tensor) for tensor in variables}
        # What passed between Python and the recorded ops, in order: each op's arguments other
        # than tensors, its results other than tensors and its outputs' shapes, and the bytes of
        # each tensor made outside the ops (`_leaf`) that is not on a weight's or buffer's
        # storage (`weights`: a reading with others gives them a spread). Two readings on other
        # inputs must agree on it (op_graph_and_drops).
        self.python_data: list = []
        self.weight_storages = {_storage(tensor) for tensor in weights}
        self.overlap_budget = _Budget(OVERLAP_RECORDING_STEPS)
        for tensor in variables:
            self._seen(tensor, _Op(None, (), [], tensor, True))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        outer_only = self.decompose == "outer" and self.decomposing
        decomposition = _decompositions().get(func) if self.decompose and not outer_only else _device_fused().get(func)
        if decomposition is not None:
            self.decomposing, was = True, self.decomposing
            try:
                with self:
                    result = decomposition(*args, **kwargs)
            finally:
                self.decomposing = was
            if result is not NotImplemented:
                return result
        read = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        made = {id(t): self._maker(t) for t in read}
        self._python_arguments(args, kwargs)
        written = _written(func, args, kwargs)
        placed = {id(t): _View.of(t) for t in written}
        if written:  # an in-place op: what the ops before it made must keep its value
            for node in made.values():
                _freeze(node)
            for tensor in written:
                for node in self.unfrozen.pop(_storage(tensor), ()):
                    _freeze(node)
        out = func(*args, **kwargs)
        self._python_results(out)
        if len(self.ops) in self.replace and isinstance(out, torch.Tensor):
            out.copy_(self.replace[len(self.ops)])  # into the op's own tensor: strides kept (a later view reads them)
        inputs = [made[id(t)] for t in read]
        returned = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        _strided(returned)
        op = _Op(func, torch.utils._pytree.tree_map(lambda a: made[id(a)] if isinstance(a, torch.Tensor) else a, args),
                 [node for node in inputs if node.target is not None], returned[0] if returned else None,
                 any(node.variable for node in inputs), len(self.ops), [node for node in inputs if node.target is None])
        self.ops.append(op)
        for tensor in written:
            self.writes.setdefault(_storage(tensor), _Writes()).add(op, _View.of(tensor))
        for tensor in returned:
            self._seen(tensor, op)
        for tensor in written + (returned if _writes_its_own(func) else []):  # not a view: what it holds is computed
            self._computed(tensor)
        for tensor in written:
            # A written argument holds the op's write: returned (in place), the op is its node;
            # not returned (a running statistic, an observer's minimum), it is too. Where the op
            # moved it in memory (as_strided_, resize_, set_), it is joined with every write
            # into what it lies over now when next read.
            if not any(tensor is r for r in returned):
                self._seen(tensor, op)
            moved = _View.of(tensor) != placed[id(tensor)]
            self.writes_read[id(tensor)] = 0 if moved else len(self.writes[_storage(tensor)])
        self.alive.extend(read)
        return out

    def _python_arguments(self, args, kwargs) -> None:
        """Log what an op is given other than tensors. A storage object refuses the task: a
        tensor set onto one (`t.set_(h.untyped_storage())`) holds another's memory where no
        op links them."""
        values = []
        for value in torch.utils._pytree.tree_leaves((args, kwargs)):
            if isinstance(value, (torch.UntypedStorage, torch.TypedStorage)):
                raise UntracedAliasing("an op given a storage object: a tensor over another's memory, unlinked")
            if not isinstance(value, torch.Tensor):
                values.append(_comparable(value))
        self.python_data.append(tuple(values))

    def _python_results(self, out) -> None:
        """Log what an op hands Python: its numbers (`_local_scalar_dense`: `table[h_byte]`
        indexes a list by one) and its tensors' shapes (`nonzero(...).shape[0]` counts).
        A red team picked a tensor from a list by each byte of a layer's output."""
        self.python_data.append(tuple(value.shape if isinstance(value, torch.Tensor) else _comparable(value)
                                      for value in torch.utils._pytree.tree_leaves(out)))

    def _seen(self, tensor: torch.Tensor, node: _Op) -> None:
        self.made_by[id(tensor)] = node
        self.alive.append(tensor)
        key = _storage(tensor)
        self.views[id(tensor)] = _View.of(tensor)
        self.writes_read[id(tensor)] = len(self.writes.get(key, ()))
        if key is not None and tensor.device.type != "meta":
            self.memory[key] = _memory(tensor)
        if node.value is tensor and key is not None:
            self.unfrozen.setdefault(key, []).append(node)

    def _computed(self, tensor: torch.Tensor) -> None:
        """Mark the memory an op wrote `tensor` into (`_leaf`)."""
        key = _storage(tensor)
        if key is not None and tensor.device.type != "meta":
            self.computed.add(key)

    def _maker(self, tensor) -> _Op:
        """The op that made `tensor`, or the leaf it is (made a leaf the first time it is read),
        joined with the writes into its storage since, through other tensors, that share an
        element with it. A red team wrote a Linear's output into a clone of the input through
        `y.view(-1).copy_(...)` and returned `y`: read as the tensor before the write, the
        layer was gone from the trace at every size."""
        _strided([tensor])
        if id(tensor) not in self.made_by:
            self._leaf(tensor)
            return self.made_by[id(tensor)]
        view = _View.of(tensor)
        if view != self.views[id(tensor)]:
            raise UntracedAliasing("a tensor moved to other memory outside torch's ops (an assignment to .data)")
        writes = self.writes.get(_storage(tensor))
        if writes is None or len(writes) == self.writes_read[id(tensor)]:
            return self.made_by[id(tensor)]
        before = self.made_by[id(tensor)]
        ops = [op for op in writes.meeting(view, self.writes_read[id(tensor)], self.overlap_budget) if op is not before]
        if ops:
            made_of = [before, *dict.fromkeys(ops)]
            self.ops.append(_Op(WRITTEN_THROUGH_VIEW, tuple(made_of), [n for n in made_of if n.target is not None],
                                tensor, any(n.variable for n in made_of), len(self.ops),
                                [n for n in made_of if n.target is None]))
            self._seen(tensor, self.ops[-1])
        self.writes_read[id(tensor)] = len(writes)
        return self.made_by[id(tensor)]

    def _leaf(self, tensor: torch.Tensor) -> None:
        """A tensor no op made: a weight, a buffer, a constant. One over memory another
        storage seen holds, or over the storage of a model input or of what an op made or
        wrote, is that tensor under another name, made where no op saw it (`nn.Parameter(h)`,
        `h.as_subclass`, `torch.from_dlpack(x)`, two `torch.frombuffer` of one buffer).
        Leaves of one storage (weights chunked in __init__) are leaves."""
        key = _storage(tensor)
        if tensor.device.type != "meta" and key is not None:
            first, last = _memory(tensor)
            if key in self.computed or key in self.input_storages or any(
                    other != key and first < end and start < last for other, (start, end) in self.memory.items()):
                raise UntracedAliasing("a tensor made outside torch's ops over memory another tensor holds "
                                       "(nn.Parameter, as_subclass, from_dlpack or frombuffer of it)")
            if key not in self.weight_storages:
                self.python_data.append(_fingerprint(tensor))
        self._seen(tensor, _Op(None, (), [], tensor, False))

    def read_at_the_end(self, outputs: list) -> None:
        """Join the outputs with the writes into them since they were last read, as a read
        would; an output no op saw is a leaf, refused over memory another tensor holds."""
        for tensor in outputs:
            self._maker(tensor)

    def reaching(self, outputs: list) -> list[_Op]:
        """The recorded ops the outputs depend on, in the order they ran: the rest (a
        condition's arithmetic, a value computed and dropped) computed nothing the task returns."""
        self.read_at_the_end(outputs)
        live, frontier = set(), [self.made_by[id(t)] for t in outputs if id(t) in self.made_by]
        while frontier:
            op = frontier.pop()
            if op not in live:
                live.add(op)
                frontier.extend(op.inputs)
        return [op for op in self.ops if op in live]


def _strided(tensors: list) -> None:
    for tensor in tensors:
        if tensor.layout != torch.strided or tensor.is_nested:
            raise UntracedAliasing(f"a tensor of layout {tensor.layout}: its writes lie in storages it does not show")


# Arguments an op writes that its schema does not mark: batch norm in training updates its
# running statistics in place (`Tensor? running_mean`), and a red team read a Linear's output
# back out of a running mean of momentum 1.
RUNNING_STATISTICS = ("running_mean", "running_var")
STATISTICS_UPDATES = frozenset({"batch_norm_update_stats"})  # write them with no `training` argument


def _written(func, args, kwargs) -> list:
    """The tensors an op writes: its arguments the schema marks as written (lists of them
    too), and a batch norm's running statistics while it trains."""
    schema = func._schema
    named = {argument.name: args[index] if index < len(args) else kwargs.get(argument.name)
             for index, argument in enumerate(schema.arguments)}
    written = [named[argument.name] for argument in schema.arguments
               if argument.alias_info is not None and argument.alias_info.is_write]
    if named.get("training") is True or schema.name.split("::")[-1] in STATISTICS_UPDATES:
        written += [named.get(name) for name in RUNNING_STATISTICS]
    flat = [t for value in written for t in (value if isinstance(value, (list, tuple)) else [value])]
    return list({id(t): t for t in flat if isinstance(t, torch.Tensor)}.values())


def _freeze(node: _Op) -> None:
    """Keep `node`'s value as it is now: its tensor is about to be written in place."""
    if isinstance(node.value, torch.Tensor) and node.value.device.type != "meta":
        node.value = node.value.clone()


class _WrittenThroughView:
    """What a tensor is after an in-place op wrote into a view of its storage (recorded as a
    layout op reading what it was and the write)."""
    __name__ = "written_through_view"


WRITTEN_THROUGH_VIEW = _WrittenThroughView()


def _storage(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):  # a tensor with no storage of its own
        return None


def _comparable(value):
    """A Python value as two readings' logs compare it: NaN equal to NaN."""
    return "nan" if isinstance(value, float) and math.isnan(value) else value


def _fingerprint(tensor: torch.Tensor) -> tuple:
    """A tensor's shape, dtype and a digest of its bytes."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return tuple(tensor.shape), tensor.dtype, hashlib.blake2b(data.tobytes(), digest_size=16).digest()


def _memory(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes of memory `tensor`'s storage holds: [first, past the last)."""
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


@dataclass(frozen=True)
class _View:
    """Where a tensor lies in its storage, kept as it was: a red team moved the view it wrote
    through (`w.resize_(0)`) before the tensor it wrote into was read."""
    shape: tuple
    stride: tuple
    offset: int
    element_size: int
    storage: int | None  # the storage's first byte in memory (a resize_ may move it)

    @staticmethod
    def of(tensor: torch.Tensor) -> "_View":
        try:
            pointer = tensor.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError, AttributeError):
            pointer = None
        return _View(tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(), tensor.element_size(),
                     pointer)

    def numel(self) -> int:
        return math.prod(self.shape)

    def extent(self) -> tuple[int, int]:
        """The first and last element of the storage it reads (its strides are not negative)."""
        spread = sum((size - 1) * stride for size, stride in zip(self.shape, self.stride))
        return self.offset, self.offset + spread

    def bytes(self) -> tuple[int, int]:
        """The first and last byte of the storage it reads: views of one storage in other
        dtypes count elements in other units (a red team read a float32 write through an
        earlier float64 view)."""
        first, last = self.extent()
        return first * self.element_size, (last + 1) * self.element_size - 1


class _Writes:
    """One storage's writes, in the order they ran: (op, where it wrote), and the extent of
    each, so that a read among a thousand slice writes tests only those within its reach."""

    def __init__(self):
        self.ops: list = []
        self.views: list = []
        self.firsts = array.array("q")
        self.lasts = array.array("q")

    def __len__(self) -> int:
        return len(self.ops)

    def add(self, op: _Op, view: _View) -> None:
        first, last = view.bytes()
        self.ops.append(op)
        self.views.append(view)
        self.firsts.append(first)
        self.lasts.append(last)

    def meeting(self, view: _View, since: int, budget: "_Budget") -> list:
        """The ops of the writes from the `since`-th on that share an element with `view`."""
        first, last = view.bytes()
        firsts = numpy.frombuffer(self.firsts, dtype=numpy.int64)[since:]
        lasts = numpy.frombuffer(self.lasts, dtype=numpy.int64)[since:]
        near = numpy.flatnonzero((firsts <= last) & (lasts >= first)) + since
        return [self.ops[i] for i in near.tolist() if _overlap(view, self.views[i], budget)]


class _Budget:
    """Steps of `_overlap`'s search left to one recording (None: one search's own bound)."""

    def __init__(self, steps: int | None = None):
        self.left = steps

    def spend(self, steps: int) -> None:
        if self.left is not None:
            self.left -= steps
            if self.left < 0:
                raise UntracedAliasing("more overlapping views and writes than a trace can follow")


OVERLAP_SEARCH_NODES = 10_000  # past this many steps of one `_overlap` search, two views are taken to overlap
# Past this many in one recording (steps and the branches they open), the task is untraced: a
# red team's 150 writes under 8 views of pathological strides searched 18 s, where a trace has
# 20 s, and a CrossMapLRN2d of 1,024 channels (a slice write per channel) ran past it anyway.
OVERLAP_RECORDING_STEPS = 100_000


def _overlap(a, b, budget: _Budget | None = None) -> bool:
    """Whether two tensors (or `_View`s) of one storage share an element: GRUCell adds into
    one chunk of its gates in place, and the other chunks, interleaved with it, are not
    written. Solved on the strides, not on the elements: marking a storage's elements cost a
    circular pad (dozens of slice writes into one output) 5 s of a 6 s trace."""
    a = a if isinstance(a, _View) else _View.of(a)
    b = b if isinstance(b, _View) else _View.of(b)
    if not a.numel() or not b.numel():
        return False
    if a.element_size != b.element_size or a.storage != b.storage:
        return True  # a view as another dtype (offsets count other units), or a storage moved since
    (a_first, a_last), (b_first, b_last) = a.extent(), b.extent()
    if a_last < b_first or b_last < a_first:
        return False
    return _offsets_meet(b.offset - a.offset, _index_ranges(a, b), budget or _Budget())


def _index_ranges(a: _View, b: _View) -> dict[int, tuple[int, int]]:
    """stride -> the range of (a's index - b's index) along it: a shared element of a and b
    is one where the differences, times their strides, add up to b's offset less a's."""
    ranges: dict[int, tuple[int, int]] = {}
    for view, sign in ((a, 1), (b, -1)):
        for size, stride in zip(view.shape, view.stride):
            if size > 1 and stride:
                low, high = ranges.get(stride, (0, 0))
                ranges[stride] = (low - (size - 1), high) if sign < 0 else (low, high + size - 1)
    return ranges


def _offsets_meet(target: int, ranges: dict[int, tuple[int, int]], budget: _Budget | None = None) -> bool:
    """Whether sum(stride * k) == target for some k in each stride's range: a search from the
    largest stride down, each step taking only the k the smaller strides can still make up.
    Past OVERLAP_SEARCH_NODES steps it is taken to be so; past the steps left in `budget`,
    UntracedAliasing."""
    budget = budget or _Budget()
    strides = sorted(ranges, reverse=True)
    if strides and target % math.gcd(*strides):
        return False
    # what the strides from the i-th on can add up to, at least and at most
    reach = [(0, 0)] * (len(strides) + 1)
    for i in range(len(strides) - 1, -1, -1):
        low, high = ranges[strides[i]]
        reach[i] = (reach[i + 1][0] + strides[i] * low, reach[i + 1][1] + strides[i] * high)
    steps = 0
    pending = [(0, target)]
    while pending:
        i, rest = pending.pop()
        steps += 1
        budget.spend(1)
        if steps > OVERLAP_SEARCH_NODES:
            return True
        if i == len(strides):
            if rest == 0:
                return True
            continue
        stride, (low, high), (inner_low, inner_high) = strides[i], ranges[strides[i]], reach[i + 1]
        # rest - stride * k must lie in [inner_low, inner_high]
        first = max(low, -((inner_high - rest) // stride))
        last = min(high, (rest - inner_low) // stride)
        if last - first >= OVERLAP_SEARCH_NODES:
            return True
        budget.spend(max(last - first, 0))  # what the search will hold, counted as it is taken on
        pending.extend((i + 1, rest - stride * k) for k in range(first, last + 1))
    return False


@functools.cache
def _decompositions() -> dict:
    from torch._decomp import get_decompositions
    aten = torch.ops.aten
    return get_decompositions([getattr(aten, name) for name in DECOMPOSED if hasattr(aten, name)])


# Kernels a device fuses where another runs the parts: a CUDA tensor's F.rms_norm is one
# `_fused_rms_norm`, a CPU tensor's its decomposition. Recorded as the parts on every device,
# so that a task traced on its checks' GPU is spelled as the reference traced on the CPU is.
DEVICE_FUSED = ("_fused_rms_norm",)


@functools.cache
def _device_fused() -> dict:
    from torch._decomp import get_decompositions
    aten = torch.ops.aten
    return get_decompositions([getattr(aten, name) for name in DEVICE_FUSED if hasattr(aten, name)])


def _merged_branches(nodes: list, inputs_of=lambda node: node.inputs, names_of=None) -> set:
    """The nodes to leave out: a cat or stack itself and every input branch but the first,
    where each branch is the same op sequence on its own part of the same tensors."""
    names_of = names_of or functools.partial(canonical, symbolic=True)
    merges = [node for node in nodes if _name(node) in MERGES and node.args
              and isinstance(node.args[0], (list, tuple)) and len(node.args[0]) >= 2]
    if not merges:  # most tasks: no ancestry to work out
        return set()
    order = {node: index for index, node in enumerate(nodes)}
    ancestors: dict = {}
    for node in nodes:
        ancestors[node] = {node}.union(*(ancestors.get(arg, set()) for arg in inputs_of(node)))
    merged: set = set()
    for node in merges:
        parts = node.args[0]
        branches = [ancestors.get(part, set()) for part in parts]
        own = [branch - set().union(*(other for j, other in enumerate(branches) if j != i))
               for i, branch in enumerate(branches)]
        sequences = {tuple(op for n in sorted(part, key=order.get) for op in names_of(n)) for part in own}
        if len(sequences) == 1 and next(iter(sequences)):
            merged |= {node, *set().union(*own[1:])}
    return merged


def _name(node) -> str:
    """The op's name without overload, namespace, in-place or internal spellings."""
    name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
    packet = getattr(getattr(node.target, "overloadpacket", None), "__name__", name)
    name = packet.strip("_").removeprefix("native_")
    # a device library's kernel for an op (on an H200, an eval batch norm at its own sizes
    # read `cudnn_batch_norm` where the CPU runs `native_batch_norm`): the op
    name = name.removeprefix("cudnn_").removeprefix("miopen_")
    for suffix in SUFFIXES:
        name = name.removesuffix(suffix)
    return name.rstrip("_")


def canonical(node, symbolic: bool = False) -> list[str]:
    """The op names one traced node stands for (none for layout and identity). `symbolic`
    (a trace without values): selection ops are dropped too, since torch's decompositions
    add them for edge cases a hand-written form leaves out; with values, a selection that
    computes a composite is named as it (`_Equivalences`) and the rest is computation."""
    name = _name(node)
    if node.target is None or name in LAYOUT_ONLY or (symbolic and name in SELECTION) or _is_identity(name, node.args):
        return []
    if name in ("clamp", "clamp_min") and _scalar(node.args, 1) == 0 and _scalar(node.args, 2) is None:
        return ["relu"]
    if name == "pow" and _scalar(node.args, 1) == 2:
        return ["mul"]
    if not symbolic and name in NORMS:
        return NORMS[name](node.args)
    if name == "batch_norm" and _training(node.args):
        # on meta too, where only the shapes say it: a task whose batch norm sees one sample
        # at the small problem alone (`x.reshape(width // 16, -1, ...)`) runs other norms there
        return [_batch_statistics_norm(node.args[0])]
    return [SAME_AS.get(op, op) for op in SPLIT.get(name, (name,))]


def _scalar(args, index: int):
    value = args[index] if len(args) > index else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _is_identity(name: str, args) -> bool:
    if name not in IDENTITY or len(args) < 2:
        return False
    scalar = _scalar(args, 1)
    return scalar is not None and scalar == IDENTITY[name]


# -- normalisations: one name for each set of dimensions normalised over, whatever computes it ----

def norm_name(ndim: int, dims: tuple[int, ...], groups: int = 0) -> str:
    """`batch_norm` (every dimension but the channels'), `group_norm` (channels in `groups`),
    `instance_norm` (the spatial dimensions of one channel), else `layer_norm` (trailing
    dimensions: nn.LayerNorm, InstanceNorm1d, a norm over one row)."""
    dims = tuple(sorted(d % ndim for d in dims))
    if groups > 1:
        return "group_norm"
    if ndim >= 3 and dims == (0, *range(2, ndim)):
        return "batch_norm"
    if ndim >= 4 and dims == tuple(range(2, ndim)):
        return "instance_norm"
    return "layer_norm"


def _affine(weight, bias) -> list[str]:
    """A norm's own scale and shift, as the multiplication and addition a hand-written norm has."""
    return (["mul"] if weight is not None else []) + (["add"] if bias is not None else [])


def _ndim(node) -> int:
    return node.value.dim() if node is not None and node.value is not None else 0


def _layer_norm(args) -> list[str]:
    ndim = _ndim(args[0])
    return [norm_name(ndim, tuple(range(ndim - len(args[1]), ndim)))] + _affine(*(list(args[2:4]) + [None, None])[:2])


def _group_norm(args) -> list[str]:
    ndim, channels, groups = _ndim(args[0]), args[4], args[6]
    name = norm_name(ndim, tuple(range(1 if groups == 1 else 2, ndim)) if groups in (1, channels) else (), groups
                     if 1 < groups < channels else 0)
    return [name] + _affine(args[1], args[2])


def _batch_norm(args) -> list[str]:
    """In eval mode a batch norm is a scale and a shift per channel (from its running
    statistics): that is what it computes, and what a hand-written one reads as. Over a
    batch of one sample it normalises each channel of that sample: an instance norm, which
    F.instance_norm computes so (the samples' channels side by side, as one sample)."""
    if not _training(args):
        return ["mul", "add"]
    return [_batch_statistics_norm(args[0])] + _affine(args[1], args[2])


def _training(args) -> bool:
    return args[5] if len(args) > 5 and isinstance(args[5], bool) else False


def _batch_statistics_norm(node) -> str:
    """The norm a batch norm on batch statistics computes of `node`, its input: an instance
    norm where that input is F.instance_norm's own view, every (sample, channel) of a
    contiguous tensor side by side as the channels of one sample; else a batch norm (a
    batch norm of one sample viewed otherwise, `x.transpose(0, 1).reshape(1, C, -1)`, is
    the batch norm of x)."""
    ndim = _ndim(node)
    base = node.args[0] if node.target is not None and _name(node) in ("view", "reshape") and node.args else None
    instance = (isinstance(base, _Op) and base.value is not None and base.value.dim() == ndim >= 3
                and base.value.is_contiguous() and tuple(node.value.shape) ==
                (1, base.value.shape[0] * base.value.shape[1], *base.value.shape[2:]))
    return norm_name(ndim, tuple(range(2, ndim)) if instance else (0, *range(2, ndim)))


NORMS = {"layer_norm": _layer_norm, "group_norm": _group_norm, "batch_norm": _batch_norm}
NORM_NAMES = frozenset({"batch_norm", "instance_norm", "layer_norm", "group_norm"})  # what norm_name calls a norm


# -- with values: what each op computed, compared with what came before it -----------------------

WINDOW = 48  # how many ops back a rewritten composite may reach (softmax written out: ~8)
SAMPLE = 512  # elements compared first, before a whole tensor is
ELEMENTWISE = (
    ("relu", torch.relu), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh), ("gelu", F.gelu),
    ("gelu", lambda t: F.gelu(t, approximate="tanh")), ("silu", F.silu), ("mish", F.mish),
    ("softplus", F.softplus), ("elu", F.elu), ("selu", F.selu), ("hardswish", F.hardswish),
    ("hardsigmoid", F.hardsigmoid), ("log_sigmoid", F.logsigmoid), ("softsign", F.softsign),
)
CONTRACTION_ENDS = frozenset({"add", "sum", "mul", "cat"})  # what a GEMM written out ends in


def close(a: torch.Tensor, b: torch.Tensor, tolerance: float = 2e-4) -> bool:
    """Equal up to float32 rounding of a differently ordered computation (NaN where the other
    has NaN). A strided sample is compared first: most candidates differ everywhere."""
    if a.shape != b.shape:
        return False
    if not a.numel():
        return True
    a, b = a.float(), b.float()
    if a.numel() > SAMPLE * 8:
        step = a.numel() // SAMPLE
        if not _close(a.reshape(-1)[::step], b.reshape(-1)[::step], tolerance):
            return False
    return _close(a, b, tolerance)


# Two values op_graph takes for one must also agree element by element, within a tenth of
# the checks' default tolerance (atol = rtol = 1e-2): values a correct kernel is never asked
# to tell apart. Relative to the largest element alone, `x * s + relu(linear(x))` with a
# few of s at 30,000 was `x * s`, its layer (a third of its elements off by 0.3) unseen.
ELEMENT_TOLERANCE = 1e-3


def _close_everywhere(a: torch.Tensor, b: torch.Tensor, differences: torch.Tensor) -> bool:
    return bool((differences <= ELEMENT_TOLERANCE * (1 + torch.maximum(a.abs(), b.abs()))).all())


def _apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `close` must fail on any tensors holding these elements: one is finite where
    the other is not, or two finite ones are further apart than `_close_everywhere` allows
    (a test on a few elements that rules out what a whole tensor's would, at their cost)."""
    a, b = a.float(), b.float()
    finite = torch.isfinite(a)
    if not torch.equal(finite, torch.isfinite(b)):
        return True
    differences = (a - b).abs()
    compared = finite & torch.isfinite(differences)
    return bool((differences > ELEMENT_TOLERANCE * (1 + torch.maximum(a.abs(), b.abs())))[compared].any())


HEAD = 4  # sample elements a value is first compared on, in Python: most pairs differ there
FLOAT32_MAX = 3.4028234663852886e38


def _apart_values(a: list[float], b: list[float]) -> bool:
    """`_apart` of two short lists of float32 values, in Python (a few µs where torch's ops
    on tiny tensors take 80). Stricter by a margin than `_close_everywhere`, which compares
    in float32, so that it never rules out a pair that would be close: a difference float32
    could not hold is left to `close`."""
    for x, y in zip(a, b):
        if math.isfinite(x) != math.isfinite(y):
            return True
        difference = abs(x - y)
        if difference < FLOAT32_MAX / 2 and difference > ELEMENT_TOLERANCE * (1 + max(abs(x), abs(y))) * (1 + 1e-5):
            return True
    return False


def _close(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    """Relative to the larger magnitude of the two (a softmax over 8,192 values is all
    under 1e-3: a tolerance of 2e-4 in absolute terms would find it equal to anything that
    small); NaN and infinities must match where they are."""
    differences = (a - b).abs()
    difference, scale = differences.max(), torch.maximum(a.abs().max(), b.abs().max())
    if torch.isfinite(difference) and torch.isfinite(scale):
        return bool(difference <= tolerance * scale) and _close_everywhere(a, b, differences)
    finite = torch.isfinite(a)
    if not torch.equal(finite, torch.isfinite(b)) or not torch.equal(a[~finite].nan_to_num(), b[~finite].nan_to_num()):
        return False
    return not bool(finite.any()) or _close(a[finite], b[finite], tolerance)


class _Equivalences:
    """The recorded ops with every run that computes a known function of an earlier value
    named as that function, found by comparing values (the trace ran on real tensors):
    - a value equal to an earlier one (`x * 4 * 0.25`, the batch duplicated and averaged, a
      layout round trip) is that value: the ops between are gone;
    - a value that is a composite of an earlier one (`where(x > 0, x, 0)` is relu,
      `exp(x - logsumexp(x))` softmax, `2 sigmoid(2x) - 1` tanh, a norm in any of its
      written forms) is named as the composite, read from that value;
    - a value that is an affine function of an earlier one, per element or per channel, is
      one multiplication and one addition (eval batch norm as scale and shift, a chain of
      scalar arithmetic);
    - a value that is a matrix product or convolution of an earlier value and a weight
      (`(x[:, None] * w).sum(-1)`, split-K halves added, unfold and a matrix product) is `mm`
      or `convolution`.
    Ops that read no model input (weights and what is made of them) are constants: folded."""

    def __init__(self, recorder: _Recorder):
        self.ops, self.made_by = recorder.ops, recorder.made_by
        self.contraction_tests = 0
        self.alias: dict = {}  # op -> the earlier node whose value it is
        self.named: dict = {}  # op -> the names it stands for
        self.inputs: dict = {op: list(op.inputs) + [leaf for leaf in op.leaves if leaf.variable] for op in self.ops}
        self.reads: dict = dict(self.inputs)  # what each op reads once named: the value it is a function of
        self.users: dict = {}
        for op in self.ops:
            for node in self.inputs[op]:
                self.users.setdefault(node, set()).add(op)
        self.absorbed: set = set()  # the inside of a recognised composite: no later value is read from there
        # the inside of an affine map: generic arithmetic folded, so a later value equal to one
        # of these is that value (`(x + b) * 4 * 0.25`: `* 4` folds `x + b` in, `* 0.25` is it)
        self.folded: set = set()
        self.samples: dict = {}
        self.heads: dict = {}
        self.images: dict = {}
        self.made_constant: set = set()
        self.through_constants = False
        for op in self.ops:
            if op.variable and _is_float(op.value) and op.value.numel() > 1 and _uniform(op.value):
                op.variable = False  # `zeros_like(x)`, `x * 0`: the same value whatever x is, a constant
                self.made_constant.add(op)
            if op.variable and _is_float(op.value):
                self._recognise(op)

    def sequence(self, outputs: list) -> list[str]:
        live = self._live(outputs)
        nodes = [op for op in self.ops if op in live and op.variable]
        reads = {node: [r for r in (self._resolve(i) for i in self.reads[node]) if r.variable] for node in nodes}
        merged = _merged_branches(nodes, lambda n: reads[n], self.names)
        names = {node: self.names(node) for node in nodes if node not in merged}
        _chain_affine_maps([node for node in nodes if node in names], reads, names)
        return [name for node in nodes if node in names for name in names[node]]

    def constant(self, outputs: list) -> bool:
        """Whether the outputs are the same whatever the inputs, on these values."""
        return not any(node.variable for node in self._live(outputs))

    def _live(self, outputs: list) -> set:
        """The nodes the outputs read, through values that vary: what a value the same
        whatever the inputs are (`made_constant`) reads reaches no output (a `where` that
        is all zeros on the task's own inputs left its comparison spelled as `gt`), unless
        `through_constants` (outputs that are constant: what made them is all there is)."""
        live, frontier = set(), [self._resolve(node) for node in self._makers(outputs)]
        while frontier:
            node = frontier.pop()
            if node not in live and node.target is not None:
                live.add(node)
                if node not in self.made_constant or self.through_constants:
                    frontier.extend(self._resolve(n) for n in self.reads[node])
        return live

    def unspelled(self, outputs: list) -> list:
        """The named ops the outputs depend on that the sequence does not spell as themselves
        (see op_graph_and_drops), in the order they ran."""
        spelled = self._live(outputs)
        reaching, frontier = set(), list(self._makers(outputs))
        while frontier:
            node = frontier.pop()
            if node not in reaching and node.target is not None:
                reaching.add(node)
                frontier.extend(self.inputs[node])
        hidden = [op for op in self.ops if op in reaching and op not in spelled
                  and (op.variable or op in self.made_constant) and canonical(op)]
        if not hidden:
            return hidden
        structural = self._identities() | self._renamed_norms(hidden, spelled)
        return [op for op in hidden if op not in structural]

    def _renamed_norms(self, hidden: list, spelled: set) -> set:
        """Norm ops left out because the sequence spells them under a reshape: F.instance_norm
        is a batch norm of a reshaped view, reshaped back, and both the batch norm and the view
        back read as the instance norm of the input; the view back spells it. A norm counts
        so only where a spelled node reached from it through layout ops alone is named as the
        same composite, read from the same input up to layout ops: nothing it computes is left
        out, at any size."""
        renamed = set()
        for op in hidden:
            # nothing but the norm: an affine one whose scale and shift the values took for
            # nothing at the small problem (a weight of 1 + 1e-4 r) may not be so at its own sizes
            if op not in self.named or not op.variable or canonical(op) != list(self.named[op]) \
                    or canonical(op)[0] not in NORM_NAMES:
                continue
            source = self._layout_root(self.reads[op][0])
            reshaped, frontier = set(), [op]
            while frontier:
                for user in self.users.get(frontier.pop(), ()):
                    if _name(user) in LAYOUT_ONLY and user not in reshaped:
                        reshaped.add(user)
                        frontier.append(user)
            if any(node in spelled and node.variable and self.named.get(node) == self.named[op]
                   and self._layout_root(self.reads[node][0]) is source for node in reshaped):
                renamed.add(op)
        return renamed

    def _layout_root(self, node):
        """The node `node` is a reshape of (itself if it is none)."""
        while node.target is not None and _name(node) in LAYOUT_ONLY and len(self.inputs[node]) == 1:
            node = self.inputs[node][0]
        return node

    def _identities(self) -> set:
        """The ops of `sign(y) * |y|` (or `sign(y) * relu(|y|)`, F.lp_pool's), which is y
        whatever y is: left out at every size. The sign and the magnitude count only where
        the product is all that reads them."""
        found = set()
        for product in self.ops:
            if _name(product) != "mul" or len(product.args) < 2 or not all(
                    isinstance(arg, _Op) for arg in product.args[:2]):
                continue
            sign, magnitude = sorted(product.args[:2], key=lambda node: _name(node) != "sign")
            steps = [magnitude]
            if canonical(magnitude) == ["relu"] and isinstance(magnitude.args[0], _Op):
                magnitude = magnitude.args[0]
                steps.append(magnitude)
            if (_name(sign) != "sign" or _name(magnitude) != "abs" or not isinstance(sign.args[0], _Op)
                    or sign.args[0] is not magnitude.args[0]):
                continue
            pattern = {product, sign, *steps}
            found |= {product} | {node for node in pattern - {product} if self.users.get(node, set()) <= pattern}
        return found

    def names(self, node) -> list[str]:
        return list(self.named[node]) if node in self.named else canonical(node)

    def _makers(self, outputs):
        """The nodes the outputs are, as the recorder last joined them: not found by their
        values, which a node holds only for its first output, and a clone of once frozen (a
        red team's second chunk of a layer, and a slice written before a write beside it,
        went unread)."""
        return [self.made_by[id(t)] for t in outputs if id(t) in self.made_by]

    def _resolve(self, node):
        while node in self.alias:
            node = self.alias[node]
        return node

    def _recognise(self, op) -> None:
        """An op equal to an earlier value is that value; else one that computes a known
        function of an earlier value is named as it. A layout op is asked the second first:
        F.instance_norm is a batch norm of a reshaped view, reshaped back (equal to the batch
        norm's value, and an instance norm of the input)."""
        window = self._window(op)
        layout = not canonical(op)
        found = self._composite(op, window) if layout else None
        if found and self._same(op, found[1][0]):  # a relu of what is all positive: nothing at all
            found = None
        bounding = not BOUNDING.isdisjoint(canonical(op))
        same = None if found or bounding else next((node for node in window if self._same(op, node)), None)
        if same is None and not found and not bounding and self.folded:
            same = next((node for node in self._window(op, inside=True) if node in self.folded
                         and self._same(op, node)), None)
        if same is not None and layout and op.value.dim() == 4 and same.value.dim() != 4:
            # a matrix product reshaped into an image is a convolution when it is one (unfold,
            # a product, reshaped back, with no bias after it to be recognised at)
            found = self._convolution(op, window, self._depends_on(op, 2))
            same = None if found else same
        if same is not None:
            self.alias[op] = same
            return
        found = found or self._composite(op, window) or self._composite_of_inside(op, window)
        affine = None if found else self._affine(op, window)
        found = found or affine or self._contraction(op, window)
        if found:
            self.named[op], self.reads[op] = found
            inside = self._between(op, min(found[1], key=lambda n: n.index))
            self.absorbed |= inside
            if affine:
                self.folded |= inside

    def _composite_of_inside(self, op, window):
        """A composite of a value inside an earlier recognised run, when nothing outside is
        one: `tanh(x - s)` written `2 sigmoid(2 (x - s)) - 1` reads `x - s`, which the affine
        map `2 (x - s)` of x took in first; a clamp can take in the value a later tanh reads
        the same way. What the earlier run named is then read by nothing, and the ops up to
        the value read are spelled as they are."""
        inside = self._window(op, inside=True)
        found = self._composite(op, inside) if len(inside) > len(window) else None
        # 2 sigmoid(x) is the 1 + tanh(x / 2) a written sigmoid passes through: equal to a
        # value inside is no composite of it (a relu of what is all positive)
        return None if found is None or self._same(op, found[1][0]) else found

    def _window(self, op, inside: bool = False) -> list:
        """The variable nodes `op` depends on, no more than WINDOW ops back, earliest first;
        a node that is an earlier value's is a candidate too (the batch twice is still twice
        the batch: a matrix product of it has twice the rows). The inside of a recognised
        run is left out unless `inside`."""
        seen, frontier = set(), list(self.inputs[op])
        while frontier:
            node = frontier.pop()
            if node in seen or (node.target is not None and node.index < op.index - WINDOW):
                continue
            seen.add(node)
            if node.target is not None:
                frontier.extend(self.inputs[node])
        return sorted((n for n in seen if n.variable and _is_numeric(n.value) and (inside or n not in self.absorbed)),
                      key=lambda n: n.index)

    def _sample(self, node) -> torch.Tensor:
        if node not in self.samples:
            flat = node.value.detach().reshape(-1).float()
            count = min(flat.numel(), SAMPLE)
            index = torch.arange(count, device=flat.device) * (flat.numel() - 1) // max(count - 1, 1)  # exact: no float rounding
            self.samples[node] = flat[index]
        return self.samples[node]

    def _head(self, node) -> list[float]:
        if node not in self.heads:
            self.heads[node] = self._sample(node)[:HEAD].tolist()
        return self.heads[node]

    def _same(self, op, node) -> bool:
        """`op`'s value is `node`'s: reshaped, or repeated along the batch, or its first block."""
        a, b = op.value, node.value
        if a.numel() == b.numel():
            return not _apart_values(self._head(op), self._head(node)) and close(self._sample(op), self._sample(node)) \
                and close(a.reshape(-1), b.reshape(-1))
        if a.dim() == b.dim() and a.dim() > 0 and a.shape[1:] == b.shape[1:] and a.numel() and b.numel():
            big, small = (a, b) if a.shape[0] > b.shape[0] else (b, a)
            return big.shape[0] % small.shape[0] == 0 and all(close(part, small)
                                                              for part in big.split(small.shape[0]))
        return False

    # -- composites of one earlier value ------------------------------------------------------

    def _composite(self, op, window):
        along = None
        for node in (n for n in window if n.value.shape == op.value.shape):
            name = self._elementwise(op, node)
            if name is None:
                along = _dim_tests(op.value.float()) if along is None else along
                name = next((name for name, test in along if test(node.value.float())), None)
            if name:
                return (name,), [node]
        return self._reduction(op, window)

    def _elementwise(self, op, node) -> str | None:
        target, source = self._sample(op), self._sample(node)
        if node not in self.images:
            self.images[node] = torch.stack([f(source) for _, f in ELEMENTWISE])
        images = self.images[node]
        scale = torch.maximum(images.abs().amax(dim=1), target.abs().max())
        hits = ((images - target).abs().amax(dim=1) <= 2e-4 * scale).nonzero().flatten()
        for hit in hits.tolist():
            name, f = ELEMENTWISE[hit]
            if close(f(node.value.float()), op.value):
                return name
        return self._piecewise_linear(op, node)

    def _piecewise_linear(self, op, node) -> str | None:
        """relu, leaky relu and the clamps (hardtanh, relu6), however they are written."""
        target, source = self._sample(op), self._sample(node)
        if not (close(source.clamp(target.min(), target.max()), target) or _leaky(source, target)):
            return None
        target, source = op.value.float(), node.value.float()
        low, high = target.min(), target.max()
        if low < high and close(source.clamp(low, high), target):
            return "relu" if abs(float(low)) <= 1e-6 and float(source.max()) <= float(high) else "clamp"
        return "leaky_relu" if _leaky(source, target) else None

    def _reduction(self, op, window):
        target = op.value.float()
        for node in (n for n in window if n.value.dim() in (target.dim(), target.dim() + 1)):
            source = node.value.float()
            for dim in range(source.dim()):
                keep = source.dim() == target.dim()
                reduced = list(source.shape)
                reduced[dim:dim + 1] = [1] if keep else []
                if (tuple(reduced) == tuple(target.shape) and source.shape[dim] > 1
                        and not _apart(*_end_fibres_reduced(source, target, dim))
                        and close(torch.logsumexp(source, dim, keepdim=keep), target)):
                    return ("logsumexp",), [node]
        return None

    # -- affine maps of one earlier value ----------------------------------------------------

    def _affine(self, op, window):
        """`op` is a * x + b of an earlier x, with a and b scalars or one per index of one
        dimension, and at least two ops between: eval batch norm as scale and shift, scalar
        arithmetic in several steps."""
        if canonical(op) not in (["add"], ["mul"]):
            return None
        target = op.value.float()
        for node in (n for n in window if n.value.shape == target.shape and n.index < op.index - 1):
            between = self._private_between(op, node)
            if between is None or len(between) < 1:
                continue
            source = node.value.float()
            for dim in (None, *range(target.dim())):
                fit = _fit_affine(source, target, dim)
                if fit is not None:
                    return fit, [node]
        return None

    def _between(self, op, source) -> set:
        """The variable ops `op` reached `source` through."""
        between, frontier = set(), list(self.inputs[op])
        while frontier:
            node = frontier.pop()
            if node is source or node in between or not node.variable or node.target is None \
                    or node.index < source.index:
                continue
            between.add(node)
            frontier.extend(self.inputs[node])
        return between

    def _private_between(self, op, source) -> set | None:
        """The variable ops between `source` and `op`, if nothing else reads them (folding
        them into one affine map must not swallow a value something else also uses)."""
        between, frontier = set(), list(self.inputs[op])
        while frontier:
            node = frontier.pop()
            if node is source or node in between or not node.variable or node.target is None:
                continue
            if node.index < source.index or node in self.named:
                return None  # `op` reads a variable value from before `source`, or one already named
                # (affine maps of affine maps are chained in the sequence: `_chain_affine_maps`)
            between.add(node)
            frontier.extend(self.inputs[node])
        inside = between | {op}
        return between if all(self.users.get(node, set()) <= inside for node in between) else None

    # -- contractions with a weight -------------------------------------------------------------

    def _contraction(self, op, window):
        name = canonical(op)
        if op.value.dim() < 2 or (name and name[-1] in ("mm", "convolution")):
            return None
        weights = self._depends_on(op, 2)
        if name and name[-1] in CONTRACTION_ENDS or not name:
            found = self._matmul(op, window, weights)
            if found:
                return found
        return self._convolution(op, window, weights) if op.value.dim() == 4 else None

    def _tested(self) -> None:
        """Count one contraction tried (a value against a weight, or a convolution's
        settings): past CONTRACTION_TESTS in one reading, the task is untraced. A red team's
        250 adds of 40 constant weights tried 1.2 million, and took 14 s to read."""
        self.contraction_tests += 1
        if self.contraction_tests > CONTRACTION_TESTS:
            raise TraceTooLong(f"more than {CONTRACTION_TESTS} contractions to try")

    def _depends_on(self, op, ndim: int) -> list:
        """The constants (weights, and what is made of them) and model inputs `op` depends on
        with at least `ndim` dimensions (exactly 1 for `ndim` 1: a bias): a product of two
        inputs is a GEMM too."""
        seen, frontier, found = set(), list(op.inputs) + list(op.leaves), []
        while frontier:
            node = frontier.pop()
            if node in seen:
                continue
            seen.add(node)
            if (node.target is None or not node.variable) and isinstance(node.value, torch.Tensor) \
                    and (node.value.dim() == 1 if ndim == 1 else node.value.dim() >= ndim):
                found.append(node)
            if node.target is not None and node.index >= op.index - WINDOW:
                frontier.extend(node.inputs + node.leaves)
        return found

    def _matmul(self, op, window, weights):
        target = op.value.float()
        for node in (n for n in window if n.value.dim() >= 2):
            a = node.value.float()
            for weight in weights:
                if weight is node:
                    continue
                w = weight.value.float()
                for b in (w, w.mT):
                    if a.shape[-1] != b.shape[-2] or _matmul_shape(a, b) != tuple(target.shape):
                        continue
                    self._tested()
                    rows, columns = slice(0, 3), slice(0, 16)  # a corner first: a weight can be 8192 x 8192
                    if close(a[..., :1, :] @ b[..., columns], target[..., :1, columns], 1e-3) \
                            and close(a[..., rows, :] @ b, target[..., rows, :], 1e-3) \
                            and close(a @ b, target, 1e-3):  # every row: a task can fake the corner alone
                        return ("mm",), [node] + ([weight] if weight.variable else [])
        return None

    def _convolution(self, op, window, weights):
        target = op.value.float()
        for weight in (w for w in weights if w.value.dim() == 4 and w.value.shape[0] == target.shape[1]):
            w = weight.value.float()
            biases = [None] + [n.value.float() for n in self._depends_on(op, 1) if n.value.shape == (target.shape[1],)]
            for node in (n for n in window if n.value.dim() == 4 and n.value.shape[0] == target.shape[0]):
                x = node.value.float()
                if x.shape[1] % w.shape[1]:
                    continue
                for stride, padding, dilation in _conv_settings(x, w, target):
                    self._tested()
                    groups = x.shape[1] // w.shape[1]
                    if groups == 1 and not close(F.conv2d(x[:1], w[:1], None, stride, padding, dilation),
                                                 target[:1, :1] - (target[:1, :1] - F.conv2d(
                                                     x[:1], w[:1], None, stride, padding, dilation)).mean(), 1e-3):
                        continue  # one output channel, up to its bias, rules most settings out
                    for bias in biases:
                        got = F.conv2d(x[:1], w, bias, stride, padding, dilation, groups)
                        # then every sample: a task can convolve the first alone
                        if close(got, target[:1], 1e-3) and close(F.conv2d(x, w, bias, stride, padding, dilation,
                                                                           groups), target, 1e-3):
                            return ("convolution",), [node]
        return None


AFFINE = ("mul", "add")


def _chain_affine_maps(nodes: list, reads: dict, names: dict) -> None:
    """An affine map of an affine map is one (`names` edited in place): a norm's own scale
    and shift followed by an eval batch norm's reads `mul add` once, as the same arithmetic
    folded by hand does. A map is a node of multiplications and additions that reads one
    variable value; it joins the map that made that value when nothing else reads it."""
    users: dict = {}
    for node in nodes:
        for read in reads[node]:
            users.setdefault(read, []).append(node)
    owner: dict = {}  # a node folded into an earlier map -> that map's node
    for node in nodes:
        mine = names[node]
        if not mine or not set(mine) <= set(AFFINE) or len(reads[node]) != 1:
            continue
        previous = reads[node][0]
        previous = owner.get(previous, previous)
        tail = _affine_tail(names.get(previous, []))
        if not tail or len(users.get(reads[node][0], [])) != 1:
            continue
        names[previous] = names[previous][:len(names[previous]) - len(tail)] + \
            [op for op in AFFINE if op in tail or op in mine]
        names[node] = []
        owner[node] = previous


def _affine_tail(names: list) -> list:
    tail = []
    for name in reversed(names):
        if name not in AFFINE or name in tail:
            break
        tail.insert(0, name)
    return tail


def _uniform(value: torch.Tensor) -> bool:
    flat = value.reshape(-1)
    return bool(torch.equal(flat[:1].expand_as(flat), flat))


def _is_numeric(value) -> bool:
    """A value an op's value may equal or be a function of: indices too (`argmax(x) * 4.0 * 0.25`
    is the argmax, made float)."""
    return isinstance(value, torch.Tensor) and value.dtype != torch.bool and not value.is_complex() \
        and value.numel() > 0 and value.device.type != "meta"


def _is_float(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 0 \
        and value.device.type != "meta"


def _dim_tests(target: torch.Tensor) -> list:
    """(name, test of a source) for what `target` could be along its dimensions: softmax,
    log-softmax, the normalisations. Asked of one fibre of the target first (sums to one,
    mean 0 and variance up to 1), so that most ops have no test to run on their sources."""
    tests = []
    for dim in range(target.dim()):
        if target.shape[dim] < 2:
            continue
        fibre = _fibre(target, (dim,))
        if fibre.min() >= 0 and abs(float(fibre.sum()) - 1) < 1e-4 and _normalised(target, (dim,), 0, "softmax"):
            tests.append(("softmax", lambda source, dim=dim: close(torch.softmax(source, dim), target)))
        if abs(float(torch.logsumexp(fibre, 0))) < 1e-4 and _normalised(target, (dim,), 0, "log_softmax"):
            tests.append(("log_softmax", lambda source, dim=dim: close(torch.log_softmax(source, dim), target)))
    normalised = [(dims, groups) for dims, groups in _norm_dims(target)
                  if _normalised(_group_view(target, groups) if groups else target, (2,) if groups else dims, 0, "norm")]
    # a norm in g groups looks normalised in every count that divides g as well: the finest
    # are tried (a red team's sign pattern looked normalised in all 120 of its counts)
    grouped = sorted((found for found in normalised if found[1]), key=lambda found: -found[1])
    for dims, groups in [found for found in normalised if not found[1]] + grouped[:GROUP_COUNTS_TRIED]:
        tests.append((norm_name(target.dim(), dims, groups),
                      lambda source, dims=dims, groups=groups: _is_norm_of(source, target, dims, groups)))
    return tests


def _leaky(source: torch.Tensor, target: torch.Tensor) -> bool:
    negative = source < -1e-3
    if not negative.any() or negative.all():
        return False
    slope = (target[negative] / source[negative]).median()
    return bool(0 < slope < 1) and close(torch.where(source > 0, source, slope * source), target)


def _fibre(target: torch.Tensor, dims) -> torch.Tensor:
    """The values along `dims` at index 0 of every other dimension (a view: no copy)."""
    return target[tuple(slice(None) if d in dims else 0 for d in range(target.dim()))]


def _normalised(view: torch.Tensor, dims, _groups, kind: str) -> bool:
    """What `kind` makes along `dims` holds of the first fibre, then of the whole: sums to
    one (softmax), log-sum-exp zero (log-softmax), mean 0 and variance up to 1, under it by the eps (a norm)."""
    if all(view.shape[d] == 1 for d in dims):
        return False
    for part in (_fibre(view, dims).unsqueeze(0), view):
        along = tuple(range(1, part.dim())) if part is not view else dims
        if kind == "softmax":
            ok = part.min() >= 0 and (part.sum(along) - 1).abs().max() < 1e-4
        elif kind == "log_softmax":
            ok = torch.logsumexp(part, along).abs().max() < 1e-4 if len(along) == 1 else \
                torch.logsumexp(part.flatten(1), 1).abs().max() < 1e-4
        else:
            mean, var = part.mean(along), part.var(along, unbiased=False)  # under 1 by the eps
            ok = mean.abs().max() < 1e-3 and var.min() > 1e-3 and var.max() < 1 + 1e-2
        if not ok:
            return False
    return True


def _norm_dims(target: torch.Tensor):
    """(dimensions, groups) a normalisation of a tensor of this shape could work along."""
    ndim = target.dim()
    for first in range(1, ndim):
        yield tuple(range(first, ndim)), 0
    if ndim >= 3:
        yield (0, *range(2, ndim)), 0
    if ndim >= 2:  # a group norm of features alone (after a Linear) has groups too
        channels = target.shape[1]
        for groups in range(2, channels):
            if channels % groups == 0:
                yield tuple(range(1, ndim)), groups


def _group_view(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x.reshape(x.shape[0], groups, -1)


GROUP_COUNTS_TRIED = 3
MAX_EPS = 1e-2  # the largest eps a normalisation is taken to add to the variance


def _is_norm_of(source: torch.Tensor, target: torch.Tensor, dims, groups) -> bool:
    """`target` is `(source - mean) / sqrt(var + eps)` along `dims` (or in `groups`), for
    one eps in [0, MAX_EPS] whatever it is (1e-5, 1e-6, 1e-12: every library and hand has
    its own; on a small variance it decides the value). The eps is read off the fibre of
    least variance, where it weighs most, and the whole is then checked with it."""
    along = (2,) if groups else dims
    view = _group_view(source, groups) if groups else source
    mean, var = view.mean(along, keepdim=True), view.var(along, unbiased=False, keepdim=True)
    reached = (_group_view(target, groups) if groups else target).var(along, unbiased=False, keepdim=True)
    if reached.min() <= 0:
        return False
    least = int(var.reshape(-1).argmin())
    eps = max(float(var.reshape(-1)[least] * (1 / reached.reshape(-1)[least] - 1)), 0.0)
    return eps <= MAX_EPS and close(((view - mean) / torch.sqrt(var + eps)).reshape(source.shape), target, 2e-3)


def _fit_affine(source: torch.Tensor, target: torch.Tensor, dim) -> tuple[str, ...] | None:
    """("mul", "add") when target = a * source + b, with a and b scalars (dim None) or one
    per index along `dim`; the fitted a and b decide which of the two it needs. Fitted on a
    corner of the tensors first (every index of `dim`, a few of each other dimension)."""
    corner = tuple(slice(None) if d == dim else slice(0, 4) for d in range(source.dim()))
    if _affine_fit(source[corner], target[corner], dim) is None:
        return None
    return _affine_fit(source, target, dim)


def _affine_fit(source: torch.Tensor, target: torch.Tensor, dim) -> tuple[str, ...] | None:
    x, y = (source.reshape(1, -1), target.reshape(1, -1)) if dim is None else \
        (source.movedim(dim, 0).reshape(source.shape[dim], -1), target.movedim(dim, 0).reshape(target.shape[dim], -1))
    if x.shape[1] < 4:
        return None
    xm, ym = x.mean(1, keepdim=True), y.mean(1, keepdim=True)
    var = ((x - xm) ** 2).mean(1, keepdim=True)
    if (var < 1e-8).any():
        return None
    a = ((x - xm) * (y - ym)).mean(1, keepdim=True) / var
    b = ym - a * xm
    if not close(a * x + b, y):
        return None
    scaled, shifted = not close(a, torch.ones_like(a)), bool(b.abs().max() > 1e-4 * y.abs().max())
    return ("mul",) * scaled + ("add",) * shifted or None


def _end_fibres_reduced(source: torch.Tensor, target: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-sum-exp along `dim` of the first and the last fibre of `source`, and the two
    elements of `target` they would be (`_reduction` rules most candidates out on these)."""
    ends = [tuple(slice(None) if d == dim else end for d in range(source.dim())) for end in (0, -1)]
    reduced = torch.stack([torch.logsumexp(source[index], 0) for index in ends])
    kept = [tuple(i for d, i in enumerate(index) if d != dim or source.dim() == target.dim()) for index in ends]
    return reduced, torch.stack([target[tuple(0 if isinstance(i, slice) else i for i in index)] for index in kept])


def _matmul_shape(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """The shape of a @ b, or () when the batch dimensions do not broadcast (in Python:
    torch.broadcast_shapes cost a third of a matrix product's recognition)."""
    batch = []
    for x, y in itertools.zip_longest(reversed(a.shape[:-2]), reversed(b.shape[:-2]), fillvalue=1):
        if x != y and 1 not in (x, y):
            return ()
        batch.insert(0, y if x == 1 else x)
    return (*batch, a.shape[-2], b.shape[-1])


def _conv_settings(x: torch.Tensor, w: torch.Tensor, target: torch.Tensor):
    """(stride, padding, dilation) that give a convolution of x by w the target's size."""
    for stride in (1, 2, 3, 4):
        for padding in (0, 1, 2, 3):
            for dilation in (1, 2, 3):
                size = [(n + 2 * padding - dilation * (k - 1) - 1) // stride + 1
                        for n, k in zip(x.shape[2:], w.shape[2:])]
                if tuple(size) == tuple(target.shape[2:]):
                    yield stride, padding, dilation
