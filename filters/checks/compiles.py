"""The compile check: torch.compile (Inductor) builds the model and agrees with eager mode.
Inductor's entry point is bound by `bind_compiler`, in a worker before any task loads."""
from __future__ import annotations

import time
import warnings

import torch

from filters.checks.base import Check, TaskUnderTest
from filters.checks.measure.execution import (GpuGate, Reject, forward, max_diff, ran_out_of_gpu_memory, short,
                                              tolerance_share)
from filters.checks.verdicts import CompilesRule

_compile = torch.compile
_reset_dynamo = torch._dynamo.reset
_inductor = None  # bound by bind_compiler, in a worker before any task loads


def bind_compiler() -> None:
    """Bind Inductor's entry point now (a worker does, before any task code runs; the main
    process, which only reads the registry, never pays for importing it)."""
    global _inductor
    with warnings.catch_warnings():  # importing inductor warns about torch.jit deprecations
        warnings.simplefilter("ignore")
        from torch._inductor.compile_fx import compile_fx
    _inductor = compile_fx


class Compiles(CompilesRule, Check):
    """torch.compile (Inductor) builds the model and agrees with eager mode."""

    def run(self, t: TaskUnderTest) -> None:
        _reset_dynamo()
        began = time.perf_counter()
        try:
            model = _compile(t.model, backend=gated_inductor(t.gate))
            # a compiled run may need more memory than the eager steps grew the job to: it grows too
            compiled = t.gate.growing(lambda: forward(model, t.inputs))
        except Exception as error:  # out of GPU memory still is no compile error: the worker runs it alone
            raise Reject("compile", "out_of_memory" if ran_out_of_gpu_memory(error) else "compile_error", short(error))
        finally:
            t.metrics["compile_ms"] = (time.perf_counter() - began) * 1e3
        # GPU work: a timer elsewhere must not measure beside it
        t.metrics["compile_max_diff"] = t.gate.call(max_diff, t.out, compiled)
        t.metrics["compile_tolerance_share"] = t.gate.call(tolerance_share, compiled, t.out, t.cfg["atol"],
                                                           t.cfg["rtol"])
        self.stop_if_failed(t)


def gated_inductor(gate: GpuGate):
    """Inductor, with only the compiled code's runs under the GPU gate. Compiling is seconds
    of CPU work: held under the gate, it made every timer wait for all compiles under way
    while the other workers' GPU work queued behind the timer."""
    def backend(graph, example_inputs):
        compiled = _inductor(graph, example_inputs)

        def run(*args):
            with gate.shared("compiled run"):
                return compiled(*args)
        run._boxed_call = getattr(compiled, "_boxed_call", False)  # inductor's calling convention
        return run
    return backend
