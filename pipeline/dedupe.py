"""`opsynth dedupe`: one row per task with its nearest reference task and duplicate.

Every task is traced in the sandbox, a batch of tasks per child (filters/sandbox/trace_batch.py):
a child per task cost more than the trace itself. Only tasks the static policy lets through
share a child: one that holds the interpreter can replace the batch's own guard (a red team
set `trace_batch.changed` to a function that finds no change, then steered every later silu)
and is traced alone. A task has as long in a batch as alone; a batch that a task changed, or
that failed, is finished one task per child."""
from __future__ import annotations

import logging
import math
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from filters.grammar import static_check
from filters.sandbox.worker import TRACE_LIMIT_S
from filters.similarity.decontaminate import SimilarityIndex, decontaminate, dedupe
from filters.similarity.reference import (ReferenceSet, ReferenceSetError, fingerprint_all, graph_key, in_full,
                                          load_reference, read_tasks, stored_reading, trace_job, with_graphs,
                                          with_shipped)
from filters.similarity.score import with_graph
from filters.store import JsonStore

log = logging.getLogger(__name__)
REPORT_SCHEMA = pa.schema([("source", pa.string()), ("max_similarity", pa.float64()), ("nearest", pa.string()),
                           ("duplicate_of", pa.string()), ("traced", pa.bool_()), ("kept", pa.bool_())])
TRACE_BATCH = 32  # tasks a child traces: a few seconds of work, well inside the trace's time limit
PROGRESS_S = 10.0  # how often a long trace logs how far it is
# A batch whose child died is batched again without the task it was tracing (that one goes to
# a child of its own) at most this many times over; past it, what is left goes one per child.
QUARANTINES = 4


def dedupe_report(tasks: str, against: str, levels: tuple[int, ...], threshold: float, dedupe_threshold: float,
                  out: Path, pool, cache_dir: str | Path, shipped: dict | None = None,
                  keep_untraced: bool = False) -> list[dict]:
    """Both sets are traced in the sandbox `pool` (cached under `cache_dir`), so that what
    a task computes is compared, and read as text; dedupe inside the set is textual. The
    reference is read as a run reads it (the shipped table where it holds a task, on the CPU
    at seed 0 otherwise), and the tasks likewise: a partial reading read again at the task's
    own sizes, so that a copy of a reference task reads as the table does. A task whose
    computation cannot be read is removed, as a run rejects it (`untraced`), unless
    `keep_untraced`: compared by its text alone, an adversary's copy that traced past its
    time limit, or whose two readings disagreed, was kept at 0.32 and 0.38."""
    named = read_tasks(tasks)
    if not named:
        raise ReferenceSetError(f"{tasks} holds no tasks")
    reference = load_reference(against, levels)
    fingerprints, unparsable = fingerprint_all(named)
    codes = dict(named)
    checks = {"device": "cpu", "seed": 0}
    reference = with_graphs(reference, reference_graphs(list(reference.codes), pool, cache_dir, checks, shipped))
    candidates = [codes[fp.name] for fp in fingerprints]
    graphs = in_full(candidates, readings_in_batches(candidates, pool, cache_dir), pool, cache_dir, checks)
    computed = [with_graph(fp, graph) for fp, graph in zip(fingerprints, graphs)]
    matches = decontaminate(computed, SimilarityIndex(reference.fingerprints), threshold)
    duplicates = dedupe(fingerprints, dedupe_threshold)
    rows = [{"source": fp.name, "max_similarity": match.similarity, "nearest": match.nearest,
             "duplicate_of": dup.duplicate_of, "traced": graph is not None,
             "kept": dup.kept and not match.too_close(threshold) and (graph is not None or keep_untraced)}
            for fp, match, dup, graph in zip(fingerprints, matches, duplicates, graphs)]
    rows += [{"source": name, "max_similarity": None, "nearest": None, "duplicate_of": None, "traced": False,
              "kept": False} for name in unparsable]
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=REPORT_SCHEMA), out, compression="zstd")
    return rows


