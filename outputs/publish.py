"""`opsynth publish`: a finished output folder becomes a named, never-overwritten version
at a destination: a local git repository laid out like the Hub repository, or a Hub
dataset repository (outputs/hub.py). Every check happens before the destination changes.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from outputs.versions import (PUBLISHED, PublishError, Snapshot, VersionDiff, check_source, check_version, diff,
                              published_files, snapshot_from_files)

HUB_PREFIX = "hf://datasets/"
# -- local git destination -----------------------------------------------------------------

# Who opsynth's own commits and tags are by: given to each git call that makes one, never
# written into the destination's configuration.
IDENTITY = ("-c", "user.name=opsynth", "-c", "user.email=opsynth@localhost")


class LocalDestination:
    """A git repository laid out exactly like the Hub repository: one commit and one
    annotated tag per version."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def versions(self) -> list[str]:
        if not (self.path / ".git").exists():
            return []
        # newest first; tags made within the same second (git dates have whole seconds) by version
        return self._git("tag", "--sort=-v:refname", "--sort=-creatordate").split()

    def snapshot(self, version: str) -> Snapshot:
        def read(path: str):
            if path.endswith("/"):
                return self._git("ls-tree", "-r", "--name-only", version, "--", path).split()
            return subprocess.run(["git", "-C", str(self.path), "show", f"{version}:{path}"],
                                  capture_output=True, check=True).stdout
        return snapshot_from_files(read)

    def publish(self, source: Path, version: str, message: str) -> str:
        self._prepare()
        if version in self.versions():
            raise PublishError(f"version {version} already exists in {self.path}; versions are never overwritten")
        try:
            self._replace_contents(source)
            self._git("add", "-A")
            self._git(*IDENTITY, "commit", "-q", "-m", message)
            self._git(*IDENTITY, "tag", "-a", version, "-m", message)
        except (OSError, subprocess.CalledProcessError) as error:
            self._restore()
            raise PublishError(f"publishing to {self.path} failed and was rolled back: {_why(error)}") from None
        return self._git("rev-parse", "HEAD").strip()

    def _prepare(self) -> None:
        if (self.path / ".git").exists():
            if self._git("status", "--porcelain").strip():
                raise PublishError(f"{self.path} has uncommitted changes; commit or discard them first")
            return
        if self.path.exists() and any(self.path.iterdir()):
            raise PublishError(f"{self.path} exists, is not empty and is not a git repository")
        self.path.mkdir(parents=True, exist_ok=True)
        self._git("init", "-q", "-b", "main")

    def _replace_contents(self, source: Path) -> None:
        for name in PUBLISHED:
            target = self.path / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        for relative in published_files(source):
            (self.path / relative).parent.mkdir(parents=True, exist_ok=True)
            # a plain copy: the files get this version's time, which `datasets` keys its cache on
            shutil.copyfile(source / relative, self.path / relative)

    def _restore(self) -> None:
        if self._git("rev-parse", "--verify", "-q", "HEAD", check=False).strip():
            self._git("reset", "-q", "--hard", "HEAD")
        self._git("clean", "-q", "-fd")

    def _git(self, *args: str, check: bool = True) -> str:
        return subprocess.run(["git", "-C", str(self.path), *args], capture_output=True, text=True,
                              check=check).stdout


def _why(error: Exception) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        return (error.stderr or b"").decode() if isinstance(error.stderr, bytes) else (error.stderr or str(error))
    return str(error)


# -- the command ---------------------------------------------------------------------------

def destination_for(dest: str, private: bool = False):
    if dest.startswith(HUB_PREFIX):
        from outputs.hub import HubDestination
        repo_id = dest[len(HUB_PREFIX):].strip("/")
        if repo_id.count("/") != 1:
            raise PublishError(f"--to {dest}: a Hub destination is hf://datasets/ORG/NAME")
        return HubDestination(repo_id, private=private)
    if "://" in dest:
        raise PublishError(f"--to {dest}: use a local path or hf://datasets/ORG/NAME")
    return LocalDestination(Path(dest))


def publish(source: Path, dest: str, version: str, *, private: bool = False, allow_undecontaminated: bool = False,
            dry_run: bool = False, message: str | None = None) -> tuple[VersionDiff, str | None]:
    """Returns the change against the latest version and the new commit (None on a dry run)."""
    check_version(version)
    current = check_source(Path(source), allow_undecontaminated)
    destination = destination_for(dest, private)
    if dry_run and hasattr(destination, "attempts"):
        destination.attempts = 2  # a look, not a publication: an unreachable Hub is said at once
    try:
        versions = destination.versions()
    except PublishError as unreachable:
        if not dry_run:
            raise
        # offline: what the folder would publish is still worth showing
        raise PublishError(f"{unreachable}. What {source} would publish, against no version: "
                           f"{diff(None, None, current).describe()}") from None
    if version in versions:
        raise PublishError(f"version {version} already exists at {dest}; versions are never overwritten")
    latest = versions[0] if versions else None
    previous = destination.snapshot(latest) if latest else None
    if previous == current:
        raise PublishError(f"nothing changed since {latest}: the same samples and the same stats; "
                           "nothing was published")
    change = diff(latest, previous, current)
    if dry_run:
        return change, None
    return change, destination.publish(Path(source), version, message or f"opsynth dataset {version}")
