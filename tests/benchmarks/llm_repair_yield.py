"""Yield with and without repair, and tokens per accepted sample, on the LLM stand-in.

    python -m tests.benchmarks.llm_repair_yield [--samples 6] [--candidates 40]

The stand-in answers with a fixed pattern of bad answers (missing op, no code, a wrong
interface) among good ones. The same run, to the same number of accepted samples, is made
with llm.repair_rounds 0 and 1, each from an empty cache: what does reaching N cost?
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.llm_standin import LLMStandIn

OPS = "torch.nn.Linear,torch.nn.ReLU,torch.nn.GELU,torch.nn.Tanh,torch.nn.Sigmoid,torch.nn.SiLU"
PATTERN = ["missing_op", None, "no_code", None, "bad_interface"]  # 3 bad answers in 5


def run(rounds: int, samples: int, candidates: int, folder: Path) -> dict:
    config = folder / f"r{rounds}.yaml"
    config.write_text(f"llm:\n  repair_rounds: {rounds}\n  backoff_s: 0.05\n  concurrency: 4\n")
    with LLMStandIn(PATTERN * 40) as llm:
        env = {**os.environ, "OPENAI_BASE_URL": llm.base_url}
        out = folder / f"out{rounds}"
        subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "--composer", "llm", "--llm-model", "standin",
                        "--ops", OPS, "--num-samples", str(samples), "--max-candidates", str(candidates), "--out", str(out),
                        "--cache-dir", str(folder / f"cache{rounds}"), "--config", str(config)],
                       env=env, capture_output=True, text=True, timeout=1800)
        stats = json.loads((out / "stats.json").read_text())
        return {"requests": llm.requests, **stats}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--candidates", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="opsynth-repair-") as folder:
        summaries = [run(rounds, args.samples, args.candidates, Path(folder)) for rounds in (0, 1)]
    for rounds, s in enumerate(summaries):
        llm = s["llm"]
        print(f"repair_rounds={rounds}: composed {s['composed']}, accepted {s['accepted']} "
              f"({s['accepted'] / s['composed']:.0%}), after repair {llm['accepted_after_repair']}, "
              f"requests {s['requests']}, tokens per accepted {llm['tokens_per_accepted']}, "
              f"rejects {s['rejected_by_reason']}")


if __name__ == "__main__":
    main()
