"""The child a zygote readies for its next checks job while the job before runs
(filters/sandbox/worker.py, `Ahead`): the job runs in it, and nothing another job does to it
costs the job its verdict. Through the real jailed pool, and in this process for what only
a test can do to a readied child (kill it, stop it, signal it at will)."""
import glob
import os
import shutil
import signal
import time

import pytest

from filters.sandbox import worker
from filters.sandbox.harness import REASONS
from filters.sandbox.pool import WorkerPool
from tests.conftest import make_task, sandbox_options

FAST = {"compile": False, "window_ms": [1e-6, 1e6]}
BENIGN = make_task("return torch.sigmoid(x).cumsum(-1)")
# Passes only in a process forked at least a second before its checks ran: a readied child.
AGED = make_task("""\
    import os
    started = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    age = float(open("/proc/uptime").read().split()[0]) - started
    assert age > 1.0, f"forked {age:.2f} s before its checks: not a readied child"
    return torch.sigmoid(x).cumsum(-1)""")
# Every signal it can send to every other process of its jail but the zygote and init,
# through pidfds (no audit event): where Landlock scopes signals (ABI 6+) the kernel refuses
# them; elsewhere they reach the child readied for the next job.
SIGNALS_EVERYONE = make_task("""\
    import os, signal
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        if pid in (1, os.getpid(), os.getppid()):
            continue
        for number in (signal.SIGSTOP, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGKILL):
            try:
                signal.pidfd_send_signal(os.pidfd_open(pid), number)
            except OSError:
                pass
    return x * 2.0""")


@pytest.fixture(scope="module")
def one_worker(cache_dir):
    with WorkerPool(1, sandbox_options(cache_dir, timeout_s=30, warm_up=False)) as pool:
        yield pool


def run(pool, code):
    [result] = pool.run_many([{"code": code, "config": FAST}])
    return result


def test_a_checks_job_runs_in_the_child_readied_before_it_came(one_worker):
    assert run(one_worker, BENIGN)["passed"]  # the next job's child is readied now
    time.sleep(1.5)
    result = run(one_worker, AGED)
    assert result["passed"], result


def test_a_job_that_signals_every_process_it_sees_costs_the_next_job_nothing(one_worker):
    run(one_worker, SIGNALS_EVERYONE)
    for _ in range(2):  # the child readied during the attack, and the one after
        result = run(one_worker, BENIGN)
        assert result["passed"], result


# -- in this process: the zygote's side, with a readied child a test can reach -------------

OPTIONS = {"device": "cpu", "threads": 1, "timeout_s": 60}


@pytest.fixture
def ahead(monkeypatch):
    readied = worker.Ahead(OPTIONS)
    monkeypatch.setattr(worker, "_AHEAD", readied)
    folders = set(glob.glob("/tmp/job-*"))
    yield readied
    readied.close()
    for folder in set(glob.glob("/tmp/job-*")) - folders:  # an unjailed zygote does not wipe /tmp
        shutil.rmtree(folder, ignore_errors=True)


def checks(code: str) -> dict:
    return worker._in_child({"code": code, "config": FAST}, OPTIONS, REASONS, worker._child, ahead=True)


def ignoring(pid: int, number: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        ignored = int(next(line for line in status if line.startswith("SigIgn:")).split()[1], 16)
    return bool(ignored >> (number - 1) & 1)


def test_the_job_goes_to_the_readied_child_and_the_next_is_readied_at_once(ahead):
    ahead.ready()
    first = ahead.pid
    time.sleep(1.5)
    result = checks(AGED)
    assert result["passed"], result
    assert ahead.pid not in (None, first)


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGALRM])
def test_a_readied_child_ignores_what_another_job_could_send_it(ahead, number):
    ahead.ready()
    deadline = time.monotonic() + 30
    while not ignoring(ahead.pid, signal.SIGTERM):
        assert time.monotonic() < deadline, "the readied child never came to ignore signals"
        time.sleep(0.01)
    os.kill(ahead.pid, number)
    time.sleep(1.2)
    result = checks(AGED)  # in the readied child still, which the signal did not end
    assert result["passed"], result


def test_a_stopped_readied_child_is_continued(ahead):
    ahead.ready()
    os.kill(ahead.pid, signal.SIGSTOP)
    time.sleep(1.2)
    result = checks(AGED)
    assert result["passed"], result


def test_a_killed_readied_child_gives_its_job_a_fresh_one(ahead):
    ahead.ready()
    killed = ahead.pid
    os.kill(killed, signal.SIGKILL)
    time.sleep(0.2)
    result = checks(BENIGN)
    assert result["passed"], result
    with pytest.raises(ChildProcessError):  # reaped: the job did not wait on it
        os.waitpid(killed, os.WNOHANG)
