"""One case per execution reason code, all run through the real sandbox pool in one batch."""
import ast
import threading
import time

import pytest
import torch

from filters.checks import harness
from filters.checks.base import TaskUnderTest
from filters.checks.depends_on_input import DependsOnInput
from filters.checks.deterministic import Deterministic
from filters.checks.nothing_dead import NothingDead
from filters.checks.timing import SizeSearch
from filters.checks.measure.execution import POLITE_S, GpuGate, build_model, forward, load_task, measure
from filters.checks.measure.resize import small_problem
from operators.sizes import in_ladders

from tests.conftest import make_task

OPEN = {"window_ms": [1e-6, 1e6]}  # timing is tested by its own cases; the others must not hinge on it
FAST = {**OPEN, "compile": False}
CASES = {
    "accepted": (make_task("return torch.relu(self.linear(x))", init="self.linear = nn.Linear(256, 256)"), {}),
    "eager_error": (make_task("return x @ torch.ones(3, 3)"), FAST),
    "nan_or_inf": (make_task("return torch.log(x - 2.0)"), FAST),
    "nondeterministic": (make_task("self.calls += 1\nreturn x * self.calls", init="self.calls = 0"), FAST),
    # remembers the first input it is shown: later inputs give other outputs, the first one
    # always the same, so the repeat, the input-dependence and the compile checks all pass
    "remembers_first_input": (make_task("if self.first is None:\n    self.first = x.clone()\n"
                                        "return self.linear(torch.ones_like(x) * float(torch.equal(x, self.first)))",
                                        init="self.first = None\nself.linear = nn.Linear(256, 256)"), FAST),
    "remembers_in_module_state": (make_task("SEEN.append(x.clone()) if not SEEN else None\n"
                                            "return self.linear(torch.ones_like(x) * float(torch.equal(x, SEEN[0])))",
                                            init="self.linear = nn.Linear(256, 256)", header="SEEN = []"), FAST),
    "constant_output": (make_task("return x * 0.0 + 1.0"), FAST),
    "fixed_inputs": (make_task("return x * 2.0", inputs="[torch.ones(batch_size, features)]"), FAST),
    "too_fast": (make_task("return x + 1.0", constants="features = 8", inputs="[torch.rand(4, features)]"),
                 {"compile": False}),
    "too_slow": (make_task("return x @ x.T", constants="features = 512", inputs="[torch.rand(2048, features)]"),
                 {"compile": False, "window_ms": [0.001, 0.01]}),
    "out_of_memory": (make_task("return x + torch.empty(1 << 40)"), FAST),
    "compile_error": (make_task("if torch.compiler.is_compiling():\n    return x.reshape(-1, 7)\nreturn x * 2.0"), OPEN),
    "compile_mismatch": (make_task("if torch.compiler.is_compiling():\n    return x + 1.0\nreturn x * 2.0"), OPEN),
    "dead_parameter": (make_task("return torch.nn.functional.instance_norm(self.conv(x))",
                                 init="self.conv = nn.Conv1d(4, 4, 3)",  # its bias is normalized away
                                 inputs="[torch.rand(batch_size, 4, features)]"), FAST),
    "unused_module": (make_task("return torch.tanh(x)", init="self.relu = nn.ReLU()"), FAST),
    "redundant_op": (make_task("return torch.clamp(torch.sigmoid(x), max=2.0)"), FAST),  # never binds
    "resized": (make_task("return torch.tanh(x).cumsum(-1)", constants="batch_size = 1\nfeatures = 256"),
                {"compile": False}),
    # in the window as written: with target_ratio set, grown until a precise measure is near the target
    "aimed": (make_task("return torch.tanh(x).cumsum(-1)", constants="batch_size = 64\nfeatures = 256"),
              {"compile": False, "window_ms": [0.001, 1000.0], "target_ms": 5.0, "target_ratio": 1.5}),
    "resized_by_batch": (make_task("return x.reshape(x.shape[0], 4, 64).sum(-1)",
                                   constants="batch_size = 1\nfeatures = 256"), {"compile": False}),
    # an RMSNorm as transformers writes it: its float32 casts are no-ops here, not redundant ops
    "casts_kept": (make_task("h = x.to(torch.float32)\nh = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)\n"
                             "return self.weight * h.float().to(x.dtype)",
                             init="self.weight = nn.Parameter(torch.rand(256))"), FAST),
}


@pytest.fixture(scope="module")
def results(pool):
    names = list(CASES)
    outcomes = pool.run_many([{"code": CASES[n][0], "config": CASES[n][1]} for n in names])
    return dict(zip(names, outcomes))


EXPECTED = {"remembers_first_input": "nondeterministic", "remembers_in_module_state": "nondeterministic"}


@pytest.mark.parametrize("name", [n for n in CASES if n not in ("accepted", "resized", "aimed", "resized_by_batch", "casts_kept")])
def test_each_execution_reason(results, name):
    result = results[name]
    assert not result["passed"]
    assert result["reason"] == EXPECTED.get(name, name), result
    if name.startswith("remembers"):
        assert "depends on what it saw before" in result["detail"], result


def test_an_error_escaping_a_later_check_is_the_execute_stages_and_names_the_check():
    """The task's own error past its first run is an eager error of the execute stage (the
    stage a repair reads), and the record says which check's step raised it: on the H200
    every job sent to run alone said `execute/out_of_memory`, whichever check ran out."""
    code = make_task("self.calls += 1\nif self.calls > 1:\n    raise RuntimeError('only once')\nreturn x * 2.0",
                     init="self.calls = 0")
    verdict = harness.evaluate(code, FAST)
    assert (verdict["stage"], verdict["reason"]) == ("execute", "eager_error")
    assert verdict["metrics"]["error_in"] == "timing" and "only once" in verdict["detail"]
    assert "error_in" not in harness.evaluate(make_task("return x * 2.0"), FAST)["metrics"]
    at_other_sizes = make_task("if x.shape[0] != 64:\n    raise RuntimeError('only a batch of 64')\nreturn x * 2.0")
    verdict = harness.evaluate(at_other_sizes, {**FAST, "window_ms": [1e-6, 1e-5]})  # too slow: re-sized
    assert (verdict["stage"], verdict["reason"], verdict["metrics"]["error_in"]) == ("execute", "eager_error", "timing")


