"""One candidate through the acceptance checks, inside a sandbox worker (docs/architecture.md,
"Acceptance"): `evaluate` runs filters/checks/order.py's CHECKS in order; `warm_up` readies a
worker; `trace` records what a task computes.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import math
import os
from typing import Callable

import torch

from filters.checks.base import TaskUnderTest
from filters.checks.compiles import bind_compiler
from filters.checks.order import CHECKS
from filters.checks.registry import DEFAULTS
from filters.checks.verdicts import SANDBOX_REASONS
from filters.checks.measure.execution import (GpuGate, Reject, as_reject, build_model, first_inputs, load_task, release,
                                      timed)
from filters.sandbox.gpu_memory import GpuMemoryBusy
from filters.computation.memory import _storage
from filters.computation.graph import MAX_OP_GRAPH, Kernels, _Reading, op_graph_and_drops
from filters.checks.measure.resize import small_problem

_reset_dynamo = torch._dynamo.reset
bind_compiler()  # this module is imported by a worker before it runs any task

# Every (stage, reason) a check can decide, and the sandbox's own; a worker's result that
# names another is not a verdict.
REASONS = {"accepted": frozenset({""}), "sandbox": frozenset(SANDBOX_REASONS),
           **{check.stage: frozenset(check.reasons) for check in CHECKS}}


def evaluate(code: str, config: dict) -> dict:
    """Run every enabled check in order; returns {passed, stage, reason, detail, metrics, code}.
    What the task computes (`trace`) is recorded by the worker, in a process of its own."""
    cfg = {**DEFAULTS, **config}
    gate = gpu_gate(cfg)
    t = TaskUnderTest(code, cfg, torch.device(cfg["device"]), gate)
    running = None
    try:
        for running in [check for check in CHECKS if check.enabled(cfg)]:
            with timed(t.metrics, running.stage):
                running.run(t)
    except Reject as reject:
        if running and reject.stage != running.stage:  # the task at a size the timing check tried, say
            t.metrics["error_in"] = running.stage
        return _result(t, False, reject.stage, reject.reason, reject.detail, code)
    except (Exception, GpuMemoryBusy) as error:
        # A later stage of the task's own code failed, or other jobs held the GPU memory it
        # needed: an out_of_memory the worker runs again alone. Its verdict is the execute
        # stage's; the check it escaped from is kept for the record.
        reject = as_reject(error, "execute")
        t.metrics["error_in"] = running.stage if running else "execute"
        return _result(t, False, reject.stage, reject.reason, reject.detail, code)
    finally:
        t.metrics.update(gate.metrics())
    return _result(t, True, "accepted", "", "", t.code)


def gpu_gate(cfg: dict) -> GpuGate:
    """The gate a job's checks and its trace share the GPU through (execution.GpuGate)."""
    return GpuGate(cfg["timing_lock"] or os.environ.get("OPSYNTH_TIMING_LOCK"), cfg["gate_step_limit_s"],
                   cfg["gpu_alone"])


def _result(t: TaskUnderTest, passed: bool, stage: str, reason: str, detail: str, code: str) -> dict:
    """A reject carries the code as submitted; an accepted task, the code as re-sized."""
    return {"passed": passed, "stage": stage, "reason": reason, "detail": detail, "metrics": t.metrics, "code": code}


WARM_UP_TASK = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def forward(self, x):
        return torch.tanh(self.linear(x)).cumsum(-1)


def get_inputs():
    return [torch.rand(32, 64)]


def get_init_inputs():
    return []
"""


def warm_up(device: str, cache_dir: str) -> dict:
    """Run every check once on a small built-in task, then freeze what is alive into the
    garbage collector's permanent generation. The first compile imports most of Inductor;
    frozen, those objects are no longer traversed by every full collection (0.2-0.3 s a
    candidate on this code's CPU, before), and no candidate pays the cold compile.
    The warm-up compiles into `cache_dir`, the worker's own: no compiler cache is shared
    with another worker, job or run, so none can be poisoned by a task."""
    use_compiler_caches(cache_dir)
    result = evaluate(WARM_UP_TASK, {"device": device, "window_ms": (0.0, math.inf)})
    _reset_dynamo()
    release(torch.device(device))
    gc.freeze()
    return result


def use_compiler_caches(folder: str) -> None:
    """Inductor's and Triton's caches in `folder` from now on. Inductor memoizes some paths
    under its cache: those are cleared."""
    os.environ.update(TORCHINDUCTOR_CACHE_DIR=folder, TRITON_CACHE_DIR=os.path.join(folder, "triton"))
    try:
        from torch._inductor.utils import clear_caches
    except ImportError:  # a torch without it memoizes no cache path
        return
    clear_caches()


@dataclasses.dataclass
class ChecksDevice:
    """Where a task is traced at its own sizes: on the device its checks ran on, from their
    seed, under their GPU gate, so that the trace reads the values the checks computed. The
    CPU's and a GPU's generators draw other weights and inputs from one seed, and their
    kernels round differently: a layer gated by a product that is zero on the CPU's values
    and not on the GPU's would be traced as absent. `start` readies the device (CUDA's
    context, the worker's share of the GPU's memory) outside the gate, once, and only when
    a trace needs it."""
    device: str = "cpu"
    seed: int = 0
    gate: GpuGate = dataclasses.field(default_factory=lambda: GpuGate(None))
    start: Callable[[], None] = lambda: None
    # the same device as the job run alone (nearly all the counted memory, or uncounted, every
    # step alone), for a trace that ran out of its job's memory: the checks ran the task
    # in it, the trace keeps every value it reads (worker.retried_alone, for the checks)
    alone: ChecksDevice | None = None


@dataclasses.dataclass(frozen=True)
class Reading:
    """A trace, and whether it is `partial`: a trusted task's reading at a smaller problem
    than its own that left named ops unspelled (its own sizes may read more: reference.py
    reads it again there, where candidates are read)."""
    graph: str | None
    partial: bool = False


def trace(code: str, untrusted: bool = True, checks: ChecksDevice | None = None) -> str | None:
    """`read`'s trace."""
    return read(code, untrusted, checks).graph


