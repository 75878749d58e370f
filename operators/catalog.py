"""The operator catalog: crawl sources, write one Parquet file, and cache it by versions."""
from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import threading
import time
import warnings
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from operators.records import InlinedOp, OpSpec, SkippedOp
from operators.libraries import library_name

log = logging.getLogger(__name__)
CATALOG_VERSION = "9"  # bump when probing or screening rules change, so cached catalogs are rebuilt
MAX_PROCESSES = 16

CATALOG_SCHEMA = pa.schema([
    ("name", pa.string()), ("library", pa.string()), ("kind", pa.string()),
    ("runnable", pa.bool_()), ("skip_reason", pa.string()), ("skip_detail", pa.string()),
    ("layouts", pa.list_(pa.string())), ("keeps_rank", pa.list_(pa.string())),
    ("init_args", pa.string()), ("call_args", pa.string()),
    ("output_shape", pa.list_(pa.int64())), ("output_dtype", pa.string()), ("seed_code", pa.string()),
    ("definitions", pa.string()), ("output_item", pa.int64()), ("source", pa.string()),
])


def crawl(libraries: list[str], processes: int | None = None,
          ops: list[str] | None = None) -> tuple[list[OpSpec], list[SkippedOp]]:
    """Probe every op each source yields (with `ops`, fnmatch patterns of dotted names: only
    the ops they match). An op seen twice (by signature, then with an
    OpInfo sample) keeps the first runnable result; a skip is replaced by a later success.
    With `processes` > 1 (default: one per core, at most MAX_PROCESSES), each library's
    source is split in that many parts (sources.source_shard), probed in parallel, and the
    results are merged in the source's own order: the catalog is the one-process crawl's."""
    from operators.sources import source_for  # torch: only a crawl needs it, not a cached catalog
    processes = processes or min(os.cpu_count() or 1, MAX_PROCESSES)
    for library in libraries:  # an unknown --library fails here, before any process starts
        source_for(library)
    if processes <= 1:
        keyed = [(position, key, name, result) for position, library in enumerate(libraries)
                 for key, name, result in _crawl_part(library, 0, 1, ops)]
    else:
        parts = [(position, library, shard) for position, library in enumerate(libraries) for shard in range(processes)]
        # A Pool, not an executor: leaving its block (Ctrl-C included) terminates the processes
        # at once instead of waiting for the parts under way.
        done: list = [None] * len(parts)
        with multiprocessing.get_context("spawn").Pool(processes, initializer=_leave_interrupts_to_the_parent) as pool:
            progress = _CrawlProgress(libraries, len(parts))
            for index, part in pool.imap_unordered(_crawl_indexed, [(index, library, shard, processes, ops) for index, (
                    _, library, shard) in enumerate(parts)]):
                done[index] = part
                progress.part_done()
        keyed = [(position, key, name, result) for (position, _, _), part in zip(parts, done)
                 for key, name, result in part]
    results: dict[str, OpSpec | SkippedOp] = {}
    for _, _, name, result in sorted(keyed, key=lambda item: item[:2]):
        if isinstance(results.get(name), OpSpec):
            continue
        if name not in results or isinstance(result, OpSpec):
            results[name] = result
    specs = [r for r in results.values() if isinstance(r, OpSpec)]
    skipped = [r for r in results.values() if isinstance(r, SkippedOp)]
    log.info("crawled %s: %d runnable, %d skipped", ",".join(libraries), len(specs), len(skipped))
    return specs, skipped


def _leave_interrupts_to_the_parent() -> None:
    """A crawl process ignores Ctrl-C: the terminal sends it to the whole process group, and
    each process printed its own traceback before the command's one line. The parent stops
    them when it leaves the pool's block."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _CrawlProgress:
    """A line as parts of the crawl finish, at most every few seconds, with the time left."""

    def __init__(self, libraries: list[str], parts: int, every_s: float = 5.0):
        self.libraries, self.parts, self.every_s = ", ".join(libraries), parts, every_s
        self.done, self.began = 0, time.monotonic()
        self.logged = self.began - every_s
        log.info("crawling %s: %d parts on %d processes", self.libraries, parts, min(parts, os.cpu_count() or 1))

    def part_done(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.logged >= self.every_s or self.done == self.parts:
            left = (now - self.began) / self.done * (self.parts - self.done)
            log.info("crawling %s: %d of %d parts in %.0f s, about %.0f s left", self.libraries, self.done, self.parts,
                     now - self.began, left)
            self.logged = now


def _crawl_indexed(job: tuple) -> tuple[int, list]:
    index, library, shard, shards, ops = job
    return index, _crawl_part(library, shard, shards, ops)


def _crawl_part(library: str, shard: int, shards: int,
                ops: list[str] | None = None) -> list[tuple[tuple, str, OpSpec | SkippedOp]]:
    """(key, name, result) of every entry of one part of a library's source (that `ops` match), probed."""
    import torch

    from operators.sources import source_shard
    torch.set_num_threads(1)  # one process a core: probes are small
    out, runnable = [], set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, entry in source_shard(library, shard, shards):  # in the source's order
            name = entry[0] if isinstance(entry, tuple) else entry.name
            if name in runnable or not wanted(name, ops):  # the merge keeps the first runnable result
                continue
            result = _probe_entry(entry, name.split(".")[0] if isinstance(entry, tuple) else None)
            out.append((key, name, replace(result, source=library)))
            if isinstance(result, OpSpec):
                runnable.add(name)
    return out


