"""`opsynth run` on Beam's DaskRunner, on a real dask.distributed cluster: a scheduler and
two workers, each a process of its own started here, as they would be on separate hosts,
with the output and the cache (verdict store, catalog) in one folder they all see. One
worker is killed with SIGKILL while it validates; the run still decides every composed
index exactly once, and its records are the ones the DirectRunner makes of the same jobs."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("distributed", reason="the DaskRunner needs opsynth[dask]")
import psutil  # noqa: E402  (distributed's own dependency)

from pipeline.staging import read_rounds  # noqa: E402

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"


@pytest.fixture
def dask_cluster(tmp_path):
    """A scheduler and two single-thread workers without nannies: a killed worker stays dead."""
    scheduler_file = tmp_path / "scheduler.json"
    common = ["--scheduler-file", str(scheduler_file), "--no-dashboard"]
    processes = [_start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                         "--port", "0", *common], tmp_path / "scheduler.log")]
    _wait_for(scheduler_file.exists, 60, "the dask scheduler wrote no scheduler file")
    for name in ("w0", "w1"):
        processes.append(_start([sys.executable, "-m", "distributed.cli.dask_worker", "--name", name,
                                 "--nthreads", "1", "--no-nanny", "--memory-limit", "0",
                                 "--local-directory", str(tmp_path / name), *common], tmp_path / f"{name}.log"))
    address = json.loads(scheduler_file.read_text())["address"]
    _wait_for(lambda: _workers_seen(address) == 2, 120, "the two dask workers did not join the scheduler")
    yield address, processes[1:]
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.mark.slow
def test_a_run_on_a_dask_cluster_loses_and_repeats_nothing_when_a_worker_is_killed(tmp_path, cache_dir, dask_cluster):
    address, (victim, survivor) = dask_cluster
    store = cache_dir / "verdicts"
    before = set(store.rglob("*.json"))
    out = tmp_path / "dask"
    command = [sys.executable, "-m", "pipeline.cli", "run", "--num-samples", "4", "--out", str(out),
               "--cache-dir", str(cache_dir), "--seed", "23", "--library", "torch", "--workers", "1", "--",
               f"--runner={DASK_RUNNER}", f"--dask_client_address={address}"]
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def victim_mid_validation():  # its sandbox worker is running and some verdicts are in the shared store
        return bool(psutil.Process(victim.pid).children(recursive=True)) and len(set(store.rglob("*.json")) - before) >= 1
    _wait_for(victim_mid_validation, 300, "the first dask worker never validated")
    jailed = psutil.Process(victim.pid).children(recursive=True)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    _, alive = psutil.wait_procs(jailed, timeout=30)
    assert not alive  # its sandbox workers went with it (bwrap --die-with-parent)
    _, stderr = run.communicate(timeout=900)
    assert run.returncode == 0, stderr[-3000:]
    assert survivor.poll() is None

    records = read_rounds(out / ".staging")
    indexes = sorted(c.provenance["index"] for c, _ in records)
    assert indexes == list(range(len(indexes)))  # every composed index once: none lost, none repeated
    assert not any(v.reason == "crashed" for _, v in records)  # the kill became nobody's verdict
    stats = json.loads((out / "stats.json").read_text())
    accepted = sum(v.passed for _, v in records)
    # --num-samples of them are written, the rest held back apart (not rejected)
    assert accepted >= 4 and stats["accepted"] == 4
    assert stats["held_back"] == accepted - 4 and "surplus" not in stats["rejected_by_reason"]
    assert stats["composed"] == len(records)
    assert not list((out / ".staging").glob("beam-temp-*"))

    # The same jobs on the DirectRunner (their verdicts are in the store now) give the same
    # records. Its first round is smaller (on the local runner, FIRST_ROUND_PER_WORKER): it may
    # stop sooner, with the first of the cluster's records.
    direct = subprocess.run(command[:command.index("--out") + 1] + [str(tmp_path / "direct")]
                            + command[command.index("--out") + 2:command.index("--")],
                            capture_output=True, text=True, timeout=600)
    assert direct.returncode == 0, direct.stderr[-3000:]
    local = _decided(read_rounds(tmp_path / "direct" / ".staging"))
    assert local == _decided(records)[:len(local)] and sum(reason == "" for *_, reason in local) >= 4


def _decided(records) -> list:
    return sorted((c.provenance["index"], c.id, v.stage, v.reason) for c, v in records)


def _start(argv, log_path):
    return subprocess.Popen(argv, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def _workers_seen(address: str) -> int:
    from distributed import Client
    with Client(address, timeout=30) as client:
        return len(client.scheduler_info()["workers"])


def _wait_for(condition, timeout_s: float, failure: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    pytest.fail(failure)
