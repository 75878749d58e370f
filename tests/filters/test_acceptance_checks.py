"""The acceptance checks' protocol (measure, then decide) and the checks a kernel-writing agent
could otherwise game: `decide` on hand-made measurements (no sandbox), and one tiny task per
reject reason, with the close legitimate case, through the real checks (harness.evaluate)."""
import math

import pytest
import torch

from filters.checks import harness, registry
from filters.checks.base import TaskUnderTest
from filters.checks.measure.execution import (GpuGate, Reject, build_model, close, forward, load_task, max_diff,
                                              tolerance_share)
from filters.checks.order import CHECKS
from filters.checks.pure import Pure
from filters.checks.registry import DEFAULTS, RULES, decide, measures

from tests.conftest import make_task

FAST = {"window_ms": [1e-6, 1e6], "compile": False}
LAYER = "self.linear = nn.Linear(256, 256)"
# What a sound task measures (the harness's warm-up task on this CPU, rounded).
PASSING = {"output_finite": True, "eager_ms": 3.0, "peak_memory_mb": None, "resize_rounds": 0, "resized": False,
           "determinism_max_diff": 0.0, "history_max_diff": 0.0, "deterministic_ops": True,
           "deterministic_mode_share": 0.0, "inputs_unchanged": True, "weights_unchanged": True,
           "rng_unchanged": True, "output_aliased": False, "state_unchanged": True, "later_calls": 7,
           "later_call_max_diff": 0.0, "inputs_fresh": True, "input_sensitivity": 0.9, "input_tolerance_share": 40.0,
           "identical_share": 0.0, "changed_share": 0.98, "dominant_share": 0.01, "float64_share": 0.001, "ulp_share": 0.0001,
           "output_max_abs": 12.0, "dead_parameters": 0, "graph_traced": True, "unused_modules": 0,
           "redundant_ops": 0, "compile_ms": 900.0, "compile_max_diff": 1e-6, "compile_tolerance_share": 1e-4}


# -- decide, on hand-made measurements ------------------------------------------------------

def test_the_measures_of_a_sound_task_pass_and_cover_every_declared_measure():
    assert set(measures(DEFAULTS)) == set(PASSING)
    assert decide(PASSING, DEFAULTS) is None


def test_the_checks_run_in_the_order_of_their_rules():
    """The zygote decides by RULES what a worker's child ran by CHECKS: one rule a check, in
    the same order, each check the measuring half of its rule."""
    assert len(CHECKS) == len(RULES)
    assert all(isinstance(check, type(rule)) for check, rule in zip(CHECKS, RULES))
    assert [check.stage for check in CHECKS] == [rule.stage for rule in RULES]


def test_measures_follow_the_enabled_checks():
    without = measures({**DEFAULTS, "compile": False, "ablation": False})
    assert "compile_ms" not in without and "redundant_ops" not in without and "ulp_share" in without
    assert decide({k: v for k, v in PASSING.items() if k not in ("compile_ms", "compile_tolerance_share")},
                  {**DEFAULTS, "compile": False}) is None