def test_a_sound_task_passes_with_every_measurement_kept(results):
    result = results["accepted"]
    assert result["passed"], result
    metrics = result["metrics"]
    assert 1.0 <= metrics["eager_ms"] <= 100.0
    assert metrics["determinism_max_diff"] <= 1e-5
    assert metrics["compile_max_diff"] <= 1e-2 and metrics["compile_ms"] > 0
    assert metrics["input_sensitivity"] > 1e-2


def test_dtype_casts_are_never_ablated_as_redundant(results):
    assert results["casts_kept"]["passed"], results["casts_kept"]


def test_a_too_fast_task_is_resized_into_the_window_as_a_whole_problem_of_real_sizes(results):
    result = results["resized"]
    assert result["passed"], result
    assert result["metrics"]["resized"] and 1.0 <= result["metrics"]["eager_ms"] <= 100.0
    constants = {n.targets[0].id: n.value.value for n in ast.parse(result["code"]).body
                 if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}
    assert constants["batch_size"] > 1 and constants["batch_size"] % 8 == 0 and in_ladders(constants["batch_size"])
    assert in_ladders(constants["features"])
    assert result["metrics"]["resize_scope"] == "whole"


def test_with_target_ratio_a_task_in_the_window_is_grown_until_a_precise_measure_is_near_the_target(results):
    result = results["aimed"]
    assert result["passed"], result
    metrics = result["metrics"]
    assert metrics["resized"] and metrics["batch_size"] > 64
    assert 5.0 / 1.5 <= metrics["eager_ms"] or metrics["resize_rounds"] == 8, metrics


def test_a_task_whose_widths_are_fixed_is_resized_by_its_batch_alone(results):
    result = results["resized_by_batch"]
    assert result["passed"], result
    assert result["metrics"]["resize_scope"] == "batch" and "size.features" not in result["metrics"]
    assert "features = 256\n" in result["code"] and f"batch_size = {result['metrics']['batch_size']}\n" in result["code"]


def test_rejects_keep_the_measurements_they_took(results):
    assert results["too_fast"]["metrics"]["eager_ms"] < 1.0
    assert results["constant_output"]["metrics"]["input_sensitivity"] == 0.0


def test_resize_search_never_repeats_a_level_known_to_miss_and_falls_back_to_the_batch():
    search = SizeSearch(make_task("return x * 2.0", constants="batch_size = 8\nfeatures = 256"))
    up = search.next_level(100.0, aimed=False)  # level 0 too fast: a level above it
    assert up > 0 and search.too_fast_at == 0
    search.level = up
    down = search.next_level(0.1, aimed=False)  # that one too slow: between the two
    assert down is None or 0 < down < up
    assert search.next_level(1.0, aimed=True) is None  # at the target: stay
    search.level = 0  # quick measures said level 0 too slow; a precise one says too fast: it wins
    search.too_slow_at = 0
    assert search.next_level(100.0, aimed=False, precise=True) > 0 and search.too_slow_at == float("inf")
    assert search.changes_widths(up)
    alone = search.by_batch_alone()
    assert search.batch_only and alone > 0 and not search.changes_widths(alone)


def test_the_batch_alone_search_after_a_shrink_aims_from_the_size_as_written_and_stays_below_it():
    """The execute check shrank the task (the size as written ran out of the most one job
    may hold) and the first measure, at a quarter of the work, said 3x too fast: the batch
    alone is searched below the size as written, at about 3/4 of its work (a red team's run
    aimed above it, at sizes that had all run out, and ended `too_large`)."""
    code = make_task("return x * 2.0", constants="batch_size = 64\nfeatures = 256")
    search = SizeSearch(code)
    search.level = search.out_of_memory(0)
    shrunk = search.sizes(search.level)
    search.next_level(3.0, aimed=False)
    alone = search.by_batch_alone()
    assert search.too_slow_at == 0 and alone < 0
    assert search.sizes(alone)["features"] == 256 and search.sizes(alone)["batch_size"] < 64
    assert shrunk["batch_size"] * shrunk["features"] < 64 * 256 <= 4 * shrunk["batch_size"] * shrunk["features"]

    grown = SizeSearch(code)  # no shrink: a first measure 3x too fast at the size as written aims above it
    grown.next_level(3.0, aimed=False)
    assert grown.by_batch_alone() > 0 and grown.too_fast_at == 0


def test_gpu_gate_lets_readers_share_and_a_timer_wait_for_them(tmp_path):
    """The gate's locking on the CPU: readers in two processes overlap; the writer waits
    until the reader already inside is done, and a new reader waits for the writer."""
    import multiprocessing
    import time

    path = str(tmp_path / "gpu0.lock")
    log = multiprocessing.get_context("spawn").Queue()

    def stamp(event):
        log.put((event, time.monotonic()))

    context = multiprocessing.get_context("fork")
    reader = context.Process(target=_hold_shared, args=(path, 0.6, log))
    reader.start()
    time.sleep(0.2)
    gate = GpuGate(path)
    with gate.exclusive():
        stamp("writer in")
        late = context.Process(target=_hold_shared, args=(path, 0.0, log))
        late.start()
        time.sleep(0.3)
        stamp("writer out")
    reader.join()
    late.join()
    events = dict(log.get(timeout=5) for _ in range(6))
    assert events["writer in"] >= events["reader 0.6 out"]  # waited for the reader inside
    assert events["reader 0.0 in"] >= events["writer out"]  # the late reader waited for the writer
    assert gate.waited_s >= 0.3 and gate.alone_s >= 0.3  # what the run reports as gate_wait and gpu_alone


