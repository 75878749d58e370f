"""A linear map of one value, read as the convolution it is: solved for its weights from the
values a trace recorded, whichever ops wrote it (a Conv3d as per-depth Conv2d summed, a
convolution as nine shifted matrix products, unfold and a product, depth taps stacked into
channels). `_Recognisers._linear_map` (filters/computation/recognise.py) asks it where a run
of linear ops of one input joins what a single layer would compute.

The solve is least squares over output positions: a convolution shares its kernel across
positions, so an image gives many more equations than the kernel has taps, and a fit that
predicts positions it was not solved on is the map. A dense map of a few rows (a Linear at a
trace's batch of 4) has more unknowns than equations: it is not solved here.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from filters.computation.names import LAYOUT_ONLY, _name, is_convolution
from filters.computation.values import close

# Ops linear in the values they read that vary (`linear_step`: the rest constant, a weight or
# a scale). A product among them is a contraction; a window made of a value (unfold, taps
# stacked or concatenated) or a part cut from one (a shifted slice) is what a single layer
# would slide over. A run of such ops is solved only where each of the partial values it joins
# holds a contraction, and a contraction or a cut of its own, and a cut or a convolution is
# among them: a residual `conv(x) + x` is two things, and `fc1(x) + fc2(x)` of one whole value
# is a product, not a convolution.
CONTRACTIONS = frozenset({"mm", "bmm", "matmul", "addmm", "convolution"})
WINDOWS = frozenset({"im2col", "unfold", "cat", "stack"})
CUTS = frozenset({"slice", "select", "narrow", "split", "split_with_sizes", "unsafe_split", "chunk", "unbind",
                  "tensor_split"})
JOINS = frozenset({"add", "sub"})
SUMS = frozenset({"sum", "mean"})  # a join of stacked parts (`stack(parts).sum(0)`)
# channels moved into positions: a product's phases laid out as one image, or its columns
# painted and summed (a ConvTranspose as a convolution of its stride's phases and a pixel
# shuffle, or as a product and `F.fold`)
SHUFFLES = frozenset({"pixel_shuffle", "col2im"})
LINEAR_NAMES = frozenset({"add", "mul", "sum", "mm"})
LINEAR_STEPS = (LAYOUT_ONLY - {"written_through_view", "as_strided"}) | CONTRACTIONS | WINDOWS | JOINS | \
    SUMS | SHUFFLES | {"neg", "mul", "div", "constant_pad_nd"}
KERNELS = range(1, 8)  # the kernel widths tried, smallest first (KernelBench's: 1 to 7)
STRIDES = (1, 2, 3)
DILATIONS = (1, 2, 3)
SETTINGS_TRIED = 24  # settings that give the value's shape, solved at most per value
UNKNOWNS = 1024  # taps and bias of one output channel at most: a solve costs their square times the rows
SPARE_ROWS = 64  # rows solved on beyond two per unknown
CHECKED_ROWS = 4096  # rows a fit is checked on, none of them solved on
ZERO_TAP = 1e-5  # a solved tap this small against the largest is a zero of the kernel
# (kernel, stride, padding, dilation) along one dimension, the padding up to the kernel's reach
ONE_DIMENSION = tuple((kernel, stride, padding, dilation) for kernel in KERNELS
                      for dilation, stride in itertools.product(DILATIONS if kernel > 1 else (1,), STRIDES)
                      for padding in range(dilation * (kernel - 1) + 1))


@dataclass(frozen=True)
class LinearRun:
    """The run of linear ops that ends at an op: the variable values it starts from (`leaves`:
    where a non-linear op or a model input stops it), its contractions and its cuts (windows
    made, parts cut), whether windows were made on the way (`windowed`), and whether it joins
    what one layer may compute (`composed`: partial products added or stacked, or a product
    of windows)."""
    leaves: frozenset
    contractions: frozenset
    cuts: frozenset
    windowed: bool
    composed: bool

    @classmethod
    def of(cls, op, parts: list | None) -> "LinearRun":
        """`op`'s run from its variable inputs' (`parts`), or a run it starts (None: not a linear step)."""
        if parts is None:
            return cls(frozenset({op}), frozenset(), frozenset(), False, False)
        name = _name(op)
        contractions = frozenset().union(*(part.contractions for part in parts)) | (
            {op} if name in CONTRACTIONS else set())
        cuts = frozenset().union(*(part.cuts for part in parts)) | ({op} if _cuts(op) else set())
        windowed = name in WINDOWS or any(part.windowed for part in parts)
        joined = (name in JOINS or name in ("cat", "stack")) and len(parts) > 1 and \
            cuts | {c for c in contractions if _name(c) == "convolution"} and \
            all(part.contractions for part in parts) and all(
                (part.contractions | part.cuts) - (other.contractions | other.cuts)
                for part in parts for other in parts if other is not part)
        product = name in CONTRACTIONS and any(part.windowed for part in parts)
        shuffled = name in SHUFFLES and bool(contractions)
        return cls(frozenset().union(*(part.leaves for part in parts)), contractions, cuts, windowed,
                   bool(joined or product or shuffled or any(part.composed for part in parts)))


def _cuts(op) -> bool:
    """Whether `op` makes windows of a value, or cuts a part from it (a slice narrower than it)."""
    name = _name(op)
    if name in WINDOWS:
        return True
    source = op.args[0] if op.args else None
    return name in CUTS and isinstance(getattr(source, "value", None), torch.Tensor) and \
        isinstance(op.value, torch.Tensor) and op.value.numel() < source.value.numel()


def linear_step(op) -> bool:
    """Whether `op` is linear in the variable values it reads, the rest being constants."""
    name = _name(op)
    if op.target is None or not op.variable or name not in LINEAR_STEPS:
        return False
    varying = [getattr(arg, "variable", False) for arg in op.args]
    if name in ("mul", "mm", "bmm", "matmul"):
        return sum(varying[:2]) == 1
    if name == "div":
        return varying[:1] == [True] and not any(varying[1:])
    if name == "addmm":
        return not varying[0] and sum(varying[1:3]) == 1
    if name == "convolution":
        return varying[:1] == [True] and not any(varying[1:])
    return True


def names_a_linear_map(names) -> bool:
    """Whether what a recogniser named an op (a sum, a product, a convolution, a scale or a
    shift) is linear in what it reads: a composite it named (a hardswish written out) ends a
    run of linear ops there, though its last op (a division by 6) is one."""
    return all(name in LINEAR_NAMES or is_convolution(name) for name in names)


def joins_a_layer(op) -> bool:
    """Whether `op` is where a composed run may be one layer: where partial products meet (an
    addition of two varying values: a bias added is not; a sum of them stacked), a product,
    or a reshape (a layout the layer's output has once reshaped)."""
    name = _name(op)
    if name in JOINS:
        return sum(getattr(arg, "variable", False) for arg in op.args[:2]) == 2
    return name in CONTRACTIONS or name in LAYOUT_ONLY or name in SUMS or name in SHUFFLES


@dataclass(frozen=True)
class Setting:
    """A kernel's width, stride, padding and dilation along each spatial dimension."""
    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple

    def positions(self, size: tuple) -> tuple:
        """The output positions per dimension of a `size` image convolved so."""
        return tuple(_positions(*along) for along in zip(size, self.kernel, self.stride, self.padding, self.dilation))


def _positions(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


@dataclass(frozen=True)
class Convolution:
    """A convolution a value was solved to be: weight (out, in, *kernel), its bias (None where
    the fit's is zero), its setting, and the value laid out as its image (batch, out, *positions)."""
    weight: torch.Tensor
    bias: torch.Tensor | None
    setting: Setting
    image: torch.Tensor
    convolved: torch.Tensor  # what the setting convolves: the source, or it stuffed with zeros and padded


def solve_convolution(source: torch.Tensor, value: torch.Tensor, tested) -> Convolution | None:
    """The convolution of `source` (batch, channels, *positions) that `value` is, plus a bias
    per output channel, or None. `value` may lay its channels first or last and its positions
    out or flattened: (batch, out, *positions), (batch, *positions, out), (batch, out, count)
    or (batch, count, out). `tested()` is called before each least-squares solve (it raises
    past a reading's share)."""
    spatial = source.dim() - 2
    if spatial < 1 or value.dim() < 3 or value.shape[0] != source.shape[0] or not value.is_floating_point():
        return None
    size, tried = tuple(source.shape[2:]), 0
    for layout in _layouts(value, spatial):
        # an image grown is a transposed convolution's before it is a plain one's padded past its kernel
        tries = itertools.chain(((up, layout, _plain(up.kernel)) for up in _upsamplings(size, layout)), (
            (None, layout.reshape(*layout.shape[:2], *setting.positions(size)), setting)
            for setting in _settings(size, layout)))
        for up, image, setting in tries:
            tried += 1
            if tried > SETTINGS_TRIED:
                return None
            found = _solved(source, image, setting, tested) if up is None else \
                _solved(_stuffed(source, up), image, setting, tested, phases=up.stride)
            if found is not None:
                return found
    return None


@dataclass(frozen=True)
class Upsampling:
    """A transposed convolution's kernel, stride, padding and output padding per dimension."""
    kernel: tuple
    stride: tuple
    padding: tuple
    extra: tuple

    def square(self) -> bool:
        """Whether its kernel, stride and padding are the same along every dimension."""
        return len(set(zip(self.kernel, self.stride, self.padding))) == 1


# (kernel, stride, padding, output padding) along one dimension of a transposed convolution
# that upsamples (stride 1 is a plain one, padded: `ONE_DIMENSION`)
ONE_DIMENSION_UP = tuple((kernel, stride, padding, extra) for kernel in KERNELS for stride in (2, 3, 4)
                         for padding in range(kernel) for extra in range(stride))


def _upsamplings(size: tuple, layout: torch.Tensor) -> list:
    """The transposed convolutions of a `size` image whose output has `layout`'s positions
    (laid out, not flattened): a ConvTranspose written as a convolution of several phases and
    a pixel shuffle, or through `F.fold`. Square ones first (the same setting along every
    dimension), then each dimension's own, the smallest kernel first: a red team's fold of
    kernel 4, stride 2 and padding 1 sat past the settings tried behind (2, 3) kernels."""
    if layout.dim() != len(size) + 2 or all(m <= n for n, m in zip(size, layout.shape[2:])):
        return []
    each = [[along for along in ONE_DIMENSION_UP if _grown(n, *along) == m] for n, m in zip(size, layout.shape[2:])]
    return sorted((Upsampling(*zip(*alongs)) for alongs in itertools.product(*each)),
                  key=lambda up: (not up.square(), math.prod(up.kernel), up.kernel, up.padding, up.extra))


def _grown(size: int, kernel: int, stride: int, padding: int, extra: int) -> int:
    """The output positions along one dimension of a `size` image convolved transposed so."""
    return (size - 1) * stride - 2 * padding + kernel + extra


def _stuffed(source: torch.Tensor, up: Upsampling) -> torch.Tensor:
    """`source` with stride - 1 zeros between its positions, padded so that a plain
    convolution of it by the flipped kernel is the transposed convolution."""
    size = [(n - 1) * s + 1 for n, s in zip(source.shape[2:], up.stride)]
    stuffed = source.new_zeros(*source.shape[:2], *size)
    stuffed[(..., *[slice(None, None, s) for s in up.stride])] = source
    pads = [(k - 1 - p, k - 1 - p + e) for k, p, e in zip(up.kernel, up.padding, up.extra)]
    return F.pad(stuffed, [pad for pair in reversed(pads) for pad in pair])


def _plain(kernel: tuple) -> Setting:
    ones = (1,) * len(kernel)
    return Setting(kernel, ones, (0,) * len(kernel), ones)


def _layouts(value: torch.Tensor, spatial: int) -> list:
    """`value` as (batch, out, ...) in each layout it may have: channels first, or last."""
    if value.dim() == spatial + 2 or (value.dim() == 3 and spatial > 1):
        return [value, value.movedim(-1, 1)]
    return []


def _settings(size: tuple, layout: torch.Tensor) -> list:
    """The settings whose convolution of a `size` image has `layout`'s positions, the smallest
    kernel first: square ones, then (where `layout` lays its positions out, not only their
    count) each dimension's own (a 3 x 5 kernel)."""
    square = [Setting(*zip(*[along] * len(size))) for along in ONE_DIMENSION]
    if layout.dim() != len(size) + 2:
        return [setting for setting in square if min(setting.positions(size)) >= 1
                and math.prod(setting.positions(size)) == layout.shape[2]]
    square = [setting for setting in square if setting.positions(size) == tuple(layout.shape[2:])]
    each = [[along for along in ONE_DIMENSION if _positions(n, *along) == m] for n, m in zip(size, layout.shape[2:])]
    own = sorted((Setting(*zip(*alongs)) for alongs in itertools.product(*each)),
                 key=lambda setting: (math.prod(setting.kernel), setting.kernel))
    return square + [setting for setting in own if setting not in square]


def _solved(source: torch.Tensor, image: torch.Tensor, setting: Setting, tested,
            phases: tuple | None = None) -> Convolution | None:
    """The weight and bias of `setting`'s convolution of `source` into `image`, solved on some
    output positions and checked on others, or None where no such convolution is `image`.
    `phases`: an upsampling's stride, where `source` is stuffed with zeros between its values."""
    batch, out = image.shape[:2]
    unknowns = source.shape[1] * math.prod(setting.kernel) + 1
    if unknowns > UNKNOWNS:
        return None  # a solve past a trace's time
    rows = batch * math.prod(image.shape[2:])
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(rows))
    drawn = _drawn(order, image.shape, source.shape[1], setting.kernel, phases or (1,) * len(setting.kernel))
    if drawn is None:
        return None  # no more equations than a fit of anything needs
    tested()
    windows = _windows(source, setting)  # (batch, channels, *positions, *kernel): a view of the padded source
    solved_on, checked_on = drawn
    a, b = _rows(windows, image, solved_on)
    solution = torch.linalg.lstsq(a, b).solution  # (unknowns, out)
    if not torch.isfinite(solution).all():
        return None
    a, b = _rows(windows, image, checked_on)
    if not close((a @ solution).float(), b.float(), 1e-3):
        return None
    taps, bias = solution[:-1].T, solution[-1]
    taps = torch.where(taps.abs() > ZERO_TAP * taps.abs().max(), taps, torch.zeros_like(taps))
    weight = taps.reshape(out, source.shape[1], *setting.kernel).float().to(source.device)
    bias = bias.float().to(source.device)
    # every position, not the rows sampled: a red team's map differed at the 6% never drawn
    convolve = (F.conv1d, F.conv2d, F.conv3d)[source.dim() - 3]
    if not close(convolve(source, weight, bias, setting.stride, setting.padding, setting.dilation), image, 1e-3):
        return None
    kept = float(bias.abs().max()) > ZERO_TAP * max(float(b.abs().max()), 1e-30)
    return Convolution(weight, bias if kept else None, setting, image, source)


def _drawn(order: torch.Tensor, shape: torch.Size, channels: int, kernel: tuple, phases: tuple) -> tuple | None:
    """(the rows to solve on, the rows to check on) of `order` (every output row, shuffled), or
    None where there are too few. A zero-stuffed source's windows hold its values at the taps
    their phase (positions modulo the stride) puts them, so each phase's rows solve only that
    phase's taps: each phase gets twice as many rows as the taps it reads, and its share of
    SPARE_ROWS more; SPARE_ROWS are left to check on. Rows drawn from all phases at once left
    the busiest one short of its taps (KernelBench L2 26's ConvTranspose3d written as its 8
    phases, 32 channels: 256 taps, ~220 rows); SPARE_ROWS more for each phase left a red
    team's 6 x 6 image too few rows for any."""
    count = math.prod(phases)
    reads = channels * math.prod(-(-size // stride) for size, stride in zip(kernel, phases)) + 1
    needed = 2 * reads + -(-SPARE_ROWS // count)
    positions = torch.unravel_index(order, (shape[0], *shape[2:]))[1:]
    phase = torch.zeros_like(order)
    for position, stride in zip(positions, phases):
        phase = phase * stride + position % stride
    solving = []
    for each in range(count):
        rows = order[phase == each]
        if len(rows) < needed:
            return None
        solving.append(rows[:needed])
    solved_on = torch.cat(solving)
    if len(order) < len(solved_on) + SPARE_ROWS:
        return None
    unsolved = torch.ones(len(order), dtype=torch.bool)
    unsolved[solved_on] = False
    return solved_on, order[unsolved[order]][:CHECKED_ROWS]


def _windows(source: torch.Tensor, setting: Setting) -> torch.Tensor:
    """Each output position's window of the padded `source`: (batch, channels, *positions,
    *kernel), a view of it."""
    padded = F.pad(source, [pad for padding in reversed(setting.padding) for pad in (padding, padding)])
    for dim, (kernel, stride, dilation) in enumerate(zip(setting.kernel, setting.stride, setting.dilation), 2):
        padded = padded.unfold(dim, dilation * (kernel - 1) + 1, stride)
    return padded[(..., *[slice(None, None, dilation) for dilation in setting.dilation])]


def _rows(windows: torch.Tensor, image: torch.Tensor, chosen: torch.Tensor) -> tuple:
    """(the windows of the `chosen` output positions, each with a 1 for the bias; the image's
    values there), as float64 matrices on the CPU."""
    positions = image.shape[2:]
    index = torch.unravel_index(chosen.to(image.device), (image.shape[0], *positions))
    spatial = len(positions)
    windows = windows.movedim(1, 1 + spatial)  # (batch, *positions, channels, *kernel)
    taken = windows[index].reshape(len(chosen), -1).double().cpu()
    ones = torch.ones(len(chosen), 1, dtype=torch.float64)
    values = image.movedim(1, -1)[index].double().cpu()  # (chosen, out)
    return torch.cat([taken, ones], 1), values
