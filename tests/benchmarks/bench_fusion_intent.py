"""What the template composer's samples look like: `uniform` chains against `layers` chains.

    python -m tests.benchmarks.bench_fusion_intent [--candidates 500] [--device cuda] [--workers 7]
        [--catalog CATALOG.parquet] [--kernelbench KernelBench/level2]

The same number of candidates of each sampling, drawn as a run with the default
configuration draws them (seed, op-count mix, library mix, usage weights), validated by one
warm worker pool with a run's checks. Reports per sampling: the acceptance rate, the share
of accepted tasks holding a compute-heavy op (anchor or normalisation) and leading with
one, the top-20 ops, the op-count mix against the target, the library mix, and the eager
time distribution; with --kernelbench, the eager times of those tasks measured by the same
pool (no re-sizing) as the yardstick. --catalog uses a crawled catalog instead of crawling.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from filters.sandbox.pool import SandboxOptions, WorkerPool
from filters.sandbox.validate import validate
from operators.catalog import load_or_crawl, read_catalog
from operators.records import Candidate, task_id
from operators.roles import compute_heavy
from operators.task import library_ops
from operators.usage import op_usage
from pipeline.composers.template import SAMPLINGS, CompositionFailed, TemplateComposer
from outputs.stats import share
from operators.libraries import DEFAULT_LIBRARIES
from pipeline.config import RunConfig
from pipeline.devices import gpu_share_gb
from pipeline.run_info import shares

PERCENTILES = (10, 25, 50, 75, 90)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--catalog", help="a crawled catalog Parquet file (default: crawl or the cache)")
    parser.add_argument("--kernelbench", help="a folder of KernelBench tasks to time as the yardstick (level2)")
    parser.add_argument("--out", help="write the full report here as JSON")
    parser.add_argument("--sampling", action="append", choices=SAMPLINGS,
                        help="measure only this sampling (repeatable; default: uniform, then layers)")
    args = parser.parse_args()

    defaults = RunConfig()
    catalog = read_catalog(Path(args.catalog)) if args.catalog else \
        load_or_crawl(list(DEFAULT_LIBRARIES), Path(defaults.cache_dir))[1]
    usage = op_usage([spec.name for spec in catalog], DEFAULT_LIBRARIES)
    drawn = {sampling: compose(catalog, sampling, usage, defaults, args.candidates, args.seed)
             for sampling in args.sampling or ("uniform", "layers")}  # before, then after
    print(f"device {args.device}, {args.candidates} candidates per sampling, {args.workers} workers", flush=True)
    cuda = args.device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="opsynth-bench-") as folder:
        options = SandboxOptions(device=args.device, threads=max(1, (os.cpu_count() or 1) // args.workers),
                                 timing_lock_dir=os.path.join(folder, "locks") if cuda else None,
                                 gpu_memory_gb=gpu_share_gb([0], args.workers) if cuda else None)
        config = {**check_config(defaults, args.device), "memory_budget_gb":
                  options.gpu_memory_gb / 3 if options.gpu_memory_gb else None}
        with WorkerPool(args.workers, options) as pool:
            report = {}
            for sampling, (candidates, repeats) in drawn.items():
                began = time.perf_counter()
                verdicts = validate(candidates, pool, config, library_ops(catalog))
                report[sampling] = summarize(candidates, verdicts, defaults, time.perf_counter() - began)
                report[sampling].update(repeats=repeats, accepted_per_index=round(
                    report[sampling]["accepted"] / args.candidates, 3))
                print_section(sampling, report[sampling])  # as it is done: a long run that is cut off keeps it
            if args.kernelbench:
                report["kernelbench"] = time_reference(Path(args.kernelbench), pool, config)
                print_section("kernelbench", report["kernelbench"])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


def compose(catalog, sampling, usage, defaults, count, seed) -> tuple[list[Candidate], int]:
    """The distinct candidates of the first `count` indexes (a run rejects a repeat as
    `duplicate` before validating it), and how many repeats there were."""
    composer = TemplateComposer(catalog, defaults.op_count_mix, defaults.library_mix, sampling, usage)
    candidates, seen = [], set()
    for index in range(count):
        try:
            candidate = composer.compose(index, seed)
        except CompositionFailed:
            continue
        if candidate.id not in seen:
            seen.add(candidate.id)
            candidates.append(candidate)
    return candidates, count - len(candidates)


def check_config(defaults: RunConfig, device: str) -> dict:
    return {"device": device, "seed": defaults.seed, "atol": defaults.atol, "rtol": defaults.rtol,
            "determinism_tol": defaults.determinism_tol, "window_ms": list(defaults.window_ms),
            "target_ms": defaults.target_ms, "max_task_memory_gb": defaults.max_task_memory_gb}


def summarize(candidates, verdicts, defaults: RunConfig, seconds: float) -> dict:
    accepted = [c for c, v in zip(candidates, verdicts) if v.passed]
    eager = sorted(v.metrics["eager_ms"] for v in verdicts if v.passed and "eager_ms" in v.metrics)
    counts = Counter(len(c.ops) for c in accepted)
    return {
        "candidates": len(candidates), "accepted": len(accepted),
        "acceptance": round(len(accepted) / max(1, len(candidates)), 3),
        "validate_s": round(seconds, 1),
        "compute_heavy": share(compute_heavy(c.ops) for c in accepted),
        "led_by_compute_heavy": share(compute_heavy(c.ops[:2]) for c in accepted if len(c.ops) > 1),
        "top_ops": Counter(op for c in accepted for op in c.ops).most_common(20),
        "op_count_mix": {str(n): round(counts[n] / max(1, len(accepted)), 3) for n in sorted(defaults.op_count_mix)},
        "op_count_target": shares(defaults.op_count_mix),
        "library_mix": dict(Counter(c.data_source.split("#")[0] for c in accepted)),
        "eager_ms": percentiles(eager),
        "rejected_by_reason": dict(Counter(v.reason for v in verdicts if not v.passed).most_common(8)),
    }


def time_reference(folder: Path, pool, config: dict) -> dict:
    """Eager times of the reference tasks as they are (a window that takes any time)."""
    tasks = [Candidate(task_id(p.read_text()), (), "kernelbench", p.read_text(), "reference", 0, {})
             for p in sorted(folder.glob("*.py"))]
    verdicts = validate(tasks, pool, {**config, "window_ms": [0.0, 1e9], "ablation": False})
    eager = sorted(v.metrics["eager_ms"] for v in verdicts if "eager_ms" in v.metrics)
    untimed = Counter(v.reason for v in verdicts if "eager_ms" not in v.metrics)
    return {"tasks": len(tasks), "timed": len(eager), "eager_ms": percentiles(eager), "untimed": dict(untimed)}


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    at = lambda p: values[min(len(values) - 1, max(0, math.ceil(p / 100 * len(values)) - 1))]  # noqa: E731
    return {f"p{p}": round(at(p), 2) for p in PERCENTILES} | {"mean": round(statistics.fmean(values), 2)}


def print_section(name: str, r: dict) -> None:
    if name == "kernelbench":
        print(f"== reference: {r['timed']} of {r['tasks']} tasks timed; eager ms {r['eager_ms']}; "
              f"untimed {r['untimed']}", flush=True)
        return
    print(f"== {name}: {r['repeats']} repeats dropped; accepted {r['accepted']}/{r['candidates']} distinct "
          f"({r['acceptance']:.1%}; {r['accepted_per_index']:.1%} of the indexes) in {r['validate_s']} s; "
          f"compute-heavy {r['compute_heavy']}, led by one {r['led_by_compute_heavy']}")
    print(f"   op-count mix {r['op_count_mix']} (target {r['op_count_target']})")
    print(f"   library mix {r['library_mix']}; eager ms {r['eager_ms']}")
    print(f"   rejects {r['rejected_by_reason']}")
    print("   top ops " + ", ".join(f"{op.rsplit('.', 1)[-1]} {n}" for op, n in r["top_ops"]), flush=True)


if __name__ == "__main__":
    main()
