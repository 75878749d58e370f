"""`opsynth dedupe`: one row per task with its nearest reference task and duplicate."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from filters.similarity.decontaminate import SimilarityIndex, decontaminate, dedupe
from filters.similarity.reference import ReferenceSetError, fingerprint_all, load_reference, read_tasks, trace_all, traced
from filters.similarity.score import with_graph

REPORT_SCHEMA = pa.schema([("source", pa.string()), ("max_similarity", pa.float64()), ("nearest", pa.string()),
                           ("duplicate_of", pa.string()), ("kept", pa.bool_())])


def dedupe_report(tasks: str, against: str, levels: tuple[int, ...], threshold: float, dedupe_threshold: float,
                  out: Path, pool, cache_dir: str | Path) -> list[dict]:
    """Both sets are traced in the sandbox `pool` (cached under `cache_dir`), so that what
    a task computes is compared, and read as text; dedupe inside the set is textual."""
    named = read_tasks(tasks)
    if not named:
        raise ReferenceSetError(f"{tasks} holds no tasks")
    reference = traced(load_reference(against, levels), pool, cache_dir)
    fingerprints, unparsable = fingerprint_all(named)
    codes = dict(named)
    graphs = trace_all([codes[fp.name] for fp in fingerprints], pool, cache_dir)
    computed = [with_graph(fp, graph) for fp, graph in zip(fingerprints, graphs)]
    matches = decontaminate(computed, SimilarityIndex(reference.fingerprints), threshold)
    duplicates = dedupe(fingerprints, dedupe_threshold)
    rows = [{"source": fp.name, "max_similarity": match.similarity, "nearest": match.nearest,
             "duplicate_of": dup.duplicate_of, "kept": dup.kept and not match.too_close(threshold)}
            for fp, match, dup in zip(fingerprints, matches, duplicates)]
    rows += [{"source": name, "max_similarity": None, "nearest": None, "duplicate_of": None, "kept": False}
             for name in unparsable]
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=REPORT_SCHEMA), out, compression="zstd")
    return rows
