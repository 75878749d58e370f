"""The acceptance checks a candidate meets in a sandbox worker, in order (docs/architecture.md, "Acceptance").

Each check is one object: its `stage` (the funnel's name for it and its time metric), the
`reasons` it rejects with and what each means, which of them an LLM may `repair` from the
detail, the configuration it reads (`defaults`), and `run`, which measures into the task's
metrics and raises Reject past a threshold. CHECKS is the one ordered registry: the harness
runs it, the funnel and the dataset card list its stages and reasons, the repair loop reads
what is repairable, and the run configuration takes its keys. A new check is a class here
and a line in CHECKS.
"""
from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from filters.sandbox import ablation
from filters.sandbox.execution import (GpuGate, Reject, build_model, close, forward, identical, load_and_run,
                                       load_task, make_inputs, max_diff, measure, release, short, warm_up_calls)
from filters.sandbox.resize import NotResizable, scale_constant

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

# What any check may also end in: the task's own code raising, or running out of memory.
TASK_ERRORS = {"eager_error": "raises in eager mode", "out_of_memory": "ran out of memory"}
# What the sandbox decides when the checks could not finish (filters/sandbox/pool.py, stage "sandbox").
SANDBOX_REASONS = {"crashed": "killed its worker", "timeout": "ran past the wall-clock limit",
                   "out_of_memory": "ran out of memory"}


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


class Check:
    stage: str = ""
    reasons: dict[str, str] = {}
    repairable: frozenset[str] = frozenset()
    defaults: dict = {}

    def enabled(self, cfg: dict) -> bool:
        return True

    def run(self, t: TaskUnderTest) -> None:
        raise NotImplementedError


class Executes(Check):
    """The task builds, runs in eager mode and gives finite output."""

    stage = "execute"
    reasons = {**TASK_ERRORS, "nan_or_inf": "output holds NaN or Inf"}
    repairable = frozenset({"eager_error", "nan_or_inf"})

    def run(self, t: TaskUnderTest) -> None:
        t.task, t.model, t.inputs, t.out = load_and_run(t.code, t.cfg, t.device, t.gate)


class InTimingWindow(Check):
    """Median eager time inside the window and peak memory under the cap. While outside,
    `batch_size` is scaled and the task measured again. Small tasks are overhead-bound, so a
    linear estimate can overshoot: the batch sizes known to be too fast and too slow (or out
    of memory) bracket the next guess. The search uses quick measurements; only the final
    one takes the GPU exclusively."""

    stage = "timing"
    reasons = {**TASK_ERRORS, "too_fast": "under the timing window even after re-sizing",
               "too_slow": "over the timing window even after re-sizing", "too_large": "over the memory cap"}
    repairable = frozenset({"too_fast", "too_slow", "too_large"})
    defaults = {"window_ms": (1.0, 100.0), "target_ms": 3.0, "max_resize_rounds": 6, "max_task_memory_gb": 16.0,
                # Memory the resize search may give one task in this worker (None: the task cap). The
                # later checks hold a second model and more outputs, so a share's third is the limit.
                "memory_budget_gb": None,
                # Timing holds the GPU alone while every other worker waits: 5 to 10 samples, ~50 ms of them.
                "timing_budget_ms": 50.0, "warmup_ms": 20.0, "min_repeats": 5, "max_repeats": 10}

    def run(self, t: TaskUnderTest) -> None:
        cfg, metrics, gate, device = t.cfg, t.metrics, t.gate, t.device
        low, high = cfg["window_ms"]
        target = min(max(cfg["target_ms"], low), high)
        cap_bytes = min(cfg["max_task_memory_gb"], cfg["memory_budget_gb"] or math.inf) * 2**30
        original, too_fast_at, too_slow_at = t.code, 0, math.inf
        for attempt in range(cfg["max_resize_rounds"] + 1):
            with gate.shared():
                eager_ms, peak = measure(t.model, t.inputs, cfg, device, precise=False)
            too_large = peak is not None and peak > cap_bytes
            if low <= eager_ms <= high and not too_large:
                warm_up_calls(t.model, t.inputs, device, cfg["warmup_ms"], gate)  # only measuring holds the GPU alone
                with gate.exclusive():
                    eager_ms, peak = measure(t.model, t.inputs, cfg, device, precise=True)
                too_large = peak is not None and peak > cap_bytes
            metrics.update(eager_ms=eager_ms, peak_memory_mb=peak / 2**20 if peak is not None else None,
                           resize_rounds=attempt, resized=t.code != original)
            if low <= eager_ms <= high and not too_large:
                return
            if attempt == cfg["max_resize_rounds"]:
                break
            try:
                _, batch, _ = scale_constant(t.code, 1.0)
            except NotResizable:
                break
            if eager_ms < low and not too_large:
                too_fast_at = max(too_fast_at, batch)
            else:
                too_slow_at = min(too_slow_at, batch)
            factor = cap_bytes / peak * 0.8 if too_large else target / max(eager_ms, 1e-3)
            guess = bracketed(round(batch * min(max(factor, 1 / 64), 64)), batch, too_fast_at, too_slow_at)
            if guess is None:
                break
            t.task = t.model = t.inputs = t.out = None
            release(device)
            too_slow_at = self._load_resized(t, guess, batch, too_fast_at, too_slow_at)
        if metrics.get("peak_memory_mb") and metrics["peak_memory_mb"] * 2**20 > cap_bytes:
            raise Reject("timing", "too_large", f"peak memory {metrics['peak_memory_mb']:.0f} MB over the cap of "
                                                f"{cap_bytes / 2**20:.0f} MB")
        reason = "too_fast" if metrics["eager_ms"] < low else "too_slow"
        raise Reject("timing", reason, f"median eager time {metrics['eager_ms']:.3f} ms is outside [{low}, {high}] ms")

    @staticmethod
    def _load_resized(t: TaskUnderTest, guess, batch, too_fast_at, too_slow_at) -> float:
        """Load the task at `guess` into `t`; running out of memory lowers the bracket and
        tries smaller. Returns the (maybe lowered) too-slow bound."""
        while guess is not None:
            resized, _, _ = scale_constant(t.code, guess / batch)
            try:
                t.task, t.model, t.inputs, t.out = load_and_run(resized, t.cfg, t.device, t.gate)
            except Reject as reject:
                if reject.reason != "out_of_memory":
                    raise
                release(t.device)
                too_slow_at = min(too_slow_at, guess)
                guess = bracketed(round(math.sqrt(max(too_fast_at, 1) * guess)), batch, too_fast_at, too_slow_at)
                continue
            t.metrics["batch_size"] = guess
            t.code = resized
            return too_slow_at
        raise Reject("timing", "too_large", f"no batch size between {too_fast_at} and {batch} fits in memory")


