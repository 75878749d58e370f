"""The acceptance checks a candidate meets in a sandbox worker, in order (docs/architecture.md, "Acceptance").

Each check is one object: its `stage` (the funnel's name for it and its time metric), the
`reasons` it rejects with and what each means, which of them an LLM may `repair` from the
detail, the configuration it reads (`defaults`), what it `measures` (the metrics its `run`
always records when it completes, with their types), `run`, which measures into the task's
metrics, and `decide`, which holds every threshold of the check and turns the metrics into a
verdict. `run` stops early by raising Reject with what `decide` says; it raises on its own
only for the task's own errors (eager_error, out_of_memory, compile_error ...).

`decide` is pure: it reads only the metrics and the configuration, uses math only and never
raises, whatever JSON it is given (a missing or non-numeric measure is a failure,
`unmeasured`). So a process that never runs task code can take a child's measurements and
decide itself (the module-level `measures` and `decide`).

CHECKS is the one ordered registry: the harness runs it, the funnel and the dataset card
list its stages and reasons, the repair loop reads what is repairable, and the run
configuration takes its keys. A new check is a class here and a line in CHECKS.
"""
from __future__ import annotations

import functools
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from filters.sandbox import ablation, gpu_memory, numerics, purity
from filters.sandbox.execution import (GpuGate, Reject, all_finite, build_model, close, flatten, forward,
                                       fresh_copies, fresh_factor, identical, load_and_run, load_task, make_inputs,
                                       max_diff, measure, ran_out_of_gpu_memory, release, scaled_copies, short,
                                       tolerance_share, warm_up_calls)
from filters.sandbox.resize import (RESIZE_CONSTANT, SIZE_METRIC, at_level, kind_of, nearest_level, size_constants,
                                    sizes_metrics, with_constants, work_ratio)
from operators.sizes import BATCH

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
# What any decide may end in: a measure its check must record is absent or not a number.
UNMEASURED = {"unmeasured": "a measurement the check must record is missing or not a number"}
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
    other_out: list = field(default_factory=list)  # the output for a second, independent input
    search: SizeSearch | None = None  # the re-sizing under way, if the execute check began it



