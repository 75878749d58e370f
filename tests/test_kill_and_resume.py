"""A run killed with SIGKILL and started again with the same command finishes with no lost
and no duplicated samples (issue 8's acceptance, on the multi-process DirectRunner)."""
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from tests.conftest import interruptible


@pytest.mark.slow
def test_sigkill_mid_run_then_the_same_command_finishes_cleanly(tmp_path, cache_dir):
    out = tmp_path / "killed"
    store = cache_dir / "verdicts"
    command = [sys.executable, "-m", "pipeline.cli", "run", "--num-samples", "6", "--out", str(out),
               "--cache-dir", str(cache_dir), "--seed", "5", "--library", "torch", "--",
               "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    before = set(store.rglob("*.json")) if store.exists() else set()
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and first.poll() is None:
        if len((set(store.rglob("*.json")) if store.exists() else set()) - before) >= 2:
            break  # some validations have finished: kill it in the middle of the round
        time.sleep(0.5)
    assert first.poll() is None, "the run ended before it could be killed"
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    finished_before_kill = {path: path.stat().st_mtime_ns for path in set(store.rglob("*.json")) - before}
    assert not (out / "data").exists()  # killed mid-round: nothing was written yet

    again = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "verdicts found in the verdict store, decided before: not run again" in again.stderr  # it says so
    accepted = pq.read_table(out / "data").column("id").to_pylist()
    rejected = pq.read_table(out / "rejects").column("id").to_pylist()
    assert len(accepted) >= 6
    assert len(set(accepted)) == len(accepted) and len(set(rejected)) == len(rejected)
    assert not set(accepted) & set(rejected)
    # validations finished before the kill were reused, not redone: their records were never rewritten
    assert all(path.stat().st_mtime_ns == mtime for path, mtime in finished_before_kill.items())


@pytest.mark.slow
def test_ctrl_c_mid_validation_stops_the_run_at_once_and_ends_its_sandbox_workers(tmp_path, cache_dir):
    """Ctrl-C reaches the run while a Beam stage waits for sandbox jobs. It used to be raised
    again as Beam's RuntimeError, and the exit then waited for every job under way."""
    import psutil

    store = cache_dir / "verdicts"
    before = set(store.rglob("*.json")) if store.exists() else set()
    command = [sys.executable, "-m", "pipeline.cli", "run", "--num-samples", "6", "--out", str(tmp_path / "run"),
               "--cache-dir", str(cache_dir), "--seed", "29", "--library", "torch"]
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           preexec_fn=interruptible)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len((set(store.rglob("*.json")) if store.exists() else set()) - before) < 1:
        time.sleep(0.5)
    sandbox = psutil.Process(run.pid).children(recursive=True)
    assert run.poll() is None and sandbox, "the run was not validating"
    interrupted = time.monotonic()
    run.send_signal(signal.SIGINT)
    _, stderr = run.communicate(timeout=60)
    assert time.monotonic() - interrupted < 15, "the exit waited for the jobs under way"
    assert run.returncode == 130, stderr[-2000:]
    assert "interrupted; finished work is kept" in stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr  # one line, not Beam's traceback
    # its time counts in the run's stats, though it finished no round (an H200 call interrupted
    # mid-round was missing from the resumed run's accepted/h)
    ledger = json.loads((tmp_path / "run" / ".staging" / "invocations.json").read_text())
    assert [entry["decided"] for entry in ledger.values()] == [0]
    assert list(ledger.values())[0]["wall_time_s"] > 1.0
    _, alive = psutil.wait_procs(sandbox, timeout=10)
    assert not alive
