"""Which confinement step a CUDA worker survives: each combination in a fresh process, then
`torch.zeros(1, device="cuda")`. A diagnostic for a GPU host, not a test.

    python -m tests.benchmarks.cuda_confinement_probe
"""
from __future__ import annotations

import subprocess
import sys
import tempfile

STEPS = {
    "none": "",
    "pidns": "print(worker.isolate_processes(tempfile.mkdtemp()))",
    "netns": "print(worker.isolate_network())",
    "read_only_fs": "print(worker.confine_filesystem(worker._writable_folders(tempfile.mkdtemp())))",
}
COMBINATIONS = (("none",), ("pidns",), ("netns",), ("read_only_fs",), ("pidns", "netns", "read_only_fs"))


def main() -> None:
    for combination in COMBINATIONS:
        script = "\n".join(["import tempfile", "from filters import worker", *(STEPS[s] for s in combination),
                            "import torch", "print('cuda ok', torch.zeros(1, device='cuda').item(), "
                            "torch.cuda.get_device_name())"])
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                              cwd=tempfile.gettempdir())
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        print(f"{'+'.join(combination):32s} rc={done.returncode} {' | '.join(tail)}", flush=True)


if __name__ == "__main__":
    main()
