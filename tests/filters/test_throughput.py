"""What the sandbox's throughput rests on: the GPU gate's accounting and its alone mode, the
retry of a job whose GPU memory ran out, and the benchmark's arithmetic. The gate runs on the
CPU here with the same code as on a GPU (flock on files)."""
from __future__ import annotations

import threading
import time

from filters.checks.measure.execution import GpuGate
from filters.sandbox.worker import gpu_memory_ran_out, longest_job_s
from tests.benchmarks.bench_throughput import summarise, wasted_work

ON_GPU = {"device": "cuda", "gpu_memory_gb": 15.0}


def _hold(gate: GpuGate, seconds: float, entered: threading.Event | None = None) -> None:
    with gate.shared("hold"):
        if entered:
            entered.set()
        time.sleep(seconds)


def _second_waits(path: str, first: GpuGate) -> float:
    """How long a plain worker's step waited while `first` held a step of 0.4 s."""
    entered = threading.Event()
    holder = threading.Thread(target=_hold, args=(first, 0.4, entered))
    holder.start()
    entered.wait(5)
    other = GpuGate(path)
    with other.shared():
        pass
    holder.join()
    return other.waited_s


def test_steps_share_the_gpu_but_a_job_run_alone_holds_it_alone(tmp_path):
    path = str(tmp_path / "gpu0.lock")
    assert _second_waits(path, GpuGate(path)) < 0.2  # readers overlap
    alone = GpuGate(path, alone=True)
    assert _second_waits(path, alone) >= 0.3  # every step of the retried job is exclusive
    assert alone.alone_s >= 0.4 and alone.shared_s == 0.0


def test_the_gate_reports_its_holds_and_the_longest_step(tmp_path, monkeypatch):
    """The longest hold is what every timer (and every worker behind it) waited for: the
    benchmark names its step, and counts the long ones."""
    from filters.checks.measure import execution
    gate = GpuGate(str(tmp_path / "gpu0.lock"))

    def slow_build():
        time.sleep(0.3)

    gate.call(lambda: None)
    gate.call(slow_build)
    with gate.exclusive():
        time.sleep(0.05)
    monkeypatch.setattr(execution, "LONG_HOLD_S", 0.2)
    gate.call(slow_build)
    metrics = gate.metrics()
    assert metrics["gate_longest_step"].endswith("slow_build") and metrics["gate_longest_ms"] >= 300
    assert metrics["gate_shared_ms"] >= 600 and metrics["gpu_alone_ms"] >= 50
    assert metrics["gate_long_holds"] == 1 and metrics["gate_long_held_ms"] >= 300  # counted from the second
    assert GpuGate(None).metrics() == {}  # the CPU has no gate to report


def _ended(reason: str, detail: str = "", stage: str = "numerics") -> dict:
    return {"passed": False, "stage": stage, "reason": reason, "detail": detail, "metrics": {}}


def test_a_gpu_allocation_failure_on_a_shared_gpu_is_retried_and_nothing_else_is():
    oom = _ended("out_of_memory", "CUDA out of memory. Tried to allocate 2.00 GiB")
    cublas = _ended("eager_error", "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate")
    assert gpu_memory_ran_out(oom, ON_GPU, {}) and gpu_memory_ran_out(cublas, ON_GPU, {})
    assert not gpu_memory_ran_out(oom, ON_GPU, {"gpu_alone": True})  # a retry is never retried
    assert not gpu_memory_ran_out(oom, {"device": "cpu"}, {})  # the CPU's memory is the task's own
    assert not gpu_memory_ran_out(oom, {"device": "cuda", "gpu_memory_gb": None}, {})  # a GPU of its own
    assert not gpu_memory_ran_out(_ended("out_of_memory", "resident memory passed 8 GB", "sandbox"), ON_GPU, {})
    assert not gpu_memory_ran_out(_ended("eager_error", "RuntimeError: shapes cannot be multiplied"), ON_GPU, {})
    assert not gpu_memory_ran_out({**_ended("", ""), "passed": True, "stage": "accepted"}, ON_GPU, {})


def test_the_pool_waits_long_enough_for_a_job_and_its_retry():
    """The pool's backstop replaces a worker that overstays: a job run again alone must not
    be taken for one."""
    assert longest_job_s(100) >= 2 * (2 * 100)


def _record(ident: str, index: int, reason: str = "", wall_ms: float = 1000.0, **metrics) -> dict:
    return {"candidate": {"id": ident, "provenance": {"index": index}},
            "verdict": {"passed": not reason, "stage": "numerics" if reason else "accepted", "reason": reason,
                        "metrics": {"job_wall_ms": wall_ms, **metrics}}}


