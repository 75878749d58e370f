"""What the acceptance checks run a task with, inside a sandbox worker: loading and
building it, calling it on fresh copies of its inputs, timing it, comparing outputs, and the
GPU gate that lets several workers share one GPU while each times alone.

The torch functions the comparisons use are bound when this module is imported, before any
candidate code runs, so a task cannot patch them.
"""
from __future__ import annotations

import contextlib
import fcntl
import gc
import math
import os
import signal
import statistics
import time
import types

import torch

from filters.sandbox import gpu_memory

_allclose = torch.allclose
_isfinite = torch.isfinite
_equal = torch.equal
_abs, _sub, _div, _amax, _ne, _any = torch.abs, torch.sub, torch.div, torch.amax, torch.ne, torch.any
_size, _to, _clone, _isnan = torch.Tensor.size, torch.Tensor.to, torch.Tensor.clone, torch.isnan
_promote = torch.promote_types

# use_deterministic_algorithms refuses cuBLAS without a fixed workspace: set it before CUDA starts
# (this module is imported before any task runs), so a plain matmul is not taken for a
# nondeterministic op. 4096 KiB x 8 is one of the two configurations cuBLAS documents.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# Where a worker's child reports the time it has waited at the GPU gate: its zygote adds it
# to the job's time limit, which counts the task's own work, not other tasks' queue.
report_gate_wait = lambda waited_s: None  # noqa: E731


class Reject(Exception):
    def __init__(self, stage: str, reason: str, detail: str):
        super().__init__(detail)
        self.stage, self.reason, self.detail = stage, reason, detail


