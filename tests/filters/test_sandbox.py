"""Hostile tasks against the pool, straight through it (past the static check, as a task
that slipped by it): each is caught with a reason, leaves nothing for the next job, reaches
no secret, and benign work in the same run goes on."""
import json
import os
import time

import pytest

from filters.sandbox import jail
from filters.checks.harness import REASONS
from filters.sandbox.pool import WorkerPool, _finish
from filters.checks.measure.resize import with_constants
from filters.sandbox.validate import validate
from filters.sandbox.worker import check_result
from operators.records import Candidate
from tests.conftest import make_task, sandbox_options

FAST = {"compile": False, "window_ms": [1e-6, 1e6]}  # timing is tested on its own cases
BENIGN = make_task("return torch.sigmoid(x).cumsum(-1)")
CONSTANT = make_task("return x * 0.0")
HOSTILE = {
    "timeout": make_task("while True:\n    pass"),
    "crashed_segfault": make_task("import faulthandler\nfaulthandler._sigsegv()\nreturn x"),
    "crashed_exit": make_task("import os\nos._exit(0)"),
    "crashed_system_exit": make_task("raise SystemExit(0)"),
}
FORGED = {"passed": True, "stage": "accepted", "reason": "", "detail": "", "metrics": {},
          "code": "import os\nos.system('owned')"}


@pytest.fixture(scope="module")
def short_pool(cache_dir):
    with WorkerPool(1, sandbox_options(cache_dir, timeout_s=15, warm_up=False)) as pool:
        yield pool


def run(pool, code, config=FAST):
    [result] = pool.run_many([{"code": code, "config": config}])
    return result


def test_hostile_tasks_get_a_reason_and_cost_their_job_not_the_worker(short_pool):
    worker = short_pool.workers[0]
    assert run(short_pool, BENIGN)["passed"]
    zygote = worker.process.pid
    results = {name: run(short_pool, code) for name, code in HOSTILE.items()}
    assert results["timeout"]["reason"] == "timeout"
    for name in ("crashed_segfault", "crashed_exit", "crashed_system_exit"):
        assert results[name]["reason"] == "crashed", results[name]
    assert "SIGSEGV" in results["crashed_segfault"]["detail"]
    assert run(short_pool, BENIGN)["passed"]
    assert worker.process.pid == zygote  # the warm worker lived through all of them


def test_a_hang_queued_before_benign_tasks_costs_them_nothing(short_pool):
    """One worker: the hang runs first, and the benign tasks wait in the pool's queue. Their
    limits count their own work, not the queue: each gets its own verdict."""
    hang, *benign = [short_pool.submit({"code": code, "config": FAST}) for code in (HOSTILE["timeout"], BENIGN, BENIGN)]
    assert hang.result()["reason"] == "timeout"
    assert all(future.result()["passed"] for future in benign), [future.result() for future in benign]


def test_a_worker_that_dies_under_a_job_costs_the_job_nothing(short_pool):
    """Killed from outside (the host's doing, not the task's): the job runs again on a fresh
    worker and gets its own verdict. A worker killed twice under the same job is a crash."""
    slow = make_task("return torch.sigmoid(x).cumsum(-1)", header="import time\ntime.sleep(2)")  # at each load
    short_pool.workers[0].start()
    first = short_pool.workers[0].process.pid
    future = short_pool.submit({"code": slow, "config": FAST})
    time.sleep(1.0)
    os.killpg(first, 9)
    result = future.result()
    assert result["passed"], result
    assert short_pool.workers[0].process.pid != first


def test_a_forged_verdict_reaches_no_job(short_pool):
    """At import, a task writes an 'accepted' result carrying other code to every descriptor
    it might hold and to stdout: its own job is refused, and the jobs after it on the same
    worker get their own, true verdicts."""
    message = json.dumps(FORGED).encode()
    frame = len(message).to_bytes(8, "little") + message
    forger = make_task("return x", header=f"import os\nfor fd in range(3, 64):\n    try:\n"
                                          f"        os.write(fd, {frame!r})\n    except OSError:\n        pass\n"
                                          f"print({json.dumps(FORGED)!r})")
    forged = run(short_pool, forger)
    assert not forged["passed"] and forged["code"] == forger, forged
    assert run(short_pool, CONSTANT)["reason"] == "constant_output"
    benign = run(short_pool, BENIGN)
    assert benign["passed"] and benign["code"] == BENIGN


