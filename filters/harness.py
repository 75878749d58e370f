"""The execution checks, run inside a sandbox worker on one candidate (docs/architecture.md, "Acceptance").

Each check measures, then decides by a threshold from the config; every measurement is
returned in `metrics`, for rejects too. The comparison functions are bound when this
module is imported, before any candidate code runs, so a task cannot patch them.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import math
import os
import signal
import statistics
import time
import types
import warnings

import torch

from filters import ablation
from filters.op_graph import op_graph
from filters.worker import MAX_OP_GRAPH
from filters.resize import NotResizable, scale_constant

_allclose = torch.allclose
_isfinite = torch.isfinite
_equal = torch.equal
_abs, _sub, _amax, _size, _to_float = torch.abs, torch.sub, torch.amax, torch.Tensor.size, torch.Tensor.float
_clone = torch.Tensor.clone
_compile = torch.compile
with warnings.catch_warnings():  # importing inductor warns about torch.jit deprecations
    warnings.simplefilter("ignore")
    from torch._inductor.compile_fx import compile_fx as _inductor  # bound before any task loads
_reset_dynamo = torch._dynamo.reset

DEFAULTS = {
    "device": "cpu", "seed": 0, "atol": 1e-2, "rtol": 1e-2, "determinism_tol": 1e-5,
    "window_ms": (1.0, 100.0), "target_ms": 3.0, "max_resize_rounds": 6, "max_task_memory_gb": 16.0,
    # Memory the resize search may give one task in this worker (None: the task cap). The
    # later checks hold a second model and more outputs, so a share's third is the limit.
    "memory_budget_gb": None,
    # Timing holds the GPU alone while every other worker waits: 5 to 10 samples, ~50 ms of them.
    "timing_budget_ms": 50.0, "warmup_ms": 20.0, "min_repeats": 5, "max_repeats": 10,
    "ablation": True, "compile": True, "timing_lock": None,
    # The longest one step may hold the GPU gate: past it the task's process is ended at once
    # (SIGALRM), so a hang in forward frees the gate for every other worker within this.
    "gate_step_limit_s": 30.0,
}
# Where a worker's child reports the time it has waited at the GPU gate: its zygote adds it
# to the job's time limit, which counts the task's own work, not other tasks' queue.
report_gate_wait = lambda waited_s: None  # noqa: E731


# Every (stage, reason) a check can decide, and the sandbox's own; a worker's result that
# names another is not a verdict.
REASONS = {
    "accepted": frozenset({""}),
    "execute": frozenset({"eager_error", "nan_or_inf", "out_of_memory"}),
    "timing": frozenset({"too_fast", "too_slow", "too_large", "eager_error", "out_of_memory"}),
    "determinism": frozenset({"nondeterministic", "eager_error", "out_of_memory"}),
    "degenerate": frozenset({"fixed_inputs", "constant_output", "eager_error", "out_of_memory"}),
    "ablation": frozenset({"dead_parameter", "unused_module", "redundant_op", "eager_error", "out_of_memory"}),
    "compile": frozenset({"compile_error", "compile_mismatch", "eager_error", "out_of_memory"}),
    "sandbox": frozenset({"crashed", "timeout", "out_of_memory"}),
}


class Reject(Exception):
    def __init__(self, stage: str, reason: str, detail: str):
        super().__init__(detail)
        self.stage, self.reason, self.detail = stage, reason, detail


def evaluate(code: str, config: dict) -> dict:
    """Run every execution check; returns {passed, stage, reason, detail, metrics, code}.
    What the task computes (`trace`) is recorded by the worker, in a process of its own."""
    cfg = {**DEFAULTS, **config}
    metrics: dict = {}
    try:
        code = _run_checks(code, cfg, metrics)
    except Reject as reject:
        return {"passed": False, "stage": reject.stage, "reason": reject.reason, "detail": reject.detail,
                "metrics": metrics, "code": code}
    except Exception as error:  # a later stage of the task's own code failed
        reject = _as_reject(error, "execute")
        return {"passed": False, "stage": reject.stage, "reason": reject.reason, "detail": reject.detail,
                "metrics": metrics, "code": code}
    return {"passed": True, "stage": "accepted", "reason": "", "detail": "", "metrics": metrics, "code": code}


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
    _release(torch.device(device))
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


def _run_checks(code: str, cfg: dict, metrics: dict) -> str:
    device = torch.device(cfg["device"])
    gate = GpuGate(cfg["timing_lock"] or os.environ.get("OPSYNTH_TIMING_LOCK"), cfg["gate_step_limit_s"])
    try:
        with _timed(metrics, "load"):
            task, model, inputs, out = _load_and_run(code, cfg, device, gate)
        with _timed(metrics, "timing"):
            code, task, model, inputs, out = _fit_window(code, cfg, device, metrics, task, model, inputs, out, gate)
        with _timed(metrics, "determinism"):
            _check_determinism(task, model, inputs, out, cfg, device, metrics, gate)
        with _timed(metrics, "degenerate"):
            _check_not_constant(task, model, inputs, out, cfg, device, metrics, gate)
        if cfg["ablation"]:
            with _timed(metrics, "ablation"):
                _check_nothing_dead(model, inputs, out, cfg, metrics, gate)
        if cfg["compile"]:
            with _timed(metrics, "compile"):
                _check_compile(model, inputs, out, cfg, metrics, gate)
    finally:
        if gate.path:
            metrics.update(gate_wait_ms=gate.waited_s * 1e3, gpu_alone_ms=gate.alone_s * 1e3)
    return code


class GpuGate:
    """A reader-writer lock over one GPU shared by several workers, with writer priority.

    Timing is the writer: it closes the gate (no new GPU work may start), waits for the
    GPU work under way to finish, and measures alone. Every other stretch of GPU work is a
    reader, held for one step (a build, a forward, a comparison), not a whole check: a timer
    waits for the longest reader under way, and every other worker waits behind the timer.
    Both are flock(2) locks on files beside each other, so they hold across processes and
    are released by the OS if a worker dies. Without a path (CPU) both are no-ops.
    A step that holds the gate past `step_limit_s` ends its process (SIGALRM's default
    action): the OS releases its locks, and nobody waits behind a hang for long."""

    def __init__(self, path: str | None, step_limit_s: float | None = None):
        self.path, self.step_limit_s = path, step_limit_s
        self.waited_s = 0.0  # time spent waiting to enter, either way
        self.alone_s = 0.0  # time spent holding the GPU alone

    @contextlib.contextmanager
    def shared(self):
        if not self.path:
            yield
            return
        with _lock_file(self.path + ".gate") as gate, _lock_file(self.path) as gpu:
            began = time.perf_counter()
            fcntl.flock(gate, fcntl.LOCK_SH)  # waits while a timer holds the gate
            fcntl.flock(gpu, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
            self._entered(began)
            try:
                yield
                if torch.cuda.is_initialized():  # the step's kernels finish before a timer may enter
                    torch.cuda.synchronize()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                fcntl.flock(gpu, fcntl.LOCK_UN)

    def call(self, step, *args):
        """`step(*args)` as one stretch of shared GPU work."""
        with self.shared():
            return step(*args)

    @contextlib.contextmanager
    def exclusive(self):
        if not self.path:
            yield
            return
        with _lock_file(self.path + ".gate") as gate, _lock_file(self.path) as gpu:
            began = time.perf_counter()
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(gpu, fcntl.LOCK_EX)
            entered = time.perf_counter()
            self._entered(began)
            try:
                yield
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                fcntl.flock(gpu, fcntl.LOCK_UN)
                fcntl.flock(gate, fcntl.LOCK_UN)
                self.alone_s += time.perf_counter() - entered


    def _entered(self, began: float) -> None:
        """Count the wait, report it, and arm the step limit."""
        self.waited_s += time.perf_counter() - began
        report_gate_wait(self.waited_s)
        if self.step_limit_s:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.setitimer(signal.ITIMER_REAL, self.step_limit_s)


def _lock_file(path: str):
    """The pool makes the lock files; a jailed worker sees them read-only (flock needs no more)."""
    return open(path, "r") if os.path.exists(path) else open(path, "a")


@contextlib.contextmanager
def _timed(metrics: dict, stage: str):
    """Wall time of each check, kept as `t_<stage>_ms` (the time split per check)."""
    began = time.perf_counter()
    try:
        yield
    finally:
        metrics[f"t_{stage}_ms"] = (time.perf_counter() - began) * 1e3


# -- building and running ----------------------------------------------------------------

def trace(code: str) -> str | None:
    """What the task computes (filters/op_graph.py) as space-separated op names, traced on
    the meta device from a fresh load of its code; None when it cannot be traced. It runs
    the task's code: the worker calls it in a child of its own, under a hard time limit."""
    try:
        task = load_task(code)
        with torch.device("meta"):
            model = task.Model(*task.get_init_inputs()).eval()
            inputs = task.get_inputs()
        return " ".join(op_graph(model, inputs))[:MAX_OP_GRAPH]
    except Exception:  # data-dependent code, an op without a meta kernel: the textual score remains
        return None


