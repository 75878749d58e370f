"""The ablation check: every parameter, submodule and op changes the output (the probes are
filters/checks/measure/ablation.py)."""
from __future__ import annotations

import functools

from filters.checks.base import Check, TaskUnderTest
from filters.checks.measure import ablation
from filters.checks.measure.execution import close, forward, fresh_copies
from filters.checks.verdicts import NothingDeadRule


class NothingDead(NothingDeadRule, Check):
    """Every parameter moves the output, every submodule is used, and no op, nor a run of up to
    six consecutive ops, nor two such runs apart, can be dropped. A model torch.fx cannot trace is ablated on the
    graph make_fx records on its real inputs; one neither can trace is refused."""

    def run(self, t: TaskUnderTest) -> None:
        tolerances, metrics = (t.cfg["atol"], t.cfg["rtol"]), t.metrics
        # Each probe's forward and comparison take the gate; the perturbations between them
        # (one elementwise kernel per parameter) and the tracing (CPU) do not.
        gated_forward, gated_close = functools.partial(t.gate.call, forward), functools.partial(t.gate.call, close)
        dead = ablation.find_dead_parameter(t.model, t.inputs, t.out, gated_forward, gated_close, *tolerances,
                                            t.cfg["seed"] + 7)
        metrics["dead_parameters"] = int(dead is not None)
        if dead:
            metrics["dead_parameter"] = dead[:200]
        self.stop_if_failed(t)
        graph = ablation.trace(t.model)
        metrics["traceable"] = graph is not None
        if graph is not None:
            unused = ablation.find_unused_module(t.model, graph)
        else:  # an aten graph knows no modules: a parameterless module left unused goes unseen
            unused, graph = None, t.gate.call(ablation.trace_on, t.model, fresh_copies(t.inputs))
        metrics.update(graph_traced=graph is not None, unused_modules=int(unused is not None))
        if unused:
            metrics["unused_module"] = unused[:200]
        self.stop_if_failed(t)
        redundant = ablation.find_redundant_op(graph, t.inputs, t.out, gated_forward, gated_close, *tolerances)
        metrics["redundant_ops"] = int(redundant is not None)
        if redundant:
            metrics["redundant_op"] = redundant[:200]
        self.stop_if_failed(t)
