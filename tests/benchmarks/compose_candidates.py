"""A fixed candidate set, as files, for benchmarks that compare two versions of the checks on
the same candidates (on another machine too: the files travel, the catalog need not):

    python -m tests.benchmarks.compose_candidates --count 512 --seed 0 --out DIR

Writes DIR/task-00000.py ... : the first `count` template candidates that pass the static
check, drawn as a run with the default configuration draws them (tests/benchmarks/
bench_validate.py's `candidates`). `opsynth validate DIR` and `bench_validate --tasks DIR` read them.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tests.benchmarks.bench_validate import candidates


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    codes = candidates(args.count, args.seed)
    for index, code in enumerate(codes):
        (out / f"task-{index:05d}.py").write_text(code)
    print(f"{out}: {len(codes)} candidates (seed {args.seed})")


if __name__ == "__main__":
    main()