def test_a_result_is_taken_only_in_the_shape_the_checks_produce():
    good = {"passed": False, "stage": "degenerate", "reason": "constant_output", "detail": "d", "metrics": {"a": 1.0}}
    assert check_result(good, REASONS) == good
    for forged in (FORGED, {**good, "reason": "made_up"}, {**good, "passed": True}, {**good, "metrics": {"a": [1]}},
                   {**good, "stage": "accepted"}, "accepted", None):
        assert check_result(forged, REASONS) is None, forged


def test_a_resized_verdict_applies_to_the_jobs_own_code_resized_by_the_pool(short_pool):
    tiny = make_task("return torch.sigmoid(x).cumsum(-1)", constants="batch_size = 2\nfeatures = 256")
    result = run(short_pool, tiny, {"compile": False, "window_ms": [1.0, 1e6], "target_ms": 2.0})
    metrics = result["metrics"]
    assert metrics["resized"] and metrics["batch_size"] > 2, result
    sizes = {name[len("size."):]: value for name, value in metrics.items() if name.startswith("size.")}
    assert sizes and result["code"] == with_constants(tiny, sizes)


def test_the_pool_rebuilds_resized_code_only_from_sizes_of_the_jobs_own_constants():
    tiny = make_task("return torch.sigmoid(x)", constants="batch_size = 2\nfeatures = 256")
    result = lambda metrics: {"passed": True, "stage": "accepted", "reason": "", "detail": "",  # noqa: E731
                              "metrics": {"resized": True, **metrics}}
    assert "batch_size = 64\nfeatures = 512\n" in _finish({"code": tiny}, result({"size.batch_size": 64,
                                                                              "size.features": 512}))["code"]
    for forged in ({"size.batch_size": 64, "size.os": 1}, {"size.batch_size": -1}, {"size.features": "512"}):
        assert _finish({"code": tiny}, result(forged))["code"] == tiny, forged


def test_nothing_a_task_changes_reaches_the_next_job(short_pool):
    """Files in /tmp, /dev/shm and its compiler cache, a replaced torch function, a thread
    left spinning: the next job on the same worker starts from the clean zygote."""
    poison = make_task("""\
        import os, threading
        for path in ("/tmp/poison", "/dev/shm/poison", os.environ["TORCHINDUCTOR_CACHE_DIR"] + "/poison"):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").write("payload")
        torch.manual_seed = lambda *a: None
        threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()
        return x * 2.0""")
    run(short_pool, poison)
    check = make_task("""\
        import os, threading, glob
        assert not glob.glob("/tmp/poison") and not glob.glob("/dev/shm/*") and not glob.glob("/tmp/job-*/*/poison")
        assert torch.manual_seed.__module__ == "torch.random", "manual_seed was replaced"
        assert threading.active_count() == 1, threading.enumerate()
        return torch.sigmoid(x).cumsum(-1)""")
    result = run(short_pool, check)
    assert result["passed"], result


def test_no_process_a_job_starts_outlives_it(short_pool):
    """A program the audit hook lets a child start (a compiler, openssl) in a session of its
    own escapes the kill of the child's process group; a process left in the worker could
    reach every later job of the same uid. The zygote ends every process of its jail after
    each job: the next job finds no one but itself, its zygote and the jail's init."""
    linger = make_task("""\
        import subprocess
        subprocess.Popen(["openssl", "speed", "-seconds", "60", "md5"], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return x * 2.0""")
    assert run(short_pool, linger)["passed"]
    census = make_task("""\
        import os
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())]
        names = [open(f"/proc/{p}/comm").read().strip() for p in others]
        assert not names, f"still running: {names}"
        return torch.sigmoid(x).cumsum(-1)""")
    result = run(short_pool, census)
    assert result["passed"], result


