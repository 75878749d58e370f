"""How often the template composer repeats itself as a run grows, round by round, with and
without the op tuples of earlier rounds held back (`drawn`), in the same run.

    python -m tests.benchmarks.bench_repeats [--rounds 5] [--round-size 512] [--catalog PATH]

Composes as `opsynth run --config ops6k --composer template` does: the recipe's catalog
(torch and transformers; or a catalog Parquet, such as the one a GPU host crawled), op-count
mix, library mix and layered sampling, seed 0, rounds of `--round-size` consecutive
indexes. Only composition runs, no validation: an exact repeat is a candidate whose code an
earlier one already had, which a run rejects as `duplicate` before the sandbox.
"""
from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from pathlib import Path

from operators.catalog import load_or_crawl, read_catalog
from operators.usage import op_usage
from pipeline.composers.template import CompositionFailed, TemplateComposer
from pipeline.config import build_config


def rounds(composer_for, rounds_: int, size: int, seed: int) -> tuple[list[int], Counter, float]:
    """Exact repeats per round, the op-count mix of the distinct tasks, and the seconds."""
    seen_codes, drawn, repeats, mix = set(), set(), [], Counter()
    began = time.perf_counter()
    for number in range(rounds_):
        composer = composer_for(frozenset(drawn))
        repeated = 0
        for index in range(number * size, (number + 1) * size):
            try:
                candidate = composer.compose(index, seed)
            except CompositionFailed:
                continue
            if candidate.id in seen_codes:
                repeated += 1
            else:
                mix[len(candidate.ops)] += 1
            seen_codes.add(candidate.id)
            drawn.add(candidate.ops)
        repeats.append(repeated)
    return repeats, mix, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--catalog", help="a catalog Parquet (default: crawl or read the cache)")
    args = parser.parse_args()
    os.environ.setdefault("KERNELBENCH", "unused")  # the recipe names a reference; composing needs none
    cfg = build_config("ops6k", {"composer": "template", "reference": None})
    catalog = read_catalog(Path(args.catalog)) if args.catalog else load_or_crawl(cfg.libraries, Path(cfg.cache_dir))[1]
    usage = op_usage([spec.name for spec in catalog], cfg.libraries)

    def composer_for(drawn):
        return TemplateComposer(catalog, cfg.op_count_mix, cfg.library_mix, cfg.sampling, usage, drawn)

    total = args.rounds * args.round_size
    print(f"{len(catalog)} ops, {args.rounds} rounds of {args.round_size}, seed {args.seed}")
    for name, factory in (("every draw kept", lambda drawn: composer_for(frozenset())),
                          ("earlier rounds' tuples held back", composer_for)):
        repeats, mix, seconds = rounds(factory, args.rounds, args.round_size, args.seed)
        distinct = sum(mix.values())
        share = {k: f"{mix[k] / distinct:.1%}" for k in sorted(mix)}
        print(f"{name}: exact repeats by round {repeats}, {sum(repeats)} of {total}; "
              f"distinct tasks {distinct}; their op-count mix {share}; {seconds:.0f} s")


if __name__ == "__main__":
    main()
