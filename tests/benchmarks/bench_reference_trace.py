"""The reference's cold trace: KernelBench traced and read in full from an empty cache, as a
run with `--reference` does before its first verdict (pipeline.dedupe.traced_in_batches).

    python -m tests.benchmarks bench_reference_trace /path/to/KernelBench [--levels 1 2 3] [--workers 2]
        [--baseline COMMIT]

Prints the wall time, how many tasks were traced, and how many went one per child and why
(the run's own log lines). --baseline COMMIT first runs the same measure on that commit's
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


def measure(kernelbench: str, levels: tuple[int, ...], workers: int) -> dict:
    """One cold trace in this process, with whichever tree is first on sys.path."""
    import logging

    from filters.sandbox.pool import SandboxOptions, WorkerPool
    from filters.similarity.reference import load_reference
    from filters.similarity.reference import in_full
    from pipeline.dedupe import readings_in_batches

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logging.getLogger("pipeline.dedupe").addHandler(Keep())
    logging.getLogger("pipeline.dedupe").setLevel(logging.INFO)
    reference = load_reference(kernelbench, levels)
    with tempfile.TemporaryDirectory() as cache:
        # the same options as a run's pool for the reference (pipeline/run.py)
        with WorkerPool(workers, SandboxOptions(timeout_s=120, threads=1, warm_up=False)) as pool:
            pool.run_many([{"code": "", "config": {"trace_batch": []}}] * workers)  # every worker started
            codes = list(reference.codes)
            began = time.perf_counter()
            readings = readings_in_batches(codes, pool, cache)  # as traced_in_batches does, timed apart
            read = time.perf_counter()
            graphs = in_full(codes, readings, pool, cache)
            done = time.perf_counter()
    return {"tasks": len(codes), "traced": sum(bool(graph) for graph in graphs), "wall_s": round(done - began, 1),
            "batches_s": round(read - began, 1), "in_full_s": round(done - read, 1),
            "read_in_full": sum(bool(entry.get("partial")) for entry in readings),
            "one_per_child": [line for line in lines if "one per child" in line]}


def in_tree(tree: Path | None, args) -> dict:
    """`measure` in a fresh process, `tree`'s code first on its path (this checkout's if None)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (tree, ROOT) if p)}
    if tree:
        env["PYTHONSAFEPATH"] = "1"  # `-c` puts the working folder first otherwise
    code = (f"import json, sys; from tests.benchmarks.bench_reference_trace import measure; "
            f"print('RESULT', json.dumps(measure({args.kernelbench!r}, {tuple(args.levels)!r}, {args.workers})))")
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
    args = parser.parse_args()
    results = {}
    if args.baseline:
        with tempfile.TemporaryDirectory() as tree:
            archive = subprocess.run(["git", "archive", args.baseline, "pipeline", "filters", "operators", "outputs"],
                                     cwd=ROOT, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            results[args.baseline] = in_tree(Path(tree), args)
    results["this checkout"] = in_tree(None, args)
    for name, result in results.items():
        print(f"{name}: {result['traced']} of {result['tasks']} traced in {result['wall_s']} s on "
              f"{args.workers} workers: {result['batches_s']} s reading them, {result['in_full_s']} s reading "
              f"{result['read_in_full']} again at their own sizes")
        for line in result["one_per_child"]:
            print(f"    {line}")
    if args.baseline:
        before, after = results[args.baseline]["wall_s"], results["this checkout"]["wall_s"]
        print(f"cold reference trace: {before} s -> {after} s ({before / after:.2f}x)")


if __name__ == "__main__":
    main()