# Two layers and three ops; every forward takes 50 ms of (pretend) GPU time. Run here, in
# this process: no sandbox, so it may sleep.
SLOW_CHAIN = make_task("time.sleep(0.05)\nreturn torch.relu(self.b(torch.tanh(self.a(x))))",
                       init="self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)", header="import time",
                       inputs="[torch.rand(4, 16)]")


def test_a_check_holds_the_gpu_gate_one_step_at_a_time_so_a_timer_waits_for_one_step(tmp_path):
    """A timer waits for the readers inside to finish. Held for a whole check (the ablation
    runs a dozen forwards), that wait stalled every other worker behind the timer."""
    path = str(tmp_path / "gpu0.lock")
    cfg = {**harness.DEFAULTS, "window_ms": (0.0, 1e9)}
    task = load_task(SLOW_CHAIN)
    model = build_model(task, 0, torch.device("cpu"))
    torch.manual_seed(1)  # as the harness draws inputs: not from the weights' seed
    inputs = [torch.rand(4, 16)]
    out = forward(model, inputs)
    finished = []

    def checks():
        t = TaskUnderTest(SLOW_CHAIN, cfg, torch.device("cpu"), GpuGate(path), task=task, model=model, inputs=inputs,
                          out=out)
        for check in (Deterministic(), DependsOnInput(), NothingDead()):
            check.run(t)
        finished.append(t.metrics)

    began = time.monotonic()
    worker = threading.Thread(target=checks)
    worker.start()
    waits = []
    while worker.is_alive():
        timer = GpuGate(path)
        with timer.exclusive():
            time.sleep(0.01)
        waits.append(timer.waited_s)
    worker.join()
    assert finished and finished[0]["determinism_max_diff"] == 0.0  # the checks ran to the end and passed
    assert time.monotonic() - began > 0.6  # the checks ran a dozen forwards of 50 ms
    # a timer never waited for more than one of them, after looking for a gap between them
    # (execution.POLITE_S): held for the whole check, it would wait for a dozen
    assert len(waits) > 5 and max(waits) < POLITE_S + 0.2, waits


def _hold_shared(path, seconds, log):
    import time

    with GpuGate(path).shared():
        log.put((f"reader {seconds} in", time.monotonic()))
        time.sleep(seconds)
        log.put((f"reader {seconds} out", time.monotonic()))


def test_a_trace_reads_what_the_task_computes_at_its_own_batch_not_at_the_small_one():
    """The policy lets forward branch on a shape, and the trace runs at a batch of 4: a red
    team's task ran a Linear and a ReLU (a KernelBench layer) at any batch over 4 and decoy
    ops at 4, was accepted by a WorkerPool, and its trace read the decoy. A task that runs
    other ops at its own batch than at the small one is traced at its own, on meta."""
    linear = "self.linear = nn.Linear(features, features)"
    decoy = make_task("if x.shape[0] > 4:\n    return torch.relu(self.linear(x)) * 2.0\n"
                      "return torch.cumsum(torch.tanh(x), dim=1) + torch.sigmoid(x)", init=linear)
    honest = make_task("return torch.relu(self.linear(x)) * 2.0", init=linear)
    assert harness.trace(decoy) == harness.trace(honest) == "mm add relu mul"
    small = make_task("return torch.relu(self.linear(x)) * 2.0", init=linear, constants="batch_size = 4\nfeatures = 64")
    assert harness.trace(small) == "mm add relu mul"  # a task at the small batch already is traced as it is


# A KernelBench layer (Linear, ReLU) scaled by a value of the sizes that is zero or nothing
# at the trace's small problem (a width of 16, a batch of 4) and not at the task's own: the
# red team's third round. The ops are the same at both sizes, so the meta comparison passed;
# the values at the small size dropped the layer, and the trace read `sigmoid`.
SIZE_VALUES = {
    "zero_scale": "return torch.relu(self.linear(x)) * (x.shape[1] - 16) + torch.sigmoid(x)",
    "batch_zero": "return torch.relu(self.linear(x)) * (x.shape[0] // 5) + torch.sigmoid(x)",
    "tensor_scale": "return torch.relu(self.linear(x)) * torch.tensor(float(x.shape[1] - 16)) + torch.sigmoid(x)",
    "arange_mask": "return torch.relu(self.linear(x)) * (torch.arange(x.shape[1]) >= 16).float().mean()"
                   " + torch.sigmoid(x)",
    "empty_slice": "return torch.cat([torch.relu(self.linear(x))[:, :x.shape[1] - 16], torch.sigmoid(x)], dim=1)",
}


@pytest.mark.parametrize("kind", sorted(SIZE_VALUES))
def test_a_value_of_the_sizes_does_not_hide_a_layer_from_the_trace(kind):
    task = make_task(SIZE_VALUES[kind], init="self.linear = nn.Linear(features, features)")
    graph = harness.trace(task)
    assert "mm" in graph and "relu" in graph, graph
    assert graph == harness._traced_and_drops(task)[0]  # as at its own sizes


