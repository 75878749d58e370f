"""Reference sets to decontaminate against: a KernelBench checkout, any folder of .py
tasks, a Parquet file with a `code` column, or a Hub dataset id (through `datasets`)."""
from __future__ import annotations

import hashlib
import logging
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from filters.similarity import Fingerprint, fingerprint

log = logging.getLogger(__name__)
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
DEFAULT_LEVELS = (1, 2, 3)


class ReferenceSetError(ValueError):
    """The reference cannot be used: missing, empty, or of an unknown form."""


@dataclass(frozen=True)
class ReferenceSet:
    source: str
    revision: str
    fingerprints: tuple[Fingerprint, ...]
    unparsable: tuple[str, ...] = ()


def load_reference(source: str, levels: tuple[int, ...] = DEFAULT_LEVELS) -> ReferenceSet:
    tasks, revision = _read_tasks(source, levels)
    if not tasks:
        raise ReferenceSetError(f"--reference {source} holds no tasks for levels {list(levels)}; "
                                "point it at a KernelBench checkout, a folder of .py files or a Parquet file with a code column")
    fingerprints, unparsable = fingerprint_all(tasks)
    if unparsable:
        log.warning("reference %s: %d tasks do not parse and are left out: %s", source, len(unparsable), unparsable[:5])
    digest = hashlib.sha256("\n".join(code for _, code in tasks).encode()).hexdigest()[:12]
    return ReferenceSet(source, revision or f"content-{digest}", tuple(fingerprints), tuple(unparsable))


def fingerprint_all(tasks: list[tuple[str, str]]) -> tuple[list[Fingerprint], list[str]]:
    """Fingerprints of the tasks that parse, and the names of those that do not."""
    fingerprints, unparsable = [], []
    for name, code in tasks:
        try:
            fingerprints.append(fingerprint(code, name))
        except SyntaxError:
            unparsable.append(name)
    return fingerprints, unparsable


def read_tasks(source: str) -> list[tuple[str, str]]:
    """(name, code) pairs from a folder of .py files or a Parquet file with a `code` column."""
    path = Path(source)
    if path.is_file() and path.suffix == ".parquet":
        return _parquet_tasks(path)
    if path.is_dir():
        return [(str(p.relative_to(path)), p.read_text()) for p in sorted(path.rglob("*.py"))]
    raise ReferenceSetError(f"{source}: not a folder of .py files or a .parquet file")


def _read_tasks(source: str, levels) -> tuple[list[tuple[str, str]], str | None]:
    path = Path(source)
    if path.exists():
        root = path / "KernelBench" if (path / "KernelBench").is_dir() else path
        level_dirs = [root / f"level{n}" for n in levels if (root / f"level{n}").is_dir()]
        if level_dirs:
            tasks = [(f"{d.name}/{p.name}", p.read_text()) for d in level_dirs for p in sorted(d.glob("*.py"))]
            return tasks, _git_revision(path)
        return read_tasks(source), _git_revision(path) if path.is_dir() else None
    if HUB_ID.match(source):
        return _hub_tasks(source, levels)
    raise ReferenceSetError(f"--reference {source}: no such file or folder, and not a Hub dataset id (ORG/NAME)")


def _parquet_tasks(path: Path) -> list[tuple[str, str]]:
    table = pq.read_table(path)
    if "code" not in table.column_names:
        raise ReferenceSetError(f"{path} has no `code` column (columns: {', '.join(table.column_names)})")
    names = table.column("name").to_pylist() if "name" in table.column_names else None
    codes = table.column("code").to_pylist()
    return [(names[i] if names else f"{path.name}#{i}", code) for i, code in enumerate(codes)]


def _hub_tasks(hub_id: str, levels) -> tuple[list[tuple[str, str]], str | None]:
    import datasets
    try:
        loaded = datasets.load_dataset(hub_id)
    except Exception as error:  # network, auth, or no such dataset: all the user's to fix
        raise ReferenceSetError(f"--reference {hub_id}: could not load it from the Hub ({type(error).__name__}: "
                                f"{str(error)[:200]}); check the id, your network and HF_TOKEN") from None
    wanted = {f"level_{n}" for n in levels} | {f"level{n}" for n in levels}
    splits = [s for s in loaded if s in wanted] or list(loaded)
    tasks = [(f"{split}/{row.get('name', i)}", row["code"]) for split in splits for i, row in enumerate(loaded[split])]
    revision = getattr(next(iter(loaded.values())).info, "version", None)
    return tasks, f"{hub_id}@{revision}" if revision else hub_id


def _git_revision(path: Path) -> str | None:
    try:
        result = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None
