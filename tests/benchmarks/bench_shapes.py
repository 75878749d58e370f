"""How much a set of tasks looks like real layers: of their size constants (module-level
ints whose name says what they size: filters/checks/measure/resize.py, `size_constants`), the share
that are multiples of 8, powers of two, and rungs of the real-size ladders (operators/sizes.py);
how many distinct shapes (sets of size constants) the tasks have; the batch sizes.

    python -m tests.benchmarks.bench_shapes --count 500 --seed 0 [SOURCE ...]

It composes `count` template candidates with this checkout (the sizes a run starts from),
then reads each SOURCE: a folder of task files (`compose_candidates --out`, run from another
checkout, gives the candidates as that version composed them), a KernelBench level folder, or
a dataset folder (its data/*.parquet `code`, and its `eager_ms` percentiles: the re-sized,
accepted tasks of a run, which `opsynth validate` makes on the H200), or the shards that
`h200.sh funnel` brings back ($OUT/NAME/train-*.parquet).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

from filters.checks.measure.resize import RESIZE_CONSTANT, size_constants
from operators.sizes import in_ladders, power_of_two


def shape_figures(codes: list[str]) -> dict:
    """The shares of size constants that are multiples of 8, powers of two and real sizes."""
    sizes, batches, shapes = [], [], set()
    for code in codes:
        try:
            constants = size_constants(code)
        except Exception:  # a file that does not parse counts for nothing
            continue
        sizes += constants.values()
        shapes.add(tuple(sorted(constants.items())))
        if RESIZE_CONSTANT in constants:
            batches.append(constants[RESIZE_CONSTANT])
    share = lambda test: sum(map(test, sizes)) / len(sizes) if sizes else math.nan  # noqa: E731
    return {"tasks": len(codes), "constants": len(sizes), "multiple_of_8": share(lambda s: s % 8 == 0),
            "power_of_two": share(power_of_two), "real_size": share(in_ladders),
            "distinct_shapes": len(shapes), "batch_p50": statistics.median(batches) if batches else None,
            "batch_max": max(batches) if batches else None}


def composed(count: int, seed: int) -> tuple[list[str], float]:
    from tests.benchmarks.bench_validate import candidates
    began = time.monotonic()
    codes = candidates(count, seed)
    return codes, (time.monotonic() - began) / max(len(codes), 1)


def read_source(path: Path) -> tuple[list[str], list[float]]:
    """The tasks of a folder of .py files or of a dataset folder, and the dataset's eager ms."""
    shards = sorted(path.glob("data/*.parquet")) or sorted(path.glob("train-*.parquet"))
    if shards:
        import pyarrow.parquet as pq
        rows = [row for shard in shards for row in pq.read_table(shard, columns=["code", "eager_ms"]).to_pylist()]
        return [row["code"] for row in rows], [row["eager_ms"] for row in rows if row["eager_ms"] is not None]
    return [file.read_text() for file in sorted(path.glob("*.py"))], []


def print_row(name: str, figures: dict, eager: list[float]) -> None:
    timing = ""
    if eager:
        ordered = sorted(eager)
        timing = f"  eager ms p50 {statistics.median(ordered):.2f} p90 {ordered[int(0.9 * (len(ordered) - 1))]:.2f}"
    print(f"{name:<40} {figures['tasks']:>5} tasks {figures['constants']:>6} sizes  "
          f"x8 {figures['multiple_of_8']:6.1%}  2^k {figures['power_of_two']:6.1%}  real {figures['real_size']:6.1%}  "
          f"shapes {figures['distinct_shapes']:>4}  batch p50 {figures['batch_p50']} max {figures['batch_max']}{timing}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("sources", nargs="*", type=Path)
    args = parser.parse_args()
    if args.count:
        codes, per_candidate_s = composed(args.count, args.seed)
        print_row(f"composed here (seed {args.seed})", shape_figures(codes), [])
        print(f"{'':<40} composing took {per_candidate_s * 1e3:.0f} ms a candidate")
    for source in args.sources:
        codes, eager = read_source(source)
        print_row(str(source)[-40:], shape_figures(codes), eager)


if __name__ == "__main__":
    main()
