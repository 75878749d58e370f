"""The determinism check: two runs agree, a fresh copy agrees, and so does a run under
torch.use_deterministic_algorithms; train mode is measured beside them, deciding nothing."""
from __future__ import annotations

import math

import torch

from filters.checks.base import Check, TaskUnderTest
from filters.checks.measure.execution import (build_model, forward, fresh_copies, load_task, make_inputs, max_diff,
                                              ran_out_of_gpu_memory, tolerance_share)
from filters.checks.verdicts import DeterministicRule


class Deterministic(DeterministicRule, Check):
    """Two runs on the same weights and inputs agree, and so does a fresh copy of the task
    (its code loaded again, its model built again from the same seed) that was shown other
    inputs first: an output that depends on what the task saw before (a call counter, the
    first input remembered) is not a function of its input, whatever the later checks see.
    A third run under torch.use_deterministic_algorithms must not meet an op that has no
    deterministic implementation (on CUDA: atomics whose order changes the sum, as
    `scatter_add_` with colliding indices), and must agree with the first at the verification
    tolerance (a task that reads the mode must not compute something else under it).

    It also measures, deciding nothing, whether a copy of the model in train mode (what a
    consumer that never calls .eval() runs, KernelBench's harness among them) computes the
    same: a batch norm's batch statistics do not. The row keeps the measure
    (`train_mode_share`, at most 1 where train mode agrees) and the card counts the rows whose
    verdict holds in eval mode alone; the grammar keeps a task's own code from reading the mode."""

    def run(self, t: TaskUnderTest) -> None:
        gate, seed = t.gate, t.cfg["seed"]
        again = gate.call(forward, t.model, t.inputs)
        t.metrics["determinism_max_diff"] = gate.call(max_diff, t.out, again)
        self.stop_if_failed(t)
        fresh_task = load_task(t.code)
        fresh_model = gate.call(build_model, fresh_task, seed, t.device)
        torch.manual_seed(seed + 2)
        gate.call(forward, fresh_model, gate.call(make_inputs, fresh_task, t.device))
        fresh = gate.call(forward, fresh_model, t.inputs)
        t.metrics["history_max_diff"] = gate.call(max_diff, t.out, fresh)
        self.stop_if_failed(t)
        strict = gate.call(forward_deterministically, t.model, t.inputs)
        t.metrics["deterministic_ops"] = strict is not None
        share = gate.call(tolerance_share, strict, t.out, t.cfg["atol"], t.cfg["rtol"]) if strict else math.inf
        t.metrics["deterministic_mode_share"] = share
        self.stop_if_failed(t)
        in_train_mode = gate.call(forward_in_train_mode, t.model, t.inputs)
        t.metrics["train_mode_share"] = gate.call(tolerance_share, in_train_mode, t.out, t.cfg["atol"],
                                                  t.cfg["rtol"]) if in_train_mode else math.inf


NONDETERMINISTIC_OP = "does not have a deterministic implementation"


def forward_in_train_mode(model, inputs) -> list | None:
    """The output of one call of the model in train mode; None when it fails there (a batch
    norm given one value per channel). Its buffers (running statistics a train-mode call
    updates) are put back, and the model is in eval mode again after."""
    kept = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    model.train()
    try:
        return forward(model, fresh_copies(inputs))
    except Exception as error:
        if ran_out_of_gpu_memory(error):
            raise
        return None
    finally:
        model.eval()
        with torch.no_grad():
            for buffer, value in kept:
                buffer.copy_(value)


def forward_deterministically(model, inputs) -> list | None:
    """The output of one call with only deterministic algorithms allowed; None when the task
    uses an op that has none. On the CPU no op raises: the path runs, and catches nothing."""
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), \
        torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return forward(model, inputs)
    except RuntimeError as error:
        if NONDETERMINISTIC_OP in str(error):
            return None
        raise
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