def load_task(code: str) -> types.ModuleType:
    module = types.ModuleType("opsynth_task")
    exec(compile(code, "<task>", "exec"), module.__dict__)
    return module


def build_model(task, seed: int, device: torch.device):
    torch.manual_seed(seed)
    with torch.device(device):
        return task.Model(*task.get_init_inputs()).to(device).eval()


def make_inputs(task, device: torch.device) -> list:
    with torch.device(device):
        inputs = task.get_inputs()
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def forward(model, inputs) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(*fresh_copies(inputs))
    return flatten(out)


def fresh_copies(inputs: list) -> list:
    """Every call, checked or timed, gets new copies of the inputs: a task that changes its
    inputs in place changes no later call, and none can tell a timed call by its arguments."""
    return [_clone(x) if isinstance(x, torch.Tensor) else x for x in inputs]


def flatten(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in flatten(item)]
    raise TypeError(f"forward returned {type(out).__name__}, not tensors")


def _load_and_run(code: str, cfg: dict, device: torch.device, gate: "GpuGate"):
    try:
        task = load_task(code)
        model = gate.call(build_model, task, cfg["seed"], device)
        torch.manual_seed(cfg["seed"] + 1)
        inputs = gate.call(make_inputs, task, device)
        out = gate.call(forward, model, inputs)
    except Exception as error:
        raise _as_reject(error, "execute") from None
    if not gate.call(_all_finite, out):
        raise Reject("execute", "nan_or_inf", "the eager output holds NaN or Inf")
    return task, model, inputs, out


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    return all(bool(_isfinite(t).all()) for t in tensors if t.is_floating_point() or t.is_complex())