# A KernelBench layer gated by a value the trace's generic values set to zero and the task's
# own do not: op_graph reads a trace with signed inputs and spread weights (a relu of
# torch.rand's all-positive values is no op), and each of these hid the layer from it.
GENERIC_VALUES = {
    # each gate is material on the task's own values: a layer scaled by what a kernel could
    # leave out within the checks' tolerance (`relu(x.min())` of torch.rand at 64 x 256, 6e-5)
    # is no part of what it computes, and is read as such
    "input_sign": ("", "return torch.relu(self.linear(x)) * torch.relu(x.min() + 1.0) + torch.sigmoid(x)"),
    "input_all_positive": ("", "return torch.relu(self.linear(x)) * (x.min() >= 0).float() + torch.sigmoid(x)"),
    "weight_spread": ("self.g = nn.Parameter(torch.ones(16))",
                      "return torch.relu(self.linear(x)) * (torch.relu(self.g.min() - 0.99) * 100.0) + torch.sigmoid(x)"),
    "buffer_constant": ("self.register_buffer('g', torch.ones(16))",
                        "return torch.relu(self.linear(x)) * (self.g.std() == 0).float() + torch.sigmoid(x)"),
}


@pytest.mark.parametrize("kind", sorted(GENERIC_VALUES))
def test_a_value_the_generic_trace_zeroes_does_not_hide_a_layer_the_checks_ran(kind):
    gate, body = GENERIC_VALUES[kind]
    task = make_task(body, init=f"{gate}\nself.linear = nn.Linear(features, features)")
    graph = harness.trace(task)
    assert "mm" in graph and "relu" in graph, graph


# A layer gated by a weight's draw: live from seed 0 (randn(2)[0] is 1.54), dead from seed 1
# (0.66). The CPU's and a GPU's generators differ as two seeds do: a trace must read the
# draw the checks ran on, from their device and seed.
SEED_GATED = make_task("return torch.relu(self.linear(x)) * torch.relu(self.g[0] - 1.0) + torch.sigmoid(x)",
                       init="self.g = nn.Parameter(torch.randn(2))\nself.linear = nn.Linear(features, features)")


def test_a_trace_reads_the_values_of_the_checks_seed():
    live = harness.trace(SEED_GATED, checks=harness.ChecksDevice(seed=0))
    dead = harness.trace(SEED_GATED, checks=harness.ChecksDevice(seed=1))
    assert "mm" in live and "mm" not in dead, (live, dead)


def test_a_worker_traces_with_the_device_and_seed_its_checks_ran_with(pool):
    live, dead = pool.run_many([{"code": SEED_GATED, "config": {"trace_only": True, "seed": seed}} for seed in (0, 1)])
    assert "mm" in live["metrics"]["op_graph"] and "mm" not in dead["metrics"]["op_graph"], (live, dead)


def test_a_trace_that_runs_out_of_the_workers_share_of_the_gpu_is_taken_again_alone():
    """The checks ran the task in the worker's share of the GPU's memory; a trace keeps every
    value it reads, and a KernelBench-sized level-1 task needs more (one did, on the H200).
    Its own sizes are traced again with the GPU's memory to itself. (The share running out
    is raised where the GPU would raise it: starting the device, before the trace's steps.)"""
    task = make_task("return torch.relu(self.linear(x)) * 4.0 * 0.25", constants="batch_size = 4\nfeatures = 16",
                     init="self.linear = nn.Linear(features, features)")  # the small problem already: its own sizes
    started = []

    def share_ran_out():
        started.append("share")
        raise torch.OutOfMemoryError("CUDA out of memory (the worker's share)")

    alone = harness.ChecksDevice(start=lambda: started.append("alone"))
    assert harness.trace(task, checks=harness.ChecksDevice(start=share_ran_out, alone=alone)) == "mm add relu"
    assert started == ["share", "alone"]
    # with nothing to fall back on, no value was read: untraced (on meta, the round trip would be spelled out)
    assert harness.trace(task, checks=harness.ChecksDevice(start=share_ran_out)) is None


def test_a_trace_reads_the_very_weights_and_inputs_the_checks_ran_first():
    """The checks draw a task's inputs from seed + 1 (execution.load_and_run); the trace drew
    them from where the model's build left the generator, and a red team's gate on
    `x[0, 0]` was live for the checks and zero for the trace."""
    from filters.checks.measure.execution import GpuGate, load_and_run
    task = make_task("return torch.relu(self.linear(x))", init="self.linear = nn.Linear(features, features)")
    for seed in (0, 7):
        _, checked_model, checked_inputs, _ = load_and_run(task, {"seed": seed}, torch.device("cpu"), GpuGate(None))
        model, inputs = harness._built(task, "cpu", seed)
        assert torch.equal(inputs[0], checked_inputs[0])
        assert torch.equal(model.linear.weight, checked_model.linear.weight)


# Ways the red team of session 13 hid a layer the checks ran inside a value op_graph took for
# another: each traced as the decoy alone (`mul`, `mm`, `convolution`) and was accepted.
DISGUISED_BY_VALUES = {
    # a few elements 30,000 times the rest: within 2e-4 of the largest, the layer's 0.3 vanished
    "dominant_residual": ("scale = torch.ones(features)\nscale[::4] = 30000.0\nself.register_buffer('scale', scale)\n"
                          "self.linear = nn.Linear(features, features)",
                          "return x * self.scale + torch.relu(self.linear(x))", "relu"),
    # a matrix product in the rows the recognition compared, a softmax in the rest
    "product_in_a_corner": ("self.weight = nn.Parameter(torch.randn(features, features) / 16)",
                            "return torch.cat([x[:3] @ self.weight, torch.softmax(x[3:] * 8.0, dim=1) * 100.0], dim=0)",
                            "softmax"),
    # a convolution of the first sample, which the recognition compared, a sigmoid of the rest
    "convolution_of_one_sample": ("self.conv = nn.Conv2d(4, 4, 3, padding=1)",
                                  "return torch.cat([self.conv(x[:1]), torch.sigmoid(x[1:] * 3.0)], dim=0)", "sigmoid"),


    # a layer a composite took in: scaled by 1e-6 at the trace's width of 16 (0.42 at the task's
    # 256) inside a maximum read as a relu of x; the same with a gate small on signed inputs alone
    "inside_a_composite_at_the_small_width": ("self.linear = nn.Linear(features, features)",
                                              "return torch.maximum(x, torch.relu(self.linear(x)) * SCALE)", "mm"),
    "inside_a_composite_on_signed_inputs": ("self.linear = nn.Linear(features, features)",
                                            "gate = torch.sigmoid(x.amin() * 6.0)\n"
                                            "return torch.maximum(x, torch.relu(self.linear(x)) * gate)", "mm"),
}
SHIFTED_INPUTS = {"inside_a_composite_at_the_small_width": "[torch.randn(batch_size, features)]",
                  "inside_a_composite_on_signed_inputs": "[torch.rand(batch_size, features) - 0.2]"}