def read(code: str, untrusted: bool = True, checks: ChecksDevice | None = None, in_full: bool = False,
         small_only: bool = False) -> Reading:
    """What the task computes (filters/computation/) as space-separated op names, from a
    fresh load of its code; None when it cannot be traced. It runs the task's code: the worker
    calls it in a child of its own, under a hard time limit.

    On real tensors, at a small problem on the CPU: the values let op_graph see what a run of
    ops computes, and a task cannot tell a trace from a run (a branch on `x.is_meta` would
    show a meta trace decoy ops). A trace at smaller sizes than the task's stands only where
    the meta device shows the same ops at both and it leaves no named op unspelled (a value
    can depend on the sizes: `relu(linear(x)) * (x.shape[1] - 16)` is zero at a width of
    16); else the task is traced at its own sizes, on real tensors on the checks' device
    (`ChecksDevice`), and a task none of whose readings stands is untraced (a run rejects
    it). A task of the reference (or one `dedupe` was given) is not `untrusted`: nothing it
    could gain by steering its trace, it keeps the small problem's trace wherever the meta
    device shows the same ops (KernelBench at its full sizes took 115 s, not 39, and 4 of
    200 tasks ran past the worker's 20 s), and one the policy allows is spelled on meta
    where no reading on real tensors runs. Such a reading that left ops unspelled is
    `partial`; `in_full` reads such a task again as a candidate is read past its small
    problem: at the small batch, and at its own sizes where that leaves ops unspelled too (a
    task that cut its widths into 512 segments read at widths of 16 as segments of one, its
    layer and norm constant; at the small batch it reads in full). `small_only` never reads it
    there on real tensors (the composer's reference screen: a full-size task on one CPU
    thread can take seconds)."""
    checks = checks or ChecksDevice()
    graph = None
    try:
        ladder = [*small_problem(code), code]
        pending = list(dict.fromkeys(ladder[1:] if in_full else ladder[:-1] if small_only else ladder))
    except Exception:  # code that does not parse: nothing to trace
        return Reading(None)
    tried = set()
    while pending:
        small = pending.pop(0)
        tried.add(small)
        try:
            graph, unspelled = _traced_and_drops(small, checks if small == code else ChecksDevice(seed=checks.seed),
                                                 untrusted)
        except Exception:  # sizes the model cannot take, an op without a kernel, memory, ReadingsDisagree, ...
            continue
        if small == code:
            return Reading(graph)
        if (untrusted or in_full) and unspelled:
            continue
        sizes = _at_its_sizes(code, small)
        if sizes == SAME_OPS:
            return Reading(graph, partial=bool(unspelled))
        if sizes == COLLAPSED and (parts := small_problem(code, every_divisor=True)[0]) not in tried | set(pending):
            pending.insert(0, parts)
    if untrusted or in_full:
        # no reading on real tensors stands: on meta its values would go unread, and a round
        # trip around a KernelBench layer (`x * 4 * 0.25`) or a GEMM written as a broadcast
        # product and a sum (a red team's, whose readings disagreed at every size) would be
        # spelled out as its ops, `mul relu mul` or `mul sum`: untraced
        return Reading(None)
    from filters.grammar import static_check
    if static_check(code) is not None:  # a reference task, or one `dedupe` was given, the policy refuses
        return Reading(graph)
    try:
        return Reading(_on_meta(code)[0])
    except Exception:  # data-dependent code has no value to decide by on meta
        return Reading(None)


SAME_OPS, COLLAPSED, OTHER_OPS = "same ops", "collapsed", "other ops"


