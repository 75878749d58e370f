"""Sandbox throughput: a candidate folder through `opsynth validate`, and where the time went.

    python -m tests.benchmarks.bench_throughput TASKS [--limit N] [--device cuda] [--workers N]
        [--tree DIR] [--name NAME] [--json FILE] [--records FILE] [--timeout-s S] [-- MORE VALIDATE FLAGS]

Copies the first N .py files of TASKS (from compose_candidates; .bench/cands holds 512) to a
folder of its own and runs the real command on them, `python -m pipeline.cli validate`, with
a fresh output folder and cache (no verdict is reused), the code of this checkout or of
--tree (an earlier commit's `git archive`: the same candidates before and after on one
machine). From the command's own records it prints:

- accepted/h and candidates/h, over the whole wall and steady (less the workers' start);
- worker-seconds per check (each check's wall time summed over candidates), the seconds a
  job's child spent outside the checks (fork, CUDA start, ...), and the accepted tasks'
  traces (a child each, after the job's own; the zygote's clock);
- the GPU gate: seconds waited, held alone (timing), held shared, and the longest single
  hold with the step that held it (a long shared hold makes every timer, and so every
  worker, wait behind it); how long timers kept it closed, in how many closures (every
  step that came meanwhile waited), and how many shared steps there were;
- the GPU busy share: NVML's utilisation sampled twice a second during the run, and the
  share of the wall the GPU was held alone;
- the bounds: the accepted/h every core busy with the jobs' own work would give, and the
  GPU's exclusive holds back to back (what limits the rate, and how far the run is from it);
- candidates wasted: exact repeats of an earlier candidate (same task id) and NaN/Inf
  outputs, with the worker-seconds they cost; jobs retried alone after running out of
  GPU memory, and how many of those then passed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    args, validate_flags = parse_args()
    with tempfile.TemporaryDirectory(prefix="opsynth-throughput-") as folder:
        tasks = copy_tasks(Path(args.tasks), Path(folder) / "tasks", args.limit)
        out, cache = Path(folder) / "out", Path(folder) / "cache"
        sampler = GpuSampler() if args.device.startswith("cuda") else None
        began = time.monotonic()
        code = run_validate(args, tasks, out, cache, validate_flags)
        wall_s = time.monotonic() - began
        busy = sampler.stop() if sampler else None
        if code != 0 or not (out / "stats.json").exists():
            raise SystemExit(f"opsynth validate exited with {code}; see its output above")
        records = read_records(out)
        summary = summarise(args, records, read_worker_starts(out / "workers.log"), wall_s, busy)
        if args.records:  # each candidate's verdict and metrics (no code), for a closer look later
            Path(args.records).write_text("".join(json.dumps({"id": r["candidate"]["id"], **r["verdict"]}) + "\n"
                                                  for r in records))
    print_report(summary)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", help="a folder of candidate .py files")
    parser.add_argument("--limit", type=int, default=512, help="the first N files, by name")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workers", type=int, default=0, help="sandbox workers (0: the command's default)")
    parser.add_argument("--tree", default=None, help="run this folder's code (pipeline/, filters/, ...) instead")
    parser.add_argument("--name", default="", help="a label for the report")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--records", help="write each candidate's verdict and metrics here (JSON lines)")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="the command's per-candidate limit")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    own, rest = argv[:split], argv[split + 1:]
    return parser.parse_args(own), rest


def copy_tasks(source: Path, target: Path, limit: int) -> Path:
    """The first `limit` .py files of `source`, copied (the source folder is never changed)."""
    files = sorted(source.glob("*.py"))[:limit]
    if not files:
        raise SystemExit(f"{source} holds no .py files")
    target.mkdir(parents=True)
    for path in files:
        shutil.copyfile(path, target / path.name)
    return target


def run_validate(args, tasks: Path, out: Path, cache: Path, flags: list[str]) -> int:
    """The real command, in a process of its own, on `args.tree`'s code when given."""
    command = [sys.executable, "-m", "pipeline.cli", "validate", str(tasks), "--out", str(out), "--cache-dir", str(cache),
               "--device", args.device, "--timeout-s", str(args.timeout_s), *flags]
    if args.workers:
        command += ["--workers", str(args.workers)]
    env = dict(os.environ)
    if args.tree:  # `python -m` puts the working folder first on sys.path: PYTHONSAFEPATH keeps the tree's code first
        tree = str(Path(args.tree).resolve())
        env.update(PYTHONPATH=os.pathsep.join(p for p in (tree, str(REPO), env.get("PYTHONPATH")) if p),
                   PYTHONSAFEPATH="1")
    return subprocess.run(command, cwd=REPO, env=env).returncode


