"""What the compile check's torch.compile costs a candidate, with Inductor as it comes and with
fewer kernel configurations to compile and benchmark (the check asks only that the compiled
model runs and agrees with eager mode, not how fast it runs).

    python -m tests.benchmarks.bench_compile TASKS [--candidates 64] [--parallel 8] [--device cuda]
        [--settings autotuned,pointwise,deterministic]

Each (candidate, setting) compiles in a fresh process with empty Inductor and Triton caches, as
a job's child does (filters/checks/harness.py: use_compiler_caches), the settings interleaved
so that each sees the same load. A child times the compiled model's first call (compiling,
autotuning and running it) and compares its output with eager mode's. Printed per setting: the
median and summed seconds, the ratio against the first setting, and whether each candidate's
compiled output agrees with eager mode at the checks' tolerance under every setting.

The candidates run outside the sandbox: give it only tasks you composed yourself
(`tests.benchmarks.compose_candidates`), never untrusted code.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Inductor options per setting (torch.compile's `options`). As it comes, a 1-D pointwise kernel is
# compiled in two configurations and a reduction in up to seven, each a Triton compile of its
# own, and all are benchmarked at the first call; `deterministic` also picks one reduction
# configuration and one template choice without benchmarking them.
SETTINGS = {"autotuned": {}, "pointwise": {"triton.autotune_pointwise": False},
            "deterministic": {"triton.autotune_pointwise": False, "deterministic": True}}


def compile_one(path: str, setting: str, device: str) -> dict:
    """In this (fresh) process: the first compiled call's seconds and its agreement with eager."""
    import torch

    from filters.checks.registry import DEFAULTS
    from filters.checks.measure.execution import build_model, first_inputs, forward, load_task, max_diff, tolerance_share
    task = load_task(Path(path).read_text())
    target = torch.device(device)
    model = build_model(task, 0, target)
    inputs = first_inputs(task, 0, target)
    eager = forward(model, inputs)
    began = time.perf_counter()
    compiled = forward(torch.compile(model, options=SETTINGS[setting]), inputs)
    if target.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    share = tolerance_share(compiled, eager, DEFAULTS["atol"], DEFAULTS["rtol"])
    return {"seconds": seconds, "agrees": share <= 1.0, "max_diff": max_diff(eager, compiled)}


def run_child(path: str, setting: str, device: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="opsynth-compile-") as folder:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": folder, "TRITON_CACHE_DIR": os.path.join(folder, "triton"),
               "TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-m", "tests.benchmarks.bench_compile", "--one", path,
                               "--setting", setting, "--device", device],
                              capture_output=True, text=True, env=env, timeout=300)
    lines = done.stdout.strip().splitlines()
    try:
        return {"path": path, "setting": setting, **json.loads(lines[-1])}
    except (IndexError, json.JSONDecodeError):
        return {"path": path, "setting": setting, "error": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tasks", nargs="?")
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--one")
    parser.add_argument("--setting")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(compile_one(args.one, args.setting, args.device)))
        return
    settings = args.settings.split(",")
    paths = [str(p) for p in sorted(Path(args.tasks).glob("*.py"))[:args.candidates]]
    jobs = [(path, setting) for path in paths for setting in settings]
    began = time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda job: run_child(*job, args.device), jobs))
    print(f"== compile: {len(paths)} candidates x {len(settings)} settings, {args.parallel} at once, "
          f"device {args.device}, {time.perf_counter() - began:.0f} s")
    report(results, settings, paths)


def report(results: list[dict], settings: list[str], paths: list[str]) -> None:
    by = {(r["path"], r["setting"]): r for r in results}
    compiled = [p for p in paths if all("seconds" in by[p, s] for s in settings)]
    base = sum(by[p, settings[0]]["seconds"] for p in compiled)
    for setting in settings:
        seconds = [by[p, setting]["seconds"] for p in compiled]
        errors = [by[p, setting] for p in paths if "seconds" not in by[p, setting]]
        print(f"{setting}: median {statistics.median(seconds):.2f} s, sum {sum(seconds):.1f} s over {len(seconds)} "
              f"(x{base / sum(seconds):.2f} against {settings[0]}); agree with eager "
              f"{sum(by[p, setting]['agrees'] for p in compiled)}; failed {len(errors)} "
              f"{[(Path(e['path']).name, e['error'][:80]) for e in errors][:3]}")
    differ = [Path(p).name for p in compiled if len({by[p, s]["agrees"] for s in settings}) > 1]
    print(f"agreement with eager differs between settings for {len(differ)}: {differ[:8]}")


if __name__ == "__main__":
    main()