def _probe_entry(entry, library: str | None) -> OpSpec | SkippedOp:
    """A source entry is (name, object[, call recipe]), an InlinedOp or an already decided SkippedOp.
    The library of a named entry is the package its name starts with."""
    from operators.probe import probe, probe_inlined
    if isinstance(entry, SkippedOp):
        return entry
    if isinstance(entry, InlinedOp):
        return probe_inlined(entry)
    name, obj, recipe = (*entry, None) if len(entry) == 2 else entry
    return probe(obj, name, library, recipe)


def write_catalog(path: Path, specs: list[OpSpec], skipped: list[SkippedOp]) -> None:
    rows = [{**spec.to_row(), "runnable": True, "skip_reason": "", "skip_detail": ""} for spec in specs]
    rows += [{"name": s.name, "library": s.library, "kind": s.kind, "runnable": False,
              "skip_reason": s.reason, "skip_detail": s.detail, "layouts": [], "keeps_rank": [],
              "init_args": "{}", "call_args": "{}", "output_shape": [], "output_dtype": "", "seed_code": "",
              "definitions": "", "output_item": None, "source": s.source}
             for s in skipped]
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_table(pa.Table.from_pylist(rows, schema=CATALOG_SCHEMA), path)


def _write_table(table: pa.Table, path: Path) -> None:
    """Write `table` to `path` whole or not at all, through a temporary file of this writer's
    own: processes that crawl one library into one cache at once (bench_dedupe's composing
    pool) each rename a file of their own, where a shared `.tmp` was renamed away under one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(path)


def read_catalog(path: Path) -> list[OpSpec]:
    rows = pq.ParquetFile(path).read().to_pylist()  # read_table imports pyarrow.dataset and pandas: seconds
    return [OpSpec.from_row(row) for row in rows if row["runnable"]]


def cache_key(libraries: list[str]) -> str:
    versions = {lib: _version(library_name(lib)) for lib in libraries}
    blob = json.dumps({"catalog": CATALOG_VERSION, "versions": versions, "libraries": libraries}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_or_crawl(libraries: list[str], cache_dir: Path, ops: list[str] | None = None) -> tuple[Path, list[OpSpec]]:
    """The catalog for these libraries at their installed versions, crawling only on a miss.
    Each library is crawled and cached on its own, so a crawl killed after torch keeps torch.
    With `ops` (--ops patterns), a library not cached whole is crawled for the ops they match
    alone, and that part is cached apart: a first run narrowed to a few ops probes those, not
    the minutes of a library's every op."""
    folder = Path(cache_dir) / "catalogs"
    whole = folder / f"catalog-{cache_key(libraries)}.parquet"
    if whole.exists():
        return whole, read_catalog(whole)
    parts = [_library_part(folder, library, ops) for library in libraries]
    narrowed = any(narrow for _, narrow in parts)
    path = whole.with_name(f"{whole.stem}-{ops_key(ops)}.parquet") if narrowed else whole
    if not path.exists():
        _merge([part for part, _ in parts], path)
    return path, read_catalog(path)


def _library_part(folder: Path, library: str, ops: list[str] | None) -> tuple[Path, bool]:
    """(a library's cached catalog, whether `ops` narrowed it): the whole library's where it
    is cached or no `ops` narrow it, else the part `ops` match; crawled now if not cached."""
    part = folder / f"library-{cache_key([library])}.parquet"
    narrowed = bool(ops) and not part.exists()
    if narrowed:
        part = part.with_name(f"{part.stem}-{ops_key(ops)}.parquet")
    if not part.exists():
        log.info("crawling %s%s (the first time for this version; cached in %s)", library,
                 f" for --ops {','.join(ops)}" if narrowed else "", folder)
        specs, skipped = crawl([library], ops=ops if narrowed else None)
        write_catalog(part, specs, skipped)
    return part, narrowed


def ops_key(ops: list[str] | None) -> str:
    return hashlib.sha256(json.dumps(sorted(ops or [])).encode()).hexdigest()[:12]


def wanted(name: str, ops: list[str] | None) -> bool:
    """Whether --ops patterns (none: every op) match an op's dotted name, as select_ops matches them."""
    return not ops or any(fnmatch.fnmatchcase(name, pattern) for pattern in ops)


def _merge(parts: list[Path], path: Path) -> None:
    """One catalog of several libraries' parts: an op in two keeps its first runnable entry."""
    rows: dict[str, dict] = {}
    for part in parts:
        for row in pq.ParquetFile(part).read().to_pylist():
            if row["name"] not in rows or row["runnable"] and not rows[row["name"]]["runnable"]:
                rows[row["name"]] = row
    _write_table(pa.Table.from_pylist(list(rows.values()), schema=CATALOG_SCHEMA), path)


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unversioned"


def coverage_summary(path, top: int = 8) -> str:
    """Runnable ops per --library value and kind, families for inlined libraries, and the top skip reasons."""
    rows = pq.ParquetFile(path).read(columns=["name", "source", "kind", "runnable", "skip_reason"]).to_pylist()
    lines = []
    for source in sorted({row["source"] for row in rows}):
        mine = [row for row in rows if row["source"] == source]
        runnable = [row for row in mine if row["runnable"]]
        kinds = ", ".join(f"{sum(r['kind'] == kind for r in runnable)} {kind}s" for kind in ("module", "function"))
        families = {row["name"].split(".")[2] for row in runnable if row["name"].startswith("transformers.models.")}
        lines.append(f"{source}: {len(runnable)} runnable ({kinds})"
                     + (f" from {len(families)} model families" if families else "")
                     + f", {len(mine) - len(runnable)} skipped")
        reasons = Counter(row["skip_reason"] for row in mine if not row["runnable"])
        if reasons:
            lines.append("  skipped: " + ", ".join(f"{reason} {count}" for reason, count in reasons.most_common(top)))
    return "\n".join(lines)