def test_the_benchmark_counts_repeats_and_nan_as_waste():
    records = [_record("a", 0), _record("b", 1, "nan_or_inf", 500.0, t_timing_ms=300.0, gate_timer_wait_ms=100.0),
               _record("a", 2, wall_ms=2000.0), _record("c", 3, "too_fast", 700.0, t_timing_ms=700.0)]
    records[3]["verdict"]["stage"] = "timing"  # rejected by the timing check itself: not after it
    assert wasted_work(records) == {"repeats": 1, "repeats_worker_s": 2.0, "nan_or_inf": 1, "nan_or_inf_worker_s": 0.5,
                                    "rejected_after_timing": 1, "their_timing_worker_s": 0.3,
                                    "their_timer_wait_s": 0.1}


def test_the_benchmark_rates_and_splits_add_up():
    class Args:
        name, device, workers, tree = "t", "cuda", 8, None

    records = [_record("a", 0, t_compile_ms=3000.0, t_execute_ms=500.0, wall_ms=4000.0, gpu_alone_ms=100.0, trace_wall_ms=700.0,
                       gate_wait_ms=200.0, gate_longest_ms=80.0, gate_longest_step="forward", gate_timer_wait_ms=300.0,
                       gate_closed_ms=300.0, gate_closures=2, gate_steps=10),
               _record("b", 1, "nan_or_inf", 1000.0, t_execute_ms=900.0, retried_alone=True, gate_long_holds=2,
                       first_failure="execute/out_of_memory", first_error_in="numerics", first_job_wall_ms=3000.0, gate_timer_wait_ms=400.0,
                       gate_long_held_ms=2500.0, gate_longest_ms=1500.0, gate_longest_step="Numerics.float64_share")]
    s = summarise(Args, records, starts=[10.0, 20.0], wall_s=120.0, busy=0.25)
    assert s["accepted_per_hour"] == 30 and s["steady_accepted_per_hour"] == 36  # 1 in 120 s; 1 in 100 s
    assert s["worker_s_per_check"] == {"compile": 3.0, "execute": 1.4}
    assert s["worker_s_outside_checks"] == 0.6  # 5 s of jobs, 4.4 s of checks
    assert s["worker_s_traces"] == 0.7  # outside the jobs' clocks
    assert s["gate_s"]["longest_hold_step"] == "Numerics.float64_share" and s["gate_s"]["waiting"] == 0.2
    assert s["gate_s"]["timers_waiting"] == 0.7
    assert (s["gate_s"]["closed"], s["gate_s"]["closures"], s["gate_s"]["shared_steps"]) == (0.3, 2, 10)
    assert s["gate_s"]["long_holds"] == {"holds": 2, "held_s": 2.5, "longest_steps": {"float64_share": 1}}
    assert s["retried_alone"] == {"jobs": 1, "accepted": 0, "first_failures": {"execute/out_of_memory in numerics": 1},
                                  "worker_s": 4.0, "rerun_waiting_s": 0.4}
    assert s["rejected_by_reason"] == {"nan_or_inf": 1}
    # 2 candidates in 5 s of jobs, 0.2 s of it waiting: 2.4 s of own work each; half accepted
    cores = __import__("os").cpu_count()
    assert s["bounds_accepted_per_hour"] == {"cores": round(cores * 3600 / 2.4 * 0.5), "gpu_alone": 36000}


def test_a_gpu_zygote_warms_dynamo_without_leaving_torch_blind_to_the_gpu(tmp_path):
    """The "dynamo" warm-up tells torch there is no GPU while it compiles; afterwards torch
    asks the real question again, and a compile still runs (here on the CPU: this host has no
    GPU, bench_gpu_warm_up measures it on one)."""
    import subprocess
    import sys

    script = f"""
import torch
real = torch.cuda.is_available
from filters.sandbox.warm import warm_for_gpu
said = warm_for_gpu("dynamo", {str(tmp_path / "cache")!r})
assert torch.cuda.is_available is real and not torch.cuda.is_initialized()
assert "dynamo" in said, said
model = torch.nn.Linear(4, 4)
assert torch.allclose(torch.compile(model, backend="aot_eager")(torch.ones(2, 4)), model(torch.ones(2, 4)))
print("WARMED", said)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "WARMED imports" in done.stdout, done.stderr[-2000:]
    refused = subprocess.run([sys.executable, "-c", "from filters.sandbox.warm import warm_for_gpu; "
                              f"warm_for_gpu('everything', {str(tmp_path)!r})"], capture_output=True, text=True)
    assert "unknown GPU warm-up" in refused.stderr


def test_a_worker_on_a_shared_gpu_runs_a_job_again_alone_after_its_memory_ran_out(cache_dir):
    """Through the real pool, with a GPU worker's options on this CPU (the task runs on the
    CPU; its allocation fails as on a full GPU): the job that ran out of memory is run again
    alone, once, and its verdict is the second run's; a job that did not is never rerun."""
    from filters.sandbox.pool import WorkerPool
    from tests.conftest import make_task, sandbox_options

    hog = make_task("return x + torch.empty(1 << 40).sum()")
    fine = make_task("return torch.tanh(x) * 2")
    options = sandbox_options(cache_dir, device="cuda", memory_guard="rlimit", max_memory_gb=2, gpu_memory_gb=1.0)
    with WorkerPool(1, options) as pool:
        ran_out, passed = pool.run_many([{"code": code, "config": {"device": "cpu", "window_ms": [1e-6, 1e6],
                                                                       "compile": False}} for code in (hog, fine)])
    assert ran_out["reason"] == "out_of_memory" and ran_out["metrics"].get("retried_alone") is True, ran_out
    assert passed["passed"] and "retried_alone" not in passed["metrics"], passed


