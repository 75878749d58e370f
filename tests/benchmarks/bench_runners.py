"""The same run on the DirectRunner in one process and in multi-process mode.

    python -m tests.benchmarks.bench_runners [--candidates 24]

Same candidates (seed, --max-candidates), each run from an empty compiler and verdict
cache; prints both wall times and the ratio.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed_run(folder: Path, name: str, candidates: int, beam_args: list[str]) -> tuple[float, dict]:
    command = [sys.executable, "-m", "pipeline.cli", "run", "--num-samples", "100000", "--max-candidates",
               str(candidates), "--seed", "2", "--out", str(folder / name), "--cache-dir", str(folder / f"cache-{name}")]
    subprocess.run(command + ["--max-candidates", "1", "--out", str(folder / "warm")], capture_output=True)  # crawl
    began = time.perf_counter()
    subprocess.run(command + (["--", *beam_args] if beam_args else []), capture_output=True, text=True, timeout=3600)
    return time.perf_counter() - began, json.loads((folder / name / "stats.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", type=int, default=24)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="opsynth-runners-"))
    single, s1 = timed_run(folder, "single", args.candidates, [])
    multi, s2 = timed_run(folder, "multi", args.candidates, ["--direct_running_mode=multi_processing",
                                                             f"--direct_num_workers={args.processes}"])
    print(f"{args.candidates} candidates: one process {single:.1f} s ({s1['accepted']} accepted), "
          f"{args.processes} processes {multi:.1f} s ({s2['accepted']} accepted), speed-up {single / multi:.2f}x")


if __name__ == "__main__":
    main()