class GpuGate:
    """A reader-writer lock over one GPU shared by several workers, with writer priority.

    Timing is the writer: it takes the GPU in a gap between the other workers' steps when
    one comes soon (POLITE_S), else it closes the gate (no new GPU work may start), waits for
    the GPU work under way to finish; then it measures alone. Every other stretch of GPU work
    is a reader, held for one step (a build, a forward, a comparison), not a whole check. A
    timer that closed the gate behind a long step opens it again after DRAIN_S, so that only
    the timer, not every worker, waits that step out.
    Both are flock(2) locks on files beside each other, so they hold across processes and
    are released by the OS if a worker dies. Without a path (CPU) both are no-ops.
    A step that holds the gate past `step_limit_s` ends its process (SIGALRM's default
    action): the OS releases its locks, and nobody waits behind a hang for long."""

    def __init__(self, path: str | None, step_limit_s: float | None = None, alone: bool = False):
        self.path, self.step_limit_s = path, step_limit_s
        # A job run again after its GPU memory ran out. Where the worker counts GPU memory it
        # may grow into all of it (gpu_memory.GpuMemory.run_alone); where it does not, every
        # step holds the GPU alone: no other worker's step allocates while one of its runs.
        self.alone = alone
        self.waited_s = 0.0  # time spent waiting to enter, either way
        self.timer_waited_s = 0.0  # of which waiting to hold the GPU alone
        self.alone_s = 0.0  # time spent holding the GPU alone
        self.shared_s = 0.0  # time spent holding the GPU with others
        self.longest_s, self.longest_step = 0.0, ""  # the longest single hold: what every timer waited behind
        self.long_holds, self.long_held_s = 0, 0.0  # shared holds of LONG_HOLD_S or more: what timers drain
        self.reopened = 0  # times this job's timer closed the gate, found a long step under way and opened it again
        self.closures, self.closed_s = 0, 0.0  # times its timers closed the gate, and how long it stayed closed:
        # every other worker's step that came meanwhile waited, which its own wait does not show
        self.steps = 0  # shared holds

    @contextlib.contextmanager
    def shared(self, step: str = "a step"):
        if not self.path:
            yield
            return
        if self.alone and gpu_memory.held is None:  # an uncounted job run alone: no step of another's beside it
            with self.exclusive(step):
                yield
            return
        with _lock_file(self.path + ".gate") as gate, _lock_file(self.path) as gpu:
            began = time.perf_counter()
            report = lambda: self._report_wait(time.perf_counter() - began)  # noqa: E731
            _taken(gate, math.inf, report, fcntl.LOCK_SH)  # waits while a timer holds the gate, saying so
            fcntl.flock(gpu, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
            entered = self._entered(began)
            self.steps += 1
            try:
                yield
                if torch.cuda.is_initialized():  # the step's kernels finish before a timer may enter
                    torch.cuda.synchronize()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                fcntl.flock(gpu, fcntl.LOCK_UN)
                held = self._held(entered, step)
                self.shared_s += held
                if held >= LONG_HOLD_S:
                    self.long_holds, self.long_held_s = self.long_holds + 1, self.long_held_s + held

    def call(self, step, *args):
        """`step(*args)` as one stretch of shared GPU work. Where the worker counts GPU memory
        (filters/sandbox/gpu_memory.py), a step that outgrows what its job holds runs again
        once the job holds more, the gate not held meanwhile. Running a step again is fair to
        a pure task, and an impure one is refused whatever a first try changed."""
        name = getattr(step, "__qualname__", type(step).__name__)

        def gated():
            with self.shared(name):
                return step(*args)
        return self.growing(gated)

    def growing(self, run):
        """`run()`, which takes the gate itself (a compiled call, each of whose runs does), run
        again each time it outgrows what its job holds and the job grows."""
        while True:
            try:
                return run()
            except Exception as error:
                if gpu_memory.held is None or not ran_out_of_gpu_memory(error):
                    raise
                failed = error.with_traceback(None)  # the tensors its frames held go with the traceback
            if not self._grown():
                raise failed

    def _grown(self) -> bool:
        """Whether the job now holds more GPU memory (gpu_memory.GpuMemory.grow)."""
        release(torch.device("cuda"))
        try:
            return gpu_memory.held.grow(self._report_wait)
        finally:
            self._report_wait()

    def _report_wait(self, under_way_s: float = 0.0) -> None:
        """The job's time waiting on other workers: at the gate (`under_way_s` of it not yet
        counted), and for GPU memory they held."""
        report_gate_wait(self.waited_s + under_way_s + (gpu_memory.held.waited_now_s if gpu_memory.held else 0.0))

    @contextlib.contextmanager
    def exclusive(self, step: str = "timing"):
        """The GPU alone: taken in a gap between other workers' steps if one comes within
        POLITE_S, else by closing the gate and waiting for the steps under way."""
        if not self.path:
            yield
            return
        with _lock_file(self.path + ".gate") as gate, _lock_file(self.path) as gpu:
            began = time.perf_counter()
            closed = self._alone(gate, gpu, began)
            entered = self._entered(began)
            self.timer_waited_s += entered - began
            try:
                yield
                if self.alone and torch.cuda.is_initialized():  # what the step freed goes back before others run
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                fcntl.flock(gpu, fcntl.LOCK_UN)
                if closed is not None:
                    fcntl.flock(gate, fcntl.LOCK_UN)
                    self.closed_s += time.perf_counter() - closed
                self.alone_s += self._held(entered, step)

    def _alone(self, gate, gpu, began: float) -> float | None:
        """Hold the GPU lock alone: in a gap between steps, else by closing the gate for the
        steps under way to end. A step still under way after DRAIN_S is a long one: the gate
        opens again, and the other workers work beside it while this timer waits it out,
        until it has waited TIMER_PATIENCE_S (then it keeps the gate closed: never starved).
        When the gate was closed (to open when done), None if it was not. The wait is reported
        as it goes: it can last TIMER_PATIENCE_S and a step, and the zygote extends the job's
        time limit only by the wait it has been told of."""
        report = lambda: self._report_wait(time.perf_counter() - began)  # noqa: E731
        while True:
            if _taken(gpu, POLITE_S, report):
                return None
            _taken(gate, math.inf, report)
            closed = time.perf_counter()
            self.closures += 1
            if closed - began >= TIMER_PATIENCE_S:
                _taken(gpu, math.inf, report)
                return closed
            if _taken(gpu, DRAIN_S, report):
                return closed
            fcntl.flock(gate, fcntl.LOCK_UN)
            self.closed_s += time.perf_counter() - closed
            self.reopened += 1

    def _entered(self, began: float) -> float:
        """Count the wait, report it, and arm the step limit; the time the hold began."""
        entered = time.perf_counter()
        self.waited_s += entered - began
        self._report_wait()
        if self.step_limit_s:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.setitimer(signal.ITIMER_REAL, self.step_limit_s)
        return entered

    def _held(self, entered: float, step: str) -> float:
        """The seconds this hold lasted, kept as the longest when it is."""
        held = time.perf_counter() - entered
        if held > self.longest_s:
            self.longest_s, self.longest_step = held, step
        return held

    def metrics(self) -> dict:
        """What a job reports of its gate (nothing on the CPU, where there is none)."""
        if not self.path:
            return {}
        memory = gpu_memory.held.metrics() if gpu_memory.held else {}
        return {**memory, "gate_wait_ms": self.waited_s * 1e3, "gpu_alone_ms": self.alone_s * 1e3,
                "gate_shared_ms": self.shared_s * 1e3, "gate_longest_ms": self.longest_s * 1e3,
                "gate_longest_step": self.longest_step[:200], "gate_timer_wait_ms": self.timer_waited_s * 1e3,
                "gate_long_holds": self.long_holds, "gate_long_held_ms": self.long_held_s * 1e3,
                "gate_reopened": self.reopened, "gate_closures": self.closures,
                "gate_closed_ms": self.closed_s * 1e3, "gate_steps": self.steps}


# A timer first looks this long for a gap between other workers' steps, stopping none of
# them; only then does it close the gate, so that it is never starved. Closing it at once
# stopped every worker behind whichever step was under way when a timer came: on the H200, 8
# workers waited 483 s at the gate for 25 s of timing (200 candidates, one forward held 8.6 s).
POLITE_S, GAP_POLL_S = 0.5, 0.002
LONG_HOLD_S = 1.0  # a shared hold this long is counted apart
# A closed gate waits this long for the steps under way, then opens again. On the H200 (16
# workers, 512 candidates) 36 shared steps of 1 s or more (torch.special kernels compiled at
# run time, float64 forwards, slow sizes' measures) held 110 s in all, up to 13 s each, and
# every worker queued behind each one that a timer closed the gate on (1,400 s of waiting).
DRAIN_S, TIMER_PATIENCE_S = 0.2, 30.0


def _taken(lock, within_s: float, report, kind: int = fcntl.LOCK_EX) -> bool:
    """Whether `lock` was taken (alone, or shared: `kind`) within `within_s`; `report()` is
    called between tries, so a wait the zygote must add to the job's limit is told as it goes."""
    deadline = time.perf_counter() + within_s
    while True:
        try:
            fcntl.flock(lock, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.perf_counter() >= deadline:
                return False
            report()
            time.sleep(GAP_POLL_S)


def _lock_file(path: str):
    """The pool makes the lock files; a jailed worker sees them read-only (flock needs no more)."""
    return open(path, "r") if os.path.exists(path) else open(path, "a")


@contextlib.contextmanager
def timed(metrics: dict, stage: str):
    """Wall time of each check, kept as `t_<stage>_ms` (the time split per check)."""
    began = time.perf_counter()
    try:
        yield
    finally:  # a stage of two parts (the timing check's search and its precise measure) adds them up
        metrics[f"t_{stage}_ms"] = metrics.get(f"t_{stage}_ms", 0.0) + (time.perf_counter() - began) * 1e3


# -- building and running ----------------------------------------------------------------

def load_task(code: str) -> types.ModuleType:
    module = types.ModuleType("opsynth_task")
    exec(compile(code, "<task>", "exec"), module.__dict__)
    return module


def build_model(task, seed: int, device: torch.device):
    seed_for(device, seed)
    with torch.device(device):
        return task.Model(*task.get_init_inputs()).to(device).eval()


def make_inputs(task, device: torch.device) -> list:
    with torch.device(device):
        inputs = task.get_inputs()
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def first_inputs(task, seed: int, device: torch.device) -> list:
    """The inputs every check runs a task on first, drawn from `seed + 1` after its model was
    built from `seed`: the values its trace reads too (harness.ChecksDevice)."""
    seed_for(device, seed + 1)
    return make_inputs(task, device)


def seed_for(device: torch.device, seed: int) -> None:
    """Seed the generator a build on `device` draws from. On the CPU (or meta, which draws
    nothing), that one alone: torch.manual_seed also queues a seed for every accelerator not
    started, with a stack trace for each (1 ms a call, 6% of a trace in `opsynth dedupe`)."""
    if device.type in ("cpu", "meta"):
        torch.random.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def forward(model, inputs) -> list[torch.Tensor]:
    """The outputs of one call, as copies of their own: an output that is a buffer the task
    overwrites on every call would otherwise change under a comparison, and compare with itself."""
    with torch.no_grad():
        out = model(*fresh_copies(inputs))
        return [_clone(t) for t in flatten(out)]


def fresh_copies(inputs: list) -> list:
    """Every call, checked or timed, gets new copies of the inputs: a task that changes its
    inputs in place changes no later call."""
    return [_clone(x) if isinstance(x, torch.Tensor) else x for x in inputs]


NUDGE_ULPS = 8  # a nudge of a few ulps: a well-conditioned output moves by as little


def nudged_copies(inputs: list, seed: int) -> list:
    """Copies of the inputs with each floating element scaled by 1 + NUDGE_ULPS * eps * u, u
    uniform in [-1, 1): the numerics check sees how the output moves under rounding-sized
    changes of its weights. The noise comes from generators of the checks' own, so no RNG
    stream of the task's moves."""
    copies = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()) and x.numel():
            real = x.real.dtype if x.is_complex() else x.dtype
            generator = torch.Generator(device=x.device).manual_seed(seed)
            noise = torch.rand(x.shape, generator=generator, dtype=real, device=x.device)
            x = x * (1 + NUDGE_ULPS * torch.finfo(real).eps * (2 * noise - 1))
        elif isinstance(x, torch.Tensor):
            x = _clone(x)
        copies.append(x)
    return copies


EPSILON = torch.finfo(torch.float32).eps


def fresh_factor() -> float:
    """1 plus a few ulps, drawn from the OS for each call that must see inputs of its own
    (a memo keyed on the input never hits): one to NUDGE_ULPS of them."""
    return 1 + (1 + os.urandom(1)[0] % NUDGE_ULPS) * EPSILON


def scaled_copies(inputs: list, factor: float) -> list:
    """Copies of the inputs with every floating element times `factor` (a few ulps from 1):
    one pass over each input, as a plain copy costs, where `nudged_copies` draws noise."""
    return [(x * factor if x.is_floating_point() or x.is_complex() else _clone(x)) if isinstance(x, torch.Tensor)
            else x for x in inputs]


def flatten(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in flatten(item)]
    raise TypeError(f"forward returned {type(out).__name__}, not tensors")


def load_and_run(code: str, cfg: dict, device: torch.device, gate: GpuGate):
    try:
        task = load_task(code)
        model = gate.call(build_model, task, cfg["seed"], device)
        inputs = gate.call(first_inputs, task, cfg["seed"], device)
        out = gate.call(forward, model, inputs)
    except Exception as error:
        raise as_reject(error, "execute") from None
    return task, model, inputs, out


def all_finite(tensors: list[torch.Tensor]) -> bool:
    return all(bool(_isfinite(t).all()) for t in tensors if t.is_floating_point() or t.is_complex())


# -- timing -------------------------------------------------------------------------------

def release(device) -> None:
    """Hand freed memory back, so workers sharing a GPU do not starve each other."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(model, inputs, cfg, device, precise: bool = True, gate: GpuGate | None = None) -> tuple[float, int | None]:
    """Median eager forward time in ms, and peak device memory in bytes. A quick measurement
    (for the resize search) warms up with three calls and takes three samples. A precise one
    expects a model already warmed up and takes `timing_budget_ms` of samples, within
    `min_repeats`..`max_repeats`. The caller decides whether it owns the GPU: inside
    GpuGate.exclusive, no `gate`; with a `gate` (the GPU shared), each call is a step of its
    own, so a timer that closes the gate drains one call, not seven (on the H200 a quick
    measure held as one step was the longest hold of 36 jobs in 512, up to 1.5 s)."""
    def timed_call() -> float:
        return gate.call(_time_once, model, inputs, device) if gate else _time_once(model, inputs, device)

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    first = timed_call()
    if first > cfg["window_ms"][1] * 5:
        return first, _peak(device)
    if precise:
        repeats = int(min(max(cfg["timing_budget_ms"] / max(first, 1e-3), cfg["min_repeats"]), cfg["max_repeats"]))
    else:
        warm_up_calls(model, inputs, device, 0.0, gate)
        repeats = 3
    times = [timed_call() for _ in range(repeats)]
    return statistics.median(times), _peak(device)


def warm_up_calls(model, inputs, device, budget_ms: float, gate: GpuGate | None = None) -> None:
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
    # Made before the clock starts: fresh copies as for every checked call, each scaled by
    # its own factor, so no two timed calls see the same input and a memo keyed on the input
    # never hits.
    args = scaled_copies(inputs, fresh_factor())
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


# -- comparisons and errors ---------------------------------------------------------------

# The comparisons call only functions bound at import, before any task code ran. They compare
# whole tensors: the dtypes must match, a complex output is compared in its real and imaginary
# parts (through its modulus), integer and bool outputs exactly.
def close(a: list, b: list, atol: float, rtol: float) -> bool:
    return tolerance_share(a, b, atol, rtol) <= 1.0


def tolerance_share(a: list, b: list, atol: float, rtol: float) -> float:
    """The largest |a - b| / (atol + rtol * |b|) over all elements, `b` the reference: at most
    1 exactly where torch.allclose(a, b) holds. Integer and bool outputs must be equal (0 or
    inf); a dtype or shape that differs, or a NaN, is inf."""
    if not _same_layout(a, b):
        return math.inf
    shares = [_share(x, y, atol, rtol) for x, y in zip(a, b) if x.numel()]
    return max(shares, default=0.0)


def max_diff(a: list, b: list) -> float:
    """The largest |a - b| over all elements (inf on a dtype or shape that differs, or a NaN)."""
    if not _same_layout(a, b):
        return math.inf
    return max((_diff(x, y) for x, y in zip(a, b) if x.numel()), default=0.0)


def identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and _equal(a, b)


def _same_layout(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and _size(x) == _size(y) for x, y in zip(a, b))


def _exact(x: torch.Tensor) -> bool:
    return not (x.is_floating_point() or x.is_complex())


def _wide(x: torch.Tensor) -> torch.Tensor:
    """`x` in a dtype wide enough to subtract in: float32 at least, complex kept complex."""
    return _to(x, _promote(x.dtype, torch.float32))


def _diff(x: torch.Tensor, y: torch.Tensor) -> float:
    if x.dtype == torch.bool:
        return float(bool(_any(_ne(x, y))))
    if _exact(x):
        return float(_amax(_abs(_sub(_to(x, torch.int64), _to(y, torch.int64)))))
    return _finite_or_inf(float(_amax(_abs(_sub(_wide(x), _wide(y))))))


def _share(x: torch.Tensor, y: torch.Tensor, atol: float, rtol: float) -> float:
    if _exact(x):
        return math.inf if bool(_any(_ne(x, y))) else 0.0
    wide_y = _wide(y)
    return _finite_or_inf(float(_amax(_div(_abs(_sub(_wide(x), wide_y)), _abs(wide_y) * rtol + atol))))


def _finite_or_inf(value: float) -> float:
    return math.inf if math.isnan(value) else value


OOM_MESSAGES = ("can't allocate memory", "out of memory", "cannot allocate memory")
# The CUDA caching allocator asks NVML for every process's memory to word its out-of-memory
# message; where NVML cannot start in the jail (a Firecracker H200: 40 of 512 candidates),
# the out-of-memory surfaces as this internal assert instead.
OOM_REPORT_FAILED = ("nvmlinit_v2_()", "cudacachingallocator")


# What a GPU library says when an allocation fails inside it (cuBLAS and cuSOLVER cannot even
# make their handle, cuDNN cannot start): the task's error only if the GPU had room for it.
GPU_ALLOCATION_FAILED = ("alloc_failed", "out of memory", "cudaerrormemoryallocation", "cublas_status_not_initialized",
                         "cudnn_status_not_initialized", "cusolver_status_not_initialized")


def as_reject(error: BaseException, stage: str) -> Reject:
    """Running out of memory is its own reason (the task may fit once re-sized); any other
    exception from the task's code is an eager error."""
    if ran_out_of_memory(error):
        return Reject(stage, "out_of_memory", short(error))
    return Reject(stage, "eager_error", short(error))


def ran_out_of_memory(error: BaseException) -> bool:
    text = str(error).lower()
    return (isinstance(error, (MemoryError, torch.OutOfMemoryError, gpu_memory.GpuMemoryBusy))
            or any(m in text for m in OOM_MESSAGES) or all(m in text for m in OOM_REPORT_FAILED))


def ran_out_of_gpu_memory(error: BaseException) -> bool:
    """An allocation on the GPU failed: the allocator's own error (or its failed report of
    one) or a GPU library's."""
    return isinstance(error, torch.OutOfMemoryError) or gpu_allocation_failed(str(error))


def gpu_allocation_failed(text: str) -> bool:
    """Whether an error's text says a GPU allocation failed (the worker reads it from a verdict's detail)."""
    text = text.lower()
    return any(m in text for m in GPU_ALLOCATION_FAILED) or all(m in text for m in OOM_REPORT_FAILED)


def short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) < 500 else text[:497] + "..."
