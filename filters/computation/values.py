"""When two values are one: `close` (equal up to float32 rounding of a differently ordered
computation) and its quick tests on a few elements, and what kind of value an op made.
"""
from __future__ import annotations

import math

import torch

SAMPLE = 512  # elements compared first, before a whole tensor is


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
    if bool(finite.all()):  # finite values whose difference float32 cannot hold (3e38 and -3e38)
        return _close(a.double(), b.double(), tolerance)
    return not bool(finite.any()) or _close(a[finite], b[finite], tolerance)


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
