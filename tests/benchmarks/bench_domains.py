"""How many template candidates the sandbox's numeric checks would reject, and what composing costs.

    python -m tests.benchmarks.bench_domains compose OUT.json [--candidates 300] [--seed 0] [--no-screen]
    python -m tests.benchmarks.bench_domains judge OUT.json [OUT2.json ...]

`compose` draws candidates as `opsynth run` does (default catalog, mix and composer) and
writes their code, ops, layout and composition seconds; run it from another checkout (an
older commit's tree on PYTHONPATH, with this file copied in) to compose "before".
`judge` runs each candidate eagerly on the CPU at a small batch (pipeline/composers/screen.py's
sizes) in float32 and float64, with seeds other than the composer's screen uses, and counts
outputs that are non-finite, past MAGNITUDE_BOUND, or whose float32/float64 disagreement
uses more than TOLERANCE_SHARE of the tolerance; and, apart, those that feed an op that
jumps (floor, remainder, sign, atan2) a computed value.
"""
from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter

from operators.layouts import LAYOUTS

JUDGE_SEEDS = (101, 202)  # not the screen's own seed: the figure is not the screen grading itself


def compose(path: str, count: int, seed: int, numeric_screen: bool) -> None:
    from tests.benchmarks.bench_validate import default_composer
    composer = default_composer()
    if not numeric_screen:
        composer.numeric_screen = False
    rows = []
    for index in range(count):
        began = time.perf_counter()
        [result] = composer.compose_many([{"index": index}], seed)
        seconds = time.perf_counter() - began
        candidate = result[0] if isinstance(result, tuple) else result
        rows.append({"index": index, "ops": list(candidate.ops), "code": candidate.code, "seconds": seconds,
                     "layout": candidate.provenance.get("layout"), "failed": isinstance(result, tuple)})
    with open(path, "w") as out:
        json.dump(rows, out)
    times = sorted(row["seconds"] for row in rows)
    print(f"{path}: {count} candidates, {sum(times):.1f} s, {sum(times) / count * 1e3:.0f} ms a candidate "
          f"(median {times[count // 2] * 1e3:.0f} ms, slowest {times[-1]:.2f} s), "
          f"{sum(row['failed'] for row in rows)} compose_failed")


def judge(path: str) -> None:
    from operators.roles import discontinuous
    from pipeline.composers.screen import screen_sizes, screen_task
    rows = [row for row in json.load(open(path)) if not row["failed"]]
    faults: Counter = Counter()
    examples: dict[str, list] = {}
    jumps_after_computed = 0
    for row in rows:
        batch = screen_sizes(LAYOUTS[row["layout"]])[0]
        code = re.sub(r"^batch_size = \d+$", f"batch_size = {batch}", row["code"], count=1, flags=re.M)
        verdicts = [screen_task(code, seed) for seed in JUDGE_SEEDS]
        fault = next((verdict for verdict in verdicts if verdict), None)
        kind = fault.split(":")[0] if fault else "ok"
        faults[kind] += 1
        if fault:
            examples.setdefault(kind, []).append(" + ".join(row["ops"]) + f" ({fault[:70]})")
        jumps_after_computed += any(discontinuous(op) for op in row["ops"][1:])
    n = len(rows)
    rejected = faults["non_finite"] + faults["magnitude"] + faults["precision"]
    times = [row["seconds"] for row in json.load(open(path))]
    print(f"{path}: {n} candidates; non-finite, magnitude or precision: {rejected} ({rejected / n:.1%}); "
          f"a jumping op fed a computed value: {jumps_after_computed}; "
          f"{sum(times) / len(times) * 1e3:.0f} ms a candidate to compose")
    print("  " + ", ".join(f"{kind} {number}" for kind, number in sorted(faults.items())))
    for kind, listed in sorted(examples.items()):
        for example in listed[:6]:
            print(f"  {kind}: {example}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=("compose", "judge"))
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--candidates", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-screen", action="store_true", help="compose without the numeric screen")
    args = parser.parse_args()
    for path in args.paths:
        if args.step == "compose":
            compose(path, args.candidates, args.seed, not args.no_screen)
        else:
            judge(path)


if __name__ == "__main__":
    main()