def traced_in_batches(reference: ReferenceSet, pool, cache_dir: str | Path, checks: dict | None = None,
                      shipped: dict | None = None) -> ReferenceSet:
    """`reference` with each task's op sequence (filters.similarity.reference.traced, in batches)."""
    return with_graphs(reference, reference_graphs(list(reference.codes), pool, cache_dir, checks, shipped))


def reference_graphs(codes: list[str], pool, cache_dir: str | Path, checks: dict | None = None,
                     shipped: dict | None = None) -> list[str | None]:
    """Each reference task's op sequence: from the shipped table where it holds the task's code
    (filters/similarity/kernelbench_readings.json, or `shipped`), else traced in batches and
    read in full here."""
    return with_shipped(codes, lambda todo: in_full(todo, readings_in_batches(todo, pool, cache_dir), pool, cache_dir,
                                                    checks), shipped)


def trace_in_batches(codes: list[str], pool, cache_dir: str | Path, batch: int = TRACE_BATCH) -> list[str | None]:
    """What `trace_all` returns, from the same cache: the op sequence of each task, or None."""
    return [entry["op_graph"] for entry in readings_in_batches(codes, pool, cache_dir, batch)]


def readings_in_batches(codes: list[str], pool, cache_dir: str | Path, batch: int = TRACE_BATCH,
                        task_limit_s: float = TRACE_LIMIT_S) -> list[dict]:
    """What `readings` returns, from the same cache. The tasks not in the cache that pass the
    static check are traced up to `batch` to a child, fewer where a worker would have none
    (`_spread`; the others, alone). A task still tracing
    after `task_limit_s` (a trace's limit alone) is stopped and untraced, as alone, and not
    cached (a timeout may be the machine's); the rest of its batch, like what a batch leaves
    when it runs out of time, is batched again. A batch whose child died (its memory limit, a
    C call past its time) names the task it was tracing: that task is traced alone and the
    rest batched again, up to QUARANTINES times. What a batch leaves after a task changed its
    process, or when it failed with no task named, is traced one task per child. (Halving a
    failed batch until its culprit is alone measured half as fast on 2 cores: the culprit
    fails each half again, BENCHMARKS.md, the reference trace.) Each job that ends sends what it leaves
    to the pool at once, so no worker waits for a round's slowest batch; how far the trace is
    gets logged every PROGRESS_S."""
    store = JsonStore(Path(cache_dir) / "op_graphs")
    found = {code: store.get(graph_key(code)) for code in dict.fromkeys(codes)}
    missing = [code for code, entry in found.items() if entry is None]
    if not missing:
        return [found[code] for code in codes]
    pending, refused = shareable(missing)
    log.info("tracing %d tasks, %d a child on %d workers (%d cached)", len(missing),
             _spread(len(pending), batch, len(pool.workers)), len(pool.workers),
             len(found) - len(missing))

    def batched(part: list[str], quarantined: int = 0) -> Future:
        job = {"code": "", "config": {"trace_batch": part, "task_limit_s": task_limit_s}}
        return pool.submit(job, then=lambda result: (True, part, result, quarantined))

    def alone(code: str) -> Future:
        return pool.submit(trace_job(code), then=lambda result: (False, [code], result, 0))

    workers = len(pool.workers)
    running = {*map(batched, _chunks(pending, _spread(len(pending), batch, workers))), *map(alone, refused)}
    began = logged = time.monotonic()
    one_per_child, stopped, quarantined_in_all = len(refused), 0, 0
    while running:
        ended, running = wait(running, return_when=FIRST_COMPLETED)
        for future in ended:
            was_batch, part, result, quarantined = future.result()
            if not was_batch:
                found[part[0]] = stored_reading(store, graph_key(part[0]), result)
                continue
            done = result["metrics"].get("traced", 0) if result["passed"] else 0
            for i, code in enumerate(part[:done]):
                found[code] = {"op_graph": result["metrics"].get(f"op_graph_{i}"),
                               "partial": bool(result["metrics"].get(f"partial_{i}"))}
                store.put(graph_key(code), found[code])
            timed_out = _timed_out(part, done, result)
            if timed_out is not None:
                found[part[timed_out]] = {"op_graph": None, "partial": False}  # untraced, as alone, and not cached
                stopped += 1
            culprit = _died_tracing(part, result) if quarantined < QUARANTINES else None
            if culprit is not None:
                log.info("a batch of %d died tracing one task (%s: %s): that task goes to a child of its own, the "
                         "other %d to a batch again", len(part), result["reason"], result["detail"][:200], len(part) - 1)
                rest = part[:culprit] + part[culprit + 1:]
                running |= {alone(part[culprit]), *(batched(piece, quarantined + 1)
                                                    for piece in _chunks(rest, _spread(len(rest), batch, workers)))}
                quarantined_in_all += 1
                continue
            again, lone = _left_by(part, done, result, timed_out)
            running |= {*map(batched, _chunks(again, _spread(len(again), batch, workers))), *map(alone, lone)}
            one_per_child += len(lone)
        if time.monotonic() - logged > PROGRESS_S and running:
            logged = time.monotonic()
            log.info("traced %d of %d tasks in %.0f s", sum(found[code] is not None for code in missing), len(missing),
                     logged - began)
    if one_per_child:
        log.info("%d tasks traced one per child (left by a batch that failed or that a task changed, or refused "
                 "sharing by the grammar)", one_per_child)
    if quarantined_in_all:
        log.info("%d tasks traced alone after their batch's child died tracing them", quarantined_in_all)
    if stopped:
        log.info("%d tasks ran out of a trace's %.0f s in their batch: untraced", stopped, task_limit_s)
    log.info("traced %d tasks in %.0f s", len(missing), time.monotonic() - began)
    return [found[code] for code in codes]


