"""The execute check and the timing window, one family: both load the task at a size the
re-sizing search chooses (`SizeSearch`, filters/checks/measure/resize.py), the execute check
where the size as written outgrew the most one job may hold, the timing check toward its
target time. The timing check's precise measure, taken after the other checks, is
filters/checks/order.py `TimedAlone`.
"""
from __future__ import annotations

import math

from filters.checks.base import Check, TaskUnderTest
from filters.checks.measure.execution import (Reject, all_finite, load_and_run, measure, ran_out_of_gpu_memory,
                                              release, warm_up_calls)
from filters.checks.measure.resize import (RESIZE_CONSTANT, SIZE_METRIC, at_level, kind_of, nearest_level,
                                           size_constants, sizes_metrics, with_constants, work_ratio)
from filters.checks.verdicts import ExecutesRule, InTimingWindowRule, memory_cap_mb
from filters.sandbox import gpu_memory
from operators.sizes import BATCH


class Executes(ExecutesRule, Check):
    """The task builds, runs in eager mode and gives finite output."""

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


class InTimingWindow(InTimingWindowRule, Check):
    """Median eager time inside the window and peak memory under the cap. While outside (or,
    with `target_ratio` set, away from `target_ms` by more than that either way), the whole
    problem is re-sized toward `target_ms` along ladders of real layer sizes
    (filters/checks/measure/resize.py: batch, widths, extents) and measured again. Small tasks are overhead-bound, so an
    estimate can overshoot: the levels known to be too fast and too slow (or out of memory)
    bracket the next guess. A task whose model cannot be built at other widths is re-sized
    by its batch alone. Quick measurements (the GPU shared) aim the search; a precise one
    (the GPU alone, while every other worker waits) is taken once the aim is reached, and
    decides. A precise measure for every step inside the window made the gate the bottleneck
    on the H200 (6.5x the exclusive time, 1,908 -> 944 accepted/h on the same 512 candidates).
    A quick one can read slower than a precise one, so a precise measure outside the window
    aims the next step."""

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
    or out of memory), which bracket every later guess (filters/checks/measure/resize.py)."""

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


EXECUTES = Executes()
