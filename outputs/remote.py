"""Output to any Beam file system (`gs://`, `s3://`, `hdfs://`, ...).

A run works in a local mirror of the output folder, kept in the cache under a name derived
from the URL, so a killed run resumes from its staging there. When the run finishes, the
dataset folder (data, rejects, card, plots, stats, log) is copied to the URL through Beam's
FileSystems, the same layer Beam's own sinks write through. Staging never leaves the host.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from apache_beam.io.filesystems import FileSystems

STAGING = ".staging"
LOCK_NAME = ".opsynth.lock"  # the run that holds the folder (pipeline/out_dir.py)


class RemoteOutputError(ValueError):
    """An --out URL Beam cannot write to: no file system for its scheme, or no access."""


def is_remote(out: str) -> bool:
    return FileSystems.get_scheme(out) not in (None, "file")


def check_writable(out: str) -> None:
    """Fail now, not after hours of work: the scheme has a file system and a file can be made."""
    try:
        FileSystems.get_filesystem(out)
    except ValueError:
        raise RemoteOutputError(
            f"--out {out}: Beam has no file system for {FileSystems.get_scheme(out)}:// here; install its extra "
            f"(apache-beam[gcp] for gs://, apache-beam[aws] for s3://) or write to a local folder") from None
    probe = FileSystems.join(out, ".opsynth-write-test")
    try:
        with FileSystems.create(probe) as handle:
            handle.write(b"ok")
        FileSystems.delete([probe])
    except Exception as error:  # credentials, permissions, a missing bucket: the file system's own words
        raise RemoteOutputError(f"--out {out} is not writable: {error}") from None


def local_mirror(out: str, cache_dir: Path) -> Path:
    return Path(cache_dir) / "remote-out" / hashlib.sha256(out.encode()).hexdigest()[:16]


def upload(local: Path, out: str) -> list[str]:
    """Copy the finished folder to `out`, staging left behind; returns the URLs written."""
    written = []
    for path in sorted(local.rglob("*")):
        relative = path.relative_to(local)
        if not path.is_file() or relative.parts[0] in (STAGING, LOCK_NAME):
            continue
        target = FileSystems.join(out, *relative.parts)
        with open(path, "rb") as source, FileSystems.create(target) as destination:
            shutil.copyfileobj(source, destination)
        written.append(target)
    return written
