"""`opsynth run` as a user runs it, then every accepted task checked again on its own."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest

from filters.sandbox.pool import WORKER_ENV
from operators.usage import op_usage
from pipeline.composers.template import TemplateComposer
from tests.conftest import interruptible
from tests.disguise import disguise

STANDALONE_CHECK = textwrap.dedent("""
    import statistics, sys, time, torch
    namespace = {}
    exec(open(sys.argv[1]).read(), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]()).eval()
    inputs = namespace["get_inputs"]()
    other = namespace["get_inputs"]()
    with torch.no_grad():
        a, b = model(*inputs), model(*inputs)
        c = model(*other)
        compiled = torch.compile(model)(*inputs)
        times = []
        for _ in range(7):
            start = time.perf_counter(); model(*inputs); times.append((time.perf_counter() - start) * 1e3)
    assert torch.equal(a, b), "not deterministic"
    assert torch.allclose(a, compiled, atol=1e-2, rtol=1e-2), "compile disagrees"
    assert not torch.allclose(a, c, atol=1e-2, rtol=1e-2), "constant output"
    print(statistics.median(times))
""")


COPIED = range(3)  # the reference holds disguised copies of these candidates of the run


@pytest.fixture(scope="module")
def copied(torch_catalog):
    """The first candidates this run would compose, were they not in its reference."""
    names = [spec.name for spec in torch_catalog[0]]
    composer = TemplateComposer(torch_catalog[0], usage=op_usage(names, ["torch", "transformers"]))  # as the run draws
    return [composer.compose(index, 1) for index in COPIED]


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory, copied):
    """Our fixture benchmark plus disguised copies of the first candidates this run composes."""
    folder = tmp_path_factory.mktemp("reference")
    shutil.copytree(Path(__file__).parent / "fixtures" / "reference", folder, dirs_exist_ok=True)
    for index, candidate in zip(COPIED, copied):
        (folder / "level2" / f"copy_{index}.py").write_text(disguise(candidate.code))
    return folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, cache_dir, reference_dir):
    out = tmp_path_factory.mktemp("run")
    config = tmp_path_factory.mktemp("config") / "run.yaml"
    # Two transformers families keep the crawl short; every fourth candidate starts from one.
    config.write_text('libraries: [torch, "transformers:llama,bert"]\nlibrary_mix: {transformers: 0.25}\n')
    command = [sys.executable, "-m", "pipeline.cli", "run", "--num-samples", "2", "--max-candidates", "12",
               "--out", str(out), "--cache-dir", str(cache_dir), "--workers", "2", "--seed", "1",
               "--reference", str(reference_dir), "--config", str(config)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, command, result.stderr


def test_the_run_draws_transformers_layers_inlined_without_transformers(run_dir):
    out, _, _ = run_dir
    rows = pq.read_table(out / "data").to_pylist() + pq.read_table(out / "rejects").to_pylist()
    composed = [row for row in rows if row["code"]]
    from_transformers = [row for row in composed if row["data_source"].startswith("transformers#")]
    assert from_transformers
    assert all(any(op.startswith("transformers.models.") for op in row["ops"]) for row in from_transformers)
    assert not any("transformers" in line for row in composed for line in row["code"].splitlines()
                   if line.startswith(("import", "from")))


def test_run_writes_the_design_layout_and_loads_with_datasets(run_dir):
    out, _, log = run_dir
    loaded = datasets.load_dataset("parquet", data_files=str(out / "data" / "*.parquet"), split="train")
    assert loaded.num_rows >= 2
    assert loaded.column_names[:3] == ["ops", "data_source", "code"]
    rejects = pq.read_table(out / "rejects")

    stats = json.loads((out / "stats.json").read_text())
    held = pq.read_table(out / "held").num_rows if (out / "held").exists() else 0
    assert stats["composed"] == stats["accepted"] + stats["held_back"] + stats["rejected"] \
        == loaded.num_rows + held + rejects.num_rows
    assert "surplus" not in stats["rejected_by_reason"]  # an accepted task held back is no reject
    assert stats["resumed_candidates"] == 0
    _, _, log = run_dir
    card = (out / "README.md").read_text()
    rows = f"{stats['accepted']} row" + ("" if stats["accepted"] == 1 else "s")
    assert f"wrote {out}: {rows}" in log and f"{stats['rejected']} rejected (rejects/)" in log  # the log, the
    assert f"{stats['accepted_per_hour']} accepted/h over the run" in log  # stats and the card say the same
    assert f"{rows} of {stats['composed']} candidates" in card
    rate = (stats["accepted"] + stats["held_back"]) / stats["wall_time_s"] * 3600
    assert abs(stats["accepted_per_hour"] - rate) <= 0.5  # a whole number per hour
    ids = list(loaded["id"]) + [row["id"] for row in rejects.to_pylist() if row["reason"] != "duplicate"]
    assert len(ids) == len(set(ids))  # one verdict per distinct task; a repeat is rejected as `duplicate`
    assert (out / "README.md").read_text().startswith("---\n")


def test_copies_of_reference_tasks_never_reach_the_dataset(run_dir, copied):
    """The composer's reference screen draws the copied chains again before any worker
    proves them; whatever got past it, decontamination rejects."""
    out, _, log = run_dir
    index_of = lambda row: json.loads(row["provenance"])["index"]
    rows = pq.read_table(out / "data").to_pylist()
    assert {row["id"] for row in rows}.isdisjoint(candidate.id for candidate in copied)
    assert all(row["kernelbench_max_similarity"] <= 0.9 for row in rows)
    assert re.search(r"composed \d+ candidates in \d+ s \(\d+ chains too close to the reference drawn again\)", log)
    similar = {index_of(row) for row in pq.read_table(out / "rejects").to_pylist()
               if row["reason"] == "kernelbench_similar"}
    assert similar <= set(COPIED)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["decontaminated"] and stats["reference_revision"]
    assert "Decontaminated against" in (out / "README.md").read_text()


def test_every_accepted_task_holds_up_on_its_own(run_dir, tmp_path):
    out, _, _ = run_dir
    for row in pq.read_table(out / "data").to_pylist():
        path = tmp_path / f"{row['id']}.py"
        path.write_text(row["code"])
        checked = subprocess.run([sys.executable, "-c", STANDALONE_CHECK, str(path)],
                                 capture_output=True, text=True, timeout=300,
                                 env={**os.environ, **WORKER_ENV, "OMP_NUM_THREADS": "1"})
        assert checked.returncode == 0, checked.stderr[-2000:]
        assert 0.5 <= float(checked.stdout.split()[-1]) <= 150, "outside the window (with slack for a busy CI box)"


def test_the_same_command_again_resumes_without_new_work(run_dir):
    out, command, _ = run_dir
    before = sorted(p.name for p in (out / ".staging").glob("round-*"))
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming" in again.stderr
    assert sorted(p.name for p in (out / ".staging").glob("round-*")) == before
    stats = json.loads((out / "stats.json").read_text())  # the run's clock adds up both invocations
    assert stats["resumed_candidates"] == stats["composed"] and stats["accepted"] > 0
    ledger = json.loads((out / ".staging" / "invocations.json").read_text())
    assert stats["invocations"] == len(ledger) == 2 and stats["wall_time_s"] > max(e["wall_time_s"] for e in ledger.values())
    assert stats["wall_time_s"] == pytest.approx(sum(e["wall_time_s"] for e in ledger.values()), abs=0.2)
    assert stats["accepted_per_hour"] == round((stats["accepted"] + stats["held_back"]) / stats["wall_time_s"] * 3600)


def test_a_run_interrupted_while_validating_resumes_with_the_round_it_composed(tmp_path, cache_dir, run_dir):
    """Ctrl-C once a round is composed, as its validation starts: the same command reads the
    round back and composes nothing again (on the H200 that cost 150 s every resumed call)."""
    _, _, _ = run_dir  # its crawl is in the cache
    out, config = tmp_path / "out", tmp_path / "run.yaml"
    config.write_text('libraries: [torch, "transformers:llama,bert"]\nlibrary_mix: {transformers: 0.25}\n')
    command = [sys.executable, "-m", "pipeline.cli", "run", "--num-samples", "1", "--max-candidates", "3",
               "--out", str(out), "--cache-dir", str(cache_dir), "--workers", "1", "--seed", "2", "--config", str(config)]
    composed = re.compile(r"composed \d+ candidates in")
    run = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    for line in run.stderr:
        if composed.search(line):
            break
    run.send_signal(signal.SIGINT)
    err = run.stderr.read()
    assert run.wait(timeout=120) == 130, err[-2000:]
    staging = out / ".staging"
    assert len(list(staging.glob("composed-*.jsonl"))) == 1 and not list(staging.glob("round-*.jsonl"))

    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "round composed by an earlier invocation: 3 candidates read back" in again.stderr
    assert not composed.search(again.stderr)
    assert not list(staging.glob("composed-*.jsonl")) and len(list(staging.glob("round-*.jsonl"))) == 1


def test_the_finished_run_publishes_as_a_version_that_loads_back(run_dir, tmp_path):
    from pipeline.cli import main

    out, _, _ = run_dir
    assert main(["publish", str(out), "--to", str(tmp_path / "repo"), "--version", "v1.0.0"]) == 0
    loaded = datasets.load_dataset(str(tmp_path / "repo"), split="train")
    assert sorted(loaded["id"]) == sorted(pq.read_table(out / "data").column("id").to_pylist())
    assert main(["publish", str(out), "--to", str(tmp_path / "repo"), "--version", "v1.0.0"]) == 2