@pytest.mark.parametrize("kind", sorted(DISGUISED_BY_VALUES))
def test_a_value_that_only_looks_like_another_does_not_hide_what_the_task_computes(kind):
    init, body, hidden = DISGUISED_BY_VALUES[kind]
    inputs = "[torch.rand(batch_size, 4, 16, 16)]" if "conv" in init else "[torch.rand(batch_size, features)]"
    constants = "batch_size = 16\nfeatures = 256\nSCALE = 1e-6 ** (16 / features)"
    graph = harness.trace(make_task(body, init=init, inputs=SHIFTED_INPUTS.get(kind, inputs), constants=constants))
    assert hidden in graph, graph


def test_a_task_that_recognises_the_checks_first_draw_does_not_hide_a_layer_in_it():
    """A red team's task (session 13, round 3) made its Linear's input constant on the
    checks' first draw alone, by a literal of that draw's first element (the GEMM of a
    constant is a per-column shift, read as an affine map), and ran other ops on signed
    inputs so that the generic reading fell back to the first draw. Its layer is live on
    every other draw. The generic values come from a seed no task can know, and a task that
    runs other ops on them is untraced."""
    torch.manual_seed(1)  # the checks' inputs: seed + 1 (execution.first_inputs)
    first = float(torch.rand(64, 256)[0, 0])
    body = ("if x[x < 0].shape[0] > 0:\n    x = x.abs()\n"
            f"z = x * torch.log(x[0, 0] / {first!r}) + 1.0\n"
            "return torch.relu(torch.sigmoid(x) + self.linear(z))")
    task = make_task(body, init="self.linear = nn.Linear(features, features)")
    assert harness.trace(task) is None
    plain = make_task("x = x.abs()\n" + body.split("\n", 2)[2], init="self.linear = nn.Linear(features, features)")
    for _ in range(3):  # without the branch, every generic draw reads the layer
        assert "mm" in (harness.trace(plain) or ""), harness.trace(plain)


@pytest.mark.parametrize("offset", ["4000.0", "torch.sign(x) * 4000.0"])
def test_a_layer_added_to_a_large_offset_and_taken_off_again_is_not_hidden(offset):
    """Values are compared at their own magnitude: at 4,000, 4 an element apart is equal, and
    a red team's layer (0.5 an element) added to an offset and taken off again was read as
    the offset alone, `add` (round 4). A value taken for an earlier one must return the same
    outputs put in its place (`graph._aliases_hold`, filters/computation/graph.py); this one does not, at any size."""
    body = f"t = x + {offset}\ny = t + torch.relu(self.linear(x)) * 0.25\nreturn y - ({offset})"
    task = make_task(body, init="self.linear = nn.Linear(features, features)", inputs="[torch.randn(batch_size, features)]")
    graph = harness.trace(task)
    assert graph is None or "mm" in graph, graph
    honest = make_task("return (x * 4.0) * 0.25 + torch.relu(self.linear(x))", init="self.linear = nn.Linear(features, features)")
    assert harness.trace(honest) == "mm add relu add"  # a round trip whose value is the earlier one's stays one


def test_a_task_whose_readings_each_leave_out_what_the_other_reads_is_untraced():
    """A Linear and ReLU written out (a broadcast product and a sum, `h * (h > 0)`), beside a
    term zero on the task's own inputs and one zero on signed inputs: at every size each
    reading left unspelled what the other spelled, and on meta, with no values, the trace
    read `mul sum ...`, no `mm` (red team, session 13). Such a task is untraced."""
    body = ("h = (x[:, None, :] * self.weight).sum(-1) + self.bias\n"
            "t = torch.where(x.amin() > -0.5, torch.sigmoid(h), 0.0)\n"
            "return (x * (x < 0)).sum(-1, keepdim=True) + h * (h > 0) + t")
    init = "self.weight = nn.Parameter(torch.randn(features, features) / 20.0)\nself.bias = nn.Parameter(torch.randn(features) / 10.0)"
    assert harness.trace(make_task(body, init=init, constants="batch_size = 16\nfeatures = 64")) is None


def test_a_task_whose_values_dropped_an_op_and_whose_own_sizes_cannot_be_traced_is_untraced():
    """A round trip around a KernelBench layer at sizes the CPU cannot hold (level 1's
    elementwise tasks have 1.6 billion elements): traced on meta instead, its values went
    unread and the copy was spelled `mul relu mul`, 0.83 from `relu` (53 of 200 round-trip
    copies got through so). It is left untraced, and a run rejects it."""
    sizes = "batch_size = 16\nfeatures = 1099511627776"  # 2 ** 40: 16 at the small problem
    huge = make_task("return (torch.relu(x) * 4.0) * 0.25", constants=sizes)
    assert harness.trace(huge) is None
    assert harness.trace(huge, untrusted=False) == "relu"  # the reference keeps the small problem's trace
    plain = make_task("return torch.relu(x)", constants=sizes)
    assert harness.trace(plain) == "relu"  # nothing dropped: the small problem's trace stands


