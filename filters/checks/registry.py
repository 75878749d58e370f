"""The acceptance checks' one ordered registry of verdicts (docs/architecture.md, "Acceptance"):
`RULES`, each check's rule in the order the checks run (filters/checks/order.py `CHECKS`, the
same order: tests/filters/test_acceptance_checks.py holds them together). The funnel and the
dataset card list its stages and reasons, the repair loop reads what is repairable, the run
configuration takes its keys, and the zygote decides every verdict with `decide`. Like
filters/checks/verdicts.py, it imports nothing that runs a task.

A new check is a rule in verdicts.py, a line in RULES here, and its measuring half (a file of
its own in filters/checks/) with a line in order.py's CHECKS.
"""
from __future__ import annotations

from filters.checks.verdicts import (CompilesRule, DependsOnInputRule, DeterministicRule, ExecutesRule,
                                     InTimingWindowRule, MovesPerElementRule, NothingDeadRule, PureRule, Rule,
                                     WellConditionedRule)

# The timing check's rule is there twice, as its check runs twice: its quick measures choose
# the size, and its precise measure (order.TimedAlone) decides once the checks between passed.
RULES: tuple[Rule, ...] = (ExecutesRule(), InTimingWindowRule(), DeterministicRule(), PureRule(),
                           DependsOnInputRule(), MovesPerElementRule(), WellConditionedRule(), NothingDeadRule(),
                           InTimingWindowRule(), CompilesRule())
CHECK_STAGES = tuple(dict.fromkeys(check.stage for check in RULES))  # the timing stage's two parts are one


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
DEFAULTS = {**BASE_DEFAULTS, **{key: value for check in RULES for key, value in check.defaults.items()}}


def glossary() -> dict[str, str]:
    """Every reason a check rejects with, and what it means."""
    return {reason: meaning for check in RULES for reason, meaning in check.reasons.items()}


def repairable() -> frozenset[str]:
    return frozenset().union(*(check.repairable for check in RULES))


def measures(cfg: dict) -> dict[str, type]:
    """Every metric the enabled checks record when they complete, with its type."""
    return {name: kind for check in RULES if check.enabled(cfg) for name, kind in check.measures.items()}


def decide(metrics: dict, cfg: dict) -> tuple[str, str, str] | None:
    """(stage, reason, detail) of the first enabled check, in RULES order, whose decide
    fails on `metrics`; None when all pass. `cfg` is {**DEFAULTS, **job_config}. Never
    raises: a check whose decide fails on a malformed configuration is a failure of that check."""
    for check in RULES:
        try:
            verdict = check.decide(metrics, cfg) if check.enabled(cfg) else None
        except Exception as error:  # a malformed configuration: never a pass
            verdict = "unmeasured", f"could not decide: {type(error).__name__}"
        if verdict:
            return (check.stage, *verdict)
    return None
