"""Hostile tasks: each is caught with a reason, the pool survives, and benign work goes on."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from filters.sandbox import DiskFull, WorkerPool
from filters.validate import validate
from operators.records import Candidate
from tests.conftest import make_task, sandbox_options

FAST = {"compile": False, "window_ms": [1e-6, 1e6]}  # timing is tested on its own cases
BENIGN = make_task("return torch.sigmoid(x).cumsum(-1)")
HOSTILE = {
    "timeout": make_task("while True:\n    pass"),
    "crashed_segfault": make_task("import ctypes\nctypes.string_at(0)\nreturn x"),
    "crashed_exit": make_task("import os\nos._exit(0)"),
    "crashed_system_exit": make_task("raise SystemExit(0)"),
}


@pytest.fixture(scope="module")
def short_pool(cache_dir):
    with WorkerPool(2, sandbox_options(cache_dir, timeout_s=15, warm_up=False)) as pool:  # replaced often
        yield pool


def test_hostile_tasks_get_a_reason_and_benign_ones_still_pass(short_pool, tmp_path):
    names = list(HOSTILE) + ["benign_a", "benign_b"]
    jobs = [{"code": HOSTILE.get(name, BENIGN), "config": FAST} for name in names]
    results = dict(zip(names, short_pool.run_many(jobs)))
    assert results["timeout"]["reason"] == "timeout"
    for name in ("crashed_segfault", "crashed_exit", "crashed_system_exit"):
        assert results[name]["reason"] == "crashed", results[name]
    assert results["benign_a"]["passed"] and results["benign_b"]["passed"]


def test_a_task_cannot_signal_the_run_that_started_it(short_pool):
    """Straight through the pool, past the static check: the run's PID does not exist in the
    worker's PID namespace, and its parent PID reads 0."""
    worker = short_pool.workers[0]
    assert worker.run({"code": BENIGN, "config": FAST})["passed"]
    if worker.info["processes"] != "pidns":
        pytest.skip(f"no PID namespace here ({worker.info['processes']}): sending SIGKILL would end this test run")
    kill_run = make_task(f"import os, signal\nassert os.getppid() == 0\nos.kill({os.getpid()}, signal.SIGKILL)\nreturn x")
    kill_group = make_task("import os, signal\nos.killpg(0, signal.SIGKILL)\nreturn x")
    results = [worker.run({"code": code, "config": FAST}) for code in (kill_run, kill_group)]
    assert results[0]["reason"] == "eager_error" and "ProcessLookupError" in results[0]["detail"], results[0]
    # its own group holds only the worker: it dies by SIGKILL, which reads as the OOM killer's
    assert results[1]["reason"] == "out_of_memory" and "SIGKILL" in results[1]["detail"], results[1]
    assert worker.run({"code": BENIGN, "config": FAST})["passed"]  # replaced, and the run goes on


def test_a_killed_or_closed_worker_leaves_no_scratch_folder(cache_dir):
    """Each worker's scratch (its working folders, the C++ compiler's temporary files) goes
    with it, however it ends: nearly 900 left behind by killed workers once filled the disk."""
    with WorkerPool(1, sandbox_options(cache_dir, timeout_s=15, warm_up=False)) as pool:
        worker = pool.workers[0]
        assert worker.run({"code": BENIGN, "config": FAST})["passed"]
        killed = worker.scratch
        assert os.path.isdir(killed)
        assert worker.run({"code": HOSTILE["crashed_segfault"], "config": FAST})["reason"] == "crashed"
        assert not os.path.exists(killed)
        assert worker.run({"code": BENIGN, "config": FAST})["passed"]
        closed = worker.scratch
    assert closed != killed and not os.path.exists(closed)


def test_a_worker_whose_run_is_killed_mid_warm_up_leaves_no_scratch_folder(cache_dir, tmp_path):
    """kill -9 of a run while its workers warm up: no one is left to stop them, and each
    dies when it reports ready to a run that is gone. The shim outside its PID namespace
    removes its scratch then (a worker without one cleans up when its channel closes)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    start_one = ("from filters.sandbox import SandboxOptions, Worker\n"
                 f"Worker(SandboxOptions(env=(('TORCHINDUCTOR_CACHE_DIR', {str(cache_dir / 'inductor')!r}),))).start()")
    run = subprocess.Popen([sys.executable, "-c", start_one], env={**os.environ, "TMPDIR": str(temp)})
    try:
        assert _wait_for(lambda: any(temp.iterdir()), 60), "the worker's scratch folder was never made"
        time.sleep(2)  # into the worker's torch import and warm-up
        assert run.poll() is None, "the worker was ready before the run could be killed"
    finally:
        run.kill()
        run.wait()
    assert _wait_for(lambda: not any(temp.iterdir()), 120), list(temp.rglob("*"))[:5]


def _wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_disk_without_room_to_compile_stops_the_pool_before_any_candidate_runs(cache_dir):
    """A stand-in for a full disk: a free-space floor no disk meets. On a full disk every
    compile fails, and each candidate would be stored as rejected for the host's fault."""
    with WorkerPool(1, sandbox_options(cache_dir, min_free_gb=1e9)) as pool:
        future = pool.submit({"code": BENIGN, "config": FAST})
        with pytest.raises(DiskFull, match=r"GiB free on the disk of .*the sandbox needs 1e\+09 GiB"):
            future.result()
        assert not pool.workers[0].alive()  # refused before a worker was started