def read_records(out: Path) -> list[dict]:
    """Every decided candidate as {"candidate", "verdict"} (read as JSON: an older tree's records too)."""
    lines = (out / ".staging" / "validate.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def read_worker_starts(log: Path) -> list[float]:
    """Seconds each worker took to start ("warm-up ... in 12.3 s"), from workers.log."""
    if not log.exists():
        return []
    found = re.findall(r"sandbox worker: .*warm-up .* in ([0-9.]+) s", log.read_text(errors="replace"))
    return [float(s) for s in found]


class GpuSampler:
    """NVML's GPU utilisation (the share of time a kernel ran), sampled twice a second."""

    def __init__(self, period_s: float = 0.5):
        self.samples: list[float] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, args=(period_s,), daemon=True)
        self.thread.start()

    def _sample(self, period_s: float) -> None:
        try:
            import pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            read = lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu  # noqa: E731
        except Exception:  # no NVML binding: ask nvidia-smi
            read = lambda: float(subprocess.run(  # noqa: E731
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True, text=True, timeout=5).stdout.split()[0])
        while not self.done.wait(period_s):
            try:
                self.samples.append(float(read()))
            except Exception:
                return

    def stop(self) -> float | None:
        self.done.set()
        self.thread.join(timeout=10)
        return round(statistics.mean(self.samples) / 100, 3) if self.samples else None


def summarise(args, records: list[dict], starts: list[float], wall_s: float, busy: float | None) -> dict:
    verdicts = [r["verdict"] for r in records]
    metrics = [v.get("metrics") or {} for v in verdicts]
    accepted = sum(bool(v["passed"]) for v in verdicts)
    start_s = max(starts, default=0.0)  # workers start in parallel, each as its first job comes
    steady_s = max(wall_s - start_s, 1e-9)
    per_check = Counter()
    for m in metrics:
        for key, value in m.items():
            if key.startswith("t_") and key.endswith("_ms") and isinstance(value, (int, float)):
                per_check[key[2:-3]] += value / 1e3
    job_s = sum(_num(m, "job_wall_ms") for m in metrics) / 1e3
    checks_s = sum(per_check.values())
    wasted = wasted_work(records)
    alone_s = sum(_num(m, "gpu_alone_ms") for m in metrics) / 1e3
    longest = max(metrics, key=lambda m: _num(m, "gate_longest_ms"), default={})
    return {
        "name": args.name or (args.tree or "this checkout"), "device": args.device, "candidates": len(records),
        "workers": args.workers or "default", "accepted": accepted, "wall_s": round(wall_s, 1),
        "worker_start_s": round(start_s, 1),
        "accepted_per_hour": round(accepted / wall_s * 3600), "candidates_per_hour": round(len(records) / wall_s * 3600),
        "steady_accepted_per_hour": round(accepted / steady_s * 3600),
        "steady_candidates_per_hour": round(len(records) / steady_s * 3600),
        "worker_s_per_check": {k: round(v, 1) for k, v in per_check.most_common()},
        "worker_s_checks": round(checks_s, 1),
        "worker_s_outside_checks": round(max(job_s - checks_s, 0.0), 1) if job_s else None,
        "worker_s_traces": round(sum(_num(m, "trace_wall_ms") for m in metrics) / 1e3, 1),  # outside the jobs' clocks
        "gate_s": {"waiting": round(sum(_num(m, "gate_wait_ms") for m in metrics) / 1e3, 1),
                   "alone": round(alone_s, 1),
                   "shared": round(sum(_num(m, "gate_shared_ms") for m in metrics) / 1e3, 1),
                   "longest_hold_ms": round(_num(longest, "gate_longest_ms")),
                   "longest_hold_step": longest.get("gate_longest_step"),
                   "timers_waiting": round(sum(_num(m, "gate_timer_wait_ms") for m in metrics) / 1e3, 1),
                   "closed": round(sum(_num(m, "gate_closed_ms") for m in metrics) / 1e3, 1),
                   "closures": round(sum(_num(m, "gate_closures") for m in metrics)),
                   "shared_steps": round(sum(_num(m, "gate_steps") for m in metrics)),
                   "long_holds": long_holds(metrics)},
        "gpu_busy_share": busy, "gpu_alone_share": round(alone_s / wall_s, 3),
        "bounds_accepted_per_hour": bounds(len(records), accepted, job_s, metrics, alone_s),
        "wasted": wasted,
        "retried_alone": alone_reruns(verdicts, metrics),
        "gpu_memory": counted_memory(metrics),
        "accepted_eager_ms": percentiles([_num(m, "eager_ms") for v, m in zip(verdicts, metrics) if v["passed"]]),
        "accepted_resized_share": round(sum(bool(m.get("resized")) for v, m in zip(verdicts, metrics) if v["passed"])
                                        / max(accepted, 1), 3),
        "rejected_by_reason": dict(Counter(v["reason"] for v in verdicts if not v["passed"]).most_common()),
    }