# -- timing window and re-sizing ---------------------------------------------------------

def _fit_window(code, cfg, device, metrics, task, model, inputs, out, gate: "GpuGate"):
    """Measure; while outside the window (or over the memory cap), scale `batch_size` and
    measure again. Small tasks are overhead-bound, so a linear estimate can overshoot: the
    batch sizes known to be too fast and too slow (or out of memory) bracket the next guess.
    The search uses quick measurements; only the final one takes the GPU exclusively."""
    low, high = cfg["window_ms"]
    target = min(max(cfg["target_ms"], low), high)
    cap_bytes = min(cfg["max_task_memory_gb"], cfg["memory_budget_gb"] or math.inf) * 2**30
    original, too_fast_at, too_slow_at = code, 0, math.inf
    for attempt in range(cfg["max_resize_rounds"] + 1):
        with gate.shared():
            eager_ms, peak = _measure(model, inputs, cfg, device, precise=False)
        too_large = peak is not None and peak > cap_bytes
        if low <= eager_ms <= high and not too_large:
            _warm_up(model, inputs, device, cfg["warmup_ms"], gate)  # shares the GPU: only measuring holds it alone
            with gate.exclusive():
                eager_ms, peak = _measure(model, inputs, cfg, device, precise=True)
            too_large = peak is not None and peak > cap_bytes
        metrics.update(eager_ms=eager_ms, peak_memory_mb=peak / 2**20 if peak is not None else None,
                       resize_rounds=attempt, resized=code != original)
        if low <= eager_ms <= high and not too_large:
            return code, task, model, inputs, out
        if attempt == cfg["max_resize_rounds"]:
            break
        try:
            _, batch, _ = scale_constant(code, 1.0)
        except NotResizable:
            break
        if eager_ms < low and not too_large:
            too_fast_at = max(too_fast_at, batch)
        else:
            too_slow_at = min(too_slow_at, batch)
        factor = cap_bytes / peak * 0.8 if too_large else target / max(eager_ms, 1e-3)
        guess = _bracketed(round(batch * min(max(factor, 1 / 64), 64)), batch, too_fast_at, too_slow_at)
        if guess is None:
            break
        del task, model, inputs, out
        _release(device)
        loaded = _load_resized(code, guess, batch, cfg, device, metrics, too_fast_at, too_slow_at, gate)
        if loaded is None:
            raise Reject("timing", "too_large", f"no batch size between {too_fast_at} and {batch} fits in memory")
        code, task, model, inputs, out, too_slow_at = loaded
    if metrics.get("peak_memory_mb") and metrics["peak_memory_mb"] * 2**20 > cap_bytes:
        raise Reject("timing", "too_large", f"peak memory {metrics['peak_memory_mb']:.0f} MB over the cap of "
                                            f"{cap_bytes / 2**20:.0f} MB")
    reason = "too_fast" if metrics["eager_ms"] < low else "too_slow"
    raise Reject("timing", reason, f"median eager time {metrics['eager_ms']:.3f} ms is outside [{low}, {high}] ms")


