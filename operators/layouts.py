"""Input layouts: the tensor shapes an op chain can start from, with named size constants,
and the sizes real layers have.

The names become module-level constants of a task (`batch_size = 128`), so re-sizing can
scale them later (filters/checks/measure/resize.py). `batch_size` always comes first.

Each layout has default `sizes` (what the crawl probes ops at and what an inlined
transformers layer's config is resolved against), and `draw_sizes` gives a candidate sizes of
its own from tables of the sizes real models use, so that a task reads as a layer a kernel
engineer would recognise: every size a multiple of 8, most a power of two, the rest the
usual in-between sizes (768, 1536, 3072 hidden; 96, 192, 384 channels; 56, 112, 224 pixels).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from operators.sizes import BATCH, CHANNELS, FRAMES, HIDDEN, LADDERS, SEQUENCE, SPATIAL, power_of_two


@dataclass(frozen=True)
class Layout:
    name: str
    dims: tuple[str, ...]
    sizes: tuple[int, ...]
    channel_axis: int


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout("features", ("batch_size", "features"), (128, 512), 1),
        Layout("sequence", ("batch_size", "seq_len", "hidden"), (16, 128, 256), 2),
        Layout("signal", ("batch_size", "channels", "length"), (16, 32, 512), 1),
        Layout("image", ("batch_size", "channels", "height", "width"), (8, 32, 64, 64), 1),
        Layout("volume", ("batch_size", "channels", "depth", "height", "width"), (4, 16, 16, 32, 32), 1),
    )
}

# -- the sizes real layers have (operators/sizes.py) ------------------------------------------
# No RGB input (3 channels): a real stem maps 3 channels to 32-64, but a convolution's recipe
# keeps its input's channels (out_channels = $C), so an RGB input would make a 3 -> 3 conv
# that no network has, and a whole chain at 3 channels. Channel counts start at 16.

# What each layout dimension sizes.
KIND_OF_DIM = {"batch_size": BATCH, "features": HIDDEN, "hidden": HIDDEN, "seq_len": SEQUENCE,
               "channels": CHANNELS, "length": SEQUENCE, "height": SPATIAL, "width": SPATIAL, "depth": FRAMES}

# The composer's tables: the part of each ladder a drawn candidate starts from (re-sizing then
# brings it into the timing window), and how large a drawn input may be. The composer runs
# each chain on the meta device, some on the CPU (ops without a meta kernel, the numeric
# screen): the bound keeps that as cheap as the old fixed sizes were (at most 4M elements).
# Re-sizing brings a small draw up, so the floor only keeps toy inputs out.
DRAW_RANGES = {BATCH: (8, 512), HIDDEN: (256, 8192), CHANNELS: (16, 1024), SEQUENCE: (128, 4096),
               SPATIAL: (8, 512), FRAMES: (8, 32)}
MIN_DRAWN_ELEMENTS, MAX_DRAWN_ELEMENTS = 1 << 15, 1 << 22
# Aspect ratios real layers keep: a CNN halves its pixels as it doubles its channels, so
# channels x side stays within these (ResNet's 64 x 56 .. 512 x 7, VGG's 64 x 224); a
# sequence model's hidden size is not tied to its length; a 1-d conv (audio, time series)
# has long signals and few channels.
CHANNELS_TIMES_SIDE = {"image": (1024, 16384), "volume": (1024, 8192), "signal": (4096, 262144)}


def drawn(kind: str) -> tuple[int, ...]:
    low, high = DRAW_RANGES[kind]
    return tuple(size for size in LADDERS[kind] if low <= size <= high)


def size_table(layout: Layout) -> list[tuple[int, ...]]:
    """Every realistic input shape of `layout` (batch first), each dimension from its kind's
    table, within the aspect ratio its layers keep and the bounds on drawn elements."""
    per_dim = [drawn(KIND_OF_DIM[dim]) for dim in layout.dims]
    return [shape for shape in _product(per_dim, layout) if _realistic(shape, layout)]


def draw_sizes(layout: Layout, rng: random.Random) -> Layout:
    """`layout` with sizes drawn from its table (a pure function of the rng's state). A
    shape weighs twice as much for each of its sizes that is a power of two."""
    table = _cached_table(layout.name)
    return replace(layout, sizes=rng.choices(table, weights=[_weight(shape) for shape in table])[0])


def _weight(shape: tuple[int, ...]) -> int:
    return 1 << sum(power_of_two(size) for size in shape)


def _product(per_dim: list[tuple[int, ...]], layout: Layout):
    shapes = [()]
    for position, options in enumerate(per_dim):
        if layout.dims[position] == "width":  # square: width follows height
            shapes = [(*shape, shape[-1]) for shape in shapes]
            continue
        shapes = [(*shape, size) for shape in shapes for size in options]
    return shapes


def _realistic(shape: tuple[int, ...], layout: Layout) -> bool:
    if not MIN_DRAWN_ELEMENTS <= math.prod(shape) <= MAX_DRAWN_ELEMENTS:
        return False
    if layout.name in CHANNELS_TIMES_SIDE:
        low, high = CHANNELS_TIMES_SIDE[layout.name]
        return low <= shape[layout.channel_axis] * shape[-1] <= high
    return True


_TABLES: dict[str, list[tuple[int, ...]]] = {}


def _cached_table(name: str) -> list[tuple[int, ...]]:
    if name not in _TABLES:
        _TABLES[name] = size_table(LAYOUTS[name])
    return _TABLES[name]


# The layout an op's name implies (Conv1d works on signals, Conv2d on images, ...).
SUFFIX_LAYOUTS = {"1d": ("signal",), "2d": ("image",), "3d": ("volume",)}
GENERIC_LAYOUTS = ("features", "sequence", "image")


def layouts_for(op_name: str) -> tuple[str, ...]:
    leaf = op_name.rsplit(".", 1)[-1].lower()
    for suffix, layouts in SUFFIX_LAYOUTS.items():
        if leaf.endswith(suffix) or f"{suffix}_" in leaf:
            return layouts
    return GENERIC_LAYOUTS


@dataclass(frozen=True)
class Weight:
    """A learned tensor argument of a function op (the other operand of `torch.maximum`, the
    matrix of `torch.mm`): the task holds it as an nn.Parameter of this shape."""
    shape: tuple[int, ...]


def resolve(recipe, shape: tuple[int, ...], channel_axis: int):
    """Turn a recipe value into a literal for an input of `shape`: `$C` the channel size, `$L`
    the last dimension, `$W` a weight vector over the last dimension, `$M` a square matrix."""
    if recipe == "$C":
        return shape[channel_axis] if len(shape) > channel_axis else shape[-1]
    if recipe == "$L":
        return shape[-1]
    if recipe == "$W":
        return Weight((shape[-1],))
    if recipe == "$M":
        return Weight((shape[-1], shape[-1]))
    return recipe
