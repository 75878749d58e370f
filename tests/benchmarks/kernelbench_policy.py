"""The static policy over KernelBench's levels 1-3: which tasks it refuses, and why.

    python -m tests.benchmarks.kernelbench_policy PATH_TO_KERNELBENCH_CHECKOUT [--levels 1 2 3]

PATH is a checkout of ScalingIntelligence/KernelBench (the folder holding `KernelBench/level1`,
or that folder itself). The policy is meant for tasks of exactly this kind, so it should refuse
almost none: each refusal is printed with its reason and detail, then a count per level. Nothing
of KernelBench is copied into this repository; the tasks are read where they lie.
"""
from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from filters.sandbox.static_check import static_check


def level_folders(checkout: Path, levels: list[int]) -> dict[int, Path]:
    root = checkout / "KernelBench" if (checkout / "KernelBench").is_dir() else checkout
    return {level: root / f"level{level}" for level in levels}


def judge(folder: Path) -> tuple[int, list[tuple[str, tuple[str, str]]]]:
    """(tasks read, [(file name, (reason, detail)) for each refused task])."""
    tasks = sorted(folder.glob("*.py"), key=lambda path: (len(path.name), path.name))
    refused = [(path.name, verdict) for path in tasks if (verdict := static_check(path.read_text()))]
    return len(tasks), refused


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkout", type=Path)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    totals = Counter()
    for level, folder in level_folders(args.checkout, args.levels).items():
        read, refused = judge(folder)
        for name, (reason, detail) in refused:
            print(f"level{level}/{name}: {reason}: {detail}")
        totals[f"level{level}"] = len(refused)
        print(f"level{level}: {len(refused)} of {read} refused")
    print(f"total: {sum(totals.values())} refused")


if __name__ == "__main__":
    main()
