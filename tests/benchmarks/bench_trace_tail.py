"""Why some accepted tasks take seconds to trace: each one's reading timed in this process,
and for the slow ones, what the small problem's reading left unspelled.

    python -m tests.benchmarks.bench_trace_tail RECORDS [--limit 40] [--slow-s 1.0]

RECORDS is a `bench_throughput --records` file (each accepted task's code as stored). A
trace reads a task at a small problem first and stands there only where that reading leaves
no named op unspelled (filters/checks/harness.py, `read`); else it reads the task again at
its own sizes, which on the H200 took 5-20 s for a fifth of the accepted tasks (docs/benchmarks-history.md,
session 20). Printed: the distribution of trace times, and per slow task its op sequence and
the ops the small reading left unspelled (the reason it was read again).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter

from filters.checks import harness
from filters.checks.measure.resize import small_problem


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("records")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--slow-s", type=float, default=1.0)
    args = parser.parse_args()
    with open(args.records) as lines:
        codes = [record["code"] for record in map(json.loads, lines) if record.get("passed") and record.get("code")]
    codes = codes[:args.limit]
    took, why = [], Counter()
    for index, code in enumerate(codes):
        began = time.perf_counter()
        reading = harness.read(code, untrusted=True)
        took.append(time.perf_counter() - began)
        if took[-1] >= args.slow_s:
            unspelled = small_reading_unspelled(code)
            why.update(unspelled if unspelled else
                       ["(the small reading failed)"] if unspelled is None else ["(nothing: slow at the small problem)"])
            print(f"{index:>4} {took[-1]:7.2f} s  {(reading.graph or 'untraced')[:60]}  unspelled at the small "
                  f"problem: {unspelled}")
    if not took:
        raise SystemExit(f"{args.records}: no accepted task with its code")
    took.sort()
    slow = [t for t in took if t >= args.slow_s]
    print(f"{len(took)} accepted tasks traced: median {statistics.median(took):.2f} s, "
          f"p90 {took[int(0.9 * (len(took) - 1))]:.2f} s, max {took[-1]:.2f} s, total {sum(took):.1f} s; "
          f"{len(slow)} took {args.slow_s:g} s or more ({sum(slow):.1f} s)")
    print("unspelled at the small problem, over the slow ones:", dict(why.most_common()))


def small_reading_unspelled(code: str) -> list[str] | None:
    """The ops the reading at the small problem left unspelled; None where it failed."""
    small, _ = small_problem(code)
    try:
        return harness._traced_and_drops(small, harness.ChecksDevice(), True)[1]
    except Exception:
        return None


if __name__ == "__main__":
    main()
