"""Template composition on this host: time and memory per candidate, slowest candidates.

    python -m tests.benchmarks.bench_compose [--candidates 300] [--seed 0]

Composes as `opsynth run` does (default catalog, mix and seed) in this process, which is
where a run composes: a chain that is slow or large to probe here stalls the whole run
before any worker starts. Prints candidates per second, the peak resident memory and the
five slowest candidates with their ops.
"""
from __future__ import annotations

import argparse
import resource
import time

from tests.benchmarks.bench_validate import default_composer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    composer = default_composer()

    timings = []
    began = time.perf_counter()
    for index in range(args.candidates):
        start = time.perf_counter()
        [result] = composer.compose_many([{"index": index}], args.seed)
        candidate = result[0] if isinstance(result, tuple) else result
        timings.append((time.perf_counter() - start, index, candidate.ops))
    total = time.perf_counter() - began
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.candidates} candidates in {total:.1f} s ({args.candidates / total:.1f}/s) "
          f"from {len(composer.catalog)} ops; peak resident memory {peak_mib:.0f} MiB")
    for seconds, index, ops in sorted(timings, reverse=True)[:5]:
        print(f"  {seconds:6.2f} s  candidate {index}: {' + '.join(ops) or '(compose failed)'}")


if __name__ == "__main__":
    main()
