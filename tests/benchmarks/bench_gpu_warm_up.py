"""What a GPU zygote's warm-up buys each job's child: the same candidates through the jailed
pool once per level of `warm.warm_for_gpu` ("imports", today's; "triton"; "dynamo").

    python -m tests.benchmarks.bench_gpu_warm_up --tasks .bench/cands [--candidates 48] [--workers 4]
        [--levels imports,triton,dynamo]

A GPU zygote may not start CUDA (no child forked after could use the GPU), so each child
compiles from cold what the zygote could not warm. Per level it prints the workers' start,
the candidates' wall, the median and summed `compile_ms` (torch.compile's first call in the
child), the summed time per check, and whether every verdict agrees with the first level's
(a level that breaks the children's CUDA shows here as errors, not as speed).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from filters.checks.harness import WARM_UP_TASK
from filters.sandbox.pool import SandboxOptions, WorkerPool
from pipeline.devices import gpu_share_gb, task_memory_budget_gb


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", required=True, help="a folder of candidate .py files")
    parser.add_argument("--candidates", type=int, default=48)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--levels", default="imports,triton,dynamo")
    args = parser.parse_args()
    codes = [path.read_text() for path in sorted(Path(args.tasks).glob("*.py"))[:args.candidates]]
    cuda = args.device.startswith("cuda")
    share = gpu_share_gb([0], args.workers) if cuda else None
    config = {"device": args.device, "memory_budget_gb": task_memory_budget_gb([0]) if cuda else None}
    first = None
    for level in args.levels.split(","):
        with tempfile.TemporaryDirectory(prefix="opsynth-warm-") as folder:
            options = SandboxOptions(device=args.device, threads=max(1, (os.cpu_count() or 1) // args.workers),
                                     memory_guard="rss", gpu_memory_gb=share, gpu_warm_up=level,
                                     timing_lock_dir=os.path.join(folder, "locks") if cuda else None,
                                     log_path=os.path.join(folder, "workers.log"))
            start_s, wall_s, results = run_level(codes, config, args.workers, options)
        first = first or results
        report(level, start_s, wall_s, results, first)


def run_level(codes: list[str], config: dict, workers: int, options: SandboxOptions) -> tuple[float, float, list]:
    with WorkerPool(workers, options) as pool:
        began = time.perf_counter()
        warm = [pool.submit({"code": WARM_UP_TASK, "config": {**config, "window_ms": [0.0, 1e9]}})
                for _ in pool.workers]  # one job each: every worker starts now, in parallel
        assert all(f.result()["passed"] for f in warm), [f.result()["detail"] for f in warm]
        start_s = time.perf_counter() - began
        began = time.perf_counter()
        results = pool.run_many([{"code": code, "config": config} for code in codes])
        return start_s, time.perf_counter() - began, results


def report(level: str, start_s: float, wall_s: float, results: list, first: list) -> None:
    verdict = lambda r: "accepted" if r["passed"] else r["reason"]  # noqa: E731
    compiles = [r["metrics"]["compile_ms"] for r in results if isinstance(r["metrics"].get("compile_ms"), float)]
    per_check: dict = {}
    for r in results:
        for key, value in r["metrics"].items():
            if key.startswith("t_") and isinstance(value, (int, float)):
                per_check[key[2:-3]] = per_check.get(key[2:-3], 0.0) + value / 1e3
    differ = [i for i, (a, b) in enumerate(zip(results, first)) if verdict(a) != verdict(b)]
    print(f"== GPU warm-up {level}: workers' start {start_s:.1f} s, {len(results)} candidates in {wall_s:.1f} s")
    if compiles:
        print(f"compile_ms median {statistics.median(compiles):.0f}, sum {sum(compiles) / 1e3:.1f} s "
              f"over {len(compiles)} compiles")
    print("seconds per check: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_check.items(), key=lambda kv: -kv[1])))
    print(f"verdicts agree with the first level: {len(results) - len(differ)} of {len(results)}; differing "
          f"{[(i, verdict(results[i]), verdict(first[i])) for i in differ][:10]}")


if __name__ == "__main__":
    main()