@pytest.mark.parametrize("changes, expected", [
    ({"output_finite": False}, ("execute", "nan_or_inf")),
    ({"eager_ms": 0.2}, ("timing", "too_fast")),
    ({"eager_ms": 500.0}, ("timing", "too_slow")),
    ({"peak_memory_mb": 20000.0}, ("timing", "too_large")),
    ({"determinism_max_diff": 1e-3}, ("determinism", "nondeterministic")),
    ({"history_max_diff": 1e-3}, ("determinism", "nondeterministic")),
    ({"deterministic_ops": False}, ("determinism", "nondeterministic_op")),
    ({"deterministic_mode_share": 3.0}, ("determinism", "nondeterministic")),
    ({"inputs_unchanged": False}, ("purity", "mutates_input")),
    ({"weights_unchanged": False}, ("purity", "mutates_weights")),
    ({"rng_unchanged": False}, ("purity", "consumes_rng")),
    ({"output_aliased": True}, ("purity", "aliased_output")),
    ({"state_unchanged": False}, ("purity", "hidden_state")),
    ({"later_call_max_diff": 0.5}, ("purity", "call_dependent")),
    ({"inputs_fresh": False}, ("degenerate", "fixed_inputs")),
    ({"input_tolerance_share": 0.7}, ("degenerate", "constant_output")),
    ({"changed_share": 0.002}, ("sensitivity", "insensitive_output")),
    ({"identical_share": 0.72}, ("sensitivity", "insensitive_output")),
    ({"changed_share": 0.5, "dominant_share": 0.95}, ("sensitivity", "saturated_output")),
    ({"dominant_share": 0.998}, ("sensitivity", "saturated_output")),
    ({"output_max_abs": 1e6}, ("numerics", "output_too_large")),
    ({"ulp_share": 0.5}, ("numerics", "unstable_output")),
    ({"float64_share": 0.2}, ("numerics", "ill_conditioned")),
    ({"dead_parameters": 1, "dead_parameter": "conv.bias"}, ("ablation", "dead_parameter")),
    ({"graph_traced": False}, ("ablation", "untraceable")),
    ({"unused_modules": 1}, ("ablation", "unused_module")),
    ({"redundant_ops": 1, "redundant_op": "call_function rfft then call_function irfft"}, ("ablation", "redundant_op")),
    ({"compile_tolerance_share": 1.5}, ("compile", "compile_mismatch")),
])
def test_each_threshold_decides_its_reason(changes, expected):
    verdict = decide({**PASSING, **changes}, DEFAULTS)
    assert verdict is not None and verdict[:2] == expected, verdict
    assert expected[1] in dict(registry.glossary())


def test_decide_names_what_it_read_in_the_detail():
    assert "conv.bias" in decide({**PASSING, "dead_parameters": 1, "dead_parameter": "conv.bias"}, DEFAULTS)[2]


def test_no_float64_kernel_leaves_the_ulp_probe_alone_to_judge():
    assert decide({**PASSING, "float64_share": None}, DEFAULTS) is None
    assert decide({**PASSING, "float64_share": None, "ulp_share": 0.5}, DEFAULTS)[1] == "unstable_output"


HOSTILE_VALUES = [None, "0", [], {}, [1.0], True, False, math.nan, math.inf, -math.inf, -1, 1e308]


@pytest.mark.parametrize("name", sorted(PASSING))
def test_decide_never_raises_and_a_malformed_or_missing_measure_never_passes(name):
    kind = measures(DEFAULTS)[name]
    nullable = name in ("peak_memory_mb", "float64_share")
    for value in HOSTILE_VALUES:
        verdict = decide({**PASSING, name: value}, DEFAULTS)
        well_typed = (isinstance(value, bool) if kind is bool else
                      not isinstance(value, bool) and isinstance(value, (int, float)) and value == value)
        if not well_typed and not (nullable and value is None):
            assert verdict is not None, (name, value)
    missing = {k: v for k, v in PASSING.items() if k != name}
    if name not in ("peak_memory_mb",):  # an absent peak is a device without one (the CPU)
        assert decide(missing, DEFAULTS) is not None, name
    for junk in (None, [], "metrics", {"eager_ms": {}}):
        assert decide(junk, DEFAULTS) is not None


def test_every_check_declares_measures_and_decides():
    for check in CHECKS:
        assert check.measures and all(kind in (bool, int, float) for kind in check.measures.values()), check.stage
        assert check.decide({}, DEFAULTS) is not None, check.stage  # nothing measured is a failure
        assert "unmeasured" in check.reasons


# -- whole-tensor comparisons ---------------------------------------------------------------

