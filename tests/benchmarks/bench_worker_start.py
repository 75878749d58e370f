"""How long a sandbox worker takes to start (torch import and warm-up) and what it leaves on disk.

    python -m tests.benchmarks.bench_worker_start [--starts 3] [--device cpu]

A worker starts in every run and again each time a candidate kills it. Each start here is
one worker, started and stopped in turn:
- baseline: every start with an empty compiler cache of its own, as each worker's
  precompiled C++ headers used to be built in its own scratch folder;
- shared: every start with one compiler cache, as a run's workers share `--cache-dir`.
The first shared start builds the headers; the rest find them. Prints each start's seconds,
the median of each side, their ratio, and the scratch folder's size after a start.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from filters.sandbox import SandboxOptions, Worker


def timed_start(options: SandboxOptions) -> tuple[float, float]:
    """(seconds to ready, MB in the worker's scratch folder once ready)"""
    worker = Worker(options)
    began = time.perf_counter()
    worker.start()
    seconds = time.perf_counter() - began
    scratch_mb = sum(p.stat().st_size for p in Path(worker.scratch).rglob("*") if p.is_file()) / 2**20
    if worker.info["warm_up"] != "passed":
        raise SystemExit(f"the warm-up failed: {worker.info['warm_up']}")
    worker.stop()
    return seconds, scratch_mb


def options_with_cache(cache: Path, device: str) -> SandboxOptions:
    return SandboxOptions(device=device, timeout_s=300, max_memory_gb=8 if device == "cpu" else 32,
                          env=(("TORCHINDUCTOR_CACHE_DIR", str(cache)),))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="opsynth-bench-start-"))
    try:
        sides = {}
        for side in ("baseline", "shared"):
            starts = []
            for index in range(args.starts):
                cache = folder / (f"{side}-{index}" if side == "baseline" else side)
                seconds, scratch_mb = timed_start(options_with_cache(cache, args.device))
                print(f"{side} start {index}: {seconds:.1f} s, scratch {scratch_mb:.0f} MB", flush=True)
                starts.append(seconds)
            sides[side] = statistics.median(starts)
        print(f"median start: baseline {sides['baseline']:.1f} s, shared {sides['shared']:.1f} s, "
              f"{sides['baseline'] / sides['shared']:.2f}x")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
