"""How often the template composer repeats itself as a run grows, round by round, composing
each round as `opsynth run` does: one `compose_many` call over the round's indexes, given the
op tuples of earlier rounds (`drawn`).

    python -m tests.benchmarks.bench_repeats [--rounds 12] [--round-size 512] [--catalog PATH] [--every-draw-kept]
                                             [--no-screen]

Composes as `opsynth run --config ops6k --composer template` does: the recipe's catalog
(torch and transformers; or a catalog Parquet, such as the one a GPU host crawled), op-count
mix, library mix and layered sampling, seed 0, rounds of `--round-size` consecutive
indexes. Only composition runs, no validation: an exact repeat is a candidate whose code an
earlier one already had, which a run rejects as `duplicate` before the sandbox; a repeated
op tuple is one an earlier candidate drew (with another layout it is another task). Run it
on an older tree (PYTHONPATH) to measure "before": it uses only `compose_many`.
`--every-draw-kept` also composes with nothing held back (no `drawn`, one index at a time).
"""
from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from pathlib import Path

from operators.catalog import load_or_crawl, read_catalog
from operators.usage import op_usage
from pipeline.composers.template import TemplateComposer
from pipeline.config import build_config


def rounds(composer_for, rounds_: int, size: int, seed: int, one_call: bool = True) -> dict:
    """Per round: exact repeats, repeated op tuples, compose failures; over the run: the
    op-count mix of the distinct tasks, the op counts of the repeats, and the seconds."""
    seen_codes, drawn = set(), set()
    out = {"exact": [], "tuples": [], "failed": 0, "mix": Counter(), "repeated_counts": Counter()}
    began = time.perf_counter()
    for number in range(rounds_):
        composer = composer_for(frozenset(drawn))
        jobs = [{"index": index} for index in range(number * size, (number + 1) * size)]
        results = composer.compose_many(jobs, seed) if one_call else [
            result for job in jobs for result in composer.compose_many([job], seed)]
        exact = tuples = 0
        for result in results:
            if isinstance(result, tuple):
                out["failed"] += 1
                continue
            if result.id in seen_codes:
                exact += 1
                out["repeated_counts"][len(result.ops)] += 1
            else:
                out["mix"][len(result.ops)] += 1
            tuples += result.ops in drawn
            seen_codes.add(result.id)
            drawn.add(result.ops)
        out["exact"].append(exact)
        out["tuples"].append(tuples)
    out["seconds"] = time.perf_counter() - began
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--round-size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--catalog", help="a catalog Parquet (default: crawl or read the cache)")
    parser.add_argument("--every-draw-kept", action="store_true", help="also compose with nothing held back")
    parser.add_argument("--no-screen", action="store_true", help="without the numeric screen (6x faster; it redraws "
                                                                   "a few chains, so repeats differ slightly)")
    args = parser.parse_args()
    os.environ.setdefault("KERNELBENCH", "unused")  # the recipe names a reference; composing needs none
    cfg = build_config("ops6k", {"composer": "template", "reference": None})
    catalog = read_catalog(Path(args.catalog)) if args.catalog else load_or_crawl(cfg.libraries, Path(cfg.cache_dir))[1]
    usage = op_usage([spec.name for spec in catalog], cfg.libraries)

    def composer_for(drawn):
        composer = TemplateComposer(catalog, cfg.op_count_mix, cfg.library_mix, cfg.sampling, usage, drawn)
        composer.numeric_screen = not args.no_screen
        return composer

    total = args.rounds * args.round_size
    print(f"{len(catalog)} ops, {args.rounds} rounds of {args.round_size}, seed {args.seed}", flush=True)
    modes = [("as a run composes", composer_for, True)]
    if args.every_draw_kept:
        modes.append(("every draw kept", lambda drawn: composer_for(frozenset()), False))
    for name, factory, one_call in modes:
        result = rounds(factory, args.rounds, args.round_size, args.seed, one_call)
        distinct = sum(result["mix"].values())
        share = " / ".join(f"{result['mix'][k] / distinct:.1%}" for k in sorted(result["mix"]))
        print(f"{name}{' (no numeric screen)' if args.no_screen else ''}:\n  exact repeats by round {result['exact']}: {sum(result['exact'])} of {total} "
              f"({sum(result['exact']) / total:.1%}), by op count {dict(sorted(result['repeated_counts'].items()))}"
              f"\n  repeated op tuples by round {result['tuples']}: {sum(result['tuples'])} ({sum(result['tuples']) / total:.1%})"
              f"\n  compose_failed {result['failed']}; distinct tasks {distinct}, their op-count mix {share}; "
              f"{result['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
