"""`opsynth rejects DIR`: why a run's candidates were rejected, by reason, each with its
meaning and an example, read from the folder's rejects/ (and held/, which holds no reject)."""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq

from outputs.card import REJECT_GLOSSARY


class RejectsError(ValueError):
    """The folder holds no run's output."""


def summarize_rejects(folder: str | Path, examples: int = 1) -> str:
    folder = Path(folder)
    if not (folder / "rejects").is_dir():
        raise RejectsError(f"{folder} holds no rejects/ folder: give the --out of `opsynth run` or `opsynth validate`")
    rows = pq.read_table(folder / "rejects").to_pylist()
    stats = json.loads((folder / "stats.json").read_text()) if (folder / "stats.json").exists() else {}
    counts = Counter((row["stage"], row["reason"]) for row in rows)
    seen = defaultdict(list)
    for row in rows:
        if len(seen[(row["stage"], row["reason"])]) < examples:
            seen[(row["stage"], row["reason"])].append(row)
    lines = [f"{len(rows)} rejected of {stats.get('composed', '?')} candidates"
             + (f"; {stats['held_back']} more accepted and held back in held/ (not rejected)" if stats.get("held_back")
                else "") + f"; {stats.get('accepted', '?')} rows in data/."]
    for (stage, reason), count in counts.most_common():
        meaning = REJECT_GLOSSARY.get(reason, "")
        lines.append(f"\n{count:6d}  {stage}/{reason}" + (f": {meaning}" if meaning else ""))
        for row in seen[(stage, reason)]:
            name = row.get("source") or ", ".join(row.get("ops") or []) or row["id"]
            lines.append(f"        e.g. {name}: {(row['detail'] or '').splitlines()[0][:200] if row['detail'] else ''}")
    return "\n".join(lines)
