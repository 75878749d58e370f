"""`opsynth run` as a user runs it, then every accepted task checked again on its own."""
import json
import os
import subprocess
import sys
import textwrap

import datasets
import pyarrow.parquet as pq
import pytest

from filters.sandbox import WORKER_ENV

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


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, cache_dir):
    out = tmp_path_factory.mktemp("run")
    command = [sys.executable, "-m", "pipeline.cli", "run", "--num-samples", "2", "--max-candidates", "12",
               "--out", str(out), "--cache-dir", str(cache_dir), "--workers", "2", "--seed", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, command, result.stderr


def test_run_writes_the_design_layout_and_loads_with_datasets(run_dir):
    out, _, log = run_dir
    assert "NOT decontaminated" in log
    loaded = datasets.load_dataset("parquet", data_files=str(out / "data" / "*.parquet"), split="train")
    assert loaded.num_rows >= 2
    assert loaded.column_names[:3] == ["ops", "data_source", "code"]
    rejects = pq.read_table(out / "rejects")

    stats = json.loads((out / "stats.json").read_text())
    assert stats["composed"] == stats["accepted"] + stats["rejected"] == loaded.num_rows + rejects.num_rows
    ids = list(loaded["id"]) + rejects.column("id").to_pylist()
    assert len(ids) == len(set(ids))
    assert (out / "README.md").read_text().startswith("---\n")


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
