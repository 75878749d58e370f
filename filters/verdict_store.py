"""A content-addressed store of sandbox results: the key is a hash of the task's code and
of the check configuration, so a run killed mid-round and started again does not redo a
validation that finished, and a change of device or tolerance never reuses a stale one."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


class VerdictStore:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    @staticmethod
    def key(code: str, check_config: dict) -> str:
        blob = json.dumps({"code": code, "config": check_config}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> dict | None:
        try:
            return json.loads((self.folder / key[:2] / f"{key}.json").read_text())
        except (OSError, ValueError):  # missing, or cut short by a kill: validate again
            return None

    def put(self, key: str, result: dict) -> None:
        path = self.folder / key[:2] / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result, default=str))
        tmp.replace(path)
