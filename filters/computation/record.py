"""Recording one forward call: every ATen op that runs, in order, with the op that made each
tensor it reads (`_Recorder`, a dispatch mode), and the checks that keep the record honest: a
tensor whose memory changed outside torch's ops, or that was made over memory an op wrote,
refuses the task (UntracedAliasing); what passed between Python and the ops is logged, for
two readings to compare (filters/computation/graph.py). Where writes through views of one
storage meet is filters/computation/memory.py.
"""
from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field

import torch
import torch.utils._pytree
from torch.utils._python_dispatch import TorchDispatchMode

from filters.computation.memory import (OVERLAP_RECORDING_STEPS, UntracedAliasing, _Budget, _memory, _storage, _View,
                                        _Writes)

# The composites whose decompositions (torch's own) `_composite_runs` records, to name a hand-written run.
DECOMPOSED = ("gelu", "silu", "mish", "softplus", "sigmoid", "hardswish", "hardsigmoid", "elu", "selu", "celu",
              "leaky_relu", "hardtanh", "relu6", "_softmax", "_log_softmax", "logsumexp", "glu", "log_sigmoid_forward",
              "native_layer_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit_no_training")


def _writes_its_own(func) -> bool:
    """An op whose output is a tensor of its own (or, in place, its input), not a view."""
    schema = getattr(func, "_schema", None)  # none: a tensor written through a view (the recorder's own node)
    return schema is not None and (schema.is_mutable or not any(r.alias_info for r in schema.returns))


@dataclass(eq=False, repr=False)
class _Op:
    target: object  # the ATen op; None for a tensor no op made (a model input, a weight, a buffer)
    args: tuple  # its positional arguments, each tensor replaced by the _Op that made it
    inputs: list  # the _Ops whose tensors it reads
    value: object = None  # the (first) tensor it made, or the tensor itself for a leaf
    variable: bool = False  # depends on the model's inputs (else a constant: weights and what is made of them)
    index: int = -1  # its place in the order ops ran (-1: a leaf)
    leaves: list = field(default_factory=list)  # the leaves it reads
    kwargs: dict = field(default_factory=dict)  # its keyword arguments, each tensor replaced as in args


def argument_values(args) -> list:
    """A recorded op's arguments as it was called with them: each _Op as the tensor it holds."""
    return [arg.value if isinstance(arg, _Op) else arg for arg in args]


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
        as_nodes = lambda a: made[id(a)] if isinstance(a, torch.Tensor) else a  # noqa: E731
        op = _Op(func, torch.utils._pytree.tree_map(as_nodes, args),
                 [node for node in inputs if node.target is not None], returned[0] if returned else None,
                 any(node.variable for node in inputs), len(self.ops), [node for node in inputs if node.target is None],
                 torch.utils._pytree.tree_map(as_nodes, kwargs))
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


def _comparable(value):
    """A Python value as two readings' logs compare it: NaN equal to NaN."""
    return "nan" if isinstance(value, float) and math.isnan(value) else value


def _fingerprint(tensor: torch.Tensor) -> tuple:
    """A tensor's shape, dtype and a digest of its bytes."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return tuple(tensor.shape), tensor.dtype, hashlib.blake2b(data.tobytes(), digest_size=16).digest()



@functools.cache
def _decompositions() -> dict:
    from torch._decomp import get_decompositions
    aten = torch.ops.aten
    return get_decompositions([getattr(aten, name) for name in DECOMPOSED if hasattr(aten, name)])


# Kernels a device fuses where another runs the parts: a CUDA tensor's F.rms_norm is one
# `_fused_rms_norm`, a CPU tensor's its decomposition. Recorded as the parts on every device,
# so that a task traced on its checks' GPU is spelled as the reference traced on the CPU is.
# Fused arithmetic is recorded as its parts too, so that every rule reads a product and a sum
# it holds as it reads them written apart (`x + sigmoid(x) * x` as one addcmul is a silu and an add).
DEVICE_FUSED = ("_fused_rms_norm", "addcmul", "addcdiv", "lerp")


@functools.cache
def _device_fused() -> dict:
    from torch._decomp import get_decompositions
    aten = torch.ops.aten
    parts = get_decompositions([getattr(aten, name) for name in DEVICE_FUSED if hasattr(aten, name)])
    # torch's own lerp picks a form by the weight's size (a `where`): the formula is what it computes
    parts.update(dict.fromkeys((aten.lerp.Scalar, aten.lerp.Tensor),
                               lambda start, end, weight: torch.add(start, torch.mul(torch.sub(end, start), weight))))
    return parts


def _constant_leaves(node: _Op) -> set:
    """The storages of the leaves a constant is made of."""
    storages, frontier, seen = set(), [node], set()
    while frontier:
        node = frontier.pop()
        if id(node) in seen or not isinstance(node, _Op) or node.variable:
            continue
        seen.add(id(node))
        if node.target is None:
            storages.add(_storage(node.value))
        else:
            frontier.extend(node.inputs + node.leaves)
    return storages