def test_a_trace_whose_values_drop_nothing_stays_at_the_small_problem():
    """The fallback to the task's own sizes costs seconds of CPU a task: only a trace whose
    values dropped an op takes it (7 of 100 accepted rows of the H200 run)."""
    from filters.computation.graph import op_graph_and_drops

    honest = make_task("return torch.relu(self.linear(x)) * 2.0", init="self.linear = nn.Linear(features, features)")
    small, _ = small_problem(honest)
    assert harness._traced_and_drops(small) == ("mm add relu mul", [])
    positive = make_task("return torch.relu(torch.sigmoid(x))")  # a relu of what is all positive: dropped
    model, inputs = harness._built(positive, "cpu")
    assert op_graph_and_drops(model, inputs) == (["sigmoid"], ["relu"])


# A width cut into parts by a constant of any name: at the small problem's widths of 16, the
# sixth adversary's 16 clusters of KernelBench L2 30's GEMM and GroupNorm (session 41) were
# clusters of one, their norm a constant, and the copy read `add` against `mm add group_norm
# mul add clamp`. A problem that makes a dimension of one the task's own sizes do not is read
# again where each part keeps 8, whatever the constant is called.
CLUSTERED = ("h = torch.einsum('ni,gpi->ngp', x, self.proj) + self.bias\n"
             "c = h - h.mean(dim=2, keepdim=True)\n"
             "h = c * torch.rsqrt(c.pow(2).mean(dim=2, keepdim=True) + 1e-5)\n"
             "return h.clamp(-2.0, 2.0).flatten(1)")


@pytest.mark.parametrize("parts", ["clusters", "num_groups"])
def test_a_small_problem_that_cuts_a_width_into_parts_of_one_is_read_again_where_each_keeps_eight(parts):
    task = make_task(CLUSTERED, init=f"self.proj = nn.Parameter(torch.randn({parts}, features // {parts}, features))\n"
                     f"self.bias = nn.Parameter(torch.zeros({parts}, features // {parts}))",
                     constants=f"batch_size = 64\nfeatures = 1024\n{parts} = 16")
    small, _ = small_problem(task)
    kept = small_problem(task, every_divisor=True)[0]
    assert ("features = 16\n" in small) == (parts == "clusters") and "features = 128\n" in kept
    assert harness._at_its_sizes(task, small) == (harness.COLLAPSED if parts == "clusters" else harness.SAME_OPS)
    assert harness._at_its_sizes(task, kept) == harness.SAME_OPS
    assert harness.read(task, untrusted=False) == harness.Reading("mm add group_norm clamp", partial=True)


def test_a_dimension_of_one_at_every_size_is_no_collapse():
    # a mean over a last dimension of one, as written at the task's own sizes too
    task = make_task("return torch.tanh(x.view(x.shape[0], -1, 1).mean(2))")
    assert harness._at_its_sizes(task, small_problem(task)[0]) == harness.SAME_OPS


# Layers whose reading leaves ops out at every size, the layer's own: F.instance_norm is a
# batch norm of a reshaped view, reshaped back (both read as the instance norm; the view back
# spells it), and F.lp_pool's `sign(y) * relu(|y|)` is y. On the H200, 33 of 49 accepted
# tasks whose trace took over 2 s were read again at their own sizes for these alone.
OWN_OPS_LEFT_OUT = {"nn.InstanceNorm2d(4)": "instance_norm", "nn.InstanceNorm2d(4, affine=True)": "instance_norm mul add",
                    "nn.InstanceNorm1d(4)": "layer_norm", "nn.LPPool2d(2, 2)": "mul avg_pool2d mul pow",
                    "nn.LPPool2d(1.5, 2)": "pow avg_pool2d mul pow"}
HUGE = "batch_size = 16\nfeatures = 1099511627776"  # 2 ** 40: only the small problem (16) can be read


@pytest.mark.parametrize("layer", sorted(OWN_OPS_LEFT_OUT))
def test_a_layer_whose_own_ops_its_reading_leaves_out_keeps_the_small_problems_trace(layer):
    task = make_task("return self.layer(x)", init=f"self.layer = {layer}", constants=HUGE,
                     inputs="[torch.rand(batch_size, 4, features, 16)]" if "2d" in layer else
                     "[torch.rand(batch_size, 4, features)]")
    assert harness.trace(task) == OWN_OPS_LEFT_OUT[layer]


# What those exemptions must not let through: a layer scaled by a value of the sizes (1e-6 at
# the trace's width of 16, 0.42 at the task's 256), taken in by the norm or inside the
# magnitude of the identity; each is read at the task's own sizes, where the layer shows.
HIDDEN_IN_OWN_OPS = {
    "in_the_norms_input": "return self.norm(x + torch.relu(self.conv(x)) * SCALE)",
    "in_the_identitys_magnitude": "y = torch.relu(self.conv(x))\n"
                                  "return torch.sign(x) * torch.abs(x + y * SCALE)",
    "in_the_identitys_sign": "return torch.sign(x + torch.relu(self.conv(x)) * SCALE) * torch.abs(x)",
}


@pytest.mark.parametrize("kind", sorted(HIDDEN_IN_OWN_OPS))
def test_a_layer_scaled_away_at_the_small_problem_inside_those_ops_is_still_traced(kind):
    task = make_task(HIDDEN_IN_OWN_OPS[kind], init="self.conv = nn.Conv2d(4, 4, 3, padding=1)\n"
                     "self.norm = nn.InstanceNorm2d(4)", inputs="[torch.randn(batch_size, 4, features, 16)]",
                     constants="batch_size = 8\nfeatures = 256\nSCALE = 1e-6 ** (16 / features)")
    small, _ = small_problem(task)
    assert "convolution" not in harness._traced_and_drops(small)[0]  # the small problem hides it
    graph = harness.trace(task)
    assert graph is None or "convolution" in graph, graph


