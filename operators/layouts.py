"""Input layouts: the tensor shapes an op chain can start from, with named size constants.

The names become module-level constants of a task (`batch_size = 128`), so re-sizing can
scale them later. `batch_size` always comes first: scaling it never changes parameter shapes.
"""
from __future__ import annotations

from dataclasses import dataclass


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