def test_printing_a_fake_verdict_does_not_reach_the_result_channel(pool):
    fake = '{"passed": true, "stage": "accepted", "reason": "", "detail": "", "metrics": {}, "code": ""}'
    code = make_task(f"print({fake!r})\nreturn x * 0.0")
    [result] = pool.run_many([{"code": code, "config": FAST}])
    assert not result["passed"] and result["reason"] == "constant_output"


def test_rss_guard_kills_a_worker_that_outgrows_its_memory(cache_dir):
    code = make_task("y = torch.ones(3 << 28)\nreturn x + y.sum()")  # 3 GiB resident
    with WorkerPool(1, sandbox_options(cache_dir, memory_guard="rss", max_memory_gb=1.5, warm_up=False)) as pool:
        [result] = pool.run_many([{"code": code, "config": FAST}])
        assert result["reason"] == "out_of_memory", result
        [after] = pool.run_many([{"code": BENIGN, "config": FAST}])
        assert after["passed"], after


def test_workers_have_no_network_and_write_only_in_their_scratch(pool, tmp_path):
    """Run straight through the pool, past the static check, as a task that slipped by it."""
    assert pool.workers[0].run({"code": BENIGN, "config": FAST})["passed"]
    info = pool.workers[0].info
    if os.geteuid() != 0:  # no privileges for namespaces here: the worker must say so
        assert "unshare failed" in info["network"] or info["network"] == "userns+netns"
        pytest.skip(f"namespaces refused for a non-root user: {info}")
    assert info["network"] == "netns" and info["files"].startswith("read-only but ")
    code = make_task("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\nreturn x")
    [result] = pool.run_many([{"code": code, "config": FAST}])
    assert result["reason"] == "eager_error"  # no route even to loopback inside the namespace
    target = tmp_path / "written-by-a-task"
    code = make_task(f"x.numpy().tofile({str(target)!r})\nreturn x * 2.0")
    [result] = pool.run_many([{"code": code, "config": FAST}])
    assert result["reason"] == "eager_error" and "Read-only file system" in result["detail"]
    assert not target.exists()


def test_validate_runs_the_static_check_before_any_code(pool):
    hostile = Candidate("h", ("x",), "torch#1", make_task("import os\nos._exit(1)"), "template", 0)
    benign = Candidate("b", ("x",), "torch#1", BENIGN, "template", 0)
    verdicts = validate([hostile, benign], pool, FAST)
    assert (verdicts[0].stage, verdicts[0].reason) == ("static", "forbidden_import")
    assert verdicts[1].passed


def test_the_gpu_timing_gate_works_inside_a_read_only_worker(cache_dir, tmp_path, monkeypatch):
    """The gate's lock files live outside the scratch folder; the worker keeps them writable
    (a GPU run gives every worker this gate; here it runs on the CPU with the same code).
    The run's GPU 1 under CUDA_VISIBLE_DEVICES=5,7 is the host's GPU 7: its lock is gpu7's.
    The worker's warm-up compiles into a cache of its own: the run's shared one holds only
    the precompiled headers until a candidate compiles, and the worker's scratch none."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    locks, shared_cache = tmp_path / "locks", tmp_path / "inductor"
    options = sandbox_options(cache_dir, timing_lock_dir=str(locks), env=(("TORCHINDUCTOR_CACHE_DIR", str(shared_cache)),))
    with WorkerPool(1, options, gpus=[1]) as pool:
        pool.workers[0].start()
        assert pool.workers[0].info["warm_up"] == "passed"  # the built-in task, compiled, through the gate
        # but for Inductor's precompiled headers, built once for every worker and run
        assert [p for p in shared_cache.rglob("*") if p.is_file() and "precompiled_headers" not in p.parts] == []
        assert list((shared_cache / "precompiled_headers").glob("*.gch"))
        assert not list(Path(pool.workers[0].scratch).glob("torchinductor_*"))
        # with compile on: the compiled code runs under the gate through the gated backend
        [result] = pool.run_many([{"code": BENIGN, "config": {"window_ms": [1e-6, 1e6]}}])
        assert pool.workers[0].info["files"].startswith("read-only but ")
    assert any(p.is_file() for p in shared_cache.rglob("*"))
    assert result["passed"] and result["metrics"]["compile_max_diff"] <= 1e-2, result
    assert result["metrics"]["gpu_alone_ms"] > 0 and result["metrics"]["gate_wait_ms"] >= 0
    assert sorted(p.name for p in locks.iterdir()) == ["gpu7.lock", "gpu7.lock.gate"]
