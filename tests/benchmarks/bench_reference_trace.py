"""The reference's cold trace: KernelBench traced and read in full from an empty cache, as a
run with `--reference` does before its first verdict (pipeline.dedupe.traced_in_batches).

    python -m tests.benchmarks bench_reference_trace /path/to/KernelBench [--levels 1 2 3] [--workers 2]
        [--baseline COMMIT] [--no-shipped]

Prints the wall time, how many tasks were read, and how many went one per child and why
(the run's own log lines). A tree with KernelBench's shipped readings
(filters/similarity/kernelbench_readings.json) reads a stock checkout from them; --no-shipped
traces every task all the same, and times the batches apart from reading in full. --baseline COMMIT first runs the same measure on that commit's
code (`git archive` into a temporary folder, imported ahead of this checkout's), on the same
machine in the same run, and prints the ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def measure(kernelbench: str, levels: tuple[int, ...], workers: int, shipped: bool = True) -> dict:
    """One cold reference in this process, with whichever tree is first on sys.path: read from
    the shipped table where the tree has one (and `shipped`), else traced in batches and read
    in full, each phase timed."""
    import logging

    import pipeline.dedupe as dedupe
    from filters.sandbox.pool import SandboxOptions, WorkerPool
    from filters.similarity.reference import in_full, load_reference

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    for name in ("pipeline.dedupe", "filters.similarity.reference"):
        logging.getLogger(name).addHandler(Keep())
        logging.getLogger(name).setLevel(logging.INFO)
    reference = load_reference(kernelbench, levels)
    codes, phases = list(reference.codes), {}
    with tempfile.TemporaryDirectory() as cache:
        # the same options as a run's pool for the reference (pipeline/run.py)
        with WorkerPool(workers, SandboxOptions(timeout_s=120, threads=1, warm_up=False)) as pool:
            pool.run_many([{"code": "", "config": {"trace_batch": []}}] * workers)  # every worker started
            began = time.perf_counter()
            if shipped and hasattr(dedupe, "reference_graphs"):
                graphs = dedupe.reference_graphs(codes, pool, cache)
            else:
                readings = dedupe.readings_in_batches(codes, pool, cache)  # as traced_in_batches does, timed apart
                phases = {"batches_s": round(time.perf_counter() - began, 1),
                          "read_in_full": sum(bool(entry.get("partial")) for entry in readings)}
                graphs = in_full(codes, readings, pool, cache)
            wall = time.perf_counter() - began
    return {"tasks": len(codes), "traced": sum(bool(graph) for graph in graphs), "wall_s": round(wall, 1), **phases,
            "log": [line for line in lines if "one per child" in line or "shipped" in line]}


def in_tree(tree: Path | None, args) -> dict:
    """`measure` in a fresh process, `tree`'s code first on its path (this checkout's if None)."""
    # ahead of what the path held (the device's wheels are on it: tests/benchmarks/h200.sh)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (tree, ROOT, os.environ.get("PYTHONPATH")) if p)}
    if tree:
        env["PYTHONSAFEPATH"] = "1"  # `-c` puts the working folder first otherwise
    code = (f"import json, sys; from tests.benchmarks.bench_reference_trace import measure; "
            f"print('RESULT', json.dumps(measure({args.kernelbench!r}, {tuple(args.levels)!r}, {args.workers}, "
            f"{not args.no_shipped})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    result = next((line[7:] for line in out.stdout.splitlines() if line.startswith("RESULT ")), None)
    if result is None:
        raise SystemExit(f"the measure failed:\n{out.stderr[-3000:]}")
    return json.loads(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernelbench")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--baseline", help="a commit whose code is measured first, in the same run")
    parser.add_argument("--no-shipped", action="store_true", help="trace every task, the shipped readings unread")
    args = parser.parse_args()
    results = {}
    if args.baseline:
        # beside the checkout, not in /tmp: the jail mounts a tmpfs of its own there, so its
        # workers would import this checkout's code instead of the baseline's
        with tempfile.TemporaryDirectory(dir=ROOT.parent, prefix=".opsynth-baseline-") as tree:
            archive = subprocess.run(["git", "archive", args.baseline, "pipeline", "filters", "operators", "outputs"],
                                     cwd=ROOT, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            results[args.baseline] = in_tree(Path(tree), args)
    results["this checkout"] = in_tree(None, args)
    for name, result in results.items():
        phases = (f": {result['batches_s']} s in batches, then {result['wall_s'] - result['batches_s']:.1f} s reading "
                  f"{result['read_in_full']} again at their own sizes") if "batches_s" in result else ""
        print(f"{name}: {result['traced']} of {result['tasks']} read in {result['wall_s']} s on {args.workers} "
              f"workers{phases}")
        for line in result["log"]:
            print(f"    {line}")
    if args.baseline:
        before, after = results[args.baseline]["wall_s"], results["this checkout"]["wall_s"]
        ratio = f"{before / after:.1f}x" if after >= 1 else "ready in under a second"
        print(f"cold reference: {before} s -> {after} s ({ratio})")


if __name__ == "__main__":
    main()
