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

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils._pytree
from torch.utils._python_dispatch import TorchDispatchMode

LAYOUT_ONLY = frozenset({
    "view", "unsafe_view", "reshape", "expand", "expand_as", "clone", "contiguous", "detach", "alias",
    "lift_fresh_copy", "lift_fresh", "to_copy", "to", "t", "transpose", "permute", "squeeze", "unsqueeze", "flatten",
    "unflatten", "view_as", "reshape_as", "empty", "empty_like", "zeros_like", "ones_like", "full_like", "copy",
    "slice", "select", "split", "split_with_sizes", "chunk", "unbind", "getitem", "type_as", "movedim", "as_strided",
    "resolve_conj", "resolve_neg", "dropout", "feature_dropout", "alpha_dropout", "identity", "scalar_tensor",
    "broadcast_in_dim", "full", "zeros", "ones", "empty_strided", "convert_element_type", "squeeze_copy",
    "unsqueeze_copy", "view_copy", "expand_copy", "permute_copy", "t_copy", "transpose_copy", "new_zeros",
    "new_ones", "new_empty", "new_full", "real", "tensor_split",
})
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
           "square": "mul", "clamp_min": "clamp", "clamp_max": "clamp", "amax": "max", "amin": "min"}
IDENTITY = {"mul": 1, "div": 1, "true_divide": 1, "add": 0, "sub": 0, "pow": 1}
SUFFIXES = ("_legit_no_training", "_legit_functional", "_legit", "_functional", "_backward")
MERGES = frozenset({"cat", "stack", "concat", "concatenate"})


def op_graph(model: torch.nn.Module, inputs: list) -> list[str]:
    """The canonical op sequence of `model(*inputs)`, on the meta device or real tensors."""
    recorder = _Recorder()
    with torch.no_grad(), recorder:
        out = model(*inputs)
    return named_composites(_primitives(recorder, out))


def _primitives(recorder: "_Recorder", out) -> list[str]:
    nodes = recorder.reaching([t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)])
    merged = _merged_branches(nodes)
    return [op for node in nodes if node not in merged for op in canonical(node)]


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


@dataclass(eq=False)
class _Op:
    target: object  # the ATen op
    args: tuple  # its positional arguments, each tensor replaced by the _Op that made it (None: an input or a weight)
    inputs: list  # the _Ops whose tensors it reads


class _Recorder(TorchDispatchMode):
    """Every ATen op that runs, in order, with the op that made each tensor it reads. With
    `decompose`, a composite op in DECOMPOSED runs (and is recorded) as the ops it is made
    of: "all" the way down, or only the "outer" one (the composites it calls are recorded)."""

    def __init__(self, decompose: str | None = None):
        super().__init__()
        self.decompose, self.decomposing = decompose, False
        self.ops: list[_Op] = []
        self.made_by: dict[int, _Op] = {}
        self.alive: list = []  # every tensor seen, so that no id is reused while recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        outer_only = self.decompose == "outer" and self.decomposing
        decomposition = _decompositions().get(func) if self.decompose and not outer_only else None
        if decomposition is not None:
            self.decomposing, was = True, self.decomposing
            try:
                with self:
                    result = decomposition(*args, **kwargs)
            finally:
                self.decomposing = was
            if result is not NotImplemented:
                return result
        out = func(*args, **kwargs)
        made = self.made_by.get
        read = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        op = _Op(func, torch.utils._pytree.tree_map(lambda a: made(id(a)) if isinstance(a, torch.Tensor) else a, args),
                 [made(id(t)) for t in read if made(id(t)) is not None])
        self.ops.append(op)
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.made_by[id(tensor)] = op
                self.alive.append(tensor)
        self.alive.extend(read)
        return out

    def reaching(self, outputs: list) -> list[_Op]:
        """The recorded ops the outputs depend on, in the order they ran: the rest (a
        condition's arithmetic, a value computed and dropped) computed nothing the task returns."""
        live, frontier = set(), [self.made_by[id(t)] for t in outputs if id(t) in self.made_by]
        while frontier:
            op = frontier.pop()
            if op not in live:
                live.add(op)
                frontier.extend(op.inputs)
        return [op for op in self.ops if op in live]


@functools.cache
def _decompositions() -> dict:
    from torch._decomp import get_decompositions
    aten = torch.ops.aten
    return get_decompositions([getattr(aten, name) for name in DECOMPOSED if hasattr(aten, name)])


def _merged_branches(nodes: list) -> set:
    """The nodes to leave out: a cat or stack itself and every input branch but the first,
    where each branch is the same op sequence on its own part of the same tensors."""
    merges = [node for node in nodes if _name(node) in MERGES and node.args
              and isinstance(node.args[0], (list, tuple)) and len(node.args[0]) >= 2]
    if not merges:  # most tasks: no ancestry to work out
        return set()
    order = {node: index for index, node in enumerate(nodes)}
    ancestors: dict = {}
    for node in nodes:
        ancestors[node] = {node}.union(*(ancestors.get(arg, set()) for arg in node.inputs))
    merged: set = set()
    for node in merges:
        parts = node.args[0]
        branches = [ancestors.get(part, set()) for part in parts]
        own = [branch - set().union(*(other for j, other in enumerate(branches) if j != i))
               for i, branch in enumerate(branches)]
        sequences = {tuple(op for n in sorted(part, key=order.get) for op in canonical(n)) for part in own}
        if len(sequences) == 1 and next(iter(sequences)):
            merged |= {node, *set().union(*own[1:])}
    return merged


def _name(node) -> str:
    """The op's name without overload, namespace, in-place or internal spellings."""
    name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
    packet = getattr(getattr(node.target, "overloadpacket", None), "__name__", name)
    name = packet.strip("_").removeprefix("native_")
    for suffix in SUFFIXES:
        name = name.removesuffix(suffix)
    return name.rstrip("_")


def canonical(node) -> list[str]:
    """The op names one traced node stands for (none for layout, selection and identity)."""
    name = _name(node)
    if name in LAYOUT_ONLY or name in SELECTION or _is_identity(name, node.args):
        return []
    if name in ("clamp", "clamp_min") and _scalar(node.args, 1) == 0 and _scalar(node.args, 2) is None:
        return ["relu"]
    if name == "pow" and _scalar(node.args, 1) == 2:
        return ["mul"]
    return [SAME_AS.get(op, op) for op in SPLIT.get(name, (name,))]


def _scalar(args, index: int):
    value = args[index] if len(args) > index else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _is_identity(name: str, args) -> bool:
    if name not in IDENTITY or len(args) < 2:
        return False
    scalar = _scalar(args, 1)
    return scalar is not None and scalar == IDENTITY[name]
