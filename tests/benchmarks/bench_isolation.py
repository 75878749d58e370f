"""Fault isolation: do hangs and memory hogs change any other task's verdict?

    python -m tests.benchmarks.bench_isolation [--device cuda] [--workers 8] [--tasks DIR | --candidates 24]

The same benign tasks (template candidates, or every .py file of DIR) are validated three
times through one warm pool, as a run validates them: alone, alone again (how much verdicts
move by themselves: re-sizing follows measured times), and with hostile tasks sent to the
workers first and between them (tasks that slipped past the static check): infinite loops
in forward, which hold the GPU gate; a model that asks for more GPU memory than a worker's
share; one that fills host memory. Prints how many benign verdicts (passed, stage, reason)
each later pass shares with the first, the hostile tasks' verdicts, and each pass's wall time.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path

from filters.checks.harness import DEFAULTS
from filters.sandbox.pool import SandboxOptions, WorkerPool
from tests.conftest import make_task

HOSTILE = {
    "hang": make_task("while True:\n    pass"),
    "gpu_memory_hog": make_task("return x + self.hog.sum()", init="self.hog = torch.empty(200 << 30, dtype=torch.uint8)"),
    "host_memory_hog": make_task("hog = torch.ones(64 << 30, dtype=torch.uint8, device='cpu')\nreturn x + hog.sum()"),
}
ORDER = ["hang", "gpu_memory_hog", "hang", "host_memory_hog", "hang"]  # sent first, then one before every few benign


def benign_tasks(folder: str | None, count: int) -> list[str]:
    if folder:
        return [path.read_text() for path in sorted(Path(folder).glob("*.py"))][:count]
    from operators.catalog import crawl
    from pipeline.composers.template import CompositionFailed, TemplateComposer
    composer, codes = TemplateComposer(crawl(["torch"])[0]), []
    for index in itertools.count():
        if len(codes) == count:
            return codes
        try:
            codes.append(composer.compose(index, 0).code)
        except CompositionFailed:
            continue


def verdict(result: dict) -> tuple:
    return result["passed"], result["stage"], result["reason"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--candidates", type=int, default=24)
    parser.add_argument("--tasks", default=None, help="a folder of .py tasks (default: template candidates)")
    parser.add_argument("--timeout-s", type=float, default=60)
    args = parser.parse_args()
    benign = benign_tasks(args.tasks, args.candidates)
    cuda = args.device.startswith("cuda")
    config = {**DEFAULTS, "device": args.device}
    with tempfile.TemporaryDirectory() as locks:
        options = SandboxOptions(device=args.device, timeout_s=args.timeout_s, max_memory_gb=24, threads=2,
                                 timing_lock_dir=locks if cuda else None, gpu_memory_gb=16 if cuda else None)
        with WorkerPool(args.workers, options, [0] if cuda else None) as pool:
            for worker in pool.workers:
                worker.start()
            began = time.perf_counter()
            alone = pool.run_many([{"code": code, "config": config} for code in benign])
            alone_s = time.perf_counter() - began
            again = pool.run_many([{"code": code, "config": config} for code in benign])
            mixed_jobs, where = [], []
            hostile = iter(ORDER)
            for name in itertools.islice(hostile, 3):  # the hostile ones first: they hold the workers and the gate
                mixed_jobs.append({"code": HOSTILE[name], "config": config})
                where.append(name)
            for index, code in enumerate(benign):
                if index % 6 == 5 and (name := next(hostile, None)):
                    mixed_jobs.append({"code": HOSTILE[name], "config": config})
                    where.append(name)
                mixed_jobs.append({"code": code, "config": config})
                where.append(index)
            began = time.perf_counter()
            mixed_results = pool.run_many(mixed_jobs)
            mixed_s = time.perf_counter() - began
    mixed = [result for result, at in zip(mixed_results, where) if isinstance(at, int)]
    same = [verdict(a) == verdict(b) for a, b in zip(alone, mixed)]
    same_again = [verdict(a) == verdict(b) for a, b in zip(alone, again)]
    ratios = [b["metrics"]["eager_ms"] / a["metrics"]["eager_ms"] for a, b in zip(alone, mixed)
              if a["passed"] and b["passed"] and a["metrics"].get("eager_ms")]
    print(json.dumps({
        "device": args.device, "workers": args.workers, "benign": len(benign),
        "benign_verdicts_same_alone_again": f"{sum(same_again)} of {len(same_again)}",
        "benign_verdicts_same_with_hostile": f"{sum(same)} of {len(same)}",
        "changed_alone_again": [(i, verdict(a), verdict(b)) for i, (a, b, s) in
                                enumerate(zip(alone, again, same_again)) if not s],
        "changed_with_hostile": [(i, verdict(a), verdict(b), b["detail"][:120]) for i, (a, b, s) in
                    enumerate(zip(alone, mixed, same)) if not s],
        "accepted": {"alone": sum(r["passed"] for r in alone), "alone_again": sum(r["passed"] for r in again),
                     "with_hostile": sum(r["passed"] for r in mixed)},
        "eager_ms_mixed_over_alone_median": round(statistics.median(ratios), 3) if ratios else None,
        "hostile": [(at, verdict(r), r["detail"][:100]) for r, at in zip(mixed_results, where) if isinstance(at, str)],
        "wall_s": {"alone": round(alone_s, 1), "mixed": round(mixed_s, 1)},
    }, indent=1))


if __name__ == "__main__":
    main()
