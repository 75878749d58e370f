"""A stand-in for the Hugging Face Hub HTTP API, on 127.0.0.1, for tests only.

It serves just the routes huggingface_hub uses to create a dataset repo, commit files
(inline, "regular" upload mode), tag, list refs and files, and download a file at a
revision, and those `datasets.load_dataset` reads a repository through (its info, a
folder listed one level deep). It keeps every request it receives, so tests can assert what was sent, and it
can fail the next N requests to a route with a status of the test's choosing.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlparse

from tests.loopback import LoopbackServer, send_json

REPO = r"(?P<repo>[^/]+/[^/]+)"


@dataclass
class Repo:
    private: bool
    commits: list = field(default_factory=list)  # [(oid, message, {path: bytes})]
    tags: dict = field(default_factory=dict)  # name -> oid

    def head(self) -> tuple[str, dict]:
        return (self.commits[-1][0], self.commits[-1][2]) if self.commits else ("0" * 40, {".gitattributes": b"*.parquet filter=lfs\n"})

    def files_at(self, revision: str) -> tuple[str, dict] | None:
        oid = self.tags.get(revision, revision)
        if revision == "main":
            return self.head()
        return next(((o, files) for o, _, files in self.commits if o == oid), None)


class HubStandIn(LoopbackServer):
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.failures: dict[str, list[int]] = {}  # route name -> statuses to answer before serving
        self.local = threading.local()
        super().__init__(self._handler())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, route: str, *statuses: int) -> None:
        self.failures.setdefault(route, []).extend(statuses)

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub._route(self, "GET")

            def do_HEAD(self):
                hub._route(self, "HEAD")

            def do_POST(self):
                hub._route(self, "POST")

        return Handler

    # -- routing ------------------------------------------------------------------------

    def _route(self, request, method: str) -> None:
        path = unquote(urlparse(request.path).path)
        self.local.query = parse_qs(urlparse(request.path).query)  # one thread a request
        self.requests.append((method, path))
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0)) if method == "POST" else b""
        routes = [
            ("POST", r"/api/repos/create", "create", self._create),
            ("POST", r"/api/validate-yaml", "validate", lambda m, b: (200, {"errors": [], "warnings": []})),
            ("GET", rf"/api/datasets/{REPO}(?:/revision/(?P<rev>[^/]+))?", "info", self._info),
            ("GET", rf"/api/datasets/{REPO}/refs", "refs", self._refs),
            ("GET", rf"/api/datasets/{REPO}/tree/(?P<rev>[^/]+)(?P<sub>/.*)?", "tree", self._tree),
            ("POST", rf"/api/datasets/{REPO}/preupload/(?P<rev>[^/]+)", "preupload", self._preupload),
            ("POST", rf"/api/datasets/{REPO}/commit/(?P<rev>[^/]+)", "commit", self._commit),
            ("POST", rf"/api/datasets/{REPO}/tag/(?P<rev>[^/]+)", "tag", self._tag),
            ("GET", rf"/datasets/{REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)", "resolve", self._resolve),
            ("HEAD", rf"/datasets/{REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)", "resolve", self._resolve),
        ]
        for route_method, pattern, name, handle in routes:
            match = re.fullmatch(pattern, path)
            if match and route_method == method:
                if self.failures.get(name):
                    return self._send(request, method, self.failures[name].pop(0), {"error": "injected"})
                status, payload, *headers = handle(match, body)
                return self._send(request, method, status, payload, headers[0] if headers else {})
        self._send(request, method, 404, {"error": f"no route {method} {path}"})

    def _send(self, request, method, status, payload, headers=None) -> None:
        send_json(request, status, payload, headers, body=method != "HEAD")

    def _repo(self, match):
        repo = self.repos.get(match["repo"])
        if repo is None:
            return None, (404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        return repo, None

    # -- handlers -----------------------------------------------------------------------

    def _create(self, match, body):
        request = json.loads(body)
        repo_id = f"{request['organization']}/{request['name']}" if request.get("organization") else request["name"]
        url = f"{self.endpoint}/datasets/{repo_id}"
        if repo_id in self.repos:
            return 409, {"error": "You already created this dataset repo", "url": url}
        self.repos[repo_id] = Repo(private=request.get("visibility") == "private" or bool(request.get("private")))
        return 200, {"url": url}

    def _refs(self, match, body):
        repo, missing = self._repo(match)
        if missing:
            return missing
        oid, _ = repo.head()
        return 200, {"branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": oid}], "converts": [],
                     "tags": [{"name": t, "ref": f"refs/tags/{t}", "targetCommit": o} for t, o in repo.tags.items()],
                     "pullRequests": []}

    def _info(self, match, body):
        """What `datasets.load_dataset` asks first: the repo's commit and files at a revision."""
        repo, missing = self._repo(match)
        if missing:
            return missing
        found = repo.files_at(match["rev"] or "main")
        if found is None:
            return 404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"}
        oid, files = found
        return 200, {"id": match["repo"], "sha": oid, "private": repo.private, "cardData": {},
                     "siblings": [{"rfilename": path} for path in sorted(files)]}

    def _tree(self, match, body):
        repo, missing = self._repo(match)
        if missing:
            return missing
        found = repo.files_at(match["rev"])
        if found is None:
            return 404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"}
        _, files = found
        prefix = (match["sub"] or "").strip("/")
        listed = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                  for p, b in sorted(files.items()) if p.startswith(prefix)]
        if self.local.query.get("recursive") != ["false"]:
            return 200, listed
        # one level: the folder's files and its subfolders, as `datasets` lists a repository
        inside = prefix + "/" if prefix else ""
        children = [entry for entry in listed if "/" not in entry["path"][len(inside):]]
        folders = sorted({inside + p[len(inside):].split("/", 1)[0] for p in files
                          if p.startswith(inside) and "/" in p[len(inside):]})
        return 200, children + [{"type": "directory", "path": folder, "oid": "0" * 40} for folder in folders]

    def _preupload(self, match, body):
        repo, missing = self._repo(match)
        if missing:
            return missing
        return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                               for f in json.loads(body)["files"]]}

    def _commit(self, match, body):
        repo, missing = self._repo(match)
        if missing:
            return missing
        _, files = repo.head()
        files, message = dict(files), ""
        for line in body.splitlines():
            item = json.loads(line)
            if item["key"] == "header":
                message = item["value"]["summary"]
            elif item["key"] == "file":
                files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            elif item["key"] == "deletedFile":
                files.pop(item["value"]["path"], None)
            elif item["key"] == "deletedFolder":
                files = {p: b for p, b in files.items() if not p.startswith(item["value"]["path"].rstrip("/") + "/")}
        oid = hashlib.sha1(f"{len(repo.commits)}{message}".encode()).hexdigest()
        repo.commits.append((oid, message, files))
        return 200, {"commitUrl": f"{self.endpoint}/datasets/{match['repo']}/commit/{oid}", "commitOid": oid,
                     "pullRequestUrl": None}

    def _tag(self, match, body):
        repo, missing = self._repo(match)
        if missing:
            return missing
        tag = json.loads(body)["tag"]
        if tag in repo.tags:
            return 409, {"error": f"Tag {tag} already exists"}
        repo.tags[tag] = match["rev"]
        return 200, {}

    def _resolve(self, match, body):
        repo, missing = self._repo(match)
        if missing:
            return missing
        found = repo.files_at(match["rev"])
        if found is None or match["file"] not in found[1]:
            return 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"}
        oid, files = found
        data = files[match["file"]]
        return 200, data, {"Content-Type": "application/octet-stream", "X-Repo-Commit": oid,
                           "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
