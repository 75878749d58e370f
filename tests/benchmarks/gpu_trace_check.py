"""The trace on the checks' device, proven on a GPU (issue 28; docs/decontamination.md).

A task traced at its own sizes is traced where its checks ran, from their seed
(filters/checks/harness.py, `ChecksDevice`). On a GPU this prints:
- the attack it closes: a layer gated by a weight's draw, live on the GPU's generator and
  dead on the CPU's, through the checks on the GPU and traced on both devices;
- the trace attacks of tests/filters/test_harness.py, traced with the GPU as the checks' device;
- fairness: KernelBench tasks and a run's accepted rows traced as a CPU run traces them and as
  a GPU run does now (the same sequence, or where not, why), with the GPU traces' cost, under
  a worker's share of the GPU's memory;
- the reference read in full: the KernelBench tasks whose small reading is partial, read at
  their own sizes on the GPU.

    python -m tests.benchmarks.gpu_trace_check KERNELBENCH [--rows PARQUET] [--share-gb 16]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from filters.checks import harness
from filters.sandbox.cuda_start import ALONE_SHARE
from filters.similarity.reference import load_reference


def cross_device_gate(device: str) -> None:
    """A weight of n elements, drawn first in __init__, gates a Linear and ReLU by the mean of
    its excess over a threshold: the threshold sits just above every element the CPU's
    generator draws from seed 0, and between the elements the GPU's draws (n is the first
    length for which it can), so the layer is dead on the CPU and live, with the relu
    binding, on the GPU."""
    for n in range(2, 257):
        torch.manual_seed(0)
        on_cpu = torch.randn(n)
        torch.manual_seed(0)
        on_device = torch.randn(n, device=device).cpu()
        threshold = float(on_cpu.max()) + 1e-3
        if (on_device > threshold).any() and (on_device < threshold).any():
            break
    else:
        print(f"== no weight of up to 256 elements is drawn differently on {device} and the CPU")
        return
    code = TASK.format(n=n, gate=f"torch.relu(self.g - {threshold!r}).mean()")
    print(f"== a layer gated by a weight of {n} drawn elements: max {float(on_cpu.max()):.4f} on the CPU, "
          f"{int((on_device > threshold).sum())} of {n} above {threshold:.4f} on {device}")
    verdict = harness.evaluate(code, {"device": device})
    print(f"checks on {device}: passed={verdict['passed']} {verdict['reason'] or ''} "
          f"eager_ms={verdict['metrics'].get('eager_ms')}")
    cpu_trace = harness.trace(code)
    gpu_trace = harness.trace(code, checks=harness.ChecksDevice(device))
    print(f"traced as a CPU run: {cpu_trace!r}\ntraced on {device}, the checks' device: {gpu_trace!r}")
    print("closed" if "mm" in gpu_trace and "mm" not in cpu_trace else "NOT closed")


TASK = '''import torch
import torch.nn as nn

batch_size = 512
features = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.Parameter(torch.randn({n}))
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(self.linear(x)) * {gate} + torch.sigmoid(x)


def get_inputs():
    return [torch.rand(batch_size, features)]


def get_init_inputs():
    return []
'''


def test_attacks(device: str) -> None:
    from tests.conftest import make_task
    from tests.filters.test_harness import GENERIC_VALUES, SIZE_VALUES
    print(f"== the trace attacks of tests/filters/test_harness.py, checks on {device}")
    attacks = {**{k: ("", body) for k, body in SIZE_VALUES.items()}, **GENERIC_VALUES}
    caught = 0
    for kind, (gate, body) in attacks.items():
        task = make_task(body, init=f"{gate}\nself.linear = nn.Linear(features, features)")
        graph = harness.trace(task, checks=harness.ChecksDevice(device)) or ""
        caught += "mm" in graph and "relu" in graph
        print(f"  {kind}: {graph!r}")
    print(f"layer seen in {caught} of {len(attacks)}")


def fairness(name: str, codes: list[str], device: str) -> None:
    """Each task traced as a run on the CPU traces it and as a run on `device` does."""
    same, differ, failed, seconds = 0, [], [], []
    # as a worker traces: in its share of the GPU's memory, and again alone where that runs out
    own = harness.ChecksDevice(device, alone=harness.ChecksDevice(device, start=lambda: set_share(ALONE_SHARE)))
    for code in codes:
        on_cpu = harness.trace(code)
        began = time.perf_counter()
        on_gpu = harness.trace(code, checks=own)
        seconds.append(time.perf_counter() - began)
        if on_gpu == on_cpu:
            same += 1
        elif on_gpu is None:
            failed.append(code)
        else:
            differ.append((on_cpu, on_gpu))
    seconds.sort()
    print(f"== {name}: {len(codes)} traced as a CPU run and as a {device} run")
    print(f"same sequence: {same}; different: {len(differ)}; untraced on {device} only: {len(failed)}")
    print(f"trace s on {device}: p50 {statistics.median(seconds):.2f}, p90 {seconds[int(len(seconds) * 0.9)]:.2f}, "
          f"max {seconds[-1]:.2f}")
    for on_cpu, on_gpu in differ[:8]:
        print(f"  cpu {str(on_cpu)[:90]!r}\n  gpu {str(on_gpu)[:90]!r}")
    for code in failed[:3]:
        print("  untraced:", code.splitlines()[-12:-9])


def reference_in_full(codes: list[str], device: str) -> None:
    """Each reference task read as a GPU run reads it (filters/similarity/reference.py,
    `in_full`): at the small problem, and where that reading is partial, again at its own
    sizes on `device` (this CPU-only machine's figures are docs/decontamination.md's)."""
    own = harness.ChecksDevice(device, alone=harness.ChecksDevice(device, start=lambda: set_share(ALONE_SHARE)))
    partial, stands, seconds, differ = 0, 0, [], []
    for code in codes:
        small = harness.read(code, untrusted=False)
        if not small.partial:
            continue
        partial += 1
        began = time.perf_counter()
        full = harness.read(code, untrusted=False, checks=own, in_full=True).graph
        seconds.append(time.perf_counter() - began)
        stands += full is not None
        if full is not None and full != small.graph:
            differ.append((small.graph, full))
    seconds.sort()
    print(f"== the reference read in full: {partial} of {len(codes)} partial at the small problem; "
          f"{stands} read at their own sizes on {device}, {len(differ)} otherwise than at the small problem")
    if seconds:
        print(f"own-size reading s on {device}: p50 {statistics.median(seconds):.2f}, max {seconds[-1]:.2f}")
    for small, full in differ[:12]:
        print(f"  small {str(small)[:80]!r}\n  full  {str(full)[:80]!r}")


def set_share(fraction: float) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(min(1.0, fraction))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernelbench", type=Path)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rows", type=Path, help="a run's accepted rows (a Parquet file) to trace too")
    parser.add_argument("--sample", type=int, default=120, help="rows traced, of --rows")
    parser.add_argument("--share-gb", type=float, default=16.0, help="a worker's share of the GPU's memory")
    parser.add_argument("--limit", type=int, help="of the reference's tasks, the first LIMIT")
    parser.add_argument("--attack-only", action="store_true", help="the cross-device attack alone")
    parser.add_argument("--in-full-only", action="store_true", help="the reference read in full alone")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.device.startswith("cuda"):
        set_share(args.share_gb * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    reference = load_reference(str(args.kernelbench), tuple(args.levels))
    if args.in_full_only:
        reference_in_full(list(reference.codes)[:args.limit], args.device)
        return
    cross_device_gate(args.device)
    if args.attack_only:
        return
    test_attacks(args.device)
    fairness(f"KernelBench levels {args.levels}", list(reference.codes)[:args.limit], args.device)
    reference_in_full(list(reference.codes)[:args.limit], args.device)
    if args.rows:
        import pandas as pd
        rows = pd.read_parquet(args.rows, columns=["code"]).sample(frac=1.0, random_state=0)
        fairness(f"{args.sample} accepted rows of {args.rows.name}", list(rows["code"][:args.sample]), args.device)


if __name__ == "__main__":
    main()