def _bracketed(guess: int, batch: int, too_fast_at: int, too_slow_at: float) -> int | None:
    if not too_fast_at < guess < too_slow_at:
        guess = round(math.sqrt(max(too_fast_at, 1) * min(too_slow_at, batch * 64)))
    return None if guess in (batch, too_fast_at, too_slow_at) or guess < 1 else guess


def _load_resized(code, guess, batch, cfg, device, metrics, too_fast_at, too_slow_at, gate: "GpuGate"):
    """Load the task at `guess`; running out of memory lowers the bracket and tries smaller."""
    while guess is not None:
        resized, _, _ = scale_constant(code, guess / batch)
        try:
            task, model, inputs, out = _load_and_run(resized, cfg, device, gate)
        except Reject as reject:
            if reject.reason != "out_of_memory":
                raise
            _release(device)
            too_slow_at = min(too_slow_at, guess)
            guess = _bracketed(round(math.sqrt(max(too_fast_at, 1) * guess)), batch, too_fast_at, too_slow_at)
            continue
        metrics["batch_size"] = guess
        return resized, task, model, inputs, out, too_slow_at
    return None


def _release(device) -> None:
    """Hand freed memory back, so workers sharing a GPU do not starve each other."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _measure(model, inputs, cfg, device, precise: bool = True) -> tuple[float, int | None]:
    """Median eager forward time in ms, and peak device memory in bytes. A quick measurement
    (for the resize search) warms up with three calls and takes three samples. A precise one
    expects a model already warmed up and takes `timing_budget_ms` of samples, within
    `min_repeats`..`max_repeats`. The caller decides whether it owns the GPU (GpuGate)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    first = _time_once(model, inputs, device)
    if first > cfg["window_ms"][1] * 5:
        return first, _peak(device)
    if precise:
        repeats = int(min(max(cfg["timing_budget_ms"] / max(first, 1e-3), cfg["min_repeats"]), cfg["max_repeats"]))
    else:
        _warm_up(model, inputs, device, 0.0)
        repeats = 3
    times = [_time_once(model, inputs, device) for _ in range(repeats)]
    return statistics.median(times), _peak(device)


def _warm_up(model, inputs, device, budget_ms: float, gate: "GpuGate | None" = None) -> None:
    """At least three calls and `budget_ms` of them: the first calls of a fresh process
    fault their memory in (slow and uneven on a VM) and can read many times too slow.
    With a gate, each call is its own stretch of shared GPU work; without one (a caller
    already inside the gate), none takes it."""
    gate = gate or GpuGate(None)
    spent, calls = 0.0, 0
    while calls < 3 or spent < budget_ms:
        spent += gate.call(_time_once, model, inputs, device)
        calls += 1


def _time_once(model, inputs, device) -> float:
    args = fresh_copies(inputs)  # made before the clock starts, as for every checked call
    with torch.no_grad():
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(*args)
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        began = time.perf_counter()
        model(*args)
        return (time.perf_counter() - began) * 1e3


