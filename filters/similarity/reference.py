"""Reference sets to decontaminate against: a KernelBench checkout, any folder of .py
tasks, a Parquet file with a `code` column, or a Hub dataset id (through `datasets`)."""
from __future__ import annotations

import hashlib
import json
import logging
import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from filters.similarity.score import Fingerprint, fingerprint, with_graph
from filters.store import JsonStore
from operators.records import normalized_code

GRAPH_VERSION = 55  # bump when filters/computation/ canonicalises differently

log = logging.getLogger(__name__)
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
DEFAULT_LEVELS = (1, 2, 3)


class ReferenceSetError(ValueError):
    """The reference cannot be used: missing, empty, or of an unknown form."""


@dataclass(frozen=True)
class ReferenceSet:
    source: str
    revision: str
    name: str  # what the reference is (KernelBench, a Hub id, a folder's name), never a local path
    fingerprints: tuple[Fingerprint, ...]
    unparsable: tuple[str, ...] = ()
    codes: tuple[str, ...] = ()  # the source of each fingerprint, in order (for tracing)
    traced: int = 0  # how many fingerprints carry a traced op sequence


def traced(reference: ReferenceSet, pool, cache_dir: str | Path, checks: dict | None = None) -> ReferenceSet:
    """`reference` with each task's op sequence, traced in the sandbox (reference code is
    code from outside too: a Hub dataset is anyone's) and read in full (`in_full`, on the
    device and seed of `checks`), or read from the shipped table. Cached by code and torch version."""
    return with_graphs(reference, with_shipped(
        list(reference.codes), lambda codes: in_full(codes, readings(codes, pool, cache_dir), pool, cache_dir, checks)))


# KernelBench's op sequences as this GRAPH_VERSION reads them, traced once where every task can
# be read at its own sizes (`python -m pipeline.shipped_readings`): facts about KernelBench's
# code, keyed by the digest of each task's source, so that a run against a stock checkout or
# the Hub dataset starts without tracing its reference (11 minutes on 2 cores).
SHIPPED_READINGS = Path(__file__).with_name("kernelbench_readings.json")


def code_digest(code: str) -> str:
    """The shipped table's key for a task: the SHA-256 of what its code is (`normalized_code`:
    comments, docstrings and formatting left out), so that a copy of a stock task that differs
    from the checkout's file in those alone (another revision's docstring, the Hub's text, line
    endings) reads from the table; of the text where it does not parse."""
    try:
        code = normalized_code(code)
    except (SyntaxError, ValueError, RecursionError):
        pass
    return hashlib.sha256(code.encode()).hexdigest()


def shipped_readings(path: Path = SHIPPED_READINGS) -> dict[str, str | None]:
    """{code digest: op sequence, or None where none stood}: the shipped table, or nothing when
    it was read by another GRAPH_VERSION (the table is then traced afresh; the tests hold it current)."""
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    if table.get("graph_version") != GRAPH_VERSION:
        log.warning("%s was read by GRAPH_VERSION %s, not %s: the reference is traced here; rebuild it with "
                    "`python -m pipeline.shipped_readings`", path.name, table.get("graph_version"), GRAPH_VERSION)
        return {}
    return table["readings"]


def with_shipped(codes: list[str], trace, shipped: dict | None = None) -> list[str | None]:
    """Each task's op sequence: from the shipped table where it holds the task's code (`shipped`,
    by default SHIPPED_READINGS), else `trace(codes)` for the others, each once."""
    shipped = shipped_readings() if shipped is None else shipped
    digests = [code_digest(code) for code in codes]
    todo = list(dict.fromkeys(code for code, digest in zip(codes, digests) if digest not in shipped))
    if len(todo) < len(codes):
        log.info("reference: %d of %d tasks read from the shipped table, %d to trace", len(codes) - len(todo),
                 len(codes), len(todo))
    graphs = dict(zip(todo, trace(todo))) if todo else {}
    return [shipped[digest] if digest in shipped else graphs[code] for code, digest in zip(codes, digests)]


