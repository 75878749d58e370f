"""A cold trace of a KernelBench checkout, as a run with --reference or `opsynth dedupe`
makes it: failed batches halved until the task they could not survive is alone (now),
against every task of a failed batch sent to a child of its own (before), each from an
empty cache, on one pool.

    python -m tests.benchmarks.bench_reference_trace /path/to/KernelBench [--levels 1,2,3] [--workers 2]

Printed: the wall time of each way, how many tasks each traced, and whether both read the
same op sequences.
"""
from __future__ import annotations

import argparse
import tempfile
import time

from filters.sandbox.pool import SandboxOptions, WorkerPool
from filters.similarity.reference import load_reference
from pipeline import dedupe


def timed(codes: list[str], pool, halve: bool) -> tuple[float, list]:
    dedupe.HALVE_FAILED = halve
    with tempfile.TemporaryDirectory() as cache:
        began = time.perf_counter()
        graphs = dedupe.trace_in_batches(codes, pool, cache)
        return time.perf_counter() - began, graphs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kernelbench")
    parser.add_argument("--levels", default="1,2,3")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    codes = list(load_reference(args.kernelbench, tuple(int(level) for level in args.levels.split(","))).codes)
    with WorkerPool(args.workers, SandboxOptions(timeout_s=120, threads=1, warm_up=False)) as pool:
        halved_s, halved = timed(codes, pool, halve=True)
        alone_s, alone = timed(codes, pool, halve=False)
    same = sum(a == b for a, b in zip(halved, alone))
    print(f"{len(codes)} tasks, {args.workers} workers")
    print(f"failed batches halved:  {halved_s:7.1f} s, {sum(g is not None for g in halved)} traced")
    print(f"a child each (before):  {alone_s:7.1f} s, {sum(g is not None for g in alone)} traced")
    print(f"x{alone_s / halved_s:.2f}; the same op sequence for {same} of {len(codes)}")


if __name__ == "__main__":
    main()
