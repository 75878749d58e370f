"""The numerics check: float32 agrees with float64 and with itself under weights nudged by
ulps, and the output fits in float16 (the probes are filters/checks/measure/numerics.py)."""
from __future__ import annotations

import os

from filters.checks.base import Check, TaskUnderTest
from filters.checks.measure import numerics
from filters.checks.measure.execution import build_model, load_task
from filters.checks.verdicts import WellConditionedRule


class WellConditioned(WellConditionedRule, Check):
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
