"""Content-addressed JSON stores on disk, safe under threads, processes and kill -9.

- `JsonStore`: values by key, one file each (`KEY[:2]/KEY.json`), written to a temporary
  file and renamed into place, so a reader sees a whole value or none. A value that cannot
  be read counts as missing: the work is simply done again.
- `VerdictStore`: sandbox results keyed by a hash of the task's code and of the check
  configuration, so a run killed mid-round and started again does not redo a validation
  that finished, and a change of device or tolerance never reuses a stale one.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path


class JsonStore:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def get(self, key: str) -> dict | None:
        try:
            return json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, value: dict) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(value, default=str))
        tmp.replace(path)

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"


class VerdictStore(JsonStore):
    @staticmethod
    def key(code: str, check_config: dict) -> str:
        blob = json.dumps({"code": code, "config": check_config}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()
