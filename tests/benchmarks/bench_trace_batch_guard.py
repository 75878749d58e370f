"""What the guards of a batch of traces cost (filters/sandbox/trace_batch.py): one batch of 32
small tasks traced in this process, three times, with no time budget, and one reading of
`torch_state` (every torch module and class namespace and the dispatcher's kernels), which
a batch takes at both ends.

    PYTHONPATH=$PWD python -m tests.benchmarks.bench_trace_batch_guard
"""
from __future__ import annotations

import time

import filters.sandbox.trace_batch as trace_batch
from filters.checks.harness import WARM_UP_TASK, trace
from tests.pipeline.test_dedupe_batches import distinct_tasks


def main() -> None:
    trace(WARM_UP_TASK)
    trace_batch.BATCH_BUDGET_S = float("inf")  # the whole batch, not the budget's cut
    codes = distinct_tasks(64)
    trace_batch.trace_batch(codes[32:])  # warm: every op of the forwards seen once
    for _ in range(3):
        began = time.perf_counter()
        result = trace_batch.trace_batch(codes[:32])
        print(f"batch of 32: {result['traced']} traced in {time.perf_counter() - began:.2f} s")
    began = time.perf_counter()
    trace_batch.torch_state()
    print(f"torch_state: {time.perf_counter() - began:.3f} s")


if __name__ == "__main__":
    main()
