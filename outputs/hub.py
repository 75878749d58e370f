"""Publishing to a Hugging Face Hub dataset repository through huggingface_hub: the repo
is created if missing, each version is one commit and one tag, and only transient errors
(429, 5xx, dropped connections, timeouts) are retried. The endpoint follows HF_ENDPOINT;
the token comes from HF_TOKEN or the user's `hf auth login`.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
from packaging.version import InvalidVersion, Version

from outputs.retry import retry_after
from outputs.versions import PublishError, Snapshot, published_files, snapshot_from_files

log = logging.getLogger(__name__)
TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
HUB_OWNED = {".gitattributes"}  # files the Hub itself keeps in every repo


def is_transient(error: BaseException) -> bool:
    """Retry only what may succeed unchanged: rate limits, server errors, lost connections."""
    if isinstance(error, HfHubHTTPError):
        response = getattr(error, "response", None)
        return response is not None and response.status_code in TRANSIENT_STATUS
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    # a transport error of the HTTP client huggingface_hub is built on (httpx, httpx2, requests)
    module = type(error).__module__
    return module.startswith(("httpx", "requests")) and "Status" not in type(error).__name__


def retry_delay(error: BaseException, attempt: int, base_s: float) -> float:
    return retry_after(getattr(error, "response", None), attempt, base_s)


def version_key(name: str):
    try:
        return 1, Version(name.lstrip("vV")), name
    except InvalidVersion:
        return 0, Version("0"), name


class HubDestination:
    def __init__(self, repo_id: str, private: bool = False, attempts: int = 5, backoff_s: float = 1.0):
        self.repo_id, self.private = repo_id, private
        self.attempts, self.backoff_s = attempts, backoff_s
        # HF_ENDPOINT is read now, not when huggingface_hub was imported.
        self.endpoint = os.environ.get("HF_ENDPOINT") or None
        self.api = HfApi(endpoint=self.endpoint)

    def versions(self) -> list[str]:
        try:
            refs = self._call(self.api.list_repo_refs, self.repo_id, repo_type="dataset")
        except RepositoryNotFoundError:
            return []
        return sorted((tag.name for tag in refs.tags), key=version_key, reverse=True)

    def snapshot(self, version: str) -> Snapshot:
        files = self._call(self.api.list_repo_files, self.repo_id, repo_type="dataset", revision=version)
        with tempfile.TemporaryDirectory() as cache:
            def read(path: str):
                if path.endswith("/"):
                    return [f for f in files if f.startswith(path)]
                local = self._call(hf_hub_download, self.repo_id, path, repo_type="dataset", revision=version,
                                   cache_dir=cache, endpoint=self.endpoint)
                return Path(local).read_bytes()
            return snapshot_from_files(read)

    def publish(self, source: Path, version: str, message: str) -> str:
        self._call(self.api.create_repo, self.repo_id, repo_type="dataset", private=self.private, exist_ok=True)
        if version in self.versions():
            raise PublishError(f"version {version} already exists in hf://datasets/{self.repo_id}; "
                               "versions are never overwritten")
        new = {str(path) for path in published_files(source)}
        current = set(self._call(self.api.list_repo_files, self.repo_id, repo_type="dataset"))
        operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=str(source / path)) for path in sorted(new)]
        operations += [CommitOperationDelete(path_in_repo=path) for path in sorted(current - new - HUB_OWNED)]
        commit = self._call(self.api.create_commit, self.repo_id, operations=operations, commit_message=message,
                            repo_type="dataset")
        self._call(self.api.create_tag, self.repo_id, tag=version, tag_message=message, revision=commit.oid,
                   repo_type="dataset")
        return commit.oid

    def _call(self, function, *args, **kwargs):
        for attempt in range(self.attempts):
            try:
                return function(*args, **kwargs)
            except RepositoryNotFoundError:
                raise
            except Exception as error:
                status = getattr(getattr(error, "response", None), "status_code", None)
                if status == 401:
                    raise PublishError("the Hub refused the credentials (401): set HF_TOKEN or run "
                                       "`hf auth login`") from None
                if not is_transient(error) or attempt == self.attempts - 1:
                    raise PublishError(f"the Hub call {function.__name__} failed: {error}") from None
                delay = retry_delay(error, attempt, self.backoff_s)
                log.warning("Hub call %s failed (%s); retrying in %.1f s", function.__name__, error, delay)
                time.sleep(delay)