def bracketed(guess: int, batch: int, too_fast_at: int, too_slow_at: float) -> int | None:
    if not too_fast_at < guess < too_slow_at:
        guess = round(math.sqrt(max(too_fast_at, 1) * min(too_slow_at, batch * 64)))
    return None if guess in (batch, too_fast_at, too_slow_at) or guess < 1 else guess


class Deterministic(Check):
    """Two runs on the same weights and inputs agree, and so does a fresh copy of the task
    (its code loaded again, its model built again from the same seed) that was shown other
    inputs first: an output that depends on what the task saw before (a call counter, the
    first input remembered) is not a function of its input, whatever the later checks see."""

    stage = "determinism"
    reasons = {**TASK_ERRORS, "nondeterministic": "two identical runs differ"}
    defaults = {"determinism_tol": 1e-5}

    def run(self, t: TaskUnderTest) -> None:
        gate, seed = t.gate, t.cfg["seed"]
        again = gate.call(forward, t.model, t.inputs)
        fresh_task = load_task(t.code)
        fresh_model = gate.call(build_model, fresh_task, seed, t.device)
        torch.manual_seed(seed + 2)
        gate.call(forward, fresh_model, gate.call(make_inputs, fresh_task, t.device))
        fresh = gate.call(forward, fresh_model, t.inputs)
        repeat_diff, history_diff = gate.call(max_diff, t.out, again), gate.call(max_diff, t.out, fresh)
        t.metrics["determinism_max_diff"] = max(repeat_diff, history_diff)
        tol = t.cfg["determinism_tol"]
        if repeat_diff > tol:
            raise Reject("determinism", "nondeterministic", f"two runs on the same weights and inputs differ by "
                                                            f"{repeat_diff:.3g} (> {tol})")
        if history_diff > tol:
            raise Reject("determinism", "nondeterministic", f"a fresh copy of the task, shown other inputs first, "
                                                            f"differs by {history_diff:.3g} (> {tol}): its output "
                                                            "depends on what it saw before")


class DependsOnInput(Check):
    """get_inputs() draws fresh inputs, and the output changes with them."""

    stage = "degenerate"
    reasons = {**TASK_ERRORS, "fixed_inputs": "get_inputs() does not draw fresh inputs",
               "constant_output": "output does not depend on the input at the verification tolerance"}
    repairable = frozenset({"fixed_inputs", "constant_output"})

    def run(self, t: TaskUnderTest) -> None:
        gate = t.gate
        other_inputs = gate.call(make_inputs, t.task, t.device)
        tensors = [(a, b) for a, b in zip(t.inputs, other_inputs) if isinstance(a, torch.Tensor)]
        if tensors and gate.call(lambda: all(identical(a, b) for a, b in tensors)):
            raise Reject("degenerate", "fixed_inputs", "get_inputs() returned the same tensors twice")
        other = gate.call(forward, t.model, other_inputs)
        t.metrics["input_sensitivity"] = gate.call(max_diff, t.out, other)
        if gate.call(close, t.out, other, t.cfg["atol"], t.cfg["rtol"]):
            raise Reject("degenerate", "constant_output",
                         "outputs for two independent random inputs agree at the verification tolerance")


