"""The baseline for bench_validate: one fresh Python process per candidate. Reads
{"code", "config"} as JSON on stdin, runs the same checks, prints the result as JSON."""
import json
import sys

import torch

from filters.checks.harness import evaluate

if __name__ == "__main__":
    job = json.load(sys.stdin)
    torch.set_num_threads(job.get("threads") or torch.get_num_threads())
    if job.get("gpu_memory_gb") and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, job["gpu_memory_gb"] * 2**30 / total))
    print(json.dumps(evaluate(job["code"], job["config"]), default=str))