def test_a_timer_takes_a_gap_between_steps_and_stops_no_worker_while_it_looks_for_one(tmp_path):
    """A timer that comes while a step is under way does not close the gate at once: a
    worker's step that starts while the timer looks for a gap runs, and the timer takes the
    GPU alone as soon as no step holds it. Past POLITE_S it closes the gate (never starved)."""
    from filters.checks.measure import execution
    path = str(tmp_path / "gpu0.lock")
    entered = threading.Event()
    first = threading.Thread(target=_hold, args=(GpuGate(path), 0.3, entered))
    first.start()
    entered.wait(5)
    timer, timed = GpuGate(path), threading.Event()

    def measure():
        with timer.exclusive():
            timed.set()
    measuring = threading.Thread(target=measure)
    measuring.start()
    time.sleep(0.05)
    worker = GpuGate(path)
    with worker.shared():  # the timer is looking for a gap: this step is not stopped behind it
        assert not timed.is_set()
    assert worker.waited_s < 0.1
    first.join()
    measuring.join(5)
    assert timed.is_set() and 0.2 <= timer.waited_s < execution.POLITE_S


def test_a_timer_that_finds_no_gap_closes_the_gate(tmp_path, monkeypatch):
    from filters.checks.measure import execution
    monkeypatch.setattr(execution, "POLITE_S", 0.05)
    monkeypatch.setattr(execution, "DRAIN_S", 5.0)  # the step under way ends while the gate is closed
    path = str(tmp_path / "gpu0.lock")
    entered = threading.Event()
    first = threading.Thread(target=_hold, args=(GpuGate(path), 0.4, entered))
    first.start()
    entered.wait(5)
    closing = GpuGate(path)

    def measure():
        with closing.exclusive():
            pass
    timer = threading.Thread(target=measure)
    timer.start()
    time.sleep(0.15)  # past POLITE_S: the gate is closed behind the step under way
    late = GpuGate(path)
    with late.shared():
        pass
    first.join()
    timer.join(5)
    assert late.waited_s >= 0.15  # it waited for the step under way and the timer


def _steps_beside(path: str, until: threading.Event) -> list[float]:
    """What each of a worker's short steps waited at the gate, one after another until `until`."""
    waits = []
    while not until.is_set():
        worker = GpuGate(path)
        with worker.shared("short"):
            time.sleep(0.01)
        waits.append(worker.waited_s)
    return waits


def test_a_timer_behind_a_long_step_opens_the_gate_again_and_waits_it_out_alone(tmp_path, monkeypatch):
    """A step of a second is under way (a kernel compiled at run time, a float64 forward): a
    timer that closed the gate behind it opens it again after DRAIN_S, so the other workers'
    steps go on while only the timer waits; it holds the GPU alone once the long step ends.
    Past TIMER_PATIENCE_S it keeps the gate closed, as before (never starved)."""
    from filters.checks.measure import execution
    monkeypatch.setattr(execution, "POLITE_S", 0.05)
    monkeypatch.setattr(execution, "DRAIN_S", 0.05)
    path = str(tmp_path / "gpu0.lock")
    for patience, long_step in ((30.0, 1.0), (0.0, 0.6)):
        monkeypatch.setattr(execution, "TIMER_PATIENCE_S", patience)
        entered, timed = threading.Event(), threading.Event()
        holder = threading.Thread(target=_hold, args=(GpuGate(path), long_step, entered))
        holder.start()
        entered.wait(5)
        timer = GpuGate(path)

        def measure():
            with timer.exclusive():
                timed.set()
        measuring = threading.Thread(target=measure)
        measuring.start()
        waits = _steps_beside(path, timed)
        holder.join()
        measuring.join(5)
        assert timed.is_set() and timer.waited_s >= long_step - 0.1  # it waited the long step out
        gate = timer.metrics()
        assert gate["gate_closures"] == gate["gate_reopened"] + 1  # the last closure is the one it measured in
        if patience:
            assert len(waits) > 10 and max(waits) < 0.2, waits  # the others' steps went on meanwhile
            assert gate["gate_reopened"] >= 3
            assert gate["gate_closed_ms"] >= gate["gate_reopened"] * 50  # each closure waited DRAIN_S, then opened
        else:
            assert max(waits) >= long_step - 0.2, waits  # closed behind the long step, as before
            assert gate["gate_reopened"] == 0 and gate["gate_closed_ms"] >= (long_step - 0.2) * 1e3


