import json

import datasets
import pyarrow.parquet as pq

from operators.records import Candidate, Verdict
from outputs.dataset import write_dataset
from outputs.schema import REJECT_SCHEMA, SAMPLE_SCHEMA
from pipeline.run_info import versions

RUN_INFO = {"device": "cpu", "composer": "template", "seed": 3, "window_ms": [1.0, 100.0], "atol": 0.01,
            "rtol": 0.01, "determinism_tol": 1e-5, "reference": None, "reference_revision": None,
            "decontaminated": False, "similarity_threshold": 0.9, "dedupe_threshold": 0.95, "target_samples": 2, "stop_reason": "reached --num-samples",
            "wall_time_s": 1.0, "libraries": ["torch"], "versions": versions()}


def record(index, passed, reason="", stage="accepted", ops=("torch.nn.Linear", "torch.nn.ReLU")):
    candidate = Candidate(f"id{index}", ops, f"torch#{len(ops)}", f"# task {index}\n", "template", 3, {"index": index})
    metrics = {"eager_ms": 2.5 + index, "compile_ms": 900.0, "determinism_max_diff": 0.0}
    return candidate, Verdict(candidate.id, stage, passed, reason, "why" if reason else "", metrics)


def test_folder_layout_schema_and_funnel(tmp_path):
    records = [record(0, True), record(1, True, ops=("torch.cumsum",)),
               record(2, False, "constant_output", "degenerate"), record(3, False, "too_fast", "timing")]
    stats = write_dataset(tmp_path, records, RUN_INFO)
    data = pq.read_table(tmp_path / "data" / "train-00000-of-00001.parquet")
    assert data.schema.names[:3] == ["ops", "data_source", "code"]
    assert data.schema.equals(SAMPLE_SCHEMA)
    assert data.column("id").to_pylist() == ["id0", "id1"]
    rejects = pq.read_table(tmp_path / "rejects").to_pylist()
    assert {(r["stage"], r["reason"]) for r in rejects} == {("degenerate", "constant_output"), ("timing", "too_fast")}
    assert stats["composed"] == stats["accepted"] + stats["rejected"] == 4
    assert stats["op_count_mix"] == {"1": 1, "2": 1}
    assert json.loads((tmp_path / "stats.json").read_text())["rejected_by_reason"] == {"constant_output": 1, "too_fast": 1}
    funnel = {row["stage"]: row for row in stats["funnel"]}
    assert funnel["compile"]["entered"] == 2 and funnel["degenerate"]["rejected"] == 1


def test_rejects_shard_exists_when_nothing_was_rejected(tmp_path):
    write_dataset(tmp_path, [record(0, True)], RUN_INFO)
    table = pq.read_table(tmp_path / "rejects" / "rejects-00000-of-00001.parquet")
    assert table.num_rows == 0 and table.schema.equals(REJECT_SCHEMA)


def test_an_empty_run_still_writes_a_loadable_folder(tmp_path):
    stats = write_dataset(tmp_path, [], RUN_INFO)
    assert stats["composed"] == 0
    assert pq.read_table(tmp_path / "data").num_rows == 0


def test_folder_loads_with_datasets_and_the_card_declares_it(tmp_path):
    write_dataset(tmp_path, [record(0, True), record(1, True)], RUN_INFO)
    loaded = datasets.load_dataset(str(tmp_path), split="train")
    assert loaded.num_rows == 2 and loaded[0]["ops"] == ["torch.nn.Linear", "torch.nn.ReLU"]
    card = (tmp_path / "README.md").read_text()
    assert card.startswith("---\n") and "data/train-*.parquet" in card
    assert "Not decontaminated" in card


def test_a_rewrite_replaces_the_old_shards(tmp_path):
    write_dataset(tmp_path, [record(i, True) for i in range(3)], RUN_INFO)
    write_dataset(tmp_path, [record(0, True)], RUN_INFO)
    assert pq.read_table(tmp_path / "data").num_rows == 1
    assert not list(tmp_path.glob("*.tmp"))


def test_the_card_explains_every_column_and_loads_without_warnings(tmp_path, caplog):
    write_dataset(tmp_path, [record(0, True), record(1, True)], RUN_INFO)
    card = (tmp_path / "README.md").read_text()
    for field in SAMPLE_SCHEMA:
        assert f"| `{field.name}` |" in card
    assert "load_dataset(" in card and "@misc{opsynth_kernel_tasks" in card
    with caplog.at_level("WARNING"):
        datasets.load_dataset(str(tmp_path), split="train")
    assert not [r for r in caplog.records if "dataset_info" in r.getMessage()]