def with_graphs(reference: ReferenceSet, graphs: list[str | None]) -> ReferenceSet:
    fingerprints = tuple(with_graph(fp, graph) for fp, graph in zip(reference.fingerprints, graphs))
    done = sum(bool(g) for g in graphs)
    if done < len(graphs):
        log.info("reference %s: %d of %d tasks traced; the rest keep the textual score", reference.source, done,
                 len(graphs))
    return replace(reference, fingerprints=fingerprints, traced=done)


def trace_all(codes: list[str], pool, cache_dir: str | Path, as_candidates: bool = False,
              device: str = "cpu") -> list[str | None]:
    """The op sequence of each task (None where it cannot be traced), from the cache or the
    pool; traced as the reference's tasks are, or `as_candidates` are (harness.trace's
    `untrusted`: what a run's accepted task gets, read at its own sizes on `device` where
    the small problem leaves an op unspelled)."""
    return [entry["op_graph"] for entry in readings(codes, pool, cache_dir, as_candidates, device)]


def readings(codes: list[str], pool, cache_dir: str | Path, as_candidates: bool = False,
             device: str = "cpu") -> list[dict]:
    """What `trace_all` traces, as the cache holds it: {"op_graph", "partial"} (harness.Reading)."""
    return _cached([trace_job(code, as_candidates, device) for code in codes],
                   [graph_key(code, as_candidates, device=device) for code in codes], pool, cache_dir)


def trace_job(code: str, as_candidate: bool = False, device: str = "cpu") -> dict:
    """The sandbox job that traces one task, as `readings` keys it (`graph_key`)."""
    on = {"device": device} if device != "cpu" else {}
    return {"code": code, "config": {"trace_only": True, "untrusted": as_candidate, **on}}


def in_full(codes: list[str], entries: list[dict], pool, cache_dir: str | Path, checks: dict | None = None) -> list:
    """Each task's op sequence, a partial reading (harness.Reading: read at a smaller problem,
    where it left named ops unspelled) read again at the task's own sizes, as a candidate
    that leaves ops unspelled is, on the checks' device and seed (`checks`); the partial
    reading is kept where that one fails. A candidate and the task it copies are then read
    at the same sizes: a copy of KernelBench's Gemm_LogSumExp_LeakyReLU_LeakyReLU_GELU_GELU
    was read at its own width of 8,192, where the log-sum-exp is positive and the
    activations after it are identities, and its reference at the small problem."""
    partial = [i for i, entry in enumerate(entries) if entry.get("partial")]
    settings = {key: value for key, value in (checks or {}).items() if key in ("device", "seed")}
    again = _cached([{"code": codes[i], "config": {"trace_only": True, "untrusted": False, "in_full": True,
                                                   **settings}} for i in partial],
                    [graph_key(codes[i], in_full=True, device=settings.get("device", "cpu")) for i in partial],
                    pool, cache_dir)
    graphs = [entry["op_graph"] for entry in entries]
    for i, entry in zip(partial, again):
        graphs[i] = entry["op_graph"] or graphs[i]
    return graphs


def _cached(jobs: list[dict], keys: list[str], pool, cache_dir: str | Path) -> list[dict]:
    store = JsonStore(Path(cache_dir) / "op_graphs")
    found = [store.get(key) for key in keys]
    missing = [i for i, entry in enumerate(found) if entry is None]
    results = pool.run_many([jobs[i] for i in missing]) if missing else []
    for i, result in zip(missing, results):
        found[i] = stored_reading(store, keys[i], result)
    return found


def stored_reading(store: JsonStore, key: str, result: dict) -> dict:
    """A trace job's result as the cache holds it ({"op_graph", "partial"}), put in the cache
    unless the sandbox ended the job (a crash or timeout may be the machine's: try again next time)."""
    metrics = result["metrics"] if result["passed"] else {}
    reading = {"op_graph": metrics.get("op_graph"), "partial": bool(metrics.get("partial"))}
    if result["stage"] != "sandbox":
        store.put(key, reading)
    return reading


