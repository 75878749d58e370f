"""Decontamination speed: N generated candidates against a KernelBench checkout.

    python -m tests.benchmarks.bench_decontaminate /path/to/KernelBench [--candidates 10000]

Times the screened index (what opsynth runs) against exact scoring of every pair with the
same score function, checks that both flag the same candidates with the same nearest task
and score, and prints the similarity distribution of the generated set.
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

from filters.similarity.decontaminate import SimilarityIndex
from filters.similarity.reference import _read_tasks, load_reference
from filters.similarity.score import fingerprint, score
from operators.catalog import crawl
from pipeline.composers.template import TemplateComposer
from tests.disguise import disguise


def reference_codes(kernelbench: str) -> list[str]:
    """Reference tasks spread over the levels, to be disguised and mixed in."""
    tasks, _ = _read_tasks(kernelbench, (1, 2, 3))
    return [code for _, code in tasks[::2]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kernelbench")
    parser.add_argument("--candidates", type=int, default=10_000)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--copies", type=int, default=100, help="disguised reference tasks mixed in, to be caught")
    args = parser.parse_args()

    reference = load_reference(args.kernelbench, (1, 2, 3)).fingerprints
    composer = TemplateComposer(crawl(["torch"])[0])
    copies = [disguise(code) for code in reference_codes(args.kernelbench)[:args.copies]]
    codes = [composer.compose(i, 0).code for i in range(args.candidates - len(copies))] + copies

    began = time.perf_counter()
    candidates = [fingerprint(code, f"c{i}") for i, code in enumerate(codes)]
    fingerprint_s = time.perf_counter() - began

    began = time.perf_counter()
    index = SimilarityIndex(reference)
    screened = [index.match(fp, args.threshold) for fp in candidates]
    screened_s = time.perf_counter() - began

    began = time.perf_counter()
    exact = [max((score(fp, ref), ref.name) for ref in reference) for fp in candidates]
    exact_s = time.perf_counter() - began

    flagged_screened = {(fp.name, m.nearest, round(m.similarity, 9)) for fp, m in zip(candidates, screened)
                        if m.similarity > args.threshold}
    flagged_exact = {(fp.name, name, round(s, 9)) for fp, (s, name) in zip(candidates, exact) if s > args.threshold}
    pairs = len(candidates) * len(reference)
    print(f"reference tasks          {len(reference)}")
    print(f"candidates               {len(candidates)} ({len(set(codes))} distinct)")
    print(f"fingerprinting           {fingerprint_s:.1f} s ({fingerprint_s / len(candidates) * 1e3:.2f} ms each)")
    print(f"screened matching        {screened_s:.2f} s")
    print(f"exact, every pair        {exact_s:.1f} s ({pairs} pairs, {exact_s / pairs * 1e6:.1f} us a pair)")
    print(f"matching speed-up        {exact_s / screened_s:.0f}x")
    print(f"end to end (fp + match)  {fingerprint_s + screened_s:.1f} s vs {fingerprint_s + exact_s:.1f} s")
    print(f"same verdicts            {flagged_screened == flagged_exact} ({len(flagged_exact)} flagged; "
          f"{len(copies)} disguised copies mixed in)")
    buckets = Counter(min(int(s * 10), 9) / 10 for s, _ in exact[:len(exact) - len(copies)])
    print("max similarity of the generated candidates to KernelBench (exact):")
    for low in sorted(buckets):
        print(f"  [{low:.1f}, {low + 0.1:.1f})  {buckets[low]}")


if __name__ == "__main__":
    main()
