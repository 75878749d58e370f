"""Validation throughput: the warm worker pool against a fresh Python process per candidate.

    python -m tests.benchmarks.bench_validate [--candidates 16] [--device cpu|cuda] [--workers 2]

Same candidates (template composer), same device, same checks and environment, the same
number of candidates in flight at once. Prints both wall times, the ratio, and whether the
verdicts agree (a borderline timing can flip between any two measurements; those are listed).
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

from filters.sandbox import WORKER_ENV, SandboxOptions, WorkerPool
from filters.static_check import static_check
from operators.catalog import crawl
from pipeline.composers.template import TemplateComposer
from pipeline.run import gpu_share_gb


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()

    composer = TemplateComposer(crawl(["torch"])[0])
    codes = [c.code for c in (composer.compose(i, args.seed) for i in range(args.candidates * 2))
             if static_check(c.code) is None][:args.candidates]
    threads = max(1, (os.cpu_count() or 1) // args.workers)
    config = {"device": args.device}
    gpu_memory_gb = gpu_share_gb([0], args.workers) if args.device.startswith("cuda") else None  # as a run shares it
    config = {**config, "memory_budget_gb": gpu_memory_gb / 3 if gpu_memory_gb else None}
    # Each side starts from its own empty compiler cache: neither reuses the other's kernels.
    pool_cache, naive_cache = (tempfile.mkdtemp(prefix=f"opsynth-bench-{side}-") for side in ("pool", "naive"))
    env = {**os.environ, **WORKER_ENV, "TORCHINDUCTOR_CACHE_DIR": naive_cache}

    began = time.perf_counter()
    options = SandboxOptions(device=args.device, threads=threads, env=(("TORCHINDUCTOR_CACHE_DIR", pool_cache),),
                             memory_guard="rss", gpu_memory_gb=gpu_memory_gb)
    with WorkerPool(args.workers, options) as pool:
        pooled = pool.run_many([{"code": code, "config": config} for code in codes])
    pool_s = time.perf_counter() - began

    def fresh_process(code: str) -> dict:
        job = json.dumps({"code": code, "config": config, "threads": threads, "gpu_memory_gb": gpu_memory_gb})
        done = subprocess.run([sys.executable, "-m", "tests.benchmarks.naive_validator"], input=job,
                              capture_output=True, text=True, env=env, timeout=900)
        return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"reason": "crashed"}

    began = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as executor:
        naive = list(executor.map(fresh_process, codes))
    naive_s = time.perf_counter() - began

    verdict = lambda r: "accepted" if r.get("passed") else r.get("reason")
    differ = [(i, verdict(a), verdict(b)) for i, (a, b) in enumerate(zip(pooled, naive)) if verdict(a) != verdict(b)]
    splits = {}
    for result in pooled:
        for key, value in result.get("metrics", {}).items():
            if key.startswith("t_") and isinstance(value, (int, float)):
                splits[key] = splits.get(key, 0.0) + value
    print(f"device {args.device}, {len(codes)} candidates, {args.workers} in flight, {threads} threads each")
    print(f"worker pool            {pool_s:.1f} s ({pool_s / len(codes):.2f} s a candidate)")
    print(f"fresh process each     {naive_s:.1f} s ({naive_s / len(codes):.2f} s a candidate)")
    print(f"speed-up               {naive_s / pool_s:.1f}x")
    print(f"verdicts agree         {len(codes) - len(differ)} of {len(codes)}; differing: {differ}")
    print("pool time split by check (s, summed over workers): " +
          ", ".join(f"{k[2:-3]} {v / 1e3:.1f}" for k, v in sorted(splits.items(), key=lambda kv: -kv[1])))
    print("pool verdicts:", {v: [verdict(r) for r in pooled].count(v) for v in sorted({verdict(r) for r in pooled})})


if __name__ == "__main__":
    main()