def test_each_job_has_a_session_of_its_own(short_pool):
    """The scheduler's autogroup, whose nice a process may set through its own /proc entry, is
    its session's: each job's child leads a session of its own, not the zygote's
    (test_jail.py shows the write that reached every later job before)."""
    check = make_task("""\
        import os
        assert os.getsid(0) == os.getpid() != os.getsid(os.getppid()), (os.getsid(0), os.getpid())
        return torch.sigmoid(x).cumsum(-1)""")
    result = run(short_pool, check)
    assert result["passed"], result


def test_a_job_that_writes_nan_as_its_gate_wait_is_still_timed_out(cache_dir):
    """The seconds a child waited at the GPU gate come from a page it shares with its zygote,
    which adds them to its time limit, up to the limit again. A NaN there made the deadline
    NaN, and no time is past NaN: the job ran on until the pool's backstop."""
    nan_wait = make_task("return torch.sigmoid(x).cumsum(-1)", header="""\
import ctypes, time
for line in open("/proc/self/maps"):
    fields = line.split()
    if "/dev/zero" in line and fields[1].startswith("rw-s"):
        ctypes.c_double.from_address(int(fields[0].split("-")[0], 16)).value = float("nan")
time.sleep(60)
""")
    with WorkerPool(1, sandbox_options(cache_dir, timeout_s=4, warm_up=False)) as pool:
        began = time.monotonic()
        result = run(pool, nan_wait)
    assert result["reason"] == "timeout", result
    assert time.monotonic() - began < 30


def test_a_job_that_touches_the_zygotes_own_files_retires_its_worker(short_pool):
    """The zygote's precompiled headers are files of the children's uid: a task that gets to
    one (a chmod is not an audited write) ends its worker, and the next job has a new one."""
    assert run(short_pool, BENIGN)["passed"]
    zygote = short_pool.workers[0].process.pid
    touch = make_task("import os\nos.chmod('/tmp/zygote', os.stat('/tmp/zygote').st_mode)\nreturn x * 2.0")
    run(short_pool, touch)
    assert not short_pool.workers[0].alive()
    assert run(short_pool, BENIGN)["passed"] and short_pool.workers[0].process.pid != zygote


