"""What the guards of a batch of traces cost (filters/sandbox/trace_batch.py): one batch of 32
small tasks traced in this process, three times, with no time budget, with the memory guard
(a collection after each task, `holds_memory`) and without it in the same run; and one reading
of `torch_state` (every torch module and class namespace and the dispatcher's kernels), which
a batch takes at both ends.

    PYTHONPATH=$PWD python -m tests.benchmarks.bench_trace_batch_guard
"""
from __future__ import annotations

import contextlib
import time

import filters.sandbox.trace_batch as trace_batch
from filters.checks.harness import WARM_UP_TASK, trace
from filters.sandbox.worker import TRACE_LIMIT_S
from tests.pipeline.test_dedupe_batches import distinct_tasks


def timed_batches(codes: list[str]) -> float:
    """The fastest of three batches of `codes`, in seconds."""
    times = []
    for _ in range(3):
        began = time.perf_counter()
        result = trace_batch.trace_batch(codes, TRACE_LIMIT_S)
        times.append(time.perf_counter() - began)
        assert result["traced"] == len(codes), result
    return min(times)


def main() -> None:
    trace(WARM_UP_TASK)
    trace_batch.BATCH_BUDGET_S = float("inf")  # the whole batch, not the budget's cut
    codes = distinct_tasks(64)
    trace_batch.trace_batch(codes[32:], TRACE_LIMIT_S)  # warm: every op of the forwards seen once
    guarded = timed_batches(codes[:32])
    holds_memory, collected_apart = trace_batch.holds_memory, trace_batch._collected_apart
    trace_batch.holds_memory, trace_batch._collected_apart = (lambda room: False), contextlib.nullcontext
    try:
        unguarded = timed_batches(codes[:32])
    finally:
        trace_batch.holds_memory, trace_batch._collected_apart = holds_memory, collected_apart
    print(f"batch of 32, fastest of 3: {guarded:.2f} s with the memory guard, {unguarded:.2f} s without "
          f"({guarded / unguarded:.2f}x)")
    began = time.perf_counter()
    trace_batch.torch_state()
    print(f"torch_state: {time.perf_counter() - began:.3f} s")


if __name__ == "__main__":
    main()