def _timed_out(part: list[str], done: int, result: dict) -> int | None:
    """The index in `part` of the task a batch stopped for running out of its time, or None."""
    index = result["metrics"].get("timed_out") if result["passed"] else None
    return index if isinstance(index, int) and not isinstance(index, bool) and done <= index < len(part) else None


def _died_tracing(part: list[str], result: dict) -> int | None:
    """The index in `part` of the task a failed batch's child was tracing when it died, or
    None (it passed, or died between tasks, in its own checks)."""
    index = None if result["passed"] else result["metrics"].get("under_way")
    return index if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(part) else None


def _left_by(part: list[str], done: int, result: dict, timed_out: int | None) -> tuple[list[str], list[str]]:
    """(what to batch again, what to trace alone) of a batch that traced its first `done` tasks."""
    if timed_out is not None:
        return part[done:timed_out] + part[timed_out + 1:], []
    rest = part[done:]
    if result["passed"] and not result["metrics"].get("steered") and done:
        if rest and result["metrics"].get("held_memory"):
            log.info("a batch of %d ended after %d traced: its tasks held memory a later one would need", len(part), done)
        return rest, []  # out of time or room
    if rest and not result["passed"]:
        log.info("a batch of %d failed after %d traced (%s: %s)", len(part), done, result["reason"],
                 result["detail"][:200])
    elif rest:
        log.info("a batch of %d was changed after %d traced (%s)", len(part), done,
                 result["metrics"].get("moved") or "no change named")
    return [], rest


def _spread(count: int, batch: int, workers: int) -> int:
    """How many of `count` tasks to a batch: `batch`, or fewer, so that every worker has one.
    What a batch leaves comes back at the end, when most workers are idle, and holds the slow
    tasks (a level's large networks come together): in one batch they were traced one after
    another (on the H100, the last 33 of KernelBench's 250 took 300 of the build's 380 s)."""
    return max(1, min(batch, math.ceil(count / max(1, workers))))


def _chunks(codes: list[str], size: int) -> list[list[str]]:
    return [codes[i:i + size] for i in range(0, len(codes), max(1, size))]


def shareable(codes: list[str]) -> tuple[list[str], list[str]]:
    """(the tasks that may share a child, the rest). The guards of a batch run in the process
    they guard, so only code that can reach none of them may share it: code the static policy
    lets through writes no module, imports neither `sys` nor `builtins` and registers no
    kernel or global hook (3.9 ms a task; 237 of KernelBench's 250 pass it)."""
    verdicts = [static_check(code) for code in codes]
    return ([code for code, verdict in zip(codes, verdicts) if verdict is None],
            [code for code, verdict in zip(codes, verdicts) if verdict is not None])
