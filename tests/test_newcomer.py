"""opsynth as a new user meets it, each command driven as they drive it (the CLI in a
subprocess): it says what it does and why, stops when it is done, refuses a second run on the
same folder, and never answers a mistake with a traceback."""
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from operators.records import Candidate, Verdict
from outputs.dataset import write_dataset
from tests.conftest import make_task
from tests.llm_standin import LLMStandIn
from tests.outputs.test_dataset import RUN_INFO


def opsynth(*args, timeout=600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def test_a_second_command_on_the_same_out_is_refused_with_the_holders_pid(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "from pipeline.out_dir import prepare_out_dir; import sys, time; "
                               f"prepare_out_dir({str(out)!r}); print('held', flush=True); time.sleep(120)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        second = opsynth("run", "--out", out, "--num-samples", "1", "--library", "torch",
                         "--cache-dir", tmp_path / "cache", timeout=120)
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"is in use by another opsynth command (pid {holder.pid})" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        holder.kill()
        holder.wait()
    # the holder's exit lets go of the folder: the next command takes it
    taken = subprocess.run([sys.executable, "-c", "from pipeline.out_dir import prepare_out_dir; "
                            f"prepare_out_dir({str(out)!r})"], capture_output=True, text=True, timeout=60)
    assert taken.returncode == 0, taken.stderr


def _written(folder, held: int = 0):
    """A finished folder: one row, two rejects, `held` accepted rows held back."""
    def record(index, passed, stage="", reason="", detail=""):
        candidate = Candidate(f"id{index}", ("torch.relu", "torch.tanh"), "torch#2", make_task("return x"), "template",
                              0, {"index": index})
        return candidate, Verdict(f"id{index}", stage or "accepted", passed, reason, detail, {"eager_ms": 2.0})
    records = [record(0, True), record(1, False, "degenerate", "constant_output", "outputs for two inputs agree"),
               record(2, False, "static", "forbidden_import", "line 3: import of 'os'")]
    held_records = [record(3 + i, True) for i in range(held)]
    return write_dataset(folder, records, {**RUN_INFO, "target_samples": 1}, held=held_records)


def test_rejects_says_why_by_reason_with_an_example(tmp_path):
    _written(tmp_path / "run", held=2)
    shown = opsynth("rejects", tmp_path / "run", timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("2 rejected of 5 candidates; 2 more accepted and held back in held/ (not "
                                   "rejected); 1 rows in data/.")
    assert "degenerate/constant_output: output does not depend on the input" in shown.stdout
    assert "e.g. torch.relu, torch.tanh: outputs for two inputs agree" in shown.stdout
    missing = opsynth("rejects", tmp_path / "nowhere", timeout=120)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "holds no rejects/" in missing.stderr


def test_held_back_rows_are_no_rejects_and_every_count_agrees(tmp_path):
    stats = _written(tmp_path / "run", held=2)
    assert (stats["accepted"], stats["held_back"], stats["rejected"], stats["composed"]) == (1, 2, 2, 5)
    assert "surplus" not in stats["rejected_by_reason"]
    assert pq.read_table(tmp_path / "run" / "held").num_rows == 2
    assert pq.read_table(tmp_path / "run" / "rejects").num_rows == 2
    card = (tmp_path / "run" / "README.md").read_text()
    assert "1 row of 5 candidates; 2 more passed every check and are kept apart in `held/`" in card
    assert "2 rejected (`rejects/`)" in card
    funnel = {row["stage"]: row for row in stats["funnel"]}
    assert {stage: row["rejected"] for stage, row in funnel.items() if row["rejected"]} == {"static": 1, "degenerate": 1}
    assert funnel["compose"]["entered"] == 5 and stats["funnel"][-1]["entered"] - stats["funnel"][-1]["rejected"] == 3
    assert "matched against the reference" not in card and "no reference benchmark was given" in card
    assert "pip install opsynth" not in card


def test_a_report_that_cannot_be_written_is_one_line(tmp_path):
    _written(tmp_path / "run")
    (tmp_path / "a-file").write_text("")
    result = opsynth("report", tmp_path / "run", "--against", tmp_path / "run", "--out", tmp_path / "a-file" / "report",
                     timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "Not a directory" in result.stderr
    assert result.stderr.strip().count("\n") == 0


@pytest.mark.slow
def test_validate_says_why_each_task_fails_and_writes_a_card_of_a_validation(tmp_path, cache_dir):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "good.py").write_text(make_task("return torch.tanh(self.lin(x))", init="self.lin = nn.Linear(256, 256)"))
    (tasks / "leaks.py").write_text(make_task("return x", header="import os"))
    config = tmp_path / "fast.yaml"
    config.write_text("checks: {compile: false}\n")
    out = tmp_path / "audit"
    result = opsynth("validate", tasks, "--out", out, "--device", "cpu", "--workers", "1", "--config", config,
                     "--cache-dir", cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "good.py: passes" in result.stderr
    assert "leaks.py: static/forbidden_import: line 3: import of 'os'" in result.stderr
    assert f"validating 2 tasks of {tasks} on 1 workers" in result.stderr  # said at the start, not after the end
    card = (out / "README.md").read_text()
    assert f"the tasks of `{tasks}` were re-audited" in card and "composer; every candidate" not in card
    assert "validate composer" not in card and "(`--reference`)" not in card  # no flag validate has
    assert "opsynth dedupe TASKS --against" in card
    assert "1 row of 2 candidates; 1 rejected" in card
    assert "The rows' ops are not known" in card


OPS = ["torch.nn.Linear", "torch.nn.GELU", "torch.nn.Tanh"]


@pytest.mark.slow
def test_a_run_stops_at_its_target_without_waiting_for_the_work_in_flight(tmp_path, cache_dir):
    """One candidate never ends; the run has its sample before that candidate's time limit
    and stops, instead of waiting the limit out (5 silent minutes, at the default)."""
    out = tmp_path / "run"
    config = tmp_path / "fast.yaml"
    config.write_text("checks: {compile: false}\nllm: {concurrency: 1, repair_rounds: 0}\n")
    with LLMStandIn(["endless"]) as llm:
        env = {**os.environ, "OPENAI_BASE_URL": llm.base_url}
        env.pop("OPENAI_API_KEY", None)
        began = time.monotonic()
        result = opsynth("run", "--composer", "llm", "--llm-model", "standin-1", "--ops", ",".join(OPS),
                         "--num-samples", "1", "--max-candidates", "4", "--timeout-s", "300", "--workers", "2",
                         "--library", "torch", "--out", out, "--cache-dir", cache_dir, "--config", config, env=env)
        took = time.monotonic() - began
    assert result.returncode == 0, result.stderr[-3000:]
    assert took < 240, f"the run waited for its endless candidate ({took:.0f} s)"
    assert "HTTP Request:" not in result.stderr  # httpx's line per request, from whichever process composed
    stats = json.loads((out / "stats.json").read_text())
    assert stats["accepted"] == 1 and "timeout" not in stats["rejected_by_reason"]
    assert "reached --num-samples" in stats["stop_reason"]


@pytest.mark.slow
def test_a_crawl_says_how_far_it_is_and_keeps_each_library_it_finished(tmp_path):
    """Each library is crawled and cached on its own: a crawl of two after one was crawled
    probes only the other (as a crawl killed after its first library resumes)."""
    cache = tmp_path / "cache"
    first = opsynth("crawl", "--library", "einops", "--cache-dir", cache, "--out", tmp_path / "one.parquet")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "crawling einops (the first time" in first.stderr and " parts in " in first.stderr
    both = opsynth("crawl", "--library", "einops", "--library", "kornia.filters", "--cache-dir", cache,
                   "--out", tmp_path / "two.parquet")
    assert both.returncode == 0, both.stderr[-2000:]
    assert "crawling kornia.filters (the first time" in both.stderr and "crawling einops" not in both.stderr
    names = set(pq.read_table(tmp_path / "two.parquet").column("name").to_pylist())
    assert {name.split(".")[0] for name in names} == {"einops", "kornia"}


@pytest.mark.slow
def test_ctrl_c_during_a_crawl_is_one_line(tmp_path):
    """The terminal sends Ctrl-C to the whole process group: each crawl process printed
    `Process SpawnPoolWorker-N:` and a traceback before the command's own line."""
    crawl = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "crawl", "--library", "torch", "--cache-dir",
                              str(tmp_path / "cache"), "--out", str(tmp_path / "c.parquet")],
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    said = []
    for line in crawl.stderr:  # the parts are under way once they are announced
        said.append(line)
        if " parts on " in line:
            break
    time.sleep(4)
    os.killpg(crawl.pid, signal.SIGINT)
    said += crawl.stderr.readlines()
    assert crawl.wait(timeout=60) == 130, "".join(said)
    told = "".join(said)
    assert "opsynth: interrupted" in told and "Traceback" not in told and "SpawnPoolWorker" not in told, told