def _peak(device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


# -- determinism, degeneracy, compile ----------------------------------------------------

def _check_determinism(task, model, inputs, out, cfg, device, metrics, gate: "GpuGate"):
    again = gate.call(forward, model, inputs)
    fresh = gate.call(forward, gate.call(build_model, task, cfg["seed"], device), inputs)
    diff = max(gate.call(max_diff, out, again), gate.call(max_diff, out, fresh))
    metrics["determinism_max_diff"] = diff
    if diff > cfg["determinism_tol"]:
        raise Reject("determinism", "nondeterministic",
                     f"two runs on the same weights and inputs differ by {diff:.3g} (> {cfg['determinism_tol']})")


def _check_not_constant(task, model, inputs, out, cfg, device, metrics, gate: "GpuGate"):
    other_inputs = gate.call(make_inputs, task, device)
    tensors = [(a, b) for a, b in zip(inputs, other_inputs) if isinstance(a, torch.Tensor)]
    if tensors and gate.call(lambda: all(a.shape == b.shape and _equal(a, b) for a, b in tensors)):
        raise Reject("degenerate", "fixed_inputs", "get_inputs() returned the same tensors twice")
    other = gate.call(forward, model, other_inputs)
    metrics["input_sensitivity"] = gate.call(max_diff, out, other)
    if gate.call(close, out, other, cfg["atol"], cfg["rtol"]):
        raise Reject("degenerate", "constant_output",
                     "outputs for two independent random inputs agree at the verification tolerance")


def _check_nothing_dead(model, inputs, out, cfg, metrics, gate: "GpuGate"):
    tolerances = (cfg["atol"], cfg["rtol"])
    # Each probe's forward and comparison take the gate; the perturbations between them
    # (one elementwise kernel per parameter) and the tracing (CPU) do not.
    gated_forward, gated_close = functools.partial(gate.call, forward), functools.partial(gate.call, close)
    dead = ablation.find_dead_parameter(model, inputs, out, gated_forward, gated_close, *tolerances, cfg["seed"] + 7)
    if dead:
        raise Reject("ablation", "dead_parameter",
                     f"perturbing parameter {dead!r} leaves the output unchanged at the verification tolerance")
    graph = ablation.trace(model)
    metrics["traceable"] = graph is not None
    if graph is None:
        return
    unused = ablation.find_unused_module(model, graph)
    if unused:
        raise Reject("ablation", "unused_module", f"submodule {unused!r} is built in __init__ but never used")
    redundant = ablation.find_redundant_op(model, inputs, out, gated_forward, gated_close, *tolerances)
    if redundant:
        raise Reject("ablation", "redundant_op",
                     f"dropping {redundant} leaves the output unchanged at the verification tolerance")


def _check_compile(model, inputs, out, cfg, metrics, gate: "GpuGate"):
    _reset_dynamo()
    began = time.perf_counter()
    try:
        compiled = forward(_compile(model, backend=_gated_inductor(gate)), inputs)
    except Exception as error:
        raise Reject("compile", "compile_error", _short(error))
    finally:
        metrics["compile_ms"] = (time.perf_counter() - began) * 1e3
    metrics["compile_max_diff"] = max_diff(out, compiled)
    if not close(out, compiled, cfg["atol"], cfg["rtol"]):
        raise Reject("compile", "compile_mismatch",
                     f"eager and compiled outputs differ by {metrics['compile_max_diff']:.3g} "
                     f"(atol=rtol={cfg['atol']})")


def _gated_inductor(gate: "GpuGate"):
    """Inductor, with only the compiled code's runs under the GPU gate. Compiling is seconds
    of CPU work: held under the gate, it made every timer wait for all compiles under way
    while the other workers' GPU work queued behind the timer."""
    def backend(graph, example_inputs):
        compiled = _inductor(graph, example_inputs)

        def run(*args):
            with gate.shared():
                return compiled(*args)
        run._boxed_call = getattr(compiled, "_boxed_call", False)  # inductor's calling convention
        return run
    return backend


# The comparisons call only functions bound at import, before any task code ran.
def close(a: list, b: list, atol: float, rtol: float) -> bool:
    return len(a) == len(b) and all(
        _size(x) == _size(y) and _allclose(_to_float(x), _to_float(y), atol=atol, rtol=rtol) for x, y in zip(a, b))


def max_diff(a: list, b: list) -> float:
    if len(a) != len(b) or any(_size(x) != _size(y) for x, y in zip(a, b)):
        return math.inf
    diffs = [float(_amax(_abs(_sub(_to_float(x), _to_float(y))))) if x.numel() else 0.0 for x, y in zip(a, b)]
    return max(diffs, default=0.0)


OOM_MESSAGES = ("can't allocate memory", "out of memory", "cannot allocate memory")


def _as_reject(error: BaseException, stage: str) -> Reject:
    """Running out of memory is its own reason (the task may fit once re-sized); any other
    exception from the task's code is an eager error."""
    text = str(error).lower()
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)) or any(m in text for m in OOM_MESSAGES):
        return Reject(stage, "out_of_memory", _short(error))
    return Reject(stage, "eager_error", _short(error))


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) < 500 else text[:497] + "..."
