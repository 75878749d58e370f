"""What screening ahead in a pool of processes buys a round's composition
(pipeline/composers/template.py: TemplateComposer._screen_ahead).

    python -m tests.benchmarks.bench_screen_pool [--jobs 512] [--seed 0] [--workers N] [--torch-only] [--start spawn]

Composes two rounds of JOBS with the default configuration's template composer twice, from
empty screen caches: serially (every chain screened in this process, as before), and with
WORKERS screening processes (default: one per core), as `opsynth run` does; the processes
start in the first round and are kept for the second. Printed per round: the seconds each
way, their ratio, and whether both are the same candidates (they must be: composition is a
pure function of its arguments). --torch-only composes from the
torch catalog alone (a crawl of seconds, where the default libraries' cold crawl takes minutes).
--start names how the screening processes start (the default: the composer's own,
SCREEN_START_METHOD; `spawn` was main's before session 26).
"""
from __future__ import annotations

import argparse
import os
import time

from operators.catalog import crawl
from pipeline.composers import template
from pipeline.composers.template import TemplateComposer
from pipeline.config import RunConfig
from tests.benchmarks.bench_validate import default_composer


def composed_round(composer: TemplateComposer, jobs: range, seed: int) -> tuple[list, float]:
    began = time.perf_counter()
    results = composer.compose_many([{"index": index} for index in jobs], seed)
    return [getattr(result, "id", None) or result[1].reason for result in results], time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--torch-only", action="store_true")
    parser.add_argument("--start", choices=("spawn", "forkserver"), default=template.SCREEN_START_METHOD)
    args = parser.parse_args()
    template.SCREEN_START_METHOD = args.start
    if args.torch_only:
        catalog, defaults = crawl(["torch"])[0], RunConfig()
        serial, pooled = (TemplateComposer(catalog, defaults.op_count_mix) for _ in range(2))
    else:
        serial, pooled = default_composer(), default_composer()
    serial.screen_workers = 1
    pooled.screen_workers, pooled.screen_pool_from = args.workers, 1
    for name, jobs in (("first round (the processes start)", range(args.jobs)),
                       ("second round", range(args.jobs, 2 * args.jobs))):
        serial_ids, serial_s = composed_round(serial, jobs, args.seed)
        pooled_ids, pooled_s = composed_round(pooled, jobs, args.seed)
        print(f"{name} of {args.jobs}: serial {serial_s:.1f} s, {args.workers} screening processes ({args.start}) "
              f"{pooled_s:.1f} s "
              f"(x{serial_s / pooled_s:.2f}); the same candidates: {serial_ids == pooled_ids}")


if __name__ == "__main__":
    main()
