"""An independent re-audit of a run's rows on a GPU: plain torch, none of opsynth's checks.

    python -m tests.benchmarks.gpu_reaudit RUN_DIR [--rows 200] [--processes 8] [--seed 0] [--device cuda]

A random sample of the rows of `RUN_DIR/data` is split over `processes` processes, each a
fresh Python that imports torch alone. For each row it builds the task as a user would
(`exec` of its code, `Model(*get_init_inputs())`, `.eval()`, seeded, on the GPU) and asks five
questions, each answered by torch alone:

- eager: the forward runs and its output is finite;
- compile: `torch.compile(model)` agrees with eager mode at atol = rtol = 1e-2;
- deterministic: a second call, and a second model built from the same seed, give the same
  output within 1e-5 (the run's `determinism_tol`);
- timing window: the median of 20 calls, timed with CUDA events after a warm-up while no
  other process of the audit uses the GPU (an flock), lies in [1, 100] ms;
- input dependent: other inputs give another output.

It prints each row's failures and the pass rate of each question and of all five.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import pyarrow.parquet as pq

AUDIT = r'''
import fcntl, json, math, statistics, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
rows, lock_path = json.load(open(sys.argv[1])), sys.argv[2]
device = torch.device(sys.argv[3])

def build(code, seed):
    namespace = {}
    exec(compile(code, "<row>", "exec"), namespace)
    torch.manual_seed(seed)
    with torch.device(device):
        model = namespace["Model"](*namespace["get_init_inputs"]()).eval()
        torch.manual_seed(seed + 1)
        inputs = namespace["get_inputs"]()
        torch.manual_seed(seed + 2)
        other = namespace["get_inputs"]()
    move = lambda xs: [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]
    return model.to(device), move(inputs), move(other)

def first(out):
    return out[0] if isinstance(out, (tuple, list)) else out

def timed(model, inputs):
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for _ in range(3):
            model(*inputs)
        times = []
        for _ in range(20):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(); model(*inputs); end.record(); end.synchronize()
                times.append(start.elapsed_time(end))
            else:  # a smoke test off the GPU
                began = time.perf_counter(); model(*inputs); times.append((time.perf_counter() - began) * 1e3)
        return statistics.median(times)

for row in rows:
    verdict = {"id": row["id"]}
    try:
        with torch.no_grad():
            model, inputs, other = build(row["code"], 0)
            out = first(model(*inputs)).float()
            verdict["eager"] = bool(torch.isfinite(out).all())
            again = first(model(*inputs)).float()
            twin, _, _ = build(row["code"], 0)
            apart = lambda a, b: float((a - b).abs().max()) if a.numel() else 0.0
            verdict["deterministic"] = max(apart(out, again), apart(out, first(twin(*inputs)).float())) <= 1e-5
            del twin
            verdict["input_dependent"] = not torch.allclose(out, first(model(*other)).float(), atol=1e-2, rtol=1e-2)
            ms = timed(model, inputs)
            verdict["eager_ms"] = ms
            verdict["timing_window"] = 1.0 <= ms <= 100.0
            try:
                compiled = first(torch.compile(model)(*inputs)).float()
                verdict["compile"] = bool(torch.allclose(out, compiled, atol=1e-2, rtol=1e-2))
            except Exception as error:
                verdict["compile"], verdict["compile_error"] = False, f"{type(error).__name__}: {str(error)[:200]}"
    except Exception as error:
        verdict["error"] = f"{type(error).__name__}: {str(error)[:300]}"
    model = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    print(json.dumps(verdict), flush=True)
'''
QUESTIONS = ("eager", "compile", "deterministic", "timing_window", "input_dependent")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    rows = pq.read_table(os.path.join(args.run_dir, "data")).select(["id", "code", "eager_ms"]).to_pylist()
    sample = random.Random(args.seed).sample(rows, min(args.rows, len(rows)))
    with tempfile.TemporaryDirectory() as scratch:
        script, lock = os.path.join(scratch, "audit.py"), os.path.join(scratch, "gpu.lock")
        with open(script, "w") as handle:
            handle.write(AUDIT)
        children = []
        for part in range(args.processes):
            chunk = os.path.join(scratch, f"rows-{part}.json")
            with open(chunk, "w") as handle:
                json.dump(sample[part::args.processes], handle)
            children.append(subprocess.Popen([sys.executable, script, chunk, lock, args.device], stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, text=True,
                                             env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(scratch, "ind")}))
        verdicts = [json.loads(line) for child in children for line in child.communicate()[0].splitlines()
                    if line.startswith("{")]
    measured = {row["id"]: row["eager_ms"] for row in sample}
    for verdict in verdicts:
        failed = [q for q in QUESTIONS if not verdict.get(q)]
        if failed:
            print(f"{verdict['id']}: fails {', '.join(failed)}; eager {verdict.get('eager_ms', float('nan')):.2f} ms "
                  f"(the run measured {measured[verdict['id']]:.2f}) {verdict.get('error', '')}"
                  f"{verdict.get('compile_error', '')}")
    print(f"re-audited {len(verdicts)} of {len(sample)} sampled rows ({len(rows)} in the run)")
    for question in QUESTIONS:
        print(f"  {question}: {sum(bool(v.get(question)) for v in verdicts)} of {len(verdicts)}")
    print(f"  all five: {sum(all(v.get(q) for q in QUESTIONS) for v in verdicts)} of {len(verdicts)}")


if __name__ == "__main__":
    main()
