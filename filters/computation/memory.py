"""Where tensors lie in memory: the view each is of its storage (`_View`), each storage's
writes (`_Writes`), and whether two views share an element (`_overlap`), solved on the
strides. The recorder (filters/computation/record.py) joins a tensor with every write into
the elements it shares with it.
"""
from __future__ import annotations

import array
import math
from dataclasses import dataclass

import numpy
import torch

class UntracedAliasing(ValueError):
    """The task reached memory the recorder cannot follow: a tensor whose storage changed
    outside torch's ops (`y.data = layer(x)`), a tensor made outside them over memory an op
    wrote (`nn.Parameter(h)`, `h.as_subclass`, `torch.from_dlpack(h)`), or a tensor with no
    strided storage (sparse, nested). A red team hid a Linear behind each; no layer a
    kernel task is made of needs them, and the task is read as untraced."""



def _storage(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):  # a tensor with no storage of its own
        return None



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

    def add(self, op, view: _View) -> None:  # op: a recorded _Op (record.py)
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
