"""The sandbox on a GPU host: hostile tasks sent straight to CUDA workers (past the static
check, as tasks that slipped by it) must fail without touching the host, and a benign task
must still compile and pass with the file system read-only.

    python -m tests.benchmarks.gpu_sandbox_check [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import textwrap
from pathlib import Path

from filters.harness import DEFAULTS
from filters.sandbox import SandboxOptions, WorkerPool

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
    args = parser.parse_args()
    victim = Path(tempfile.gettempdir()) / "opsynth-sandbox-victim"
    home_victim = Path.home() / "opsynth-sandbox-victim"
    for path in (victim, home_victim):
        path.unlink(missing_ok=True)
    hostile = {
        "write_tmp": task(f"open({str(victim)!r}, 'w').write('owned')"),
        "write_home": task(f"open({str(home_victim)!r}, 'w').write('owned')"),
        "network": task("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)"),
        "kill_run": task(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)"),
    }
    config = {**DEFAULTS, "device": args.device, "window_ms": [1e-6, 1e6]}
    options = SandboxOptions(device=args.device, timeout_s=240, max_memory_gb=24, threads=2)
    with WorkerPool(2, options, [0] if args.device.startswith("cuda") else None) as pool:
        names = ["benign", *hostile, "benign_after"]
        jobs = [{"code": hostile.get(name, task()), "config": config} for name in names]
        results = dict(zip(names, pool.run_many(jobs)))
        info = pool.workers[0].info
    summary = {
        "worker": {key: info.get(key) for key in ("processes", "network", "files")},
        "verdicts": {name: (r["passed"], r["reason"], r["detail"][:90]) for name, r in results.items()},
        "victim_files_exist": [str(p) for p in (victim, home_victim) if p.exists()],
        "run_survived": True,
        "benign_compiled": results["benign"]["metrics"].get("compile_ms"),
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
