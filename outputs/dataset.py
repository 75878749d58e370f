"""Write a finished run as a Hugging Face dataset folder (docs/architecture.md, Outputs)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from filters.similarity.reference import ReferenceSet
from operators.records import Candidate, Verdict
from outputs.card import render_card
from outputs.plots import make_plots
from outputs.report import compare, profile_reference, profile_rows
from outputs.schema import REJECT_SCHEMA, ROW_GROUP_SIZE, ROWS_PER_SHARD, SAMPLE_SCHEMA
from outputs.stats import compute_stats

Record = tuple[Candidate, Verdict]


def write_dataset(out_dir: Path, records: list[Record], run_info: dict, reference: ReferenceSet | None = None,
                  held: list[Record] = ()) -> dict:
    """Write data/, rejects/, held/ (accepted records beyond the rows asked for, when there
    are any), stats.json and README.md; returns the stats. With the run's `reference`, the
    stats and the card hold the accepted tasks beside it (outputs/report.py)."""
    out_dir = Path(out_dir)
    accepted = [sample_row(c, v, run_info) for c, v in records if v.passed]
    rejected = [reject_row(c, v) for c, v in records if not v.passed]
    shards = write_shards(out_dir / "data", "train", accepted, SAMPLE_SCHEMA)
    write_shards(out_dir / "rejects", "rejects", rejected, REJECT_SCHEMA)
    if held or (out_dir / "held").exists():
        write_shards(out_dir / "held", "held", [sample_row(c, v, run_info) for c, v in held], SAMPLE_SCHEMA)
    stats = compute_stats(records, run_info, held=len(held))
    if reference is not None:
        stats["reference_comparison"] = compare(profile_rows("this dataset", accepted), profile_reference(reference),
                                                similarity=False)
    plots = make_plots(stats, out_dir / "plots")
    sizes = {"num_bytes": pa.Table.from_pylist(accepted, schema=SAMPLE_SCHEMA).nbytes,
             "download_size": sum(shard.stat().st_size for shard in shards)}
    _write_text(out_dir / "stats.json", json.dumps(stats, indent=2, sort_keys=True) + "\n")
    _write_text(out_dir / "README.md", render_card(stats, plots, sizes))
    return stats


def sample_row(candidate: Candidate, verdict: Verdict, run_info: dict) -> dict:
    metrics = verdict.metrics
    return {
        "ops": list(candidate.ops), "data_source": candidate.data_source,
        "code": verdict.code or candidate.code, "id": candidate.id, "num_ops": len(candidate.ops),
        "eager_ms": metrics.get("eager_ms"), "compile_ms": metrics.get("compile_ms"),
        "device": run_info["device"],
        "kernelbench_max_similarity": metrics.get("kernelbench_max_similarity"),
        "kernelbench_nearest": metrics.get("kernelbench_nearest"),
        "composer": candidate.composer, "seed": candidate.seed, "torch_version": run_info["versions"]["torch"],
        "determinism_max_diff": metrics.get("determinism_max_diff"),
        "compile_max_diff": metrics.get("compile_max_diff"),
        "input_sensitivity": metrics.get("input_sensitivity"),
        "peak_memory_mb": metrics.get("peak_memory_mb"), "output_max_abs": metrics.get("output_max_abs"),
        "resized": bool(metrics.get("resized")),
        "train_mode_agrees": _at_most_one(metrics.get("train_mode_share")),
        "source": candidate.provenance.get("source"),
        "provenance": json.dumps(candidate.provenance, sort_keys=True),
    }


def _at_most_one(share) -> bool | None:
    return share <= 1.0 if isinstance(share, (int, float)) else None


def reject_row(candidate: Candidate, verdict: Verdict) -> dict:
    return {
        "ops": list(candidate.ops), "data_source": candidate.data_source,
        "code": verdict.code or candidate.code, "id": candidate.id, "num_ops": len(candidate.ops),
        "stage": verdict.stage, "reason": verdict.reason, "detail": verdict.detail,
        "metrics": json.dumps(verdict.metrics, sort_keys=True, default=str),
        "composer": candidate.composer, "seed": candidate.seed, "source": candidate.provenance.get("source"),
        "provenance": json.dumps(candidate.provenance, sort_keys=True),
    }


def write_shards(folder: Path, prefix: str, rows: list[dict], schema: pa.Schema) -> list[Path]:
    """Replace the folder's shards with `rows`; an empty set still gets one (empty) shard,
    so every reader finds the schema."""
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    chunks = [rows[i:i + ROWS_PER_SHARD] for i in range(0, len(rows), ROWS_PER_SHARD)] or [[]]
    paths = []
    for number, chunk in enumerate(chunks):
        path = staging / f"{prefix}-{number:05d}-of-{len(chunks):05d}.parquet"
        table = pa.Table.from_pylist(chunk, schema=schema)
        pq.write_table(table, path, compression="zstd", row_group_size=ROW_GROUP_SIZE)
        paths.append(folder / path.name)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return paths


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
