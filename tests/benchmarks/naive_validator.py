"""The baseline for bench_validate: one fresh Python process per candidate. Reads
{"code", "config"} as JSON on stdin, runs the same checks, prints the result as JSON."""
import json
import sys

import torch

from filters.harness import evaluate

if __name__ == "__main__":
    job = json.load(sys.stdin)
    torch.set_num_threads(job.get("threads") or torch.get_num_threads())
    print(json.dumps(evaluate(job["code"], job["config"]), default=str))
