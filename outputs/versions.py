"""What a published version is: its files, the samples and stats it holds (Snapshot), the
change from the version before (VersionDiff), and the checks a folder must pass first. Shared
by both destinations: a local git repository (outputs/publish.py) and the Hub (outputs/hub.py).
"""
from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

PUBLISHED = ("README.md", "stats.json", "data", "held", "rejects", "plots")
VERSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class PublishError(ValueError):
    """Publishing was refused; the destination is unchanged."""


@dataclass(frozen=True)
class Snapshot:
    """What one version holds: the sample ids and the stats."""

    ids: frozenset[str]
    stats: dict


@dataclass
class VersionDiff:
    previous: str | None
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    count_delta: int = 0
    op_count_delta: dict = field(default_factory=dict)
    library_delta: dict = field(default_factory=dict)

    def describe(self) -> str:
        base = f"against {self.previous}" if self.previous else "as the first version"
        lines = [f"{len(self.added)} samples added, {len(self.removed)} removed ({self.count_delta:+d}) {base}"]
        for title, delta in (("op-count mix", self.op_count_delta), ("library mix", self.library_delta)):
            changes = ", ".join(f"{key}: {value:+d}" for key, value in sorted(delta.items()) if value)
            lines.append(f"{title}: {changes or 'unchanged'}")
        lines += [f"  + {sample_id}" for sample_id in self.added[:20]]
        lines += [f"  - {sample_id}" for sample_id in self.removed[:20]]
        return "\n".join(lines)


def check_source(source: Path, allow_undecontaminated: bool) -> Snapshot:
    missing = [name for name in ("README.md", "stats.json", "data") if not (source / name).exists()]
    if missing:
        raise PublishError(f"{source} is not a finished opsynth output folder (missing {', '.join(missing)}); "
                           "run `opsynth run --out DIR` first")
    stats = json.loads((source / "stats.json").read_text())
    if not stats.get("decontaminated") and not allow_undecontaminated:
        raise PublishError(f"{source} was not decontaminated against a reference benchmark; run with "
                           "--reference, or pass --allow-undecontaminated to publish it anyway")
    ids = {row for path in sorted((source / "data").glob("*.parquet"))
           for row in pq.read_table(path, columns=["id"]).column("id").to_pylist()}
    return Snapshot(frozenset(ids), stats)


def check_version(version: str) -> None:
    if not VERSION_NAME.match(version):
        raise PublishError(f"--version {version!r} is not a valid tag name (letters, digits, '.', '_', '-')")


def diff(previous_name: str | None, previous: Snapshot | None, current: Snapshot) -> VersionDiff:
    if previous is None:
        return VersionDiff(None, sorted(current.ids), [], len(current.ids),
                           current.stats.get("op_count_mix", {}), current.stats.get("library_mix", {}))
    return VersionDiff(
        previous_name, sorted(current.ids - previous.ids), sorted(previous.ids - current.ids),
        len(current.ids) - len(previous.ids),
        _delta(previous.stats.get("op_count_mix", {}), current.stats.get("op_count_mix", {})),
        _delta(previous.stats.get("library_mix", {}), current.stats.get("library_mix", {})))


def _delta(before: dict, after: dict) -> dict:
    return {key: after.get(key, 0) - before.get(key, 0) for key in set(before) | set(after)}


def published_files(source: Path) -> list[Path]:
    """The files a version holds, relative to the output folder (never logs or staging)."""
    files = []
    for name in PUBLISHED:
        path = source / name
        files += [p.relative_to(source) for p in sorted(path.rglob("*")) if p.is_file()] if path.is_dir() else (
            [Path(name)] if path.exists() else [])
    return files


def snapshot_from_files(read) -> Snapshot:
    """A version's Snapshot from a reader of its files: read(path) -> bytes, or a list of
    paths under data/ when given 'data/'."""
    stats = json.loads(read("stats.json"))
    ids = {row for path in read("data/") if path.endswith(".parquet")
           for row in pq.read_table(io.BytesIO(read(path)), columns=["id"]).column("id").to_pylist()}
    return Snapshot(frozenset(ids), stats)