def graph_key(code: str, as_candidate: bool = False, in_full: bool = False, device: str = "cpu") -> str:
    """The key of a task's traced op sequence in the cache: its code, the tracer and torch
    (and whether it was traced as a candidate, or at its own sizes on which device)."""
    import torch
    mode = f"\x00own\x00{device}" if in_full else "" if device == "cpu" else f"\x00on\x00{device}"
    mode = ("\x00candidate" if as_candidate else "") + mode
    return hashlib.sha256(f"{GRAPH_VERSION}\x00{torch.__version__}\x00{code}{mode}".encode()).hexdigest()


def load_reference(source: str, levels: tuple[int, ...] = DEFAULT_LEVELS) -> ReferenceSet:
    tasks, revision, name = _read_tasks(source, levels)
    if not tasks:
        raise ReferenceSetError(f"--reference {source} holds no tasks for levels {list(levels)}; "
                                "point it at a KernelBench checkout, a folder of .py files or a Parquet file with a code column")
    fingerprints, unparsable = fingerprint_all(tasks)
    if unparsable:
        log.warning("reference %s: %d tasks do not parse and are left out: %s", source, len(unparsable), unparsable[:5])
    digest = hashlib.sha256("\n".join(code for _, code in tasks).encode()).hexdigest()[:12]
    codes = dict(tasks)
    return ReferenceSet(source, revision or f"content-{digest}", name, tuple(fingerprints), tuple(unparsable),
                        tuple(codes[fp.name] for fp in fingerprints))


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


def read_parquet(path: Path):
    """The table, or a ReferenceSetError that names the file when it is not Parquet at all."""
    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as error:
        raise ReferenceSetError(f"{path} is not a readable Parquet file ({error}); "
                                "pass a Parquet file with a `code` column or a folder of .py files") from None


def _read_tasks(source: str, levels) -> tuple[list[tuple[str, str]], str | None, str]:
    """(tasks, revision, name). A folder's revision is its own git commit only when the folder
    is the top of its own checkout: a copy of KernelBench inside another repository is named
    by its content, not by that repository's commit."""
    path = Path(source)
    if path.exists():
        root = path / "KernelBench" if (path / "KernelBench").is_dir() else path
        level_dirs = [root / f"level{n}" for n in levels if (root / f"level{n}").is_dir()]
        revision = _git_revision(path) if path.is_dir() else None
        if level_dirs:
            tasks = [(f"{d.name}/{p.name}", p.read_text()) for d in level_dirs for p in sorted(d.glob("*.py"))]
            return tasks, revision, _checkout_name(path) or "KernelBench"
        return read_tasks(source), revision, _checkout_name(path) or path.resolve().name
    if HUB_ID.match(source):
        tasks, revision = _hub_tasks(source, levels)
        return tasks, revision, source
    raise ReferenceSetError(f"--reference {source}: no such file or folder, and not a Hub dataset id (ORG/NAME)")


def _parquet_tasks(path: Path) -> list[tuple[str, str]]:
    table = read_parquet(path)
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
    """The commit of the checkout whose top is `path`, else None."""
    top = _git(path, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != path.resolve():
        return None
    return _git(path, "rev-parse", "HEAD")


def _checkout_name(path: Path) -> str | None:
    """`OWNER/NAME` of the checkout whose top is `path`, from its origin's address, else None
    (also when the origin is a folder of this machine: a clone of a local copy)."""
    if not path.is_dir() or _git_revision(path) is None:
        return None
    origin = _git(path, "config", "--get", "remote.origin.url") or ""
    if origin.startswith(("file:", "/", ".")):
        return None
    match = re.search(r"([\w.-]+/[\w.-]+?)(?:\.git)?/?$", origin or "")
    return match.group(1) if match else None


def _git(path: Path, *args: str) -> str | None:
    try:
        result = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None
