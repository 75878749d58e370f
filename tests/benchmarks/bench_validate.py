"""Validation throughput: the warm worker pool against a fresh Python process per candidate.

    python -m tests.benchmarks.bench_validate [--candidates 60] [--device cpu|cuda] [--workers 2] [--tasks DIR]

Same candidates (the template composer over the default catalog, as `opsynth run` draws
them, or the .py files of --tasks DIR, from compose_candidates), same device, same checks,
environment and GPU timing gate, the same number of candidates in flight at once. The
pool's start (each worker imports torch and compiles one warm-up task) is timed apart: it
is paid once a run, not once a candidate. Prints both
wall times, the ratios with and without the start, and whether the verdicts agree (a
borderline timing can flip between any two measurements; those are listed).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from filters.checks.harness import WARM_UP_TASK
from filters.sandbox.pool import WORKER_ENV, SandboxOptions, WorkerPool
from filters.grammar import static_check
from operators.catalog import load_or_crawl
from pipeline.composers.template import CompositionFailed, TemplateComposer
from operators.libraries import DEFAULT_LIBRARIES
from pipeline.config import RunConfig
from pipeline.devices import gpu_share_gb

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", type=int, default=60)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--tasks", help="a folder of candidate .py files (compose_candidates) instead of composing")
    args = parser.parse_args()

    codes = (candidates(args.candidates, args.seed) if not args.tasks else
             [path.read_text() for path in sorted(Path(args.tasks).glob("*.py"))][:args.candidates])
    threads = max(1, (os.cpu_count() or 1) // args.workers)
    cuda = args.device.startswith("cuda")
    gpu_memory_gb = gpu_share_gb([0], args.workers) if cuda else None  # as a run shares it
    with tempfile.TemporaryDirectory(prefix="opsynth-bench-") as folder:
        # Each side starts from an empty compiler cache: a pool worker's job compiles into its
        # own job folder inside the jail (a host folder is out of the jail's reach, and as root
        # the jail's uid could not write one), the fresh processes into one of the bench's.
        naive_cache, locks = (os.path.join(folder, name) for name in ("naive", "locks"))
        config = {"device": args.device, "memory_budget_gb": gpu_memory_gb / 2 if gpu_memory_gb else None}
        options = SandboxOptions(device=args.device, threads=threads, memory_guard="rss",
                                 gpu_memory_gb=gpu_memory_gb, timing_lock_dir=locks if cuda else None)
        start_s, pool_s, pooled = time_pool(codes, config, args.workers, options)
        # The naive side times through the same gate (a lock file in the same folder).
        naive_config = {**config, "timing_lock": os.path.join(locks, "gpu0.lock") if cuda else None}
        env = {**os.environ, **WORKER_ENV, "TORCHINDUCTOR_CACHE_DIR": naive_cache}
        jobs = [{"code": code, "config": naive_config, "threads": threads, "gpu_memory_gb": gpu_memory_gb}
                for code in codes]
        naive_s, naive = time_fresh_processes(jobs, args.workers, env)
    report(args, codes, threads, start_s, pool_s, naive_s, pooled, naive)


def time_pool(codes: list[str], config: dict, workers: int, options: SandboxOptions) -> tuple[float, float, list]:
    """(seconds for every worker to start, seconds for the candidates, their results)"""
    with WorkerPool(workers, options) as pool:
        began = time.perf_counter()
        # every worker warms up as it starts; one job each makes them all start now, in parallel
        warm = [pool.submit({"code": WARM_UP_TASK, "config": {**config, "window_ms": [0.0, 1e9]}})
                for _ in pool.workers]
        assert all(f.result()["passed"] for f in warm), [f.result() for f in warm]
        start_s = time.perf_counter() - began
        began = time.perf_counter()
        pooled = pool.run_many([{"code": code, "config": config} for code in codes])
        return start_s, time.perf_counter() - began, pooled


def time_fresh_processes(jobs: list[dict], workers: int, env: dict) -> tuple[float, list]:
    """(seconds, results): each job in a fresh Python process, `workers` at a time."""
    def fresh_process(job: dict) -> dict:
        done = subprocess.run([sys.executable, "-m", "tests.benchmarks.naive_validator"], input=json.dumps(job),
                              capture_output=True, text=True, env=env, timeout=900)
        return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"reason": "crashed"}

    began = time.perf_counter()
    with ThreadPoolExecutor(workers) as executor:
        results = list(executor.map(fresh_process, jobs))
    return time.perf_counter() - began, results


def default_composer(checks_screen: bool = True) -> TemplateComposer:
    """The template composer a run with the default configuration composes with."""
    defaults = RunConfig()
    _, catalog = load_or_crawl(list(DEFAULT_LIBRARIES), Path(defaults.cache_dir))
    return TemplateComposer(catalog, defaults.op_count_mix, defaults.library_mix, checks_screen=checks_screen)


def composed(composer: TemplateComposer, count: int, seed: int) -> list:
    """The first `count` candidates of `composer` that pass the static check, drawn as a run
    with the default configuration draws them."""
    kept = []
    for index in range(count * 3):
        try:
            candidate = composer.compose(index, seed)
        except CompositionFailed:
            continue
        if static_check(candidate.code) is None:
            kept.append(candidate)
        if len(kept) == count:
            break
    return kept


def candidates(count: int, seed: int) -> list[str]:
    """The codes of `composed` by the default composer."""
    return [candidate.code for candidate in composed(default_composer(), count, seed)]


def report(args, codes, threads, start_s, pool_s, naive_s, pooled, naive) -> None:
    verdict = lambda r: "accepted" if r.get("passed") else r.get("reason")
    differ = [(i, verdict(a), verdict(b)) for i, (a, b) in enumerate(zip(pooled, naive)) if verdict(a) != verdict(b)]
    splits: dict = {}
    for result in pooled:
        for key, value in result.get("metrics", {}).items():
            if (key.startswith("t_") or key in ("gate_wait_ms", "gpu_alone_ms")) and isinstance(value, (int, float)):
                splits[key] = splits.get(key, 0.0) + value
    n = len(codes)
    print(f"device {args.device}, {n} candidates, {args.workers} in flight, {threads} threads each")
    print(f"pool start             {start_s:.1f} s (every worker: torch imported, one warm-up task compiled)")
    print(f"worker pool            {pool_s:.1f} s ({pool_s / n:.2f} s a candidate)")
    print(f"fresh process each     {naive_s:.1f} s ({naive_s / n:.2f} s a candidate)")
    print(f"speed-up               {naive_s / pool_s:.1f}x warm, {naive_s / (start_s + pool_s):.1f}x with the start")
    print(f"verdicts agree         {n - len(differ)} of {n}; differing: {differ}")
    print("pool time split (s, summed over workers): " +
          ", ".join(f"{k.removeprefix('t_').removesuffix('_ms')} {v / 1e3:.1f}"
                    for k, v in sorted(splits.items(), key=lambda kv: -kv[1])))
    print("pool verdicts:", {v: [verdict(r) for r in pooled].count(v) for v in sorted({verdict(r) for r in pooled})})


if __name__ == "__main__":
    main()
