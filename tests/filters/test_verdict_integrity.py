"""An attacker with the interpreter in the job's child: the task's code runs with `os` and
`sys` (the pool runs raw code, past the static check, as a task that slipped by it would).
It writes any bytes to any descriptor, exits early, forks, renames. Its task is constant
(`x * 0.0`): whatever it does, it is never accepted, its worker is replaced when it forged,
and the job after it on the same worker gets its own, true verdict."""
import json
import textwrap

import pytest

from filters.checks.registry import DEFAULTS, measures
from filters.sandbox.pool import WorkerPool
from filters.sandbox.worker import confirm
from tests.conftest import make_task, sandbox_options

FAST = {"compile": False, "window_ms": [1e-6, 1e6]}
BENIGN = make_task("return torch.sigmoid(x).cumsum(-1)")


def forged_verdict(metrics: dict) -> str:
    return json.dumps({"passed": True, "stage": "accepted", "reason": "", "detail": "", "metrics": metrics})


def constant_task_that(payload: str) -> str:
    """A constant task whose module runs `payload` (with os, sys, json) when it is loaded."""
    return make_task("return x * 0.0", header="import os, sys, json\n" + payload)


# Every measure the checks take, with values that pass every threshold but the clock's.
CLAIMED = {name: (True if kind is bool else 1 if kind is int else 5.0) for name, kind in measures(DEFAULTS).items()}


def on_every_descriptor(payload: str, then: str = "os._exit(0)") -> str:
    """Task code that writes `payload` (an expression, evaluated in the task) to every
    descriptor it may hold, then does `then`."""
    return f"""
for fd in range(3, 256):
    try:
        os.write(fd, {payload})
    except OSError:
        pass
{then}
"""


def forged_with(change: str) -> str:
    """A forged 'accepted' carrying CLAIMED after `change` (a statement on `claimed`)."""
    return (f"claimed = json.loads({json.dumps(CLAIMED)!r})\n{change}\n"
            + on_every_descriptor("json.dumps({'passed': True, 'stage': 'accepted', 'reason': '', 'detail': '', "
                                  "'metrics': claimed}).encode()"))


ATTACKS = {
    # the checks' answer, well formed, on every descriptor it may hold, then gone
    "a forged verdict on every descriptor, then exit": on_every_descriptor(f"{forged_verdict({})!r}.encode()"),
    # every measure named, but more time claimed than the zygote saw pass
    "every measure forged, more time than passed": forged_with("claimed.update(eager_ms=90.0, t_execute_ms=1.0)"),
    # a forged verdict with a measure left out
    "a measure missing": forged_with("claimed.pop(sorted(claimed)[0])"),
    # bytes that are no answer at all
    "garbage on every descriptor": on_every_descriptor("os.urandom(4096)", then=""),
    # a child of its own, in a session of its own, writes after the checks answered (the
    # audit hook refuses the fork: the task then fails as it loads)
    "a forked child forges after the checks": "if os.fork() == 0:\n    os.setsid()\n    import time\n"
                                              "    time.sleep(1.0)\n"
                                              + textwrap.indent(on_every_descriptor(f"{forged_verdict({})!r}.encode()"),
                                                                "    "),
    # the zygote's own files renamed and put back (a rename changes their ctime)
    "a rename of the zygote's files": """
try:
    os.rename('/tmp/zygote', '/tmp/zygote-moved')
    os.rename('/tmp/zygote-moved', '/tmp/zygote')
except OSError:
    pass
""",
}


@pytest.fixture(scope="module")
def one_worker(cache_dir):
    with WorkerPool(1, sandbox_options(cache_dir, timeout_s=20, warm_up=False)) as pool:
        yield pool


def run(pool, code):
    [result] = pool.run_many([{"code": code, "config": FAST}])
    return result


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_constant_task_holding_the_interpreter_is_never_accepted_and_costs_no_other_job(one_worker, attack):
    result = run(one_worker, constant_task_that(ATTACKS[attack]))
    assert not result["passed"], result
    assert result["reason"] in ("crashed", "constant_output", "eager_error"), result
    after = run(one_worker, BENIGN)
    assert after["passed"] and after["code"] == BENIGN, after


def test_a_forged_answer_replaces_the_worker(one_worker):
    assert run(one_worker, BENIGN)["passed"]
    zygote = one_worker.workers[0].process.pid
    result = run(one_worker, constant_task_that(ATTACKS["a forged verdict on every descriptor, then exit"]))
    assert result["reason"] == "crashed" and "not the checks' answer" in result["detail"], result
    assert run(one_worker, BENIGN)["passed"] and one_worker.workers[0].process.pid != zygote


def test_the_zygote_decides_from_the_measures_whatever_the_child_claims():
    """`confirm` runs in the zygote: a child's "accepted" is a claim that every measure was
    taken; the thresholds are the zygote's."""
    honest_but_constant = {"passed": True, "stage": "accepted", "reason": "", "detail": "",
                           "metrics": {**CLAIMED, "input_tolerance_share": 0.0, "job_wall_ms": 1e6}}
    decided = confirm(honest_but_constant, FAST)
    assert not decided["passed"] and decided["stage"] != "accepted", decided
    rejected = {"passed": False, "stage": "degenerate", "reason": "constant_output", "detail": "", "metrics": {}}
    assert confirm(rejected, FAST) == rejected  # a child may always reject itself


def test_a_compiler_is_not_a_way_to_start_other_programs(one_worker):
    """The audit hook lets a task's compile start the compilers; `gcc -wrapper PROGRAM` would
    have them start anything (a red team's route to /bin/sh inside the jail)."""
    shell = make_task("return x * 2.0", header="import subprocess\nsubprocess.run(['gcc', '-wrapper', "
                      "'/bin/sh,-c,id', '-E', '-x', 'c', '/dev/null'], capture_output=True)")
    result = run(one_worker, shell)
    assert result["reason"] == "eager_error" and "starts other programs: '-wrapper'" in result["detail"], result
