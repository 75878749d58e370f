"""The grammar over KernelBench's levels 1-3 and over a crawled catalog: which tasks it refuses,
and why.

    python -m tests.benchmarks.kernelbench_policy PATH_TO_KERNELBENCH_CHECKOUT [--levels 1 2 3]
    python -m tests.benchmarks.kernelbench_policy --catalog CATALOG.parquet   # opsynth crawl --out

PATH is a checkout of ScalingIntelligence/KernelBench (the folder holding `KernelBench/level1`,
or that folder itself). The grammar is meant for tasks of exactly this kind, so it should refuse
almost none: each refusal is printed with its reason and detail, then a count per level. With
--catalog, the seed of every runnable op of a catalog is judged the same way (a crawl keeps
only seeds the grammar allows, so a refusal there is an op a changed rule would drop). Nothing
of KernelBench is copied into this repository; the tasks are read where they lie.
"""
from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from filters.grammar import static_check


def level_folders(checkout: Path, levels: list[int]) -> dict[int, Path]:
    root = checkout / "KernelBench" if (checkout / "KernelBench").is_dir() else checkout
    return {level: root / f"level{level}" for level in levels}


def judge(folder: Path) -> tuple[int, list[tuple[str, tuple[str, str]]]]:
    """(tasks read, [(file name, (reason, detail)) for each refused task])."""
    tasks = sorted(folder.glob("*.py"), key=lambda path: (len(path.name), path.name))
    refused = [(path.name, verdict) for path in tasks if (verdict := static_check(path.read_text()))]
    return len(tasks), refused


def judge_catalog(path: Path) -> tuple[int, list[tuple[str, tuple[str, str]]]]:
    """(runnable seeds read, [(op name, (reason, detail)) for each refused seed])."""
    import pandas

    catalog = pandas.read_parquet(path)
    runnable = catalog[catalog["runnable"]]
    refused = [(row.name, verdict) for row in runnable.itertuples() if (verdict := static_check(row.seed_code))]
    return len(runnable), refused


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkout", type=Path, nargs="?")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--catalog", type=Path, help="a catalog Parquet file (`opsynth crawl --out`)")
    args = parser.parse_args()
    totals = Counter()
    folders = level_folders(args.checkout, args.levels) if args.checkout else {}
    sets = [(f"level{level}", lambda folder=folder: judge(folder)) for level, folder in folders.items()]
    sets += [("catalog", lambda: judge_catalog(args.catalog))] if args.catalog else []
    if not sets:
        parser.error("give a KernelBench checkout, --catalog, or both")
    static_check(sets and "")  # the allowlist is built once a process (about half a second): not a task's cost
    for label, run in sets:
        began = time.perf_counter()
        read, refused = run()
        took = time.perf_counter() - began
        for name, (reason, detail) in refused:
            print(f"{label}/{name}: {reason}: {detail}")
        totals[label] = len(refused)
        print(f"{label}: {len(refused)} of {read} refused ({took / max(read, 1) * 1e3:.1f} ms a task)")
    print(f"total: {sum(totals.values())} refused")


if __name__ == "__main__":
    main()
