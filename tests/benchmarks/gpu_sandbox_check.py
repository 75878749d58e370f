"""The jailed sandbox on a GPU host: hostile tasks sent straight to CUDA workers (past the
static check, as tasks that slipped by it) must fail without touching the host, benign
tasks must compile and pass on the GPU from inside the jail (bwrap, seccomp, uid 65534,
a fresh child per job that first touches CUDA itself), and a batch of benign jobs through
the pool is timed.

    python -m tests.benchmarks.gpu_sandbox_check [--device cuda] [--workers 4] [--jobs 24]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import textwrap
import time
from pathlib import Path

from filters.checks.harness import DEFAULTS
from filters.sandbox.pool import SandboxOptions, WorkerPool

TASK = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    {header}
    batch_size = 64
    features = 256


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(features, features)

        def forward(self, x):
    {body}
            return torch.relu(self.linear(x))


    def get_inputs():
        return [torch.rand(batch_size, features)]


    def get_init_inputs():
        return []
""")


def task(body: str = "", header: str = "") -> str:
    return TASK.format(header=header, body=textwrap.indent(body or "pass", " " * 8))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=24)
    args = parser.parse_args()
    os.environ["OPENAI_API_KEY"] = "sk-gpu-check-secret-0001"
    victim = Path(tempfile.gettempdir()) / "opsynth-sandbox-victim"
    home_victim = Path.home() / "opsynth-sandbox-victim"
    for path in (victim, home_victim):
        path.unlink(missing_ok=True)
    hostile = {
        "write_tmp": task(f"open({str(victim)!r}, 'w').write('owned')"),
        "write_home": task(f"open({str(home_victim)!r}, 'w').write('owned')"),
        "network": task("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)"),
        "kill_run": task(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)"),
        "secret": task("import os\nraise ValueError(str(dict(os.environ)))"),
        "hang": task("while True:\n    pass"),
    }
    config = {**DEFAULTS, "device": args.device, "window_ms": [1e-6, 1e6]}
    cuda = args.device.startswith("cuda")
    with tempfile.TemporaryDirectory() as locks:
        options = SandboxOptions(device=args.device, timeout_s=60, max_memory_gb=24, threads=2,
                                 timing_lock_dir=locks if cuda else None, gpu_memory_gb=16 if cuda else None)
        with WorkerPool(args.workers, options, [0] if cuda else None) as pool:
            began = time.perf_counter()
            for worker in pool.workers:
                worker.start()
            start_s = time.perf_counter() - began
            names = ["benign", *hostile, "benign_after"]
            jobs = [{"code": hostile.get(name, task()), "config": config} for name in names]
            results = dict(zip(names, pool.run_many(jobs)))
            info = pool.workers[0].info
            batch = [{"code": task(f"x = x * {1 + i / 10}"), "config": config} for i in range(args.jobs)]
            began = time.perf_counter()
            timed = pool.run_many(batch)
            batch_s = time.perf_counter() - began
    summary = {
        "worker": {key: info.get(key) for key in ("jail", "warm_up")},
        "warm_ups": [w.info.get("warm_up") for w in pool.workers],
        "verdicts": {name: (r["passed"], r["reason"], r["detail"][:90]) for name, r in results.items()},
        "secret_in_any_detail": any("sk-gpu-check" in r["detail"] for r in results.values()),
        "victim_files_exist": [str(p) for p in (victim, home_victim) if p.exists()],
        "run_survived": True,
        "benign_compiled_ms": results["benign"]["metrics"].get("compile_ms"),
        "benign_op_graph": results["benign"]["metrics"].get("op_graph"),
        "gate_wait_s": {name: round((r["metrics"].get("gate_wait_ms") or 0) / 1e3, 1) for name, r in results.items()},
        "pool_start_s": round(start_s, 1),
        "batch": {"jobs": args.jobs, "workers": args.workers, "passed": sum(r["passed"] for r in timed),
                  "wall_s": round(batch_s, 1), "s_per_job": round(batch_s / args.jobs, 2),
                  "median_eager_ms": sorted(r["metrics"].get("eager_ms") or 0 for r in timed)[args.jobs // 2]},
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
