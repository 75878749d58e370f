"""What a batch whose child dies costs (pipeline/dedupe.py, QUARANTINES): TASKS distinct small
tasks with HOGS among them that each take a batch's child past its memory limit while they
are traced (3 GiB resident against a pool limit of 1.5 GB), traced from empty caches twice in
one run: with the quarantine (the task the child was tracing goes alone, the rest to a batch
again) and without it (QUARANTINES = 0: what a failed batch left went one task per child, as
before), twice each, alternating; the faster of each. Prints each wall time, how many tasks
went one per child, and the ratio. The tasks are small: one per child costs little here, and
the quarantine's gain is on large ones (KernelBench L3 networks on a GPU), this bench its cost.

    PYTHONPATH=$PWD python -m tests.benchmarks bench_quarantine [--tasks 96] [--hogs 3] [--workers 2]
"""
from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import pipeline.dedupe as dedupe
from filters.sandbox.pool import SandboxOptions, WorkerPool
from tests.conftest import make_task
from tests.pipeline.test_dedupe_batches import distinct_tasks

HOG = make_task("return x + self.w.sum()", init="self.w = torch.ones(3 << 28)", constants="batch_size = {n}\nfeatures = 32")


class Counted(logging.Handler):
    """The dedupe log's lines, kept."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def traced(codes: list[str], pool: WorkerPool, quarantines: int) -> tuple[float, int, list[str]]:
    """(seconds, tasks read, the log's lines on failed batches) for `codes` from an empty cache."""
    dedupe.QUARANTINES, log = quarantines, Counted()
    logging.getLogger("pipeline.dedupe").addHandler(log)
    try:
        with tempfile.TemporaryDirectory() as cache:
            began = time.perf_counter()
            entries = dedupe.readings_in_batches(codes, pool, Path(cache))
            seconds = time.perf_counter() - began
    finally:
        logging.getLogger("pipeline.dedupe").removeHandler(log)
    lines = [line for line in log.lines if "one per child" in line or "died" in line]
    return seconds, sum(entry["op_graph"] is not None for entry in entries), lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=96)
    parser.add_argument("--hogs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    logging.getLogger("pipeline.dedupe").setLevel(logging.INFO)
    codes = distinct_tasks(args.tasks)
    for k in range(args.hogs):  # one in each of the first batches, mid-batch
        codes.insert(k * dedupe.TRACE_BATCH + 10, HOG.replace("{n}", str(100 + k)))
    quarantines = dedupe.QUARANTINES
    with tempfile.TemporaryDirectory() as logs:
        options = SandboxOptions(device="cpu", timeout_s=120, max_memory_gb=1.5, threads=1, memory_guard="rss",
                                 warm_up=False, log_path=str(Path(logs) / "workers.log"))
        with WorkerPool(args.workers, options) as pool:
            runs = [traced(codes, pool, limit) for limit in (0, quarantines, 0, quarantines)]  # each warm once
            without, with_it = min(runs[0::2]), min(runs[1::2])
    for name, (seconds, read, lines) in (("with the quarantine", with_it), ("without (QUARANTINES = 0)", without)):
        print(f"{name}: {seconds:.1f} s, {read} of {len(codes)} read; {lines[-2:] if lines else 'no batch failed'}")
    print(f"{len(codes)} tasks, {args.hogs} that kill their batch's child: {with_it[0]:.1f} s against {without[0]:.1f} s "
          f"({without[0] / with_it[0]:.2f}x faster)")


if __name__ == "__main__":
    main()