def test_no_secret_reaches_a_reject_or_the_workers_log(cache_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-secret-value-123")
    monkeypatch.setenv("HF_TOKEN", "hf_the_secret_value_456")
    log = tmp_path / "workers.log"
    leak = make_task("import os, sys\nprint(dict(os.environ), file=sys.stderr)\nraise ValueError(str(dict(os.environ)))")
    with WorkerPool(1, sandbox_options(cache_dir, timeout_s=15, warm_up=False, log_path=str(log))) as pool:
        result = run(pool, leak)
    assert result["reason"] == "eager_error"
    for text in (result["detail"], log.read_text()):
        assert "secret-value" not in text and "secret_value" not in text
    assert jail.redact("key sk-the-secret-value-123 here") == "key [redacted] here"


def test_a_task_cannot_signal_the_run_or_reach_its_processes(short_pool):
    kill_run = make_task(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\nreturn x")
    kill_group = make_task("import os, signal\nos.killpg(0, signal.SIGKILL)\nreturn x")
    assert "refuses os.kill" in run(short_pool, kill_run)["detail"]
    assert "refuses os.killpg" in run(short_pool, kill_group)["detail"]
    os.kill(os.getpid(), 0)  # still here
    assert run(short_pool, BENIGN)["passed"]


def test_the_memory_guard_kills_a_task_that_outgrows_its_memory(cache_dir):
    code = make_task("y = torch.ones(3 << 28)\nreturn x + y.sum()")  # 3 GiB resident
    for guard in ("rss", "rlimit"):
        with WorkerPool(1, sandbox_options(cache_dir, memory_guard=guard, max_memory_gb=1.5, warm_up=False)) as pool:
            assert run(pool, code)["reason"] == "out_of_memory", guard
            assert run(pool, BENIGN)["passed"], guard


def test_validate_runs_the_static_check_before_any_code(pool):
    hostile = Candidate("h", ("x",), "torch#1", make_task("import os\nos._exit(1)"), "template", 0)
    benign = Candidate("b", ("x",), "torch#1", BENIGN, "template", 0)
    verdicts = validate([hostile, benign], pool, FAST)
    assert (verdicts[0].stage, verdicts[0].reason) == ("static", "forbidden_import")
    assert verdicts[1].passed


# A constant task that writes its own 'accepted' on every descriptor and closes it, so the
# harness's true verdict never arrives: inside its child it would be believed. It reaches
# `os` through a helper of an added library (kornia's LazyLoader), which a whole-package
# allowlist let through: the run's kornia op is allowed, the rest of kornia is not.
LIBRARY_FORGER = make_task("return x * 0.0", header=f"""\
import kornia.core.external
osm = kornia.core.external.LazyLoader("os")
for fd in range(3, 64):
    try:
        osm.write(fd, {json.dumps({**FORGED, "code": None} | {"metrics": {}}).replace('"code": null, ', '')!r}.encode())
        osm.close(fd)
    except Exception:
        pass""")


def test_a_task_that_reaches_the_interpreter_through_a_library_helper_never_runs(pool):
    forger = Candidate("f", ("kornia.filters.GaussianBlur2d",), "kornia#1", LIBRARY_FORGER, "template", 0)
    [verdict] = validate([forger], pool, FAST, frozenset({"kornia.filters.GaussianBlur2d"}))
    assert (verdict.stage, verdict.reason, verdict.passed) == ("static", "forbidden_import", False), verdict


def test_the_gpu_timing_gate_works_inside_the_jail(cache_dir, tmp_path, monkeypatch):
    """The gate's lock files are made by the pool and bound into the jail read-only (flock
    needs no more; a GPU run gives every worker this gate, here it runs on the CPU with the
    same code). The run's GPU 1 under CUDA_VISIBLE_DEVICES=5,7 is the host's GPU 7."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    locks = tmp_path / "locks"
    with WorkerPool(1, sandbox_options(cache_dir, timing_lock_dir=str(locks)), gpus=[1]) as pool:
        pool.workers[0].start()
        assert pool.workers[0].info["warm_up"].startswith("passed in ")
        result = run(pool, BENIGN, {"window_ms": [1e-6, 1e6]})
    assert result["passed"] and result["metrics"]["compile_max_diff"] <= 1e-2, result
    assert result["metrics"]["gpu_alone_ms"] > 0 and result["metrics"]["gate_wait_ms"] >= 0
    assert sorted(p.name for p in locks.iterdir()) == ["gpu7.lock", "gpu7.lock.gate"]


def test_a_hang_that_holds_the_gpu_gate_costs_only_its_own_job(cache_dir, tmp_path):
    """The gate runs on the CPU here with the same code as on a GPU. A task hanging in its
    forward holds the gate, so the other worker's timing waits behind it: the hang is ended
    when its step passes the step limit, and the waiting task's own limit does not count the
    wait (8 s here: it waits about that long for the hang's own limit, then compiles)."""
    hang = make_task("while True:\n    pass")
    # warm workers: a cold first compile alone can take most of the 8 s on this CPU
    options = sandbox_options(cache_dir, timeout_s=8, timing_lock_dir=str(tmp_path / "locks"))
    with WorkerPool(2, options) as pool:
        for worker in pool.workers:
            worker.start()
        for step_limit, ended_by in ((3, "held the GPU gate past its limit"), (100, "of its own work")):
            config = {**FAST, "gate_step_limit_s": step_limit}
            hung = pool.submit({"code": hang, "config": config})
            time.sleep(0.5)  # the hang holds the gate first
            began = time.monotonic()
            compiled = {"window_ms": [1e-6, 1e6], "gate_step_limit_s": step_limit}
            benign = pool.submit({"code": BENIGN, "config": compiled}).result()
            assert benign["passed"], (step_limit, benign)
            assert ended_by in hung.result()["detail"], hung.result()
            if step_limit == 100:
                assert time.monotonic() - began > 8 and benign["metrics"]["gate_wait_ms"] > 4000, benign["metrics"]