def test_comparisons_see_the_imaginary_part_integers_bools_and_dtypes():
    z = torch.complex(torch.ones(4), torch.zeros(4))
    assert not close([z], [z + 1j], 1e-2, 1e-2) and max_diff([z], [z + 1j]) == pytest.approx(1.0)
    big = torch.tensor([2**40 + 1], dtype=torch.int64)
    assert not close([big], [big + 1], 1e-2, 1e-2) and max_diff([big], [big + 1]) == 1.0  # float32 would tie them
    flags = torch.tensor([True, False])
    assert not close([flags], [~flags], 1e-2, 1e-2) and max_diff([flags], [flags]) == 0.0
    assert not close([torch.ones(3)], [torch.ones(3, dtype=torch.float64)], 1e-2, 1e-2)
    assert max_diff([torch.ones(3)], [torch.ones(3, dtype=torch.float64)]) == math.inf
    assert tolerance_share([torch.full((2,), math.nan)], [torch.ones(2)], 1e-2, 1e-2) == math.inf
    assert close([torch.ones(3)], [torch.ones(3) + 1e-3], 1e-2, 1e-2)


def test_forward_returns_copies_so_a_reused_buffer_never_compares_with_itself():
    task = load_task(make_task("self.out.copy_(torch.tanh(x))\nreturn self.out", init="self.out = torch.zeros(64, 256)"))
    model = build_model(task, 0, torch.device("cpu"))
    first = forward(model, [torch.rand(64, 256)])
    second = forward(model, [torch.rand(64, 256)])
    assert max_diff(first, second) > 0.1  # two outputs, not one buffer seen twice


# -- each reason end to end, through the real checks ------------------------------------------

