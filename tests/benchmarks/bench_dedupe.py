"""`opsynth dedupe` speed: N distinct external tasks against a KernelBench checkout.

    python -m tests.benchmarks.bench_dedupe /path/to/KernelBench [--tasks 10000] [--workers 2] [--cores 2] [--alone 300]
        [--reference-cache DIR]

The tasks are composed by the template composer over the torch catalog (several processes;
kept in --work, so a second run reuses them) and written as a folder of .py files, as a
user would hand them over. The timed part is what `opsynth dedupe` does: start the sandbox
pool, trace every task from an empty cache, score, write the report. The reference's
traces are cached once per torch version (a run or an earlier dedupe made them): they are
made first, timed apart, and read from the cache in the total. --reference-cache DIR keeps
them in DIR for the next run (12 minutes on 2 cores saved on each: a before/after pair on the
same readings); the tasks are always traced from an empty cache.
--alone N also traces the first N tasks one per child (the path every trace took before
batching) and checks that both give the same op sequences.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from filters.sandbox.pool import SandboxOptions, WorkerPool
from filters.similarity.reference import load_reference, read_tasks, trace_all
from pipeline.dedupe import dedupe_report, trace_in_batches, traced_in_batches


def compose_part(count: int, start: int, step: int) -> list[str]:
    """Template tasks at indexes start, start + step, ... until `count` distinct codes."""
    from operators.catalog import load_or_crawl
    from pipeline.composers.template import TemplateComposer
    from pipeline.defaults import default_cache_dir
    _, catalog = load_or_crawl(["torch"], Path(default_cache_dir()))
    composer, codes, index = TemplateComposer(catalog), {}, start
    while len(codes) < count:
        candidate = composer.compose(index, 0)
        codes.setdefault(candidate.code, None)
        index += step
    return list(codes)


def composed_tasks(folder: Path, count: int, processes: int) -> Path:
    """`folder` holding `count` distinct tasks, composed now unless it already does."""
    if folder.is_dir() and len(list(folder.glob("*.py"))) == count:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    share = -(-count // processes) + 50  # parts may share a few codes: each composes a little more
    with ProcessPoolExecutor(processes) as executor:
        parts = executor.map(compose_part, [share] * processes, range(processes), [processes] * processes)
        codes = list(dict.fromkeys(code for part in parts for code in part))[:count]
    assert len(codes) == count, f"composed only {len(codes)} distinct tasks"
    for i, code in enumerate(codes):
        (folder / f"task_{i:05d}.py").write_text(code)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kernelbench")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=0, help="after composing, run on this many cores only")
    parser.add_argument("--alone", type=int, default=0, help="also trace this many tasks one per child")
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "opsynth" / "bench_dedupe"))
    parser.add_argument("--reference-cache", help="trace the reference into (and read it from) this folder")
    args = parser.parse_args()

    began = time.perf_counter()
    tasks = composed_tasks(Path(args.work) / f"tasks-{args.tasks}", args.tasks, max(1, os.cpu_count() or 1))
    print(f"tasks                 {args.tasks} distinct, in {tasks} ({time.perf_counter() - began:.0f} s to compose)")
    if args.cores:  # the sandbox workers started from here inherit it
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.cores])

    with tempfile.TemporaryDirectory(dir=args.work) as cache:
        began = time.perf_counter()
        # as `opsynth dedupe` starts its pool (pipeline/cli.py)
        with WorkerPool(args.workers, SandboxOptions(timeout_s=120, threads=1, warm_up=False)) as pool:
            pool.run_many([{"code": "", "config": {"trace_batch": []}}] * args.workers)  # every worker started
            started = time.perf_counter() - began
            # the reference's traces are cached once per torch version (a run traces them too): warm, as users see it
            reference_s = time.perf_counter()
            warm = bool(args.reference_cache) and (Path(args.reference_cache) / "op_graphs").is_dir()
            traced_in_batches(load_reference(args.kernelbench, (1, 2, 3)), pool, args.reference_cache or cache)
            if args.reference_cache:
                shutil.copytree(Path(args.reference_cache) / "op_graphs", Path(cache) / "op_graphs")
            reference_s = time.perf_counter() - reference_s
            began += reference_s
            rows = dedupe_report(str(tasks), args.kernelbench, (1, 2, 3), 0.9, 0.95, Path(cache) / "dedupe.parquet",
                                 pool, cache)
            total = time.perf_counter() - began
            alone = compare_alone(tasks, args.alone, pool, Path(cache)) if args.alone else None

    print(f"workers               {args.workers} on {len(os.sched_getaffinity(0))} cores")
    print(f"pool start            {started:.1f} s")
    print(f"reference, {'cached' if warm else 'cold  '}     {reference_s:.1f} s "
          f"(once per torch version; not in the total)")
    print(f"trace + score + write {total - started:.1f} s")
    print(f"total                 {total:.1f} s  ({args.tasks / total:.0f} tasks/s)")
    print(f"removed               {sum(not row['kept'] for row in rows)} of {len(rows)}; "
          f"{sum((row['max_similarity'] or 0) > 0.9 for row in rows)} similar to the reference")
    if alone:
        n, batched_s, alone_s, same = alone
        print(f"first {n}, from empty caches: batched {batched_s:.1f} s, one per child {alone_s:.1f} s "
              f"({alone_s / batched_s:.1f}x); same op sequences: {same}")


def compare_alone(tasks: Path, count: int, pool, work: Path) -> tuple:
    codes = [code for _, code in read_tasks(str(tasks))][:count]
    began = time.perf_counter()
    batched = trace_in_batches(codes, pool, work / "batched")
    batched_s = time.perf_counter() - began
    began = time.perf_counter()
    alone = trace_all(codes, pool, work / "alone")
    return len(codes), batched_s, time.perf_counter() - began, batched == alone


if __name__ == "__main__":
    main()
