"""What a child sends back, through the real pool (past the static check, as a task with the
interpreter): no string of its result names a secret of this process, however it is spelt,
and no line it writes, however long, costs this process memory or silences a later job's log."""
import json
import time
import uuid

from filters.sandbox import pool as pool_module
from tests.conftest import make_task

FAST = {"compile": False, "window_ms": [1e-6, 1e6]}
SECRET = "sk-the-secret-value-123"


def run(pool, code):
    [result] = pool.run_many([{"code": code, "config": FAST}])
    return result


def own_verdict(verdict: dict) -> str:
    """A task that, with the interpreter, writes its own well-formed verdict on its result
    pipe at import and exits: the zygote takes it as the checks' own."""
    message = json.dumps(verdict)
    return make_task("return x", header=f"import os\nfor fd in range(3, 64):\n    try:\n"
                                        f"        os.write(fd, {message!r}.encode())\n    except OSError:\n"
                                        f"        pass\nos._exit(0)")


def test_no_string_of_a_result_names_a_secret(pool, monkeypatch):
    monkeypatch.setenv("OPSYNTH_TEST_API_KEY", SECRET)
    spelt, reversed_ = "-".join(SECRET), SECRET[::-1]
    verdict = {"passed": False, "stage": "degenerate", "reason": "constant_output", "detail": " ".join(reversed_),
               "metrics": {"note": spelt, "hex": SECRET.encode().hex(), spelt[:60]: 1.0, "eager_ms": 2.5}}
    result = run(pool, own_verdict(verdict))
    assert result["reason"] == "constant_output", result  # the child's own verdict, as the zygote took it
    assert result["metrics"]["eager_ms"] == 2.5
    text = json.dumps({key: value for key, value in result.items() if key != "code"})
    assert "[redacted]" in text and result["detail"] == "[redacted]"
    for leaked in (spelt, reversed_, " ".join(reversed_), SECRET.encode().hex(), "s-e-c-r-e-t"):
        assert leaked not in text, text


def test_a_flood_on_stderr_costs_no_memory_and_silences_no_later_job(pool, cache_dir):
    """512 MiB on one line with no newline, then 1.6 MB of short lines: the line is cut, the
    job's lines past its budget are dropped, and the next jobs' lines on both workers appear."""
    log = cache_dir / "workers.log"
    flood = make_task("raise ValueError('flooded')", header=(
        "import os, sys\n"
        "if not hasattr(sys, 'flooded'):\n"
        "    sys.flooded = True\n"
        "    for _ in range(512):\n"
        "        os.write(2, b'x' * (1 << 20))\n"
        "    sys.stderr.write(('y' * 99 + '\\n') * (1 << 14))\n"
        "    sys.stderr.flush()\n"))
    before = resident_bytes()
    started = time.monotonic()
    assert run(pool, flood)["reason"] == "eager_error"
    grown = resident_bytes() - before
    print(f"512 MiB flood: {time.monotonic() - started:.1f} s, this process grew {grown >> 20} MiB")
    assert grown < 64 << 20
    markers = [f"later-job-{uuid.uuid4().hex}" for _ in pool.workers]
    for marker in markers:  # one per worker: the idle workers are taken in turn
        assert run(pool, make_task(f"import sys\nprint({marker!r}, file=sys.stderr)\nreturn x * 2.0"))["passed"]
    text = wait_for(log, markers)
    cut = [line for line in text.splitlines() if line.startswith("xxxx")]
    assert cut and all(len(line) < pool_module.MAX_LOG_LINE + 100 for line in cut)
    assert f"a line of {(512 << 20) + 100} bytes" in cut[-1]  # the first short line ends it
    assert "[workers.log: this job's output cut here]" in text
    assert text.count("y" * 99) * 100 <= pool_module.MAX_JOB_LOG_BYTES


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) * 1024


def wait_for(log, markers: list[str], timeout_s: float = 30.0) -> str:
    """The log once every marker is in it: a worker's lines reach it on a thread of their own."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = log.read_text(errors="replace")
        if all(marker in text for marker in markers) or time.monotonic() > deadline:
            assert all(marker in text for marker in markers), [m for m in markers if m not in text]
            return text
        time.sleep(0.2)
