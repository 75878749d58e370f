"""What each acceptance check decides: its stage (the funnel's name for it and its time
metric), the reasons it rejects with and what each means, which of them an LLM may repair
from the detail, the configuration it reads (`defaults`), what it measures (the metrics its
run always records when it completes, with their types) and `judge`, which holds every
threshold of the check and turns the metrics into a verdict.

`decide` is pure: it reads only the metrics and the configuration, uses math only and never
raises, whatever JSON it is given (a missing or non-numeric measure is a failure,
`unmeasured`). This module imports nothing that runs a task (nor torch): a process that never
runs task code takes a child's measurements and decides itself (filters/checks/registry.py,
`decide`). Each check's measuring half subclasses its rule here (`Executes(ExecutesRule,
Check)`, filters/checks/base.py), in a file of its own.
"""
from __future__ import annotations

import math

# What any check may also end in: the task's own code raising, or running out of memory.
TASK_ERRORS = {"eager_error": "raises in eager mode", "out_of_memory": "ran out of memory"}
# What any decide may end in: a measure its check must record is absent or not a number.
UNMEASURED = {"unmeasured": "a measurement the check must record is missing or not a number"}
# What the sandbox decides when the checks could not finish (filters/sandbox/pool.py, stage "sandbox").
SANDBOX_REASONS = {"crashed": "killed its worker", "timeout": "ran past the wall-clock limit",
                   "out_of_memory": "ran out of memory"}


class Rule:
    """A check's verdict: what it declares and how it decides (its `run` is the check's own,
    filters/checks/base.py `Check`)."""

    stage: str = ""
    reasons: dict[str, str] = {}
    repairable: frozenset[str] = frozenset()
    defaults: dict = {}
    measures: dict[str, type] = {}

    def enabled(self, cfg: dict) -> bool:
        return True

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



def memory_cap_mb(cfg: dict) -> float:
    return min(cfg["max_task_memory_gb"], cfg["memory_budget_gb"] or math.inf) * 2**10


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


class ExecutesRule(Rule):
    """What `Executes` decides (filters/checks/timing.py)."""

    stage = "execute"
    reasons = {**TASK_ERRORS, **UNMEASURED, "nan_or_inf": "output holds NaN or Inf"}
    repairable = frozenset({"eager_error", "nan_or_inf"})
    measures = {"output_finite": bool}

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        finite = flag(metrics, "output_finite")
        if finite is None:
            return unmeasured("output_finite")
        return None if finite else ("nan_or_inf", "the eager output holds NaN or Inf")


class InTimingWindowRule(Rule):
    """What `InTimingWindow` decides (filters/checks/timing.py)."""

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


class DeterministicRule(Rule):
    """What `Deterministic` decides (filters/checks/deterministic.py)."""

    stage = "determinism"
    reasons = {**TASK_ERRORS, **UNMEASURED, "nondeterministic": "two identical runs differ",
               "nondeterministic_op": "uses an op with no deterministic implementation on this device"}
    defaults = {"determinism_tol": 1e-5}
    measures = {"determinism_max_diff": float, "history_max_diff": float, "deterministic_ops": bool,
                "deterministic_mode_share": float}  # train_mode_share is a note, not a measure decided on

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


class PureRule(Rule):
    """What `Pure` decides (filters/checks/pure.py)."""

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


class DependsOnInputRule(Rule):
    """What `DependsOnInput` decides (filters/checks/depends_on_input.py)."""

    stage = "degenerate"
    reasons = {**TASK_ERRORS, **UNMEASURED, "fixed_inputs": "get_inputs() does not draw fresh inputs",
               "constant_output": "output does not depend on the input at the verification tolerance"}
    repairable = frozenset({"fixed_inputs", "constant_output"})
    measures = {"inputs_fresh": bool, "input_sensitivity": float, "input_tolerance_share": float}

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


class MovesPerElementRule(Rule):
    """What `MovesPerElement` decides (filters/checks/depends_on_input.py)."""

    stage = "sensitivity"
    reasons = {**TASK_ERRORS, **UNMEASURED,
               "insensitive_output": "most output elements do not move with the input",
               "saturated_output": "one value takes most of the output's elements"}
    repairable = frozenset({"insensitive_output", "saturated_output"})
    defaults = {"max_identical_share": 0.5, "min_changed_share": 0.25, "max_dominant_share": 0.75}
    measures = {"identical_share": float, "changed_share": float, "dominant_share": float}

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


class WellConditionedRule(Rule):
    """What `WellConditioned` decides (filters/checks/well_conditioned.py)."""

    stage = "numerics"
    reasons = {**TASK_ERRORS, **UNMEASURED,
               "ill_conditioned": "float32 and float64 disagree by over a tenth of the verification tolerance",
               "unstable_output": "weights nudged by a few ulps move the output by over a tenth of the tolerance",
               "output_too_large": "an output is past the largest half-precision value"}
    repairable = frozenset({"ill_conditioned", "unstable_output", "output_too_large"})
    defaults = {"max_tolerance_share": 0.1, "max_output_abs": 65504.0}
    measures = {"float64_share": float, "ulp_share": float, "output_max_abs": float}
    nullable = frozenset({"float64_share"})

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


class NothingDeadRule(Rule):
    """What `NothingDead` decides (filters/checks/nothing_dead.py)."""

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


class CompilesRule(Rule):
    """What `Compiles` decides (filters/checks/compiles.py)."""

    stage = "compile"
    reasons = {**TASK_ERRORS, **UNMEASURED, "compile_error": "torch.compile fails",
               "compile_mismatch": "eager and compiled outputs disagree"}
    repairable = frozenset({"compile_error", "compile_mismatch"})
    defaults = {"compile": True}
    measures = {"compile_ms": float, "compile_max_diff": float, "compile_tolerance_share": float}

    def enabled(self, cfg: dict) -> bool:
        return bool(cfg.get("compile"))

    def judge(self, metrics: dict, cfg: dict) -> tuple[str, str] | None:
        share, diff = number(metrics, "compile_tolerance_share"), number(metrics, "compile_max_diff")
        if share is None:
            return unmeasured("compile_tolerance_share")
        if share > 1.0:
            shown = f"{diff:.3g}" if diff is not None else "an unknown amount"
            return "compile_mismatch", f"eager and compiled outputs differ by {shown} (atol={cfg['atol']}, rtol={cfg['rtol']})"
        return None
