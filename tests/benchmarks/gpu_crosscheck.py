"""Cross-check opsynth's eager timing against an independent measurement on a GPU.

    python -m tests.benchmarks.gpu_crosscheck RUN_DIR [--tasks 20]

For accepted samples of a run, this times the eager forward twice. The first is opsynth's
way: CUDA events around each call after warm-up, median. The second is the CUDA kernel
time that torch.profiler records over the same calls, per call. The two should agree
within 10% for tasks of 1 ms and more (events also see the gaps between kernels).
"""
from __future__ import annotations

import argparse
import statistics

import pyarrow.parquet as pq
import torch
from torch.profiler import ProfilerActivity, profile

from filters.checks.measure.execution import build_model, load_task, make_inputs, measure, warm_up_calls
from filters.checks.harness import DEFAULTS


def kernel_ms_per_call(model, inputs, calls: int = 20) -> float:
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                model(*inputs)
            torch.cuda.synchronize()
    total_us = sum(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                   for e in prof.key_averages())
    return total_us / 1e3 / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--tasks", type=int, default=20)
    args = parser.parse_args()
    device = torch.device("cuda")
    rows = pq.read_table(f"{args.run_dir}/data").to_pylist()[:args.tasks]
    ratios = []
    print(f"{'task':40s} {'stored':>9s} {'events':>9s} {'profiler':>9s} {'ratio':>6s}")
    for row in rows:
        task = load_task(row["code"])
        model = build_model(task, 0, device)
        torch.manual_seed(1)
        inputs = make_inputs(task, device)
        warm_up_calls(model, inputs, device, DEFAULTS["warmup_ms"])  # as the run does, then alone on the GPU
        events_ms, _ = measure(model, inputs, dict(DEFAULTS), device)
        profiler_ms = kernel_ms_per_call(model, inputs)
        ratios.append(events_ms / profiler_ms)
        print(f"{' > '.join(op.rsplit('.', 1)[-1] for op in row['ops'])[:40]:40s} {row['eager_ms']:9.3f} "
              f"{events_ms:9.3f} {profiler_ms:9.3f} {ratios[-1]:6.3f}")
        del model, inputs
        torch.cuda.empty_cache()
    within = sum(abs(r - 1) <= 0.10 for r in ratios)
    print(f"{within} of {len(ratios)} within 10%; median ratio {statistics.median(ratios):.3f}, "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