class NothingDead(Check):
    """Every parameter moves the output, every submodule is used, and no op can be dropped."""

    stage = "ablation"
    reasons = {**TASK_ERRORS, "dead_parameter": "a parameter does not affect the output",
               "unused_module": "a submodule is built but never used",
               "redundant_op": "an op can be dropped without effect"}
    repairable = frozenset({"dead_parameter", "unused_module", "redundant_op"})
    defaults = {"ablation": True}

    def enabled(self, cfg: dict) -> bool:
        return cfg["ablation"]

    def run(self, t: TaskUnderTest) -> None:
        tolerances = (t.cfg["atol"], t.cfg["rtol"])
        # Each probe's forward and comparison take the gate; the perturbations between them
        # (one elementwise kernel per parameter) and the tracing (CPU) do not.
        gated_forward, gated_close = functools.partial(t.gate.call, forward), functools.partial(t.gate.call, close)
        dead = ablation.find_dead_parameter(t.model, t.inputs, t.out, gated_forward, gated_close, *tolerances,
                                            t.cfg["seed"] + 7)
        if dead:
            raise Reject("ablation", "dead_parameter",
                         f"perturbing parameter {dead!r} leaves the output unchanged at the verification tolerance")
        graph = ablation.trace(t.model)
        t.metrics["traceable"] = graph is not None
        if graph is None:
            return
        unused = ablation.find_unused_module(t.model, graph)
        if unused:
            raise Reject("ablation", "unused_module", f"submodule {unused!r} is built in __init__ but never used")
        redundant = ablation.find_redundant_op(t.model, t.inputs, t.out, gated_forward, gated_close, *tolerances)
        if redundant:
            raise Reject("ablation", "redundant_op",
                         f"dropping {redundant} leaves the output unchanged at the verification tolerance")


class Compiles(Check):
    """torch.compile (Inductor) builds the model and agrees with eager mode."""

    stage = "compile"
    reasons = {**TASK_ERRORS, "compile_error": "torch.compile fails",
               "compile_mismatch": "eager and compiled outputs disagree"}
    repairable = frozenset({"compile_error", "compile_mismatch"})
    defaults = {"compile": True}

    def enabled(self, cfg: dict) -> bool:
        return cfg["compile"]

    def run(self, t: TaskUnderTest) -> None:
        _reset_dynamo()
        began = time.perf_counter()
        try:
            compiled = forward(_compile(t.model, backend=gated_inductor(t.gate)), t.inputs)
        except Exception as error:
            raise Reject("compile", "compile_error", short(error))
        finally:
            t.metrics["compile_ms"] = (time.perf_counter() - began) * 1e3
        t.metrics["compile_max_diff"] = max_diff(t.out, compiled)
        if not close(t.out, compiled, t.cfg["atol"], t.cfg["rtol"]):
            raise Reject("compile", "compile_mismatch",
                         f"eager and compiled outputs differ by {t.metrics['compile_max_diff']:.3g} "
                         f"(atol=rtol={t.cfg['atol']})")


def gated_inductor(gate: GpuGate):
    """Inductor, with only the compiled code's runs under the GPU gate. Compiling is seconds
    of CPU work: held under the gate, it made every timer wait for all compiles under way
    while the other workers' GPU work queued behind the timer."""
    def backend(graph, example_inputs):
        compiled = _inductor(graph, example_inputs)

        def run(*args):
            with gate.shared():
                return compiled(*args)
        run._boxed_call = getattr(compiled, "_boxed_call", False)  # inductor's calling convention
        return run
    return backend


CHECKS: tuple[Check, ...] = (Executes(), InTimingWindow(), Deterministic(), DependsOnInput(), NothingDead(),
                             Compiles())
CHECK_STAGES = tuple(check.stage for check in CHECKS)


# What every run of the checks reads, beside each check's own `defaults`; together, the
# defaults of the configuration a worker receives (the run's own keys override them).
BASE_DEFAULTS = {
    "device": "cpu", "seed": 0, "atol": 1e-2, "rtol": 1e-2, "timing_lock": None,
    # The longest one step may hold the GPU gate: past it the task's process is ended at once
    # (SIGALRM), so a hang in forward frees the gate for every other worker within this.
    "gate_step_limit_s": 30.0,
}
DEFAULTS = {**BASE_DEFAULTS, **{key: value for check in CHECKS for key, value in check.defaults.items()}}


def glossary() -> dict[str, str]:
    """Every reason a check rejects with, and what it means."""
    return {reason: meaning for check in CHECKS for reason, meaning in check.reasons.items()}


def repairable() -> frozenset[str]:
    return frozenset().union(*(check.repairable for check in CHECKS))
