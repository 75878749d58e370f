"""Is the task well-conditioned? Measured for filters/checks/well_conditioned.py's `WellConditioned`.

A kernel is verified against the float32 reference at atol = rtol = 1e-2. A correct kernel
that sums in another order differs from the reference by rounding: where the task amplifies
rounding (floor or remainder of computed values, tan near its poles, an inverse of a
near-singular matrix), a correct kernel fails verification. Two measures say whether it does:
the float32 output against the same task in float64 (same weights, same inputs), and the
float32 output against itself with its weights nudged by a few ulps. Each is the share of the
verification tolerance used, max |a - b| / (atol + rtol * |b|).
"""
from __future__ import annotations

import contextlib

import torch

from filters.checks.measure.execution import forward, nudged_copies, ran_out_of_gpu_memory, tolerance_share


@contextlib.contextmanager
def full_float32():
    """No TF32 in matmuls or cuDNN convolutions while measuring (cuDNN uses it by default):
    the measures are the task's own conditioning, which TF32's 10-bit mantissa would swamp;
    a kernel is never asked to match a rounding that loose."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    precision = torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
        torch.set_float32_matmul_precision(precision)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Tensors the task makes in forward (`torch.ones(n)`) in `dtype`, as its weights are."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def reference_output(model, inputs) -> list[torch.Tensor]:
    with full_float32():
        return forward(model, inputs)


def float64_share(model64, inputs, out32: list, atol: float, rtol: float) -> float | None:
    """The share of the tolerance the float32 output uses against float64: `model64` is a
    copy of the task already in float64. None when the task cannot run in float64 (an op
    without a double kernel, a dtype the task fixes): the ulp probe then stands alone. Running
    out of GPU memory (float64 takes twice float32's) goes to the gate: the job grows."""
    wide = [widened([x])[0] if isinstance(x, torch.Tensor) else x for x in inputs]
    try:
        with default_dtype(torch.float64):
            out64 = forward(model64, wide)
    except Exception as error:
        if ran_out_of_gpu_memory(error):
            raise
        return None
    if len(out64) != len(out32):
        return None
    out32 = widened(out32)
    return tolerance_share(out32, [o64.to(o32.dtype) for o64, o32 in zip(out64, out32)], atol, rtol)


def widened(outputs: list) -> list:
    """Float32 outputs in float64 and complex64 in complex128, to compare with float64's."""
    wide = {torch.float32: torch.float64, torch.complex64: torch.complex128}
    return [o.to(wide[o.dtype]) if o.dtype in wide else o for o in outputs]


def ulp_share(model, inputs, out32: list, atol: float, rtol: float, seed: int) -> float:
    """The share of the tolerance a nudge of a few ulps on every floating weight moves the
    output by. The weights, not the inputs: a kernel computes `x > 0.5` on an input exactly,
    as the reference does, and a nudged input would flip an element that sits within ulps of
    0.5 (one in a million) with no kernel ever at fault. What a kernel computes from the
    weights is what it rounds its own way. A task without weights is left to the float64
    comparison (0.0 here)."""
    with full_float32(), nudged_weights(model, seed):
        nudged = forward(model, inputs)
    return tolerance_share(nudged, out32, atol, rtol)


@contextlib.contextmanager
def nudged_weights(model, seed: int):
    """Every floating parameter and buffer of `model` scaled by 1 + NUDGE_ULPS * eps * u
    (u uniform in [-1, 1), from a generator of the checks' own), and put back after."""
    saved = []
    try:
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                if tensor.is_floating_point() and tensor.numel():
                    saved.append((tensor, tensor.detach().clone()))
                    nudge = nudged_copies([tensor.detach()], seed + len(saved))[0]
                    tensor.copy_(nudge)
        yield
    finally:
        with torch.no_grad():
            for tensor, original in saved:
                tensor.copy_(original)


def max_abs(outputs: list) -> float:
    """The largest magnitude of any output element (bool outputs have none)."""
    return max((float(o.abs().max()) for o in outputs if o.numel() and o.dtype != torch.bool), default=0.0)
