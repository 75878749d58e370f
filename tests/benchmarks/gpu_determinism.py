"""On a GPU: a task whose scatter_add_ has colliding indices (atomics: the order of the adds,
and so the float sums, change run to run on CUDA; on the CPU they do not) is refused by the
checks, and the same task without collisions is not.

    python -m tests.benchmarks.gpu_determinism [--device cuda]
"""
from __future__ import annotations

import argparse

from filters.checks.harness import evaluate

TASK = """\
import torch
import torch.nn as nn

batch_size = 4096
features = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x, index):
        y = torch.tanh(self.linear(x))
        return torch.zeros(batch_size // {fold}, features, device=x.device).scatter_add_(0, index, y)


def get_inputs():
    index = (torch.arange(batch_size) // {fold}).unsqueeze(1).expand(batch_size, features).contiguous()
    return [torch.rand(batch_size, features), index]


def get_init_inputs():
    return []
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    config = {"device": args.device, "compile": False, "window_ms": [1e-6, 1e6]}
    for name, fold in (("colliding (64 rows add into one)", 64), ("no collision (one row each)", 1)):
        result = evaluate(TASK.format(fold=fold), config)
        print(f"{name}: {'accepted' if result['passed'] else result['stage'] + ' / ' + result['reason']}: "
              f"{result['detail'][:160]}")


if __name__ == "__main__":
    main()