def test_a_timer_reports_its_wait_as_it_goes_not_only_once_it_holds_the_gpu(tmp_path, monkeypatch):
    """The zygote extends a job's time limit by the wait it has been told of: a timer behind
    a long step (it can wait TIMER_PATIENCE_S and a step) reports while it waits, so a job
    near its limit is not killed for other workers' steps (a red team's timer waited 4.8 s
    before its first report)."""
    from filters.checks.measure import execution
    monkeypatch.setattr(execution, "POLITE_S", 0.05)
    monkeypatch.setattr(execution, "DRAIN_S", 0.05)
    path = str(tmp_path / "gpu0.lock")
    entered = threading.Event()
    holder = threading.Thread(target=_hold, args=(GpuGate(path), 1.0, entered))
    holder.start()
    entered.wait(5)
    reports = []
    monkeypatch.setattr(execution, "report_gate_wait", lambda waited: reports.append((time.perf_counter(), waited)))
    timer, began = GpuGate(path), time.perf_counter()
    with timer.exclusive():
        inside = time.perf_counter()
    holder.join()
    waiting = [(at - began, waited) for at, waited in reports if at < inside - 0.2]  # well before it got in
    assert inside - began >= 0.8 and timer.reopened >= 3
    assert any(waited >= 0.5 for at, waited in waiting), waiting[-3:]  # told of while it waited
    assert all(waited <= at + 0.01 for at, waited in waiting)  # never more than it has waited


def test_a_step_behind_a_closed_gate_reports_its_wait_as_it_goes(tmp_path, monkeypatch):
    """A timer out of patience keeps the gate closed behind a long step: a step that comes
    meanwhile waits with it, and says so while it waits."""
    from filters.checks.measure import execution
    monkeypatch.setattr(execution, "POLITE_S", 0.01)
    monkeypatch.setattr(execution, "TIMER_PATIENCE_S", 0.0)
    path = str(tmp_path / "gpu0.lock")
    entered, timed = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold, args=(GpuGate(path), 1.0, entered))
    holder.start()
    entered.wait(5)
    other = GpuGate(path)
    other._report_wait = lambda *waited: None  # another worker's: its reports go to its own zygote
    timer = threading.Thread(target=_timed, args=(other, timed))
    timer.start()
    time.sleep(0.1)  # the timer has closed the gate
    reports = []
    monkeypatch.setattr(execution, "report_gate_wait", lambda waited: reports.append((time.perf_counter(), waited)))
    step, began = GpuGate(path), time.perf_counter()
    with step.shared("short"):
        inside = time.perf_counter()
    holder.join()
    timer.join(5)
    assert timed.is_set() and inside - began >= 0.6
    assert any(waited >= 0.4 and at < inside - 0.2 for at, waited in reports), reports[-3:]


def _timed(gate: GpuGate, done: threading.Event) -> None:
    with gate.exclusive():
        done.set()


def test_a_quick_measure_holds_the_gate_one_call_at_a_time(tmp_path):
    """A quick measure (the resize search's, the GPU shared) makes seven calls: each is a
    step of its own, so a timer that closes the gate behind it drains one call, not seven."""
    import torch

    from filters.checks.measure.execution import measure

    class Slow(torch.nn.Module):
        def forward(self, x):
            time.sleep(0.03)
            return x + 1

    gate = GpuGate(str(tmp_path / "gpu0.lock"))
    eager_ms, _ = measure(Slow(), [torch.ones(2)], {"window_ms": (1.0, 100.0)}, torch.device("cpu"), False, gate)
    assert eager_ms >= 30 and gate.steps == 7  # the first call, three to warm up, three samples
    assert 0.03 <= gate.longest_s < 0.1  # one call at the most, not the 0.21 s of all seven