CASES = {
    # a sound layer: every new check passes it (the close legitimate case for most of them)
    "relu_layer": (make_task("return torch.relu(self.linear(x))", init=LAYER), FAST, None),
    # 0.2% of the elements move, by up to 2: the whole tensors differ, its elements do not
    "insensitive_output": (make_task("return torch.clamp(x, min=0.998) * 1000.0 - 998.0"), FAST, "insensitive_output"),
    # 80% zeros: a third of the elements move; the same case that was refused as saturated at
    # a quarter (four in five are one value) moves too little now
    "mostly_zero": (make_task("return torch.where(x > 0.8, x, torch.zeros_like(x))"), FAST, "insensitive_output"),
    # three quarters of the output a copied weight table, a quarter computed (a red team's task)
    "mostly_a_weight_copy": (make_task("return torch.cat([torch.tanh(self.linear(x)), self.table.expand(x.shape[0], 768)],"
                                       " dim=1)", init=LAYER + "\nself.table = nn.Parameter(torch.rand(1, 768))"),
                             FAST, "insensitive_output"),
    # a ReLU that zeroes most of its layer's output (about 80%): a quarter of it moves at most
    "relu_mostly_zero": (make_task("return torch.relu(self.linear(x) - 0.3)", init=LAYER), FAST, "insensitive_output"),
    # a raw input compared with a constant: any kernel compares it exactly, as the reference does
    "raw_input_threshold": (make_task("return torch.tanh(self.linear(x)) * (x > 0.5)", init=LAYER), FAST, None),
    "mutates_input": (make_task("x.mul_(2.0)\nreturn torch.tanh(x)"), FAST, "mutates_input"),
    "mutates_weights": (make_task("self.seen.add_(1.0)\nreturn torch.tanh(self.linear(x))",
                                  init=LAYER + "\nself.register_buffer('seen', torch.zeros(1))"), FAST, "mutates_weights"),
    "consumes_rng": (make_task("return torch.tanh(self.linear(x)) + 0.0 * torch.rand(1)", init=LAYER), FAST,
                     "consumes_rng"),
    "aliased_output": (make_task("self.out.copy_(torch.tanh(self.linear(x)))\nreturn self.out",
                                 init=LAYER + "\nself.out = torch.zeros(64, 256)"), FAST, "aliased_output"),
    "hidden_state_counter": (make_task("self.calls += 1\nreturn torch.tanh(self.linear(x))",
                                       init=LAYER + "\nself.calls = 0"), FAST, "hidden_state"),
    "hidden_state_itertools": (make_task("next(self.ticks)\nreturn torch.tanh(self.linear(x))",
                                         init=LAYER + "\nself.ticks = itertools.count()", header="import itertools"),
                               FAST, "hidden_state"),
    "hidden_state_global": (make_task("CALLS.append(1)\nreturn torch.tanh(self.linear(x))", init=LAYER,
                                      header="CALLS = []"), FAST, "hidden_state"),
    # a mode-reading task: another output under torch.use_deterministic_algorithms
    "reads_deterministic_mode": (make_task("s = 3.0 if torch.are_deterministic_algorithms_enabled() else 1.0\n"
                                           "return torch.tanh(self.linear(x)) * s", init=LAYER), FAST,
                                 "nondeterministic"),
    "output_too_large": (make_task("return torch.exp(self.linear(x) * 20.0)", init=LAYER), FAST, "output_too_large"),
    "unstable_output": (make_task("return torch.remainder(self.linear(x) * 1000.0, 1.0)", init=LAYER), FAST,
                        "unstable_output"),
    # float32 absorbs x into 1e4 and sums the rounding; a nudge of x is absorbed too (the ulp probe sees nothing)
    "ill_conditioned": (make_task("return (x + 1e4).sum(-1) - 1e4 * x.shape[-1]"), FAST, "ill_conditioned"),
    "redundant_pair": (make_task("return torch.tanh(torch.fft.irfft(torch.fft.rfft(x), n=x.shape[-1]))"), FAST,
                       "redundant_op"),
    # ops that cancel across others (red team, issue 47): copies made, an elementwise op, the
    # copies averaged; a scale, a ReLU, the unscale
    "copies_averaged": (make_task("y = torch.tanh(self.linear(x).repeat(4, 1))\n"
                                  "return y.view(4, x.shape[0], 256).mean(0)", init=LAYER), FAST, "redundant_op"),
    "scale_unscaled": (make_task("return torch.relu(self.linear(x) * 3.0) / 3.0", init=LAYER), FAST, "redundant_op"),
    # what the grammar lets through and only running shows (the red team of issue 47): a batch
    # norm told to train writes its statistics; a layer cast back and forth; a mode probe
    "statistics_written": (make_task("y = torch.nn.functional.batch_norm(x, self.m, self.v, training=True, momentum=0.5)"
                                     "\nreturn torch.tanh(self.linear(x)) + self.m",
                                     init=LAYER + "\nself.register_buffer('m', torch.zeros(256))\n"
                                                  "self.register_buffer('v', torch.ones(256))"), FAST, "nondeterministic"),
    "cast_back_and_forth": (make_task("y = torch.tanh(self.linear(x))\nself.linear.to(torch.bfloat16)\n"
                                      "self.linear.to(torch.float32)\nreturn y", init=LAYER), FAST, "nondeterministic"),
    "mode_probe": (make_task("seen = self.probe(torch.ones(1))\nreturn torch.where(seen > 0, torch.tanh(self.linear(x)), "
                             "x * 1000.0)", init=LAYER + "\nself.probe = nn.Dropout(1.0)"), FAST, "redundant_op"),
    # a batch norm with running statistics of its own: accepted, and it computes otherwise in train mode
    "batch_norm": (make_task("return torch.tanh(self.norm(self.linear(x)))",
                             init=LAYER + "\nself.norm = nn.BatchNorm1d(256)\nself.norm.running_mean.fill_(0.5)\n"
                                          "self.norm.running_var.fill_(2.0)"), FAST, None),
    # four rolls that cancel: no one, two or three of them do (a red team's task)
    "redundant_four": (make_task("return torch.tanh(x.roll(1, 1).roll(2, 1).roll(-1, 1).roll(-2, 1))"), FAST,
                       "redundant_op"),
    # untraceable by torch.fx (data-dependent branch): ablated on make_fx's graph, the double transpose found
    "redundant_pair_untraceable": (make_task("if x.sum() > -1e9:\n    x = x.transpose(0, 1).transpose(0, 1)\n"
                                             "return torch.tanh(self.linear(x))", init=LAYER), FAST, "redundant_op"),
    # the same branch, around ops that all count: accepted, ablated on make_fx's graph
    "branch_untraceable": (make_task("if x.sum() > -1e9:\n    x = x.flip(0)\nreturn torch.tanh(self.linear(x))",
                                     init=LAYER), FAST, None),
}


