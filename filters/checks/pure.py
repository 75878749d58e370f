"""The purity check: forward is a pure function of its inputs and weights (the probes are
filters/checks/measure/purity.py)."""
from __future__ import annotations

import torch

from filters.checks.base import Check, TaskUnderTest
from filters.checks.measure import purity
from filters.checks.measure.execution import flatten, forward, fresh_copies, fresh_factor, max_diff, scaled_copies
from filters.checks.verdicts import PureRule


class Pure(PureRule, Check):
    """forward is a pure function of its inputs and weights: it leaves its inputs, every RNG
    state and the module's parameters and buffers as they were; its outputs share no memory
    with an input, a weight, a tensor the module holds or its previous output (a buffer
    overwritten on every call compares equal to itself); no state it can reach (module
    attributes, the task's globals, closures, class attributes) changes from call to call;
    and a call after a number of earlier calls on other inputs, drawn at run time so no task
    can count to it, agrees with the first. A reference that is not pure rewards the call
    order, not the computation."""

    def run(self, t: TaskUnderTest) -> None:
        gate, model, metrics = t.gate, t.model, t.metrics
        weights = gate.call(lambda: [w.detach().clone() for w in purity.weights(model)])
        state, rng = purity.fingerprint(model, t.task), purity.rng_states()
        args = gate.call(fresh_copies, t.inputs)
        given = [x for x in args if isinstance(x, torch.Tensor)]
        kept = gate.call(lambda: [x.clone() for x in given])
        first = gate.call(call_raw, model, args)
        second = gate.call(call_raw, model, fresh_copies(t.inputs))
        metrics.update(inputs_unchanged=gate.call(purity.same_tensors, given, kept),
                       rng_unchanged=gate.call(purity.same_tensors, purity.rng_states(), rng),
                       weights_unchanged=gate.call(purity.same_tensors, purity.weights(model), weights),
                       output_aliased=purity.aliases(first, given + purity.tensors_held(model))
                       or purity.aliases(second, first))
        del first, second
        self.stop_if_failed(t)
        calls = purity.later_calls(t.cfg["purity_budget_ms"], metrics.get("eager_ms"), t.cfg["purity_calls"])
        for _ in range(calls):  # other inputs each time, as a memo or a remembered input would need
            gate.call(forward, model, scaled_copies(t.inputs, fresh_factor()))
        last = gate.call(forward, model, t.inputs)
        metrics.update(later_calls=calls, later_call_max_diff=gate.call(max_diff, t.out, last),
                       state_unchanged=purity.fingerprint(model, t.task) == state)
        self.stop_if_failed(t)


def call_raw(model, args: list) -> list:
    """The outputs of one call as the task returns them (no copies: their memory is measured)."""
    with torch.no_grad():
        return flatten(model(*args))