def alone_reruns(verdicts: list[dict], metrics: list[dict]) -> dict:
    """The jobs run again alone after a GPU memory failure (every step of the rerun holds the
    GPU alone): how many were then accepted, what sent them there, the worker-seconds they
    took (both runs) and the rerun's own wait for the GPU."""
    retried = [(v, m) for v, m in zip(verdicts, metrics) if m.get("retried_alone")]
    return {"jobs": len(retried), "accepted": sum(bool(v["passed"]) for v, _ in retried),
            "first_failures": dict(Counter(_first_failure(m) for _, m in retried).most_common()),
            "worker_s": round(sum(_num(m, "job_wall_ms") + _num(m, "first_job_wall_ms") for _, m in retried) / 1e3, 1),
            "rerun_waiting_s": round(sum(_num(m, "gate_timer_wait_ms") for _, m in retried) / 1e3, 1)}


def _first_failure(metrics: dict) -> str:
    """What sent a job to run alone, with the check whose step failed where the verdict's
    stage does not say it (an error escaping a later check is the execute stage's)."""
    failure, error_in = str(metrics.get("first_failure")), metrics.get("first_error_in")
    return f"{failure} in {error_in}" if error_in and not failure.startswith(f"{error_in}/") else failure


def long_holds(metrics: list[dict]) -> dict:
    """The shared holds of a second or more (a timer that closes the gate waits them out, and
    every worker with it): how many, their seconds, and the steps that were the jobs' longest."""
    steps = Counter(str(m.get("gate_longest_step")).rsplit(".", 1)[-1] for m in metrics
                    if _num(m, "gate_longest_ms") >= 1e3)
    return {"holds": int(sum(_num(m, "gate_long_holds") for m in metrics)),
            "held_s": round(sum(_num(m, "gate_long_held_ms") for m in metrics) / 1e3, 1),
            "longest_steps": dict(steps.most_common(6))}


