"""Fairness of the score on KernelBench's own level-2 tasks, from the shipped readings: the
4,950 pairs of distinct tasks, how many score above the threshold, and which pairs a commit's
canonical form added or removed.

    python -m tests.benchmarks bench_fairness /path/to/KernelBench [--baseline COMMIT] [--threshold 0.9]

Each side reads the table of its own tree (filters/similarity/kernelbench_readings.json, the
working tree's and `git show COMMIT:...`'s), so the two are compared in one run without
tracing anything. A task the table leaves unread keeps the textual score, as in a run.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import subprocess

from filters.similarity.reference import SHIPPED_READINGS, code_digest, load_reference, with_graphs
from filters.similarity.score import score


def level2_pairs(kernelbench: str, table: dict, threshold: float) -> tuple[dict, dict]:
    """({(a, b): score} above `threshold`, the counts by tenth) over level 2's distinct pairs."""
    reference = load_reference(kernelbench, (2,))
    # a table before 0f4b865 is keyed by the SHA-256 of the text itself
    reference = with_graphs(reference, [table["readings"].get(code_digest(code),
                                                              table["readings"].get(hashlib.sha256(code.encode()).hexdigest()))
                                        for code in reference.codes])
    above, tenths = {}, {}
    for a, b in itertools.combinations(reference.fingerprints, 2):
        value = score(a, b)
        tenths[min(int(value * 10), 9)] = tenths.get(min(int(value * 10), 9), 0) + 1
        if value > threshold:
            above[a.name, b.name] = value
    return above, tenths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernelbench")
    parser.add_argument("--baseline", help="a commit whose shipped readings are the baseline")
    parser.add_argument("--threshold", type=float, default=0.9)
    args = parser.parse_args()
    sides = {"this tree": json.loads(SHIPPED_READINGS.read_text())}
    if args.baseline:
        path = SHIPPED_READINGS.relative_to(SHIPPED_READINGS.parents[2])
        sides[args.baseline] = json.loads(subprocess.run(["git", "show", f"{args.baseline}:{path}"], check=True,
                                                         capture_output=True, text=True).stdout)
    found = {}
    for side, table in sides.items():
        above, tenths = level2_pairs(args.kernelbench, table, args.threshold)
        found[side] = above
        print(f"{side} (GRAPH_VERSION {table['graph_version']}): {sum(tenths.values())} pairs, {len(above)} above "
              f"{args.threshold}; " + ", ".join(f"[{t / 10:.1f}, {t / 10 + 0.1:.1f}) {n}" for t, n in sorted(tenths.items())))
    if args.baseline:
        now, before = found["this tree"], found[args.baseline]
        for pair in sorted(set(now) | set(before)):
            if (pair in now) != (pair in before):
                print(f"  {'added' if pair in now else 'removed'}: {pair[0]} ~ {pair[1]} "
                      f"({now.get(pair, before.get(pair)):.3f})")


if __name__ == "__main__":
    main()