def _at_its_sizes(code: str, small: str) -> str:
    """How the task runs at the sizes of its trace against its own, on the meta device (no
    memory, no arithmetic): the same ops (SAME_OPS); the same ops, but some op made a
    dimension of one (or none) that is larger at its own sizes (COLLAPSED: an adversary's 16
    clusters of a width shrunk to 16 were clusters of one, and their norm a constant); or
    not (OTHER_OPS). The policy lets forward branch on a shape, and a red team's task ran a
    KernelBench layer at a batch over 4 and decoy ops at 4: the trace read the decoy. Code
    the meta device cannot run (a data-dependent op such as masked_select) is not taken as
    the same: with one, the red team's branch hid the KernelBench layer again."""
    try:
        (small_ops, small_shapes), (own_ops, own_shapes) = _on_meta(small), _on_meta(code)
    except Exception:
        return OTHER_OPS
    if small_ops != own_ops:
        return OTHER_OPS
    collapsed = len(small_shapes) == len(own_shapes) and any(
        a is not None and b is not None and len(a) == len(b) and any(m <= 1 < n for m, n in zip(a, b))
        for a, b in zip(small_shapes, own_shapes))
    return COLLAPSED if collapsed else SAME_OPS


@functools.lru_cache(maxsize=4)  # a task's own sizes are asked once per rung read
def _on_meta(code: str) -> tuple[str, list]:
    """(the op sequence on the meta device, the shape of what each recorded op made)."""
    reading = _Reading(*_built(code, "meta"))
    return " ".join(reading.sequence)[:MAX_OP_GRAPH], reading.shapes


def _traced_and_drops(code: str, checks: ChecksDevice | None = None, untrusted: bool = True) -> tuple[str, list[str]]:
    """On real tensors: (the trace, the ops it leaves unspelled), op_graph_and_drops, read
    with generic weights (`_generic_weights`) and signed inputs unless those leave unspelled
    an op the task's own values spell; ReadingsDisagree where each leaves one the other
    spells. For an `untrusted` task the generic values are drawn from a seed it cannot know:
    a red team's task recognised the checks' first draw by a literal of its first element,
    and a draw from a known seed is as recognisable (a reference task's are drawn from a
    fixed one: its trace is cached)."""
    checks = checks or ChecksDevice()
    try:
        return _traced_and_drops_on(code, checks, untrusted)
    except (torch.OutOfMemoryError, GpuMemoryBusy):
        if checks.alone is None:
            raise
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return _traced_and_drops_on(code, checks.alone, untrusted)


def _traced_and_drops_on(code: str, checks: ChecksDevice, untrusted: bool) -> tuple[str, list[str]]:
    checks.start()
    return checks.gate.call(_read_on, code, checks, untrusted)


def _read_on(code: str, checks: ChecksDevice, untrusted: bool) -> tuple[str, list[str]]:
    model, inputs = _built(code, checks.device, checks.seed)
    torch.manual_seed(int.from_bytes(os.urandom(8), "little") if untrusted else GENERIC_SEED)
    generic = [torch.randn_like(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    graph, unspelled = op_graph_and_drops(model, inputs, generic, spread=_generic_weights,
                                          python_may_read_values=not untrusted)
    return " ".join(graph)[:MAX_OP_GRAPH], unspelled


GENERIC_SEED = 7  # a reference task's generic values


def _built(code: str, device: str, seed: int = 0) -> tuple[torch.nn.Module, list]:
    task = load_task(code)
    model = build_model(task, seed, torch.device(device))
    return model, first_inputs(task, seed, torch.device(device))


@torch.no_grad()
def _generic_weights(model: torch.nn.Module, kernels: Kernels = Kernels()) -> None:
    """Weights and inputs a value comparison cannot be fooled by: a norm's weight of ones, a
    bias of zeros, a batch norm's running statistics (0 and 1) make ops that are there look
    like identities; inputs of torch.rand (all positive) make a relu look like one. Every
    constant weight or buffer is given a spread (variances kept positive); op_graph compares
    values on signed inputs wherever the task runs the same ops on them as on its own."""
    buffers = {_storage(buffer) for buffer in model.buffers()}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if not tensor.is_floating_point() or tensor.numel() < 2:
            continue
        storage = _storage(tensor)
        kept = storage in kernels.windows or (storage in kernels.operands and storage in buffers)
        if name.endswith("running_var"):
            tensor.uniform_(0.5, 1.5)
        elif name.endswith("running_mean") or (float(tensor.std()) < 1e-6 and not kept):
            # a constant kernel with a window (a convolution's by 1 / k^2) or a buffer a matrix
            # product takes makes nothing look like an identity: a pooling, a sum, read as
            # such. A (1, C, 1, 1) scale of ones has no window, and a (1, C, H, W) gain no
            # convolution or product takes (`kernels`, op_graph_and_drops): spread, or its
            # multiplication read as nothing
            tensor.add_(torch.randn_like(tensor) * 0.2)
