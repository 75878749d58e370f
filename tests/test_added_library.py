"""Extending opsynth as a user would: a third-party op library crawled by module name
(kornia's filters) and one added through a registered op source that supplies constructor
recipes (einops' layers, which need a pattern no signature suggests), run end to end."""
import json
import os
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq
import pytest

from filters.sandbox.pool import WORKER_ENV
from operators.catalog import crawl
from operators.sources import ENTRY_POINT_GROUP
from tests.test_end_to_end import STANDALONE_CHECK

EINOPS_SOURCE = textwrap.dedent('''
    from einops.layers.torch import Rearrange, Reduce


    def einops_layers():
        """(name, layer class, constructor recipe): the recipe is what the crawl builds it with."""
        yield ("einops.layers.torch.Rearrange", Rearrange,
               {"pattern": "b c (h h2) (w w2) -> b (c h2 w2) h w", "h2": 2, "w2": 2})
        yield "einops.layers.torch.Reduce", Reduce, {"pattern": "b c h w -> b c h", "reduction": "max"}
''')


@pytest.fixture(scope="module")
def einops_source(tmp_path_factory):
    """An installed distribution registering the source under `opsynth.op_sources`."""
    site = tmp_path_factory.mktemp("site")
    (site / "opsynth_einops.py").write_text(EINOPS_SOURCE)
    dist = site / "opsynth_einops-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: opsynth-einops\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\neinops = opsynth_einops:einops_layers\n")
    return site


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, einops_source):
    out = tmp_path_factory.mktemp("run")
    command = [sys.executable, "-m", "pipeline.cli", "run", "--library", "kornia.filters", "--library", "einops",
               "--num-samples", "2", "--max-candidates", "8", "--device", "cpu", "--workers", "2",
               "--out", str(out), "--cache-dir", str(tmp_path_factory.mktemp("cache"))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(einops_source), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_a_registered_source_gives_constructor_recipes(einops_source, monkeypatch):
    monkeypatch.syspath_prepend(str(einops_source))
    specs, _ = crawl(["einops"])
    by_name = {spec.name: spec for spec in specs}
    assert by_name["einops.layers.torch.Reduce"].init_args == {"pattern": "b c h w -> b c h", "reduction": "max"}
    assert {spec.library for spec in specs} == {"einops"} and {spec.source for spec in specs} == {"einops"}
    assert "import einops.layers.torch" in by_name["einops.layers.torch.Rearrange"].seed_code


def test_tasks_of_added_libraries_import_them_and_are_accepted(run_dir):
    accepted = pq.read_table(run_dir / "data").to_pylist()
    rejects = pq.read_table(run_dir / "rejects").to_pylist()
    assert len(accepted) >= 2
    assert not [row for row in rejects if row["reason"] == "forbidden_import"]
    for row in accepted:
        imports = {line.split()[1].split(".")[0] for line in row["code"].splitlines() if line.startswith("import ")}
        assert imports - {"torch"} <= {"kornia", "einops"}
        assert {op.split(".")[0] for op in row["ops"]} <= imports
        assert row["data_source"].split("#")[0] in {"kornia", "einops"}
    assert any(row["data_source"].startswith("kornia#") for row in accepted)
    stats = json.loads((run_dir / "stats.json").read_text())
    assert stats["versions"]["kornia"] and stats["versions"]["einops"]
    card = (run_dir / "README.md").read_text()
    assert f"| kornia | {stats['versions']['kornia']} |" in card


def test_accepted_tasks_of_an_added_library_rerun_on_their_own(run_dir, tmp_path):
    for row in pq.read_table(run_dir / "data").to_pylist()[:2]:
        path = tmp_path / f"{row['id']}.py"
        path.write_text(row["code"])
        checked = subprocess.run([sys.executable, "-c", STANDALONE_CHECK, str(path)], capture_output=True, text=True,
                                 timeout=300, env={**os.environ, **WORKER_ENV, "OMP_NUM_THREADS": "1"})
        assert checked.returncode == 0, checked.stderr[-2000:]


def test_the_cards_loading_recipe_loads_a_row_of_an_added_library(run_dir):
    """The card names the added libraries' ops its rows use, and its snippet loads and runs
    such a row as written; without them the refusal says how to load it, accusing no one."""
    import re

    from outputs.load import UnsafeTask, load_task

    rows = pq.read_table(run_dir / "data").to_pylist()
    index = next(i for i, row in enumerate(rows) if not row["data_source"].startswith("torch#"))
    card = (run_dir / "README.md").read_text()
    [snippet] = re.findall(r"## Loading\n\n```python\n(.*?)```", card, re.DOTALL)
    assert "LIBRARY_OPS = [" in snippet
    namespace = {}
    exec(snippet.replace('"ORG/NAME"', repr(str(run_dir))).replace("tasks[0]", f"tasks[{index}]"), namespace)
    assert namespace["output"].numel() > 0
    with pytest.raises(UnsafeTask) as refused:
        load_task(rows[index])
    message = str(refused.value)
    assert "load_task(row, library_ops=[" in message and "changed" not in message