# A red team's answers (session 21): an affine norm whose scale and shift are near nothing at
# the small problem alone (taken in by the norm's name there), a batch norm that sees one
# sample at the small problem alone or at its own sizes alone (an instance norm there, a
# batch norm elsewhere), and the identity around a write through a view; session 30's: a 3x3
# kernel zero but for its centre at the small problem alone (a Linear there, a convolution at
# its own sizes); session 31's: an image repeated along a depth there alone (a 2-D convolution
# there). Each reads as at its own sizes.
READ_AS_AT_ITS_OWN_SIZES = {
    "affine_norm_near_identity_at_the_small_problem": (
        "return self.norm(x)", "self.norm = nn.InstanceNorm2d(4, affine=True)\n"
        "self.norm.weight = nn.Parameter(1 + SCALE * torch.randn(4))\nself.norm.bias = nn.Parameter(SCALE * torch.randn(4))"),
    "one_sample_at_the_small_problem_only": (
        "y = x.reshape(features // 16, -1, x.shape[2], x.shape[3])\n"
        "return torch.nn.functional.batch_norm(y, None, None, training=True).reshape(x.shape)", ""),
    "one_sample_at_its_own_sizes_only": (
        "y = x.reshape(16 // (features // 16), -1, x.shape[2], x.shape[3])\n"
        "return torch.nn.functional.batch_norm(y, None, None, training=True).reshape(x.shape)", ""),
    "identity_around_a_write_through_a_view": (
        "y = x.clone()\ns = torch.sign(y)\ny.view(-1).add_((torch.relu(self.conv(x)) * SCALE).reshape(-1))\n"
        "return s * torch.abs(y)", "self.conv = nn.Conv2d(4, 4, 3, padding=1)"),
    "kernel_border_zero_at_the_small_problem_only": (
        "return torch.relu(self.conv(x))", "self.conv = nn.Conv2d(4, 4, 3, padding=1)\nmask = torch.zeros(3, 3)\n"
        "mask[1, 1] = 1.0\nwith torch.no_grad():\n    self.conv.weight.mul_(mask + (1 - mask) * (features - 16))"),
    "image_repeated_at_the_small_problem_only": (
        "y = x.unsqueeze(2) * (1 + (features - 16) * torch.arange(4.0).view(1, 1, 4, 1, 1))\n"
        "return torch.relu(self.conv(y))", "self.conv = nn.Conv3d(4, 4, 3, padding=(0, 1, 1))"),
}


@pytest.mark.parametrize("kind", sorted(READ_AS_AT_ITS_OWN_SIZES))
def test_a_layer_that_differs_at_the_small_problem_reads_as_at_its_own_sizes(kind):
    body, init = READ_AS_AT_ITS_OWN_SIZES[kind]
    task = make_task(body, init=init, inputs="[torch.randn(batch_size, 4, features, 16)]",
                     constants="batch_size = 16\nfeatures = 256\nSCALE = 1e-4 ** (16 / features)")
    own = harness._traced_and_drops(task)[0]
    assert harness.trace(task) == own and own != harness._traced_and_drops(small_problem(task)[0])[0]


def test_a_data_dependent_op_does_not_hide_a_branch_on_the_batch_from_the_trace():
    """The red team's answer to the test above: a masked_select in both branches, so that the
    meta device cannot run the task at either size and the comparison was skipped. The trace
    read the decoy again. A comparison that cannot run now sends the trace to the task's own
    sizes, on real tensors; and the count masked_select hands Python (its output's shape)
    changes with the values, so both tasks are untraced (ValuesThroughPython), never read
    as the decoy."""
    linear = "self.linear = nn.Linear(features, features)"
    picked = " + x.masked_select(x > 0.5).sum()"
    decoy = make_task("if x.shape[0] > 4:\n    return torch.relu(self.linear(x)) * 2.0" + picked + "\n"
                      "return torch.cumsum(torch.tanh(x), dim=1) + torch.sigmoid(x)" + picked, init=linear)
    honest = make_task("return torch.relu(self.linear(x)) * 2.0" + picked, init=linear)
    assert harness.trace(decoy) is None and harness.trace(honest) is None
    steady = make_task("return torch.relu(self.linear(x)) * 2.0 + x.sum()", init=linear)
    assert "relu" in harness.trace(steady)  # the same layer with a count that does not vary


def test_a_cpu_build_draws_the_values_torch_manual_seed_gave_it():
    """execution.seed_for seeds the CPU generator alone: the same draws as before, so cached
    readings and verdicts stand."""
    from filters.checks.measure.execution import seed_for
    torch.manual_seed(11)
    expected = torch.randn(5)
    torch.manual_seed(0)
    seed_for(torch.device("cpu"), 11)
    assert torch.equal(torch.randn(5), expected)


def test_only_a_task_every_other_check_passed_is_timed_alone(tmp_path):
    """The precise measure holds the GPU alone while every other worker waits: it is taken
    last, so a task a later check rejects costs no one a wait (on the H200, 230 of 478)."""
    gated = {**FAST, "timing_lock": str(tmp_path / "gpu0.lock")}
    rejected = harness.evaluate(make_task("return x * 0.0 + 1.0"), gated)
    accepted = harness.evaluate(make_task("return torch.tanh(x).cumsum(-1)"), gated)
    assert rejected["reason"] == "constant_output" and rejected["metrics"]["eager_ms"] > 0  # the search measured it
    assert rejected["metrics"]["gpu_alone_ms"] == 0.0 and rejected["metrics"]["gate_timer_wait_ms"] == 0.0
    assert accepted["passed"], accepted
    assert accepted["metrics"]["gpu_alone_ms"] > 0 and accepted["metrics"]["t_timing_ms"] > 0


