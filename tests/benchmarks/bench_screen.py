"""What the template composer's checks screen stops, against the GPU's verdicts on the same
candidates (pipeline/composers/screen.py: checks_fault).

    python -m tests.benchmarks.bench_screen --records RUN.records.jsonl [--count 512] [--seed 0] [--out DIR]

Composes the first COUNT template candidates of SEED twice, as tests/benchmarks/
compose_candidates.py does (so the set without the screen is `.bench/cands`): without the
checks screen and with it. Where the two differ, the screen turned the first chain down and
drew another. RUN.records.jsonl is `bench_throughput --records` of the unscreened set on a GPU
(`h200.sh throughput`): each turned-down candidate is looked up there by id. Printed: the
composition time per candidate both ways, how many the screen turned down and of them how many
the GPU accepted (a loss) or rejected (and the worker-seconds those jobs took), and the GPU's
rejects the screen let through, by reason. With --out, the screened set is written there as
task-NNNNN.py files, for the same throughput run.
"""
from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

from tests.benchmarks.bench_validate import composed, default_composer


def timed_composition(count: int, seed: int, checks_screen: bool) -> tuple[list, float]:
    """bench_validate's candidates, with or without the checks screen, and the seconds they took."""
    composer = default_composer(checks_screen)
    began = time.perf_counter()
    return composed(composer, count, seed), time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", required=True, help="bench_throughput --records of the unscreened candidates")
    parser.add_argument("--count", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the screened candidates here")
    args = parser.parse_args()
    verdicts = {row["id"]: row for row in map(json.loads, Path(args.records).read_text().splitlines())}
    plain, plain_s = timed_composition(args.count, args.seed, checks_screen=False)
    screened, screened_s = timed_composition(args.count, args.seed, checks_screen=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for index, candidate in enumerate(screened):
            (Path(args.out) / f"task-{index:05d}.py").write_text(candidate.code)
    kept_ids = {candidate.id for candidate in screened}
    turned_down = [verdicts.get(candidate.id) for candidate in plain if candidate.id not in kept_ids]
    known = [row for row in turned_down if row]
    lost = [row for row in known if row["passed"]]
    stopped = [row for row in known if not row["passed"]]
    let_through = [verdicts[c.id] for c in plain if c.id in kept_ids and c.id in verdicts and not verdicts[c.id]["passed"]]
    worker_s = lambda rows: sum(row["metrics"].get("job_wall_ms", 0.0) for row in rows) / 1e3  # noqa: E731
    found = sum(candidate.id in verdicts for candidate in plain)
    print(f"== checks screen: {len(plain)} candidates of seed {args.seed}; {found} of them in the records")
    print(f"composition: {plain_s / len(plain) * 1e3:.0f} ms a candidate without the checks screen, "
          f"{screened_s / len(screened) * 1e3:.0f} ms with it")
    print(f"turned down {len(turned_down)}: the GPU rejected {len(stopped)} ({worker_s(stopped):.0f} worker-s of "
          f"{worker_s(list(verdicts.values())):.0f}), accepted {len(lost)}")
    print("stopped, by the GPU's reason:", dict(collections.Counter(row["reason"] for row in stopped).most_common()))
    print(f"let through {len(let_through)} the GPU rejected ({worker_s(let_through):.0f} worker-s):",
          dict(collections.Counter(row["reason"] for row in let_through).most_common()))


if __name__ == "__main__":
    main()