@pytest.fixture(scope="module")
def results():
    return {name: harness.evaluate(code, cfg) for name, (code, cfg, _) in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_each_new_reason_end_to_end(results, name):
    result, expected = results[name], CASES[name][2]
    if expected is None:
        assert result["passed"], result
    else:
        assert not result["passed"] and result["reason"] == expected, result


def test_a_passing_task_records_every_measure_with_its_type(results):
    metrics = results["relu_layer"]["metrics"]
    for name, kind in measures({**DEFAULTS, **FAST}).items():
        value = metrics[name]
        assert value is None and name in ("peak_memory_mb",) or isinstance(value, kind) and (
            kind is bool or not isinstance(value, bool)), (name, value)
    assert decide(metrics, {**DEFAULTS, **FAST}) is None  # the zygote's verdict is the child's
    assert metrics["deterministic_ops"] and metrics["later_calls"] >= 1  # the deterministic path ran on the CPU
    assert metrics["traceable"] and results["branch_untraceable"]["metrics"]["traceable"] is False
    assert results["branch_untraceable"]["metrics"]["graph_traced"]


def test_the_ablated_pairs_are_named(results):
    assert "rfft then" in results["redundant_pair"]["detail"]
    assert "repeat and" in results["copies_averaged"]["detail"]
    assert "mul and call_function truediv" in results["scale_unscaled"]["detail"]


def test_train_mode_is_measured_and_decides_nothing(results):
    """A consumer that never calls .eval() runs a batch norm on its batch's statistics: the row
    says so (`train_mode_agrees`), and the verdict, decided in eval mode, stands."""
    assert results["relu_layer"]["metrics"]["train_mode_share"] <= 1.0
    assert results["batch_norm"]["passed"] and results["batch_norm"]["metrics"]["train_mode_share"] > 1.0
    assert "transpose" in results["redundant_pair_untraceable"]["detail"]


def test_a_call_after_earlier_calls_on_other_inputs_must_agree_with_the_first():
    """State buried past the fingerprint's depth still shows: the output of the later call differs."""
    code = make_task("self.deep[0][0][0][0][0][0][0][0][0] += 1\n"
                     "return torch.tanh(self.linear(x)) * min(self.deep[0][0][0][0][0][0][0][0][0], 2)",
                     init=LAYER + "\nself.deep = [[[[[[[[[0]]]]]]]]]")
    cfg = {**DEFAULTS, **FAST}
    task = load_task(code)
    model = build_model(task, 0, torch.device("cpu"))
    inputs = [torch.rand(64, 256)]
    t = TaskUnderTest(code, cfg, torch.device("cpu"), GpuGate(None), task=task, model=model, inputs=inputs,
                      out=forward(model, inputs), metrics={"eager_ms": 1.0})
    with pytest.raises(Reject) as rejected:
        Pure().run(t)
    assert rejected.value.reason == "call_dependent", rejected.value.detail


def test_an_out_of_memory_whose_report_failed_is_still_out_of_memory():
    """On the H200 the caching allocator's out-of-memory message asks NVML, which fails in the
    jail: the assert it raises instead is an out-of-memory (the task may fit once re-sized)."""
    from filters.checks.measure.execution import as_reject
    failed_report = RuntimeError('NVML_SUCCESS == DriverAPI::get()->nvmlInit_v2_() INTERNAL ASSERT FAILED at '
                                 '"/pytorch/c10/cuda/CUDACachingAllocator.cpp":1135, please report a bug to PyTorch.')
    assert as_reject(failed_report, "execute").reason == "out_of_memory"
    assert as_reject(RuntimeError("INTERNAL ASSERT FAILED at SomethingElse.cpp"), "execute").reason == "eager_error"


def test_a_timed_call_sees_its_own_copy_of_the_inputs_scaled_by_a_few_ulps():
    from filters.checks.measure.execution import scaled_copies
    x, index = torch.rand(1000) + 0.5, torch.arange(10)
    scaled, same_index, three = scaled_copies([x, index, 3], 1 + 2 * torch.finfo(torch.float32).eps)
    assert not torch.equal(scaled, x) and torch.allclose(scaled, x, rtol=1e-6, atol=0)
    assert torch.equal(same_index, index) and same_index.data_ptr() != index.data_ptr() and three == 3