def test_where_the_precise_measure_moves_the_size_the_checks_between_run_again_there():
    """A quick measure beside other workers can read slow: where the precise measure sends
    the search on from the size the quick ones chose (out of the window, or far from the
    target), every check between runs again at the size the row keeps."""
    from filters.checks.order import CHECKS, TimedAlone
    code = make_task("return torch.tanh(x).cumsum(-1)", constants="batch_size = 64\nfeatures = 64")
    t = TaskUnderTest(code, {**harness.DEFAULTS, **FAST}, torch.device("cpu"), GpuGate(None))
    before_precise = [check for check in CHECKS if not isinstance(check, TimedAlone)][:-1]
    for check in before_precise:
        check.run(t)
    assert t.search.chosen and t.code == code and t.metrics["determinism_max_diff"] == 0.0
    t.metrics = {}  # what the checks between record, gone: they must run again
    precise_ms, _ = measure(t.model, t.inputs, t.cfg, t.device)
    # the precise measure finds the chosen size far from the target, as if the quick measures had read
    # slow (it aims upward only): far off whatever the noise of a loaded machine, and bounded: a precise
    # measure read slow under load would aim the search at seconds of work, and memory to match
    t.cfg = {**t.cfg, "target_ms": min(precise_ms * 1000, 200.0), "target_ratio": 1.5}
    TimedAlone().run(t)
    assert t.code != code and t.metrics["resized"] and t.metrics["batch_size"] > 64
    assert t.metrics["determinism_max_diff"] == 0.0 and t.metrics["input_sensitivity"] > 0  # measured again
    assert t.metrics["dead_parameters"] == 0 and t.metrics["redundant_ops"] == 0


def test_a_per_channel_scale_of_ones_is_read_as_the_multiplication_it_is():
    """A uniform kernel with a window is a pooling and keeps its value in the generic reading;
    a (1, C, 1, 1) scale of ones has no window and is spread, or its product with the
    convolution reads as nothing (a learnable scale a kernel must still apply)."""
    task = make_task("return self.conv(x) * self.scale",
                     init="self.conv = nn.Conv2d(4, 8, 3)\nself.scale = nn.Parameter(torch.ones(1, 8, 1, 1))",
                     inputs="[torch.rand(batch_size, 4, 10, 10)]", constants="batch_size = 4")
    assert harness.trace(task).split() == ["convolution2d", "mul"]


@pytest.mark.parametrize("init, forward, read", [
    ("self.g = nn.Parameter(torch.ones(1, 8, 8, 8))", "self.conv(x) * self.g", ["convolution2d", "mul"]),
    ("self.g = nn.Parameter(torch.zeros(1, 8, 8, 8))", "self.conv(x) + self.g", ["convolution2d", "add"]),
    # a kernel of ones kept for the convolution it is, though it reads the same shape
    ("self.register_buffer('g', torch.ones(8, 1, 2, 2) / 4)", "torch.nn.functional.conv2d(self.conv(x), self.g, "
     "stride=2, groups=8)", ["convolution2d", "avg_pool2d"]),
    # session 29's red team: the kernel made in forward, and read by something else too
    ("self.register_buffer('g', torch.ones(8, 1, 2, 2))", "torch.nn.functional.conv2d(self.conv(x), self.g / 2 ** 2, "
     "stride=2, groups=8)", ["convolution2d", "avg_pool2d"]),
    ("self.register_buffer('g', torch.ones(8, 1, 2, 2) / 4)", "torch.nn.functional.conv2d(self.conv(x), "
     "torch.cat([self.g[:4], self.g[4:]]), stride=2, groups=8) * self.g.sum().sign()", ["convolution2d", "avg_pool2d"]),
])
def test_a_uniform_gain_with_a_window_shape_is_read_unless_a_convolution_takes_it_as_its_kernel(init, forward, read):
    """A red team's (1, C, H, W) gain of ones, and positional bias of zeros (session 28): they
    kept their value in the generic reading as a kernel does, and their op read as nothing."""
    task = make_task(f"return {forward}", init=f"self.conv = nn.Conv2d(4, 8, 3)\n{init}",
                     inputs="[torch.rand(batch_size, 4, 10, 10)]", constants="batch_size = 4")
    assert harness.trace(task).split() == read


def test_a_partial_reading_is_read_again_at_the_small_batch_before_its_own_sizes():
    """A reading at the small problem that leaves an op unspelled (a layer scaled by
    `features - 16`, zero at widths of 16) is partial; read in full, a task is read at the
    small batch first, as a candidate is: here its own sizes (a batch of 2 ** 26) cannot be
    held at all."""
    code = make_task("return torch.tanh(self.embed(x) * (x.shape[1] - 16) + x)",
                     init="self.embed = nn.Linear(features, features)",
                     constants="batch_size = 67108864\nfeatures = 2048")
    assert harness.read(code, untrusted=False).partial
    full = harness.read(code, untrusted=False, in_full=True)
    assert not full.partial and full.graph == "mm mul add add tanh"


def test_segments_of_one_at_the_small_problem_are_read_where_each_keeps_eight():
    """The sixth adversary's L2 62 cut its width into segments whose constant's name says no
    group: at widths of 16 each segment held one feature and its norm was constant, the layer
    unread (a partial reading, read in full at the small batch before session 41). The small
    problem collapses, and the task is read where each segment keeps 8 features, in full."""
    code = make_task("""
        h = self.embed(x).unflatten(1, (segments, -1))
        h = torch.nn.functional.layer_norm(h, h.shape[-1:]).flatten(1)
        return torch.nn.functional.leaky_relu(h * self.scale + self.shift)""",
                     init="""
        self.embed = nn.Linear(features, features)
        self.scale = nn.Parameter(torch.full((features,), 2.0))
        self.shift = nn.Parameter(torch.zeros(features))""",
                     constants="batch_size = 67108864\nfeatures = 2048\nsegments = 128")
    assert harness.read(code, untrusted=False) == harness.Reading("mm add group_norm mul add leaky_relu")
    assert harness.read(code, untrusted=False, in_full=True) == harness.Reading("mm add group_norm mul add leaky_relu")
