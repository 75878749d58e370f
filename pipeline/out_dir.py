"""The output folder of a run: --out itself, or for a Beam file system URL (gs://...) a local
mirror copied there at the end; and the run's log file inside it."""
from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from outputs.remote import LOCK_NAME, RemoteOutputError, check_writable, is_remote, local_mirror, upload
from pipeline.config import ConfigError, RunConfig

log = logging.getLogger("opsynth")


def output_dir(cfg: RunConfig) -> Path:
    """The folder the run writes: --out itself, or for a Beam file system URL (gs://...) a
    local mirror in the cache, copied there at the end (outputs/remote.py)."""
    if not is_remote(cfg.out):
        return prepare_out_dir(cfg.out)
    try:
        check_writable(cfg.out)
    except RemoteOutputError as error:
        raise ConfigError(str(error)) from None
    return prepare_out_dir(str(local_mirror(cfg.out, Path(cfg.cache_dir))))


def prepare_out_dir(out: str) -> Path:
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".opsynth-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise ConfigError(f"--out {out} is not writable ({error.strerror or error}); choose a folder you can write to") from None
    hold(path)
    return path


_HELD: dict[Path, int] = {}  # the folders this process holds, and the open lock file of each


def hold(path: Path) -> None:
    """Hold the output folder for this process until it exits: two runs writing one folder
    interleave their logs, leave each other's temporary folders and count each other's rounds.
    The second is refused, with the holder's pid."""
    path = path.resolve()
    if path in _HELD:
        return
    descriptor = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(descriptor, 32).decode(errors="replace").strip() or "unknown"
        os.close(descriptor)
        raise ConfigError(f"--out {path} is in use by another opsynth command (pid {holder}); wait for it to finish, "
                          "or write to another folder") from None
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"{os.getpid()}\n".encode())
    _HELD[path] = descriptor


def copy_to_remote(out_dir: Path, out: str) -> None:
    if is_remote(out):
        written = upload(out_dir, out)
        log.info("copied %d files to %s", len(written), out)


def log_to(path: Path) -> None:
    """Everything the run logs also goes to a file in the output folder."""
    root = logging.getLogger()
    if not any(getattr(h, "baseFilename", None) == str(path.resolve()) for h in root.handlers):
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        root.addHandler(handler)
        root.setLevel(min(root.level or logging.INFO, logging.INFO))
