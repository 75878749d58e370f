"""The same run on the DirectRunner in one process and in multi-process mode.

    python -m tests.benchmarks.bench_runners [--candidates 24] [--processes 2] [--device auto]

Same candidates (seed, --max-candidates), each run with an empty compiler cache and verdict
store of its own; the catalog is crawled (or found in the default cache) once, before either
clock starts. Prints both wall times and the ratio.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.config import RunConfig


def timed_run(folder: Path, name: str, args, beam_args: list[str]) -> tuple[float, dict]:
    cache = folder / f"cache-{name}"
    cache.mkdir()
    (cache / "catalogs").symlink_to(Path(RunConfig().cache_dir).resolve() / "catalogs")
    command = [sys.executable, "-m", "pipeline.cli", "run", "--num-samples", "100000", "--max-candidates",
               str(args.candidates), "--seed", "2", "--device", args.device, "--out", str(folder / name),
               "--cache-dir", str(cache)]
    began = time.perf_counter()
    done = subprocess.run(command + (["--", *beam_args] if beam_args else []), capture_output=True, text=True,
                          timeout=3600)
    wall = time.perf_counter() - began
    if done.returncode not in (0, 1):  # 1: stopped at --max-candidates short of --num-samples, as asked here
        sys.exit(f"{name} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, json.loads((folder / name / "stats.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", type=int, default=24)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="opsynth-runners-") as name:
        folder = Path(name)
        subprocess.run([sys.executable, "-m", "pipeline.cli", "crawl", "--out", str(folder / "catalog.parquet")],
                       check=True, capture_output=True)
        single, s1 = timed_run(folder, "single", args, [])
        multi, s2 = timed_run(folder, "multi", args, ["--direct_running_mode=multi_processing",
                                                      f"--direct_num_workers={args.processes}"])
    print(f"{args.candidates} candidates on {args.device}: one process {single:.1f} s ({s1['accepted']} accepted), "
          f"{args.processes} processes {multi:.1f} s ({s2['accepted']} accepted), speed-up {single / multi:.2f}x")
    for name, stats in (("one process", s1), (f"{args.processes} processes", s2)):
        print(f"  {name}: time by check {stats['time_by_check_s']}, gpu gate {stats.get('gpu_gate_s')}")


if __name__ == "__main__":
    main()
