"""The GPU's memory counted per job (filters/sandbox/gpu_memory.py): a job holds what it grew
to, never what another holds; the OS frees what a dead job held; a step that outgrows what
its job holds runs again once it holds more, and a job the others crowd out is handed back
for a run alone, not judged. The units are flock(2)s on files, the same code on the CPU as on
a GPU; only the allocator's cap is not set here (there is no CUDA allocator)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from filters.sandbox import gpu_memory
from filters.checks.measure.execution import GpuGate
from filters.sandbox.gpu_memory import UNIT_BYTES, GpuMemory, GpuMemoryBusy, make_units
from filters.checks.harness import evaluate
from filters.checks.measure.resize import as_stored
from filters.sandbox.worker import gpu_memory_ran_out
from tests.conftest import make_task

GIB = 2**30


@pytest.fixture
def lock(tmp_path) -> str:
    """A GPU of 4 GiB counted in 8 units, as the pool makes it."""
    path = str(tmp_path / "gpu0.lock")
    make_units(path, 8)
    return path


def _job(lock: str, most_gib: float = 4) -> GpuMemory:
    memory = GpuMemory(lock, 8, int(most_gib * GIB), None)
    memory.start()
    return memory


def test_a_job_starts_small_and_grows_by_doubling_up_to_the_most_it_may_hold(lock):
    job = _job(lock, most_gib=3)
    assert job.held_bytes == GIB
    assert job.grow() and job.held_bytes == 2 * GIB
    assert job.grow() and job.held_bytes == 3 * GIB  # the most a job may hold, not twice
    assert not job.grow() and job.held_bytes == 3 * GIB  # beyond it, the out-of-memory is the task's own
    assert job.metrics()["gpu_memory_grown"] == 2


def test_jobs_never_hold_the_same_memory_and_a_crowded_out_one_gives_up(lock, monkeypatch):
    monkeypatch.setattr(gpu_memory, "GROW_WAIT_S", 0.2)
    first, second = _job(lock), _job(lock)
    assert first.grow() and not set(first.held) & set(second.held)  # 2 + 1 of 4 GiB
    assert second.grow()  # the last 1 GiB
    with pytest.raises(GpuMemoryBusy, match="held"):
        first.grow()  # 4 GiB wanted, 2 held by the other job
    assert len(first.held) == 4 and len(second.held) == 4  # a failed try gives back what it took
    assert first.waited_s >= 0.2


def test_what_a_dead_job_held_comes_free(lock, monkeypatch):
    monkeypatch.setattr(gpu_memory, "GROW_WAIT_S", 2.0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a job that holds 3 GiB of 4 and is killed
        try:
            holder = _job(lock)
            holder.grow()
            holder._hold(6, 0)
            os.write(write, b"x")
            signal.pause()
        finally:
            os._exit(1)
    os.read(read, 1)
    survivor = _job(lock)
    assert len(survivor.held) == 2  # the only free GiB... and the dead job's
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert survivor.grow() and survivor.grow() and survivor.held_bytes == 4 * GIB


class _Needs:
    """A step that runs out of GPU memory until its job holds `needed` bytes."""

    def __init__(self, needed: int, error=torch.OutOfMemoryError):
        self.needed, self.error, self.calls = needed, error, 0

    def __call__(self, value):
        self.calls += 1
        if gpu_memory.held.held_bytes < self.needed:
            raise self.error("CUDA out of memory. Tried to allocate 1.50 GiB")
        return value


def test_a_step_that_outgrows_its_job_runs_again_once_the_job_holds_more(lock, monkeypatch):
    monkeypatch.setattr(gpu_memory, "held", _job(lock))
    gate = GpuGate(lock)
    step = _Needs(4 * GIB)
    assert gate.call(step, "out") == "out" and step.calls == 3  # 1 -> 2 -> 4 GiB
    cublas = _Needs(2 * GIB + UNIT_BYTES, RuntimeError)  # a GPU library's allocation failure, in its words
    assert GpuGate(lock).call(cublas, 1) == 1 and gpu_memory.held.held_bytes == 4 * GIB


class _ReportFails(_Needs):
    """Where NVML cannot start in the jail (the H200 host's), the allocator's out-of-memory
    surfaces as an internal assert of its report: it was taken for the task's own at 1 GiB."""

    def __call__(self, value):
        self.calls += 1
        if gpu_memory.held.held_bytes < self.needed:
            raise RuntimeError("NVML_SUCCESS == DriverAPI::get()->nvmlInit_v2_() INTERNAL ASSERT FAILED at "
                               "\"/pytorch/c10/cuda/CUDACachingAllocator.cpp\":1131")
        return value


def test_an_out_of_memory_whose_report_failed_grows_the_job_too(lock, monkeypatch):
    monkeypatch.setattr(gpu_memory, "held", _job(lock))
    step = _ReportFails(2 * GIB)
    assert GpuGate(lock).call(step, 0) == 0 and step.calls == 2


def test_a_step_past_the_most_a_job_may_hold_fails_with_its_own_error_and_others_are_not_retried(lock, monkeypatch):
    monkeypatch.setattr(gpu_memory, "held", _job(lock, most_gib=2))
    step = _Needs(3 * GIB)
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        GpuGate(lock).call(step, 0)
    assert step.calls == 2  # once at 1 GiB, once at 2: then the task's own

    def wrong_shapes():
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    with pytest.raises(RuntimeError, match="shapes"):
        GpuGate(lock).call(wrong_shapes)
    monkeypatch.setattr(gpu_memory, "held", None)

    def out_of_memory():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")
    with pytest.raises(torch.OutOfMemoryError):  # a worker that counts no memory: nothing to grow into
        GpuGate(lock, alone=True).call(out_of_memory)


CROWDED_TASK = """\
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        if x.numel() > 0:
            raise RuntimeError("CUDA out of memory. Tried to allocate 3.00 GiB")
        return x

def get_inputs():
    return [torch.randn(4, 4)]

def get_init_inputs():
    return []
"""


def test_a_job_crowded_out_of_gpu_memory_is_no_verdict_and_runs_again_alone(lock, monkeypatch):
    """The checks see an out-of-memory that the worker retries alone, whichever step it hit:
    never a size signal for the resize search, never an eager error."""
    monkeypatch.setattr(gpu_memory, "GROW_WAIT_S", 0.1)
    others = _job(lock)
    others._hold(6, 0)  # every unit but the job's own
    monkeypatch.setattr(gpu_memory, "held", _job(lock))  # not a unit free for it to grow into
    verdict = evaluate(CROWDED_TASK, {"timing_lock": lock})
    assert (verdict["stage"], verdict["reason"]) == ("execute", "out_of_memory")
    assert "other jobs on this GPU held" in verdict["detail"]
    assert gpu_memory_ran_out(verdict, {"device": "cuda", "gpu_memory_gb": 2.0}, {})


def _outgrows_the_gpu_past(elements: int) -> str:
    """A task whose allocation fails, as on a full GPU, while its input, or any tensor still
    alive when a model of it first runs (what an earlier try left behind), holds more than
    `elements`: on a GPU that memory is not free for the next try."""
    oom = "raise RuntimeError('CUDA out of memory. Tried to allocate 8.00 GiB')"
    return make_task(f"if x.numel() > {elements}:\n    {oom}\n"
                     "if not hasattr(self, 'looked'):\n    self.looked = True\n"
                     f"    if any(issubclass(type(o), torch.Tensor) and o.numel() > {elements} for o in gc.get_objects()):\n"
                     f"        {oom}\n"
                     "return torch.tanh(x) * 2.0", header="import gc")


def test_a_task_too_large_for_the_most_a_job_holds_is_shrunk_by_the_execute_check_not_run_again_alone(lock, monkeypatch):
    """At the size as written it outgrows the most one job may hold: that is the task's own
    size (the timing check would shrink it anyway), so the execute check shrinks it by the
    timing check's search, and the pool's rewrite of the submitted code is the code the
    checks ran. A task that runs out at every size is still handed back to run alone."""
    monkeypatch.setattr(gpu_memory, "held", _job(lock, most_gib=2))
    code = _outgrows_the_gpu_past(4096)  # 64 x 256 as written
    verdict = evaluate(code, {"timing_lock": lock, "compile": False, "window_ms": [1e-6, 1e6]})
    assert verdict["passed"], verdict
    assert verdict["metrics"]["resized"] is True and gpu_memory.held.held_bytes == 2 * GIB and not gpu_memory.held.alone
    assert as_stored(code, verdict["metrics"]) == verdict["code"] != code
    assert evaluate(verdict["code"], {"compile": False, "window_ms": [1e-6, 1e6]})["metrics"].get("resized") is False

    monkeypatch.setattr(gpu_memory, "held", _job(lock, most_gib=2))
    never_fits = evaluate(_outgrows_the_gpu_past(0), {"timing_lock": lock, "compile": False})
    assert (never_fits["stage"], never_fits["reason"]) == ("execute", "out_of_memory")
    assert gpu_memory_ran_out(never_fits, {"device": "cuda", "gpu_memory_gb": 2.0}, {})


def test_a_size_whose_warm_up_outgrows_the_most_a_job_holds_bounds_the_timing_search(lock, monkeypatch):
    """A size the task's first call fits in, whose warm-up calls then outgrow the most one job
    may hold: the timing check takes it for a bound of its search and goes smaller, as it
    does for a size that cannot load, rather than end the job for a run alone."""
    monkeypatch.setattr(gpu_memory, "held", _job(lock, most_gib=2))
    # out of memory where more than two tensors of over 4096 elements are alive as it starts:
    # a first call's input and its copy fit; a warm-up call's copy beside them and the first output does not
    alive = "sum(issubclass(type(o), torch.Tensor) and o.numel() > 4096 for o in gc.get_objects())"
    code = make_task(f"if x.numel() > 4096 and {alive} > 2:\n"
                     "    raise RuntimeError('CUDA out of memory. Tried to allocate 8.00 GiB')\n"
                     "return torch.tanh(x) * 2.0", header="import gc")
    config = {"timing_lock": lock, "compile": False, "window_ms": [1e-6, 1e6]}
    verdict = evaluate(code, config)
    assert verdict["passed"], verdict
    assert verdict["metrics"]["resized"] is True and verdict["metrics"]["resize_rounds"] >= 1
    assert as_stored(code, verdict["metrics"]) == verdict["code"] != code

    monkeypatch.setattr(gpu_memory, "held", None)  # uncounted: no size signal, the worker runs it alone
    uncounted = evaluate(code, config)
    assert (uncounted["stage"], uncounted["reason"], uncounted["metrics"]["error_in"]) == ("execute", "out_of_memory",
                                                                                           "timing")


def test_where_no_memory_is_counted_an_out_of_memory_is_never_a_size_signal(lock, monkeypatch):
    """A worker that counts no memory cannot tell the task's size from a crowded GPU: the
    execute check leaves the size as written, and the worker runs the job again alone."""
    monkeypatch.setattr(gpu_memory, "held", None)
    verdict = evaluate(_outgrows_the_gpu_past(4096), {"timing_lock": lock, "compile": False})
    assert (verdict["stage"], verdict["reason"]) == ("execute", "out_of_memory")
    assert "resized" not in verdict["metrics"]


def test_the_units_are_made_for_a_jailed_worker_to_read_whatever_the_pools_umask(tmp_path):
    """A worker runs as another uid with the lock folder read-only: a unit it cannot open is
    memory no job can hold."""
    path = str(tmp_path / "gpu0.lock")
    old = os.umask(0o077)
    try:
        make_units(path, 3)
        make_units(path, 3)  # every worker's start makes them again: the same files
    finally:
        os.umask(old)
    folder = gpu_memory.units_folder(path)
    assert sorted(os.listdir(folder)) == ["0000", "0001", "0002", "alone"]
    assert os.stat(folder).st_mode & 0o777 == 0o755
    assert {os.stat(os.path.join(folder, name)).st_mode & 0o777 for name in os.listdir(folder)} == {0o644}


class _OutgrowsItsJob(torch.nn.Module):
    """A pure model whose forward runs out of GPU memory until its job holds 2 GiB."""

    def forward(self, x):
        if gpu_memory.held.held_bytes < 2 * GIB:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB")
        return x * 2


def test_a_check_that_swallows_a_tasks_failures_still_lets_its_job_grow(lock, monkeypatch):
    """The ablation's trace and the float64 probe take a task's failure for "no graph" or
    "no double kernel". Running out of GPU memory is neither: a red team's task got a final
    `untraceable` where its job had not grown, and a float64 probe was skipped unseen."""
    from filters.checks.measure import ablation, numerics
    x = torch.ones(2, 3)
    for step, args, expected in ((ablation.trace_on, (_OutgrowsItsJob(), [x]), "a graph"),
                                 (numerics.float64_share, (_OutgrowsItsJob().double(), [x], [x * 2], 1e-2, 1e-2), 0.0)):
        monkeypatch.setattr(gpu_memory, "held", _job(lock))
        result = GpuGate(lock).call(step, *args)
        assert (result is not None if expected == "a graph" else result == expected)
        assert gpu_memory.held.held_bytes == 2 * GIB
        gpu_memory.held.give_back()
    monkeypatch.setattr(gpu_memory, "held", _job(lock))
    with pytest.raises(torch.OutOfMemoryError):  # outside a gate's retry the error stands, not a None
        ablation.trace_on(_OutgrowsItsJob(), [x])


def test_a_job_that_waits_for_memory_reports_the_wait_as_it_goes(lock):
    """The zygote adds what a job reports waiting to its time limit. A job whose start waited
    on others' memory reported nothing until it held some: a long wait could time it out."""
    others = _job(lock)
    others._hold(8, 0)  # every unit
    waiting, reports = GpuMemory(lock, 8, 4 * GIB, None), []
    starting = threading.Thread(target=waiting.start, args=(lambda: reports.append(waiting.waited_now_s),))
    starting.start()
    time.sleep(0.3)
    assert not waiting.held and reports and reports[-1] >= 0.2  # still waiting, and it said so
    others.give_back()
    starting.join(5)
    assert waiting.held_bytes == GIB and 0.3 <= waiting.waited_s == waiting.waited_now_s  # counted once


def test_one_job_a_gpu_runs_alone_and_it_may_grow_into_all_but_an_eighth_waiting_for_it(lock):
    """A job run again after its memory ran out is the one of its GPU that may hold all the
    units but an eighth (a second waits for the first to end). It keeps each unit it takes,
    so the others' new jobs cannot take them back first, and waits as long as they hold what
    it needs; the eighth it leaves lets another worker's job start whatever it holds."""
    others = _job(lock)
    others._hold(6, 0)  # 3 of 4 GiB
    first, second = GpuMemory(lock, 8, 2 * GIB, None), GpuMemory(lock, 8, 2 * GIB, None)
    first.run_alone()
    first.start()
    waits = []
    queued = threading.Thread(target=second.run_alone, args=(lambda: waits.append(second.waited_now_s),))
    queued.start()
    growing = threading.Thread(target=first.grow)
    growing.start()  # to 2 GiB: 1 held by the others
    time.sleep(0.3)
    assert not second.alone and waits  # the first is still the one run alone; the second said it waits
    assert len(first.held) == 2 and growing.is_alive()
    others.give_back()
    growing.join(5)
    assert first.held_bytes == 2 * GIB
    assert first.grow() and first.held_bytes == 3.5 * GIB  # 7 of 8 units: 1.75 times the most of any other job
    assert not first.grow()  # past them, the task's own
    assert _job(lock, most_gib=0.5).held_bytes == 0.5 * GIB  # a new job still starts, in what it left
    first.give_back()
    queued.join(5)
    assert second.alone and second.most == 7


def test_a_job_run_alone_shares_the_gpu_and_grows_where_memory_is_counted(lock, monkeypatch):
    """Its steps held the GPU alone: on the H200 that cost such a job 48 of its 57 s, waiting
    for a gap at every step. Its memory counted, no other job takes what it needs."""
    job = GpuMemory(lock, 8, 1 * GIB, None)
    job.run_alone()
    job.start()
    monkeypatch.setattr(gpu_memory, "held", job)
    gate, step = GpuGate(lock, alone=True), _Needs(3 * GIB)
    assert gate.call(step, "out") == "out" and step.calls == 3  # 1 -> 2 -> 3.5 GiB, past the ordinary most
    assert gate.alone_s == 0.0 and gate.shared_s > 0.0
    assert gate.metrics()["gpu_memory_held_mb"] == 3584


def test_a_compiled_call_that_takes_the_gate_itself_grows_its_job_too(lock, monkeypatch):
    """A compiled run takes the gate at each of its runs (checks.gated_inductor), so it was
    never retried: in a job run alone, whose memory had grown only as far as its eager steps
    needed, a compiled run that needed more was a final out_of_memory."""
    monkeypatch.setattr(gpu_memory, "held", _job(lock))
    gate, step = GpuGate(lock), _Needs(2 * GIB)

    def compiled_call():
        with gate.shared("compiled run"):
            return step("out")
    assert gate.growing(compiled_call) == "out" and step.calls == 2


def test_a_rerun_is_counted_and_a_trace_that_runs_out_takes_the_gpu_uncounted(lock, monkeypatch):
    """The job run again alone holds the turn to run alone and may grow into nearly all the
    memory. A trace that outgrew its counted memory does not wait for that turn (its 20 s
    could pass waiting, and an untraced task is rejected): it gives its units back and runs
    uncounted, every step alone, as a job run alone did before memory was counted."""
    from filters.sandbox import cuda_start
    options, caps = {"gpu_pool_gb": 4.0, "gpu_memory_gb": 2.0}, []
    monkeypatch.setattr(cuda_start, "_uncounted_alone", False)
    monkeypatch.setattr(gpu_memory, "held", None)
    cuda_start.count_gpu_memory({**options, "alone": True}, lock, None, caps.append)  # the rerun's child
    rerun = gpu_memory.held
    assert rerun.alone and rerun.held_bytes == GIB and rerun.most == 7 and not caps
    cuda_start.count_gpu_memory({**options, "alone": True}, lock, None, caps.append)  # started again: it stands
    assert gpu_memory.held is rerun and rerun.alone and rerun.held_bytes == GIB and not caps
    rerun.give_back()

    monkeypatch.setattr(gpu_memory, "held", None)
    cuda_start.count_gpu_memory(options, lock, None, caps.append)  # a trace's child, as any job starts
    trace = gpu_memory.held
    assert trace.held_bytes == GIB and not trace.alone
    cuda_start.count_gpu_memory({**options, "alone": True}, lock, None, caps.append)  # its reading ran out
    assert gpu_memory.held is None and not trace.held and caps == [cuda_start.ALONE_SHARE]
    assert cuda_start._uncounted_alone
    assert _job(lock, most_gib=4).grow()  # nothing of the trace's is held, nor the turn to run alone
    steps = GpuGate(lock, alone=True)
    with steps.shared("a step"):
        pass
    assert steps.alone_s > 0.0 and steps.shared_s == 0.0  # uncounted: every step alone
