"""What every check's measuring half shares: the candidate under test (`TaskUnderTest`) and
`Check`, a check's rule (filters/checks/verdicts.py) with the `run` that measures into the
task's metrics. `run` stops early by raising Reject with what `decide` says; it raises on its
own only for the task's own errors (eager_error, out_of_memory, compile_error ...).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from filters.checks.measure.execution import GpuGate, Reject
from filters.checks.verdicts import Rule


@dataclass
class TaskUnderTest:
    """What the checks share about one candidate: its code (re-sized by the timing check),
    the built task, model, inputs and eager output, the configuration and the metrics."""

    code: str
    cfg: dict
    device: torch.device
    gate: GpuGate
    metrics: dict = field(default_factory=dict)
    task: Any = None
    model: Any = None
    inputs: list = field(default_factory=list)
    out: list = field(default_factory=list)
    other_out: list = field(default_factory=list)  # the output for a second, independent input
    search: object = None  # the re-sizing under way (timing.SizeSearch), if the execute check began it


class Check(Rule):
    """A check: its rule, and `run`, which measures a candidate into its metrics."""

    def run(self, t: TaskUnderTest) -> None:
        raise NotImplementedError

    def stop_if_failed(self, t: TaskUnderTest) -> None:
        """Raise the reject `decide` calls for on what has been measured so far (a measure not
        taken yet is no reason to stop: the run goes on to take it)."""
        verdict = self.decide(t.metrics, t.cfg)
        if verdict and verdict[0] != "unmeasured":
            raise Reject(self.stage, *verdict)