def counted_memory(metrics: list[dict]) -> dict:
    """What the jobs held of the GPU's counted memory (filters/sandbox/gpu_memory.py): how
    many outgrew what they started with, the seconds they waited for others' memory, and
    the GiB each held at its end."""
    counted = [m for m in metrics if "gpu_memory_held_mb" in m]
    held_gb = sorted(_num(m, "gpu_memory_held_mb") / 2**10 for m in counted)
    return {"jobs": len(counted), "grown_jobs": sum(_num(m, "gpu_memory_grown") > 0 for m in counted),
            "wait_s": round(sum(_num(m, "gpu_memory_wait_ms") for m in counted) / 1e3, 1),
            "held_gb_p50": held_gb[len(held_gb) // 2] if held_gb else None,
            "held_gb_max": held_gb[-1] if held_gb else None}


def percentiles(values: list[float]) -> dict:
    """p10 / p50 / p90 of the accepted tasks' eager ms (KernelBench L2's p50 on the H200: 3.0)."""
    if not values:
        return {}
    ranked = sorted(values)
    at = lambda q: round(ranked[min(len(ranked) - 1, int(q * len(ranked)))], 3)  # noqa: E731
    return {"p10": at(0.1), "p50": at(0.5), "p90": at(0.9)}


def bounds(candidates: int, accepted: int, job_s: float, metrics: list[dict], alone_s: float) -> dict:
    """The rates the host's two resources allow at this acceptance share: every core busy
    with the jobs' own work (their wall less their wait at the gate and for GPU memory), and the GPU doing
    nothing but the timers' exclusive holds back to back."""
    if not candidates or not accepted:
        return {}
    share = accepted / candidates
    busy_s = job_s - sum(_num(m, "gate_wait_ms") + _num(m, "gpu_memory_wait_ms") for m in metrics) / 1e3
    cores = os.cpu_count() or 1
    return {"cores": round(cores * 3600 / (busy_s / candidates) * share) if busy_s > 0 else None,
            "gpu_alone": round(3600 / (alone_s / candidates) * share) if alone_s > 0 else None}


def wasted_work(records: list[dict]) -> dict:
    """Candidates that cost worker time for nothing: exact repeats of an earlier candidate
    (the same task id, decided twice) and outputs holding NaN or Inf; and what the timing
    check (its size search, its timer's wait at the gate) cost candidates that a later
    check rejected: the share of it a reordering of the checks could save."""
    seen, repeats, repeat_s = set(), 0, 0.0
    for record in sorted(records, key=lambda r: r["candidate"]["provenance"].get("index", 0)):
        ident = record["candidate"]["id"]
        if ident in seen:
            repeats += 1
            repeat_s += _num(record["verdict"].get("metrics") or {}, "job_wall_ms") / 1e3
        seen.add(ident)
    nan = [r["verdict"] for r in records if r["verdict"]["reason"] == "nan_or_inf"]
    from filters.checks.registry import CHECK_STAGES  # this checkout's order: a --tree of the past had the same
    after_timing = set(CHECK_STAGES[CHECK_STAGES.index("timing") + 1:])
    late = [r["verdict"].get("metrics") or {} for r in records
            if not r["verdict"]["passed"] and r["verdict"]["stage"] in after_timing]
    return {"repeats": repeats, "repeats_worker_s": round(repeat_s, 1), "nan_or_inf": len(nan),
            "nan_or_inf_worker_s": round(sum(_num(v.get("metrics") or {}, "job_wall_ms") for v in nan) / 1e3, 1),
            "rejected_after_timing": len(late),
            "their_timing_worker_s": round(sum(_num(m, "t_timing_ms") for m in late) / 1e3, 1),
            "their_timer_wait_s": round(sum(_num(m, "gate_timer_wait_ms") for m in late) / 1e3, 1)}


def _num(metrics: dict, name: str) -> float:
    value = metrics.get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def print_report(s: dict) -> None:
    print(f"== throughput: {s['name']}, device {s['device']}, {s['candidates']} candidates, workers {s['workers']}")
    print(f"wall {s['wall_s']} s (workers' start {s['worker_start_s']} s); accepted {s['accepted']}")
    print(f"accepted/h {s['accepted_per_hour']} (steady {s['steady_accepted_per_hour']}); "
          f"candidates/h {s['candidates_per_hour']} (steady {s['steady_candidates_per_hour']})")
    print("worker-seconds per check: " + ", ".join(f"{k} {v}" for k, v in s["worker_s_per_check"].items())
          + f"; outside the checks {s['worker_s_outside_checks']}; the accepted tasks' traces {s['worker_s_traces']}")
    gate = s["gate_s"]
    print(f"GPU gate: waiting {gate['waiting']} s, alone {gate['alone']} s, shared {gate['shared']} s, "
          f"longest hold {gate['longest_hold_ms']} ms ({gate['longest_hold_step']}); "
          f"timers waited {gate['timers_waiting']} s; shared holds of 1 s or more {gate['long_holds']}")
    print(f"gate closed {gate['closed']} s in {gate['closures']} closures (every step that came meanwhile waited); "
          f"{gate['shared_steps']} shared steps")
    print(f"GPU busy share {s['gpu_busy_share']} (NVML), held alone {s['gpu_alone_share']} of the wall")
    b = s["bounds_accepted_per_hour"]
    print(f"bounds at this acceptance: {b.get('cores')} accepted/h with every core busy on the jobs' own work, "
          f"{b.get('gpu_alone')} with the GPU timing back to back")
    w = s["wasted"]
    print(f"wasted: {w['repeats']} repeats ({w['repeats_worker_s']} worker-s), {w['nan_or_inf']} nan_or_inf "
          f"({w['nan_or_inf_worker_s']} worker-s); retried alone after a GPU memory failure: "
          f"{s['retried_alone']['jobs']} ({s['retried_alone']['accepted']} then accepted); "
          f"rejected after the timing check: {w['rejected_after_timing']} (timing {w['their_timing_worker_s']} "
          f"worker-s, their timers waited {w['their_timer_wait_s']} s)")
    print("run alone:", json.dumps(s["retried_alone"]))
    print("GPU memory counted:", json.dumps(s["gpu_memory"]))
    print("accepted eager ms:", json.dumps(s["accepted_eager_ms"]), "re-sized share", s["accepted_resized_share"])
    print("rejected by reason:", json.dumps(s["rejected_by_reason"]))


if __name__ == "__main__":
    main()
