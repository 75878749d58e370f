"""The staging folder of a run (`OUT/.staging`): one JSON-lines file of records per finished
round, under the fingerprint of the configuration that decided them. A run started again
with the same fingerprint reads them back and goes on; a changed one starts over."""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import asdict, replace
from pathlib import Path

from filters.checks.registry import CHECK_STAGES, DEFAULTS
from filters.similarity.decontaminate import dedupe
from filters.similarity.score import fingerprint
from operators.catalog import cache_key
from operators.records import record_from_json, record_to_json
from pipeline.config import RunConfig

log = logging.getLogger("opsynth")


def staging_dir(out_dir: Path, run_id: str) -> Path:
    staging = out_dir / ".staging"
    marker = staging / "fingerprint.txt"
    if staging.exists() and (not marker.exists() or marker.read_text() != run_id):
        log.info("configuration changed since the last run in %s: starting over", out_dir)
        shutil.rmtree(staging)
    staging.mkdir(parents=True, exist_ok=True)
    marker.write_text(run_id)
    return staging


def run_fingerprint(cfg: RunConfig, device: str) -> str:
    """What decides the records of a round: change any of it and old rounds no longer apply."""
    keys = ("composer", "sampling", "seed", "libraries", "op_count_mix", "window_ms", "atol", "rtol", "determinism_tol",
            "max_task_memory_gb", "reference", "reference_levels", "similarity_threshold", "ops", "library_mix",
            "target_ms", "checks")
    llm_keys = ("model", "temperature", "max_tokens", "repair_rounds")
    blob = {key: asdict(cfg)[key] for key in keys} | {"device": device, "catalog": cache_key(cfg.libraries),
                                                       "stages": list(CHECK_STAGES), "check_defaults": DEFAULTS}
    if cfg.composer == "llm":
        blob["llm"] = {key: cfg.llm.get(key) for key in llm_keys}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


def record_invocation(staging: Path, started: str, wall_time_s: float, decided: int) -> None:
    """This invocation's line in the run's ledger (`invocations.json`), rewritten after each
    round: an invocation that is interrupted still counts the rounds it finished, and the
    run's stats add every invocation up."""
    ledger = staging / "invocations.json"
    entries = read_invocations(staging)
    entries[started] = {"wall_time_s": round(wall_time_s, 1), "decided": decided}
    ledger.with_suffix(".tmp").write_text(json.dumps(entries, indent=1))
    ledger.with_suffix(".tmp").replace(ledger)


def read_invocations(staging: Path) -> dict[str, dict]:
    """{start time: {"wall_time_s", "decided"}} of every invocation of the run so far."""
    try:
        return json.loads((staging / "invocations.json").read_text())
    except (OSError, ValueError):
        return {}


def read_rounds(staging: Path) -> list:
    return [record for path in sorted(staging.glob("round-*.jsonl")) for record in read_jsonl(path)]


def read_jsonl(path: Path) -> list:
    return [record_from_json(line) for line in path.read_text().splitlines() if line.strip()]


def keep_before_endpoint_down(path: Path) -> tuple[list, str | None]:
    """A round in which the endpoint went down keeps what came before the first job it
    failed; the rest is rewritten away so that a rerun composes it again."""
    records = read_jsonl(path)
    down = [(c, v) for c, v in records if v.reason == "endpoint_down"]
    if not down:
        return records, None
    first = min(c.provenance["index"] for c, _ in down)
    kept = [(c, v) for c, v in records if c.provenance["index"] < first]
    start = int(path.stem.split("-")[1])
    path.unlink()
    if kept:
        path.with_name(f"round-{start:07d}-{first:07d}.jsonl").write_text(
            "".join(record_to_json(c, v) + "\n" for c, v in kept))
    return kept, down[0][1].detail


def drop_near_duplicates(records: list, threshold: float) -> list:
    """Accepted samples that duplicate an earlier accepted one (by index) become rejects
    naming what they duplicate. Stable: a sample's fate depends only on earlier ones."""
    ordered = sorted(records, key=lambda r: r[0].provenance.get("index", 0))
    accepted = [(c, v) for c, v in ordered if v.passed]
    results = dedupe([fingerprint(v.code or c.code, c.id) for c, v in accepted], threshold)
    verdicts = {c.id: (v if result.kept else replace(
        v, stage="dedupe", passed=False, reason="near_duplicate",
        detail=f"AST similarity {result.similarity:.3f} to accepted sample {result.duplicate_of}"))
        for (c, v), result in zip(accepted, results)}
    return [(c, verdicts.get(c.id, v) if v.passed else v) for c, v in ordered]