class Check:
    stage: str = ""
    reasons: dict[str, str] = {}
    repairable: frozenset[str] = frozenset()
    defaults: dict = {}
    measures: dict[str, type] = {}

    def enabled(self, cfg: dict) -> bool:
        return True

    def run(self, t: TaskUnderTest) -> None:
        raise NotImplementedError

    # Measures that may be None: what decide reads as "not measurable here" (no device memory
    # on the CPU, no float64 kernel).
    nullable: frozenset[str] = frozenset()

    def decide(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        """The reject (reason, detail) the metrics call for, or None: the check's thresholds
        first, then every declared measure must be there with its type. Pure; never raises."""
        return self.judge(metrics, cfg) or self.missing(metrics)

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        raise NotImplementedError

    def missing(self, metrics) -> tuple[str, str] | None:
        for name, kind in self.measures.items():
            value = metrics.get(name, ...) if isinstance(metrics, dict) else ...
            if value is None and name in self.nullable:
                continue
            well_typed = (isinstance(value, bool) if kind is bool else
                          isinstance(value, int) and not isinstance(value, bool) if kind is int else
                          number(metrics, name) is not None)
            if not well_typed:
                return unmeasured(name)
        return None

    def stop_if_failed(self, t: TaskUnderTest) -> None:
        """Raise the reject `decide` calls for on what has been measured so far (a measure not
        taken yet is no reason to stop: the run goes on to take it)."""
        verdict = self.decide(t.metrics, t.cfg)
        if verdict and verdict[0] != "unmeasured":
            raise Reject(self.stage, *verdict)


# -- reading measurements, for decide: missing, non-numeric or NaN is None ------------------

def number(metrics, name: str) -> float | None:
    value = metrics.get(name) if isinstance(metrics, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def flag(metrics, name: str) -> bool | None:
    value = metrics.get(name) if isinstance(metrics, dict) else None
    return value if isinstance(value, bool) else None


def text(metrics, name: str, otherwise: str) -> str:
    value = metrics.get(name) if isinstance(metrics, dict) else None
    return value[:200] if isinstance(value, str) else otherwise


def unmeasured(name: str) -> tuple[str, str]:
    return "unmeasured", f"the measurement {name!r} is missing or not a number"


class Executes(Check):
    """The task builds, runs in eager mode and gives finite output."""

    stage = "execute"
    reasons = {**TASK_ERRORS, **UNMEASURED, "nan_or_inf": "output holds NaN or Inf"}
    repairable = frozenset({"eager_error", "nan_or_inf"})
    measures = {"output_finite": bool}

    def run(self, t: TaskUnderTest) -> None:
        try:
            run_eagerly(t, t.code)
            return
        except Reject as reject:
            if reject.reason != "out_of_memory" or not gpu_memory.at_the_most():
                raise
            failed = without_frames(reject)
        # The size as written outgrew the most one job may hold, four times the memory the
        # timing check lets a task's forward take: that check would shrink it anyway. It
        # shrinks here, by the same search, rather than run again with the GPU to itself
        # (on the H200, 45 of 512 candidates did, every one to end smaller: a quarter of
        # the workers' time). Where no smaller size runs, the job still runs again alone.
        release(t.device)
        search = SizeSearch(t.code)
        try:
            load_resized(t, search, search.out_of_memory(0))
        except Reject:
            raise failed from None
        t.search = search
        t.metrics["resized"] = True  # the code the later checks run is not the code as written

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        finite = flag(metrics, "output_finite")
        if finite is None:
            return unmeasured("output_finite")
        return None if finite else ("nan_or_inf", "the eager output holds NaN or Inf")


def without_frames(reject: Reject) -> Reject:
    """`reject`, kept past its handler without the frames it was raised through, nor the
    task's error it was raised from: their locals hold the model and inputs that ran out
    of memory (on the H200 every smaller size of 44 tasks ran out beside them)."""
    reject.__context__ = reject.__cause__ = None
    return reject.with_traceback(None)


def run_eagerly(t: TaskUnderTest, code: str) -> None:
    """Load `code`, build its model, draw its inputs and run it once, into `t`."""
    t.task, t.model, t.inputs, t.out = load_and_run(code, t.cfg, t.device, t.gate)
    t.metrics["output_finite"] = t.gate.call(all_finite, t.out)
    EXECUTES.stop_if_failed(t)


class InTimingWindow(Check):
    """Median eager time inside the window and peak memory under the cap. While outside (or,
    with `target_ratio` set, away from `target_ms` by more than that either way), the whole
    problem is re-sized toward `target_ms` along ladders of real layer sizes
    (filters/sandbox/resize.py: batch, widths, extents) and measured again. Small tasks are overhead-bound, so an
    estimate can overshoot: the levels known to be too fast and too slow (or out of memory)
    bracket the next guess. A task whose model cannot be built at other widths is re-sized
    by its batch alone. Quick measurements (the GPU shared) aim the search; a precise one
    (the GPU alone, while every other worker waits) is taken once the aim is reached, and
    decides. A precise measure for every step inside the window made the gate the bottleneck
    on the H200 (6.5x the exclusive time, 1,908 -> 944 accepted/h on the same 512 candidates).
    A quick one can read slower than a precise one, so a precise measure outside the window
    aims the next step."""

    stage = "timing"
    reasons = {**TASK_ERRORS, **UNMEASURED, "too_fast": "under the timing window even after re-sizing",
               "too_slow": "over the timing window even after re-sizing", "too_large": "over the memory cap"}
    repairable = frozenset({"too_fast", "too_slow", "too_large"})
    defaults = {"window_ms": (1.0, 100.0), "target_ms": 3.0, "max_resize_rounds": 8,
                # Re-size a task already in the window until within this ratio of target_ms (None:
                # the first size in the window stands). On the H200, 1.5 left the median at 2.18 ms
                # (2.2 without) and cost resize rounds: quick measures beside other workers read slow.
                "target_ratio": None,
                "max_task_memory_gb": 16.0,
                # Memory the resize search may give one task in this worker (None: the task cap). The
                # later checks hold a second model and more outputs: pipeline/devices.py gives half a share.
                "memory_budget_gb": None,
                # Timing holds the GPU alone while every other worker waits: 5 to 10 samples, ~50 ms of them.
                "timing_budget_ms": 50.0, "warmup_ms": 20.0, "min_repeats": 5, "max_repeats": 10}
    measures = {"eager_ms": float, "peak_memory_mb": float, "resize_rounds": int, "resized": bool}
    nullable = frozenset({"peak_memory_mb"})

    def __init__(self, precise: bool = True):
        # False: the search ends at a size the quick measures put in the window, and TimedAlone
        # takes the precise measure once the other checks passed there
        self.precise = precise

    def run(self, t: TaskUnderTest) -> None:
        cfg, device = t.cfg, t.device
        low, high = cfg["window_ms"]
        target = min(max(cfg["target_ms"], low), high)
        cap_bytes = memory_cap_mb(cfg) * 2**20
        # carried on where the execute check shrank the task, or where the search left off
        search = t.search or SizeSearch(t.code)
        rounds, attempt = search.rounds or cfg["max_resize_rounds"], search.attempt
        ratio = cfg["target_ratio"]
        chosen, search.chosen = search.chosen, None  # where the search left off for its precise measure
        while True:
            last = attempt == rounds
            t.metrics["resize_rounds"] = attempt
            if chosen == DECIDES:
                self._measure(t, search, precise=True)
                break
            if chosen == AIMS:
                chosen, inside, level = None, True, None
            else:
                measured = self._quick_measure(t, search)
                if measured is None:  # it outgrew the most one job may hold: a bound, as in load_resized
                    if last:
                        raise Reject("timing", "too_large", "the size of its last resize round outgrew the most one "
                                     "job may hold")
                    self._unload(t)
                    load_resized(t, search, search.out_of_memory(search.level))  # too_large where none is smaller
                    attempt += 1
                    continue
                factor = self._factor(*measured, target, cap_bytes)
                inside = self.decide(t.metrics, cfg) is None
                aimed = inside and (ratio is None or 1 / ratio <= factor <= ratio)
                level = None if aimed or last else search.next_level(factor, False)
            if level is None and inside:
                if not self.precise:  # the precise measure waits for the other checks (TimedAlone)
                    return self._chosen(t, search, AIMS, attempt, rounds)
                # Aimed, or in the window with nowhere better to go: one precise measure decides,
                # and aims too (a quick measure beside other workers reads slow: on the H200 the
                # quick aim left the accepted median at 2.2 ms for a target of 3).
                eager_ms, peak = self._measure(t, search, precise=True)
                inside = self.decide(t.metrics, cfg) is None
                factor = self._factor(eager_ms, peak, target, cap_bytes)
                short = ratio is not None and factor > ratio
                if inside and (not short or last):
                    return
                level = None if last else search.next_level(factor, False, precise=True)
                if inside and level is None:
                    return
            inside_at = (search.batch_only, search.level) if inside else None  # before a fallback moves them
            if level is None and not search.batch_only:
                # The whole problem found no size in the window (on the H200 a memory-bound chain
                # ran out of memory or rungs first: 106 too_fast of 512 against 27 by the batch
                # alone): search again by the batch alone, with rounds of its own.
                level, rounds = search.by_batch_alone(), attempt + cfg["max_resize_rounds"]
            if level is None:
                break
            self._unload(t)
            try:
                load_resized(t, search, level)
            except Reject:
                if inside_at is None:
                    raise
                # In the window, aiming closer: a size the task cannot take (a buffer of fixed
                # shape) leaves it where it was, and a precise measure decides there.
                search.batch_only, search.level = inside_at
                load_resized(t, search, search.level)
                if not self.precise:
                    return self._chosen(t, search, DECIDES, attempt, rounds)
                self._measure(t, search, precise=True)
                break
            attempt += 1
        self.stop_if_failed(t)

    @staticmethod
    def _chosen(t: TaskUnderTest, search: SizeSearch, how: str, attempt: int, rounds: int) -> None:
        """Leave the search where the quick measures chose a size, for TimedAlone to go on from:
        its precise measure AIMS as well (it may send the search on), or DECIDES alone (the
        size aimed at next could not be loaded: aiming again would try it again)."""
        t.search, search.chosen, search.attempt, search.rounds = search, how, attempt, rounds

    def _quick_measure(self, t: TaskUnderTest, search: SizeSearch) -> tuple[float, float | None] | None:
        """A warm-up (a cold model reads slow) and a quick measure; None where they outgrew the
        most one job may hold. Its calls keep more alive than one forward (on the H200, 4 of
        512 jobs ran out there, at a size the search tried, and ran again alone for it)."""
        try:
            warm_up_calls(t.model, t.inputs, t.device, t.cfg["warmup_ms"], t.gate)
            return self._measure(t, search, precise=False)
        except Exception as error:
            if not (ran_out_of_gpu_memory(error) and gpu_memory.at_the_most()):
                raise
        return None

    @staticmethod
    def _measure(t: TaskUnderTest, search: SizeSearch, precise: bool) -> tuple[float, float | None]:
        """A quick measure (the GPU shared) or a precise one (the GPU alone, after a warm-up), into the metrics."""
        if precise:
            warm_up_calls(t.model, t.inputs, t.device, t.cfg["warmup_ms"], t.gate)  # only measuring holds the GPU alone
        if precise:
            with t.gate.exclusive("precise timing"):
                eager_ms, peak = measure(t.model, t.inputs, t.cfg, t.device, precise=True)
        else:
            eager_ms, peak = measure(t.model, t.inputs, t.cfg, t.device, False, t.gate)
        t.metrics.update(eager_ms=eager_ms, peak_memory_mb=peak / 2**20 if peak is not None else None,
                         resized=t.code != search.original)
        return eager_ms, peak

    @staticmethod
    def _unload(t: TaskUnderTest) -> None:
        t.task = t.model = t.inputs = t.out = None
        t.other_out = []
        release(t.device)

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        eager_ms, peak_mb = number(metrics, "eager_ms"), metrics.get("peak_memory_mb") if isinstance(metrics, dict) else 0
        low, high = cfg["window_ms"]
        if eager_ms is None:
            return unmeasured("eager_ms")
        if peak_mb is not None:  # None: no device memory to count (the CPU)
            peak_mb, cap_mb = number(metrics, "peak_memory_mb"), memory_cap_mb(cfg)
            if peak_mb is None:
                return unmeasured("peak_memory_mb")
            if peak_mb > cap_mb:
                return "too_large", f"peak memory {peak_mb:.0f} MB over the cap of {cap_mb:.0f} MB"
        if not low <= eager_ms <= high:
            return ("too_fast" if eager_ms < low else "too_slow",
                    f"median eager time {eager_ms:.3f} ms is outside [{low}, {high}] ms")
        return None

    @staticmethod
    def _factor(eager_ms: float, peak: float | None, target: float, cap_bytes: float) -> float:
        """How much more work would bring the task to the target (under the memory cap)."""
        if peak is not None and peak > cap_bytes:
            return cap_bytes / peak * 0.8
        return target / max(eager_ms, 1e-3)


AIMS, DECIDES = "aims", "decides"  # what the timing check's precise measure does where the search left off


class SizeSearch:
    """Where the timing check's re-sizing stands: the task's size constants as written, the
    level loaded now, and the levels known too fast (under the target) and too slow (over it,
    or out of memory), which bracket every later guess (filters/sandbox/resize.py)."""

    def __init__(self, code: str):
        self.original = code
        self.constants = size_constants(code)
        self.batch_only = False
        self.level, self.too_fast_at, self.too_slow_at = 0, -math.inf, math.inf
        self.first_factor: float | None = None
        self.first_sizes = self.constants  # where the first measure was taken (the execute check may have shrunk it)
        self.ran_out_at = math.inf  # the smallest level that ran out of memory
        # where the timing check's search left off for its precise measure (TimedAlone): the
        # quick measures chose this level, after `attempt` rounds of `rounds`
        self.chosen: str | None = None
        self.attempt, self.rounds = 0, 0

    def next_level(self, factor: float, aimed: bool, precise: bool = False) -> int | None:
        """The level to try after measuring this one `factor` away from the target; None when
        this one is aimed or nothing is left between the bounds. A precise measure overrules
        a bound that quick ones set on the other side of this level (a quick measure, taken
        while other workers share the device, can read many times slower)."""
        if self.first_factor is None:
            self.first_factor, self.first_sizes = factor, self.sizes(self.level)
        if aimed:
            return None
        if precise and factor > 1 and self.too_slow_at <= self.level:
            self.too_slow_at = math.inf
        if precise and factor < 1 and self.too_fast_at >= self.level:
            self.too_fast_at = -math.inf
        if factor > 1:
            self.too_fast_at = max(self.too_fast_at, self.level)
        else:
            self.too_slow_at = min(self.too_slow_at, self.level)
        return nearest_from(self.constants, self.level, factor, self.too_fast_at, self.too_slow_at, self.batch_only)

    def out_of_memory(self, level: int) -> int | None:
        self.too_slow_at, self.ran_out_at = min(self.too_slow_at, level), min(self.ran_out_at, level)
        return nearest_from(self.constants, self.level, 0.25, self.too_fast_at, self.too_slow_at, self.batch_only)

    def by_batch_alone(self) -> int | None:
        """Start again from the task as written, re-sizing only its batch, aimed where the
        first measure said, carried to the size as written (the execute check may have taken
        it at a smaller size), and only below the size as written once that ran out of memory."""
        factor = self.first_factor * work_ratio(self.constants, self.first_sizes) if self.first_factor else 1.0
        self.batch_only, self.level = True, 0
        grows = factor > 1 and self.ran_out_at > 0
        self.too_fast_at, self.too_slow_at = (0, math.inf) if grows else (-math.inf, 0)
        return nearest_from(self.constants, 0, factor, self.too_fast_at, self.too_slow_at, True)

    def sizes(self, level: int) -> dict[str, int]:
        return at_level(self.constants, level, self.batch_only) or self.constants

    def code_at(self, level: int) -> str:
        return with_constants(self.original, self.sizes(level)) if level else self.original

    def changes_widths(self, level: int) -> bool:
        sizes = self.sizes(level)
        return any(sizes[name] != value for name, value in self.constants.items() if kind_of(name) != BATCH)

    def metrics(self, level: int) -> dict:
        """`size.<name>` of every constant the level changed, and the batch size it has."""
        sizes = self.sizes(level)
        batch = {"batch_size": sizes[RESIZE_CONSTANT]} if RESIZE_CONSTANT in sizes else {}
        scope = "batch" if self.batch_only else "whole"
        return {**sizes_metrics(self.constants, sizes), **batch, "resize_scope": scope}


def load_resized(t: TaskUnderTest, search: SizeSearch, level: int) -> None:
    """Load the task at `level` into `t`. Running out of memory makes it a too-slow bound
    and tries smaller; a model that cannot be built at other widths or extents (or gives
    NaN there) is searched again by its batch alone."""
    while level is not None:
        code = search.code_at(level)
        try:
            run_eagerly(t, code)
        except Reject as reject:
            release(t.device)
            if reject.reason == "out_of_memory":
                level = search.out_of_memory(level)
                continue
            if search.batch_only or not search.changes_widths(level) or (level := search.by_batch_alone()) is None:
                raise
            continue
        search.level = level
        t.code = code
        for name in [key for key in t.metrics if key.startswith(SIZE_METRIC)]:
            del t.metrics[name]
        t.metrics.update(search.metrics(level))
        return
    raise Reject("timing", "too_large", "no smaller size of the task fits in memory")


def nearest_from(constants: dict[str, int], level: int, factor: float, too_fast_at: float, too_slow_at: float,
                 batch_only: bool) -> int | None:
    """The level between the bounds whose work is nearest `factor` times that of `level`."""
    here = at_level(constants, level, batch_only) or constants
    scale = work_ratio(constants, here)
    guess = nearest_level(constants, factor * scale, too_fast_at, too_slow_at, batch_only)
    return None if guess == level else guess


def memory_cap_mb(cfg: dict) -> float:
    return min(cfg["max_task_memory_gb"], cfg["memory_budget_gb"] or math.inf) * 2**10


class Deterministic(Check):
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

    stage = "determinism"
    reasons = {**TASK_ERRORS, **UNMEASURED, "nondeterministic": "two identical runs differ",
               "nondeterministic_op": "uses an op with no deterministic implementation on this device"}
    defaults = {"determinism_tol": 1e-5}
    measures = {"determinism_max_diff": float, "history_max_diff": float, "deterministic_ops": bool,
                "deterministic_mode_share": float}  # train_mode_share is a note, not a measure decided on

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

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        tol = cfg["determinism_tol"]
        repeat, history = number(metrics, "determinism_max_diff"), number(metrics, "history_max_diff")
        if repeat is None:
            return unmeasured("determinism_max_diff")
        if repeat > tol:
            return "nondeterministic", f"two runs on the same weights and inputs differ by {repeat:.3g} (> {tol})"
        if history is None:
            return unmeasured("history_max_diff")
        if history > tol:
            return "nondeterministic", (f"a fresh copy of the task, shown other inputs first, differs by "
                                        f"{history:.3g} (> {tol}): its output depends on what it saw before")
        strict, share = flag(metrics, "deterministic_ops"), number(metrics, "deterministic_mode_share")
        if strict is None:
            return unmeasured("deterministic_ops")
        if not strict:
            return "nondeterministic_op", ("under torch.use_deterministic_algorithms(True) an op of the task has no "
                                           "deterministic implementation: its result changes from run to run")
        if share is None:
            return unmeasured("deterministic_mode_share")
        if share > 1.0:
            return "nondeterministic", (f"under torch.use_deterministic_algorithms(True) the output differs from "
                                        f"the first run by {share:.3g} times the verification tolerance")
        return None


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


class Pure(Check):
    """forward is a pure function of its inputs and weights: it leaves its inputs, every RNG
    state and the module's parameters and buffers as they were; its outputs share no memory
    with an input, a weight, a tensor the module holds or its previous output (a buffer
    overwritten on every call compares equal to itself); no state it can reach (module
    attributes, the task's globals, closures, class attributes) changes from call to call;
    and a call after a number of earlier calls on other inputs, drawn at run time so no task
    can count to it, agrees with the first. A reference that is not pure rewards the call
    order, not the computation."""

    stage = "purity"
    reasons = {**TASK_ERRORS, **UNMEASURED, "mutates_input": "forward changes its inputs in place",
               "mutates_weights": "forward changes the module's parameters or buffers",
               "consumes_rng": "forward draws from or reseeds a random number generator",
               "aliased_output": "an output shares memory with an input, a weight, held state or the last output",
               "hidden_state": "state forward can reach changes from call to call",
               "call_dependent": "the output after some earlier calls differs from the first"}
    repairable = frozenset(reasons) - set(TASK_ERRORS) - set(UNMEASURED)
    # The history probe's calls: at most `purity_calls`, within `purity_budget_ms` of eager time.
    defaults = {"purity_calls": 16, "purity_budget_ms": 40.0}
    measures = {"inputs_unchanged": bool, "weights_unchanged": bool, "rng_unchanged": bool,
                "output_aliased": bool, "state_unchanged": bool, "later_calls": int, "later_call_max_diff": float}

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

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        for name, reason, detail in PURITY_FLAGS:
            value = flag(metrics, name)
            if value is None:
                return unmeasured(name)
            if value is (name == "output_aliased"):
                return reason, detail
        calls, diff = number(metrics, "later_calls"), number(metrics, "later_call_max_diff")
        if calls is None or diff is None:
            return unmeasured("later_call_max_diff")
        if diff > cfg["determinism_tol"]:
            return "call_dependent", (f"after {calls:.0f} calls on other inputs the output for the first input "
                                      f"differs by {diff:.3g} (> {cfg['determinism_tol']})")
        return None


# What the first calls of the purity probe measure, in the order they are decided: the flag, the
# reject when it is False (True for output_aliased), and its detail.
PURITY_FLAGS = (
    ("inputs_unchanged", "mutates_input", "forward changed an input tensor in place"),
    ("weights_unchanged", "mutates_weights", "forward changed a parameter or buffer of the module"),
    ("rng_unchanged", "consumes_rng", "forward moved the state of a random number generator"),
    ("output_aliased", "aliased_output", "an output shares memory with an input, a parameter or buffer, a tensor "
                                         "the module holds, or the previous call's output"),
    ("state_unchanged", "hidden_state", "forward changed state it keeps between calls (an attribute, a global, "
                                        "a closure or a class attribute)"),
)


def call_raw(model, args: list) -> list:
    """The outputs of one call as the task returns them (no copies: their memory is measured)."""
    with torch.no_grad():
        return flatten(model(*args))


class DependsOnInput(Check):
    """get_inputs() draws fresh inputs, and the output changes with them."""

    stage = "degenerate"
    reasons = {**TASK_ERRORS, **UNMEASURED, "fixed_inputs": "get_inputs() does not draw fresh inputs",
               "constant_output": "output does not depend on the input at the verification tolerance"}
    repairable = frozenset({"fixed_inputs", "constant_output"})
    measures = {"inputs_fresh": bool, "input_sensitivity": float, "input_tolerance_share": float}

    def run(self, t: TaskUnderTest) -> None:
        gate = t.gate
        other_inputs = gate.call(make_inputs, t.task, t.device)
        tensors = [(a, b) for a, b in zip(t.inputs, other_inputs) if isinstance(a, torch.Tensor)]
        t.metrics["inputs_fresh"] = not (tensors and gate.call(lambda: all(identical(a, b) for a, b in tensors)))
        self.stop_if_failed(t)
        t.other_out = gate.call(forward, t.model, other_inputs)
        t.metrics["input_sensitivity"] = gate.call(max_diff, t.out, t.other_out)
        t.metrics["input_tolerance_share"] = gate.call(tolerance_share, t.out, t.other_out, t.cfg["atol"],
                                                       t.cfg["rtol"])
        self.stop_if_failed(t)

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        fresh, share = flag(metrics, "inputs_fresh"), number(metrics, "input_tolerance_share")
        if fresh is None:
            return unmeasured("inputs_fresh")
        if not fresh:
            return "fixed_inputs", "get_inputs() returned the same tensors twice"
        if share is None:
            return unmeasured("input_tolerance_share")
        if share <= 1.0:
            return "constant_output", "outputs for two independent random inputs agree at the verification tolerance"
        return None


class MovesPerElement(Check):
    """Most of the output moves with the input, element by element, and no one value takes
    most of it. The whole-tensor comparison of DependsOnInput calls an output "input-dependent"
    when one element of half a million moves, or when a clamp floor above the data holds
    99.8% of it: an agent matches those without computing them.

    Three shares, each the worst over the outputs, from the outputs for two independent
    inputs. `identical_share`, the elements exactly equal in both, at most
    `max_identical_share` = 0.5: an element no input moves is a constant, a copy of a weight
    or a saturated value, and a kernel writes it without computing anything (a red team's
    task, three quarters a copied weight table and a quarter computed, was accepted when only
    the tolerance was asked). `changed_share`, the elements that differ beyond the
    verification tolerance, at least `min_changed_share` = 0.25: an output that moves by less
    than the tolerance is one a constant kernel matches. It cannot be asked of half: averages
    and reductions of independent random inputs concentrate, and a conv then an average pool
    moves 40% at the tolerance while every element depends on the input. `dominant_share`,
    the elements (of both outputs together, sampled) equal to the most common value, at most
    `max_dominant_share` = 0.75. Measured on legitimate tasks (this CPU): a ReLU after a
    layer moves 60% (uniform inputs) to 74% (normal inputs) and a quarter of it is zero in
    both; a causal (triangular) mask holds half zeros. The broken ones move 0.2% or one
    element in 524,288. Comparisons of computed values are refused by the numerics check.
    A scalar output (a loss) is two values over two inputs: 0.5."""

    stage = "sensitivity"
    reasons = {**TASK_ERRORS, **UNMEASURED,
               "insensitive_output": "most output elements do not move with the input",
               "saturated_output": "one value takes most of the output's elements"}
    repairable = frozenset({"insensitive_output", "saturated_output"})
    defaults = {"max_identical_share": 0.5, "min_changed_share": 0.25, "max_dominant_share": 0.75}
    measures = {"identical_share": float, "changed_share": float, "dominant_share": float}
    SAMPLE = 1 << 16  # elements sampled per output for the most common value

    def run(self, t: TaskUnderTest) -> None:
        atol, rtol = t.cfg["atol"], t.cfg["rtol"]
        pairs = list(zip(t.out, t.other_out))
        t.metrics["identical_share"] = max((t.gate.call(identical_share, a, b) for a, b in pairs), default=0.0)
        t.metrics["changed_share"] = min((t.gate.call(changed_share, a, b, atol, rtol) for a, b in pairs), default=1.0)
        t.metrics["dominant_share"] = max((t.gate.call(dominant_share, a, b, self.SAMPLE) for a, b in pairs),
                                          default=0.0)
        self.stop_if_failed(t)

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        same, changed = number(metrics, "identical_share"), number(metrics, "changed_share")
        dominant = number(metrics, "dominant_share")
        if same is None:
            return unmeasured("identical_share")
        if same > cfg["max_identical_share"]:
            return "insensitive_output", (f"{same:.1%} of an output's elements are the same for two independent "
                                          f"inputs (> {cfg['max_identical_share']:.0%}): no input moves them")
        if changed is None:
            return unmeasured("changed_share")
        if changed < cfg["min_changed_share"]:
            return "insensitive_output", (f"only {changed:.1%} of an output's elements move between two independent "
                                          f"inputs at the verification tolerance (< {cfg['min_changed_share']:.0%})")
        if dominant is None:
            return unmeasured("dominant_share")
        if dominant > cfg["max_dominant_share"]:
            return "saturated_output", (f"one value takes {dominant:.1%} of an output's elements "
                                        f"(> {cfg['max_dominant_share']:.0%}): the output is mostly constant")
        return None


def identical_share(a: torch.Tensor, b: torch.Tensor) -> float:
    """The share of elements exactly equal in `a` and `b` (1.0 where they cannot be compared
    element by element)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return 1.0
    return float((a == b).double().mean()) if a.numel() else 0.0


def changed_share(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> float:
    """The share of elements of `a` and `b` that differ beyond the tolerance (exactly, for
    integer and bool outputs)."""
    if a.shape != b.shape or a.dtype != b.dtype or not a.numel():
        return 1.0 if a.shape != b.shape or a.dtype != b.dtype else 0.0
    if a.is_floating_point() or a.is_complex():
        return float((~torch.isclose(a, b, rtol=rtol, atol=atol)).double().mean())
    return float((a != b).double().mean())


def dominant_share(a: torch.Tensor, b: torch.Tensor, sample: int) -> float:
    """The share of the most common value among the elements of both outputs (a fixed random
    sample of each past `sample` elements). Both outputs together, so a scalar output is two
    values, not one value taking all of it."""
    values = torch.cat([_sample(a, sample), _sample(b, sample)])
    if values.is_complex():
        values = torch.view_as_real(values)
        _, counts = torch.unique(values, dim=0, return_counts=True)
    else:
        _, counts = torch.unique(values, return_counts=True)
    return float(counts.max()) / len(values) if len(values) else 0.0


def _sample(x: torch.Tensor, size: int) -> torch.Tensor:
    flat = x.reshape(-1)
    if flat.numel() <= size:
        return flat
    generator = torch.Generator(device="cpu").manual_seed(0)
    return flat[torch.randint(flat.numel(), (size,), generator=generator).to(flat.device)]


class WellConditioned(Check):
    """The task is computed well enough in float32 that a correct kernel summing in another
    order still passes verification. Three measures: the share of the verification tolerance
    the float32 output uses against the same task in float64 (same weights, same inputs,
    cast up), the share a nudge of a few ulps on the weights moves the output by (floor,
    remainder, round, sign, atan2 of computed values jump under it; the weights, since a
    kernel compares a raw input exactly, as the reference does), each at most
    `max_tolerance_share` = 0.1, a tenth of the tolerance, so rounding never decides a
    verdict; and the largest output magnitude, at most `max_output_abs` = 65504, the largest
    float16 value: a kernel may compute in half precision, and an output past it cannot be
    held there. Both runs are without TF32 (numerics.full_float32): the measure is the task's
    conditioning, and cuDNN's default TF32 would charge a conv task with a rounding no
    correct kernel is asked to match. A task with an op that has no float64 kernel is judged
    by the ulp probe alone (float64_share None): refusing it would refuse the op, and the
    probe catches the jumps the float64 comparison is there for."""

    stage = "numerics"
    reasons = {**TASK_ERRORS, **UNMEASURED,
               "ill_conditioned": "float32 and float64 disagree by over a tenth of the verification tolerance",
               "unstable_output": "weights nudged by a few ulps move the output by over a tenth of the tolerance",
               "output_too_large": "an output is past the largest half-precision value"}
    repairable = frozenset({"ill_conditioned", "unstable_output", "output_too_large"})
    defaults = {"max_tolerance_share": 0.1, "max_output_abs": 65504.0}
    measures = {"float64_share": float, "ulp_share": float, "output_max_abs": float}
    nullable = frozenset({"float64_share"})

    def run(self, t: TaskUnderTest) -> None:
        gate, atol, rtol = t.gate, t.cfg["atol"], t.cfg["rtol"]
        t.metrics["output_max_abs"] = gate.call(numerics.max_abs, t.out)
        self.stop_if_failed(t)
        reference = gate.call(numerics.reference_output, t.model, t.inputs)
        seed = int.from_bytes(os.urandom(4), "little")
        t.metrics["ulp_share"] = gate.call(numerics.ulp_share, t.model, t.inputs, reference, atol, rtol, seed)
        self.stop_if_failed(t)
        model64 = gate.call(build_model, load_task(t.code), t.cfg["seed"], t.device)
        gate.call(model64.double)
        t.metrics["float64_share"] = gate.call(numerics.float64_share, model64, t.inputs, reference, atol, rtol)
        self.stop_if_failed(t)

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        biggest, limit = number(metrics, "output_max_abs"), cfg["max_output_abs"]
        share_cap = cfg["max_tolerance_share"]
        if biggest is None:
            return unmeasured("output_max_abs")
        if biggest > limit:
            return "output_too_large", f"an output element reaches {biggest:.3g} (> {limit:g}, float16's largest)"
        ulp = number(metrics, "ulp_share")
        if ulp is None:
            return unmeasured("ulp_share")
        if ulp > share_cap:
            return "unstable_output", (f"weights nudged by a few ulps move the output by {ulp:.3g} of the verification "
                                       f"tolerance (> {share_cap}): rounding decides it")
        wide = number(metrics, "float64_share")
        if wide is None and isinstance(metrics, dict) and metrics.get("float64_share", 0) is not None:
            return unmeasured("float64_share")  # absent or not a number; None says: no float64 kernel
        if wide is not None and wide > share_cap:
            return "ill_conditioned", (f"float32 and float64 outputs differ by {wide:.3g} of the verification "
                                       f"tolerance (> {share_cap}): a correct kernel that rounds otherwise fails")
        return None


class NothingDead(Check):
    """Every parameter moves the output, every submodule is used, and no op, nor a run of up to
    six consecutive ops, nor two such runs apart, can be dropped. A model torch.fx cannot trace is ablated on the
    graph make_fx records on its real inputs; one neither can trace is refused."""

    stage = "ablation"
    reasons = {**TASK_ERRORS, **UNMEASURED, "dead_parameter": "a parameter does not affect the output",
               "unused_module": "a submodule is built but never used",
               "redundant_op": "an op, or a run of ops that cancel, can be dropped without effect",
               "untraceable": "no graph of its ops can be traced, so they cannot be ablated"}
    repairable = frozenset({"dead_parameter", "unused_module", "redundant_op", "untraceable"})
    defaults = {"ablation": True}
    measures = {"dead_parameters": int, "graph_traced": bool, "unused_modules": int, "redundant_ops": int}

    def enabled(self, cfg: dict) -> bool:
        return bool(cfg.get("ablation"))

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

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        dead, traced = number(metrics, "dead_parameters"), flag(metrics, "graph_traced")
        if dead is None:
            return unmeasured("dead_parameters")
        if dead:
            name = text(metrics, "dead_parameter", "a parameter")
            return "dead_parameter", f"perturbing parameter {name!r} leaves the output unchanged at the verification tolerance"
        if traced is None:
            return unmeasured("graph_traced")
        if not traced:
            return "untraceable", "neither torch.fx nor make_fx on real inputs can trace the model: its ops cannot be ablated"
        for name, reason, detail in (
                ("unused_modules", "unused_module", "submodule {!r} is built in __init__ but never used"),
                ("redundant_ops", "redundant_op", "dropping {} leaves the output unchanged at the verification tolerance")):
            count = number(metrics, name)
            if count is None:
                return unmeasured(name)
            if count:
                return reason, detail.format(text(metrics, reason, "an op" if reason == "redundant_op" else "a module"))
        return None


class TimedAlone(InTimingWindow):
    """The timing check's precise measure (the GPU alone, every other worker's step waiting),
    taken once every check between passed at the size the quick measures chose. Taken before
    them, it was spent on every candidate they then rejected: on the H200 (512 candidates, 16
    workers) 230 of the 478 timed, 377 of the timers' 664 s of waiting, and the closures
    every other worker's steps waited behind. Where the precise measure sends the search on
    (a quick one reads slow beside other workers), those checks run again at the size it
    ends at: an accepted row passed every check at the size it keeps."""

    def run(self, t: TaskUnderTest) -> None:
        at_the_chosen_size = t.code
        t.other_out = []  # the checks between are done with it: the precise measure's peak is the task's own
        release(t.device)
        super().run(t)
        if t.code != at_the_chosen_size:
            for check in AT_THE_CHOSEN_SIZE:
                if check.enabled(t.cfg):
                    check.run(t)


class Compiles(Check):
    """torch.compile (Inductor) builds the model and agrees with eager mode."""

    stage = "compile"
    reasons = {**TASK_ERRORS, **UNMEASURED, "compile_error": "torch.compile fails",
               "compile_mismatch": "eager and compiled outputs disagree"}
    repairable = frozenset({"compile_error", "compile_mismatch"})
    defaults = {"compile": True}
    measures = {"compile_ms": float, "compile_max_diff": float, "compile_tolerance_share": float}

    def enabled(self, cfg: dict) -> bool:
        return bool(cfg.get("compile"))

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

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        share, diff = number(metrics, "compile_tolerance_share"), number(metrics, "compile_max_diff")
        if share is None:
            return unmeasured("compile_tolerance_share")
        if share > 1.0:
            shown = f"{diff:.3g}" if diff is not None else "an unknown amount"
            return "compile_mismatch", f"eager and compiled outputs differ by {shown} (atol={cfg['atol']}, rtol={cfg['rtol']})"
        return None


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


EXECUTES = Executes()
AT_THE_CHOSEN_SIZE: tuple[Check, ...] = (Deterministic(), Pure(), DependsOnInput(), MovesPerElement(),
                                         WellConditioned(), NothingDead())
CHECKS: tuple[Check, ...] = (EXECUTES, InTimingWindow(precise=False), *AT_THE_CHOSEN_SIZE, TimedAlone(), Compiles())
CHECK_STAGES = tuple(dict.fromkeys(check.stage for check in CHECKS))  # the timing stage's two parts are one


# What every run of the checks reads, beside each check's own `defaults`; together, the
# defaults of the configuration a worker receives (the run's own keys override them).
BASE_DEFAULTS = {
    "device": "cpu", "seed": 0, "atol": 1e-2, "rtol": 1e-2, "timing_lock": None,
    # The longest one step may hold the GPU gate: past it the task's process is ended at once
    # (SIGALRM), so a hang in forward frees the gate for every other worker within this.
    "gate_step_limit_s": 30.0,
    # Every GPU step alone, the GPU's memory not split between workers: a job run again after
    # its GPU memory ran out while other workers held theirs (filters/sandbox/worker.py).
    "gpu_alone": False,
}
DEFAULTS = {**BASE_DEFAULTS, **{key: value for check in CHECKS for key, value in check.defaults.items()}}


def glossary() -> dict[str, str]:
    """Every reason a check rejects with, and what it means."""
    return {reason: meaning for check in CHECKS for reason, meaning in check.reasons.items()}


def repairable() -> frozenset[str]:
    return frozenset().union(*(check.repairable for check in CHECKS))


def measures(cfg: dict) -> dict[str, type]:
    """Every metric the enabled checks record when they complete, with its type."""
    return {name: kind for check in CHECKS if check.enabled(cfg) for name, kind in check.measures.items()}


def decide(metrics: dict, cfg: dict) -> tuple[str, str, str] | None:
    """(stage, reason, detail) of the first enabled check, in CHECKS order, whose decide
    fails on `metrics`; None when all pass. `cfg` is {**DEFAULTS, **job_config}. Never
    raises: a check whose decide fails on a malformed configuration is a failure of that check."""
    for check in CHECKS:
        try:
            verdict = check.decide(metrics, cfg) if check.enabled(cfg) else None
        except Exception as error:  # a malformed configuration: never a pass
            verdict = "unmeasured", f"could not decide: {type(error).__name__}"
        if verdict:
            return (check.stage, *verdict)
    return None
