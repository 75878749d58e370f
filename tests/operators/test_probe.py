import pytest
import torch
import torch.nn as nn

from operators.exclusions import exclusion_reason
from operators.probe import probe
from operators.records import OpSpec, SkippedOp


@pytest.mark.parametrize("name, reason", [
    ("torch.nn.Dropout", "stochastic"),
    ("torch.nn.functional.rrelu", "stochastic"),
    ("torch.nn.functional.relu_", "in_place"),
    ("torch.nn.MSELoss", "loss"),
    ("torch.nn.functional.cross_entropy", "loss"),
    ("torch.nn.Sequential", "container"),
    ("torch.nn.LazyLinear", "lazy_module"),
    ("torch.zeros_like", "creation_op"),
    ("torch.nn.Identity", "no_computation"),
    ("torch.nn.functional.embedding", "special_input"),
    ("torch.nn.functional._pad", "private"),
    ("torch.torch.ops.aten._safe_softmax.default", "private"),  # an OpInfo entry for a dispatcher overload
])
def test_exclusion_rules(name, reason):
    assert exclusion_reason(name) == reason


def test_compute_ops_are_not_excluded():
    for name in ("torch.nn.Conv2d", "torch.nn.functional.gelu", "torch.cumsum", "torch.nn.LayerNorm"):
        assert exclusion_reason(name) is None


def test_module_recipe_fills_shape_arguments_from_the_input():
    spec = probe(nn.Linear, "torch.nn.Linear", "torch")
    assert isinstance(spec, OpSpec)
    assert spec.init_args == {"in_features": "$L", "out_features": "$L"}
    assert "features" in spec.layouts and "features" in spec.keeps_rank
    assert "class Model" in spec.seed_code and "nn.Linear(in_features=" in spec.seed_code


def test_layout_follows_the_name_suffix():
    spec = probe(nn.Conv2d, "torch.nn.Conv2d", "torch")
    assert spec.layouts == ("image",) and spec.init_args["kernel_size"] == 3


def test_builtin_without_signature_is_probed_with_call_patterns():
    spec = probe(torch.cumsum, "torch.cumsum", "torch")
    assert isinstance(spec, OpSpec) and spec.call_args == {"dim": -1}


@pytest.mark.parametrize("op, name, call_args, parameter", [
    # a weight sized by the input names the layout constant: re-sizing `features` re-sizes it
    (torch.maximum, "torch.maximum", {"other": "$W"}, "self.maximum_other = nn.Parameter(torch.randn(features))"),
    (torch.mm, "torch.mm", {"mat2": "$M"}, "self.mm_mat2 = nn.Parameter(torch.randn(features, features))"),
])
def test_binary_ops_get_a_learned_operand(op, name, call_args, parameter):
    spec = probe(op, name, "torch")
    assert isinstance(spec, OpSpec) and spec.call_args == call_args
    assert parameter in spec.seed_code
    namespace = {}
    exec(spec.seed_code, namespace)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    assert [n for n, _ in model.named_parameters()] == [name.split(".")[-1] + "_" + next(iter(call_args))]


def test_bounds_are_the_last_call_pattern():
    spec = probe(torch.clamp, "torch.clamp", "torch")
    assert spec.call_args == {"min": 0.25} and "torch.clamp(x, min=0.25)" in spec.seed_code


def test_reduction_to_lower_rank_runs_but_does_not_keep_rank():
    spec = probe(torch.logsumexp, "torch.logsumexp", "torch")
    assert spec.layouts and not spec.keeps_rank


@pytest.mark.parametrize("obj, name, reason", [
    (torch.sort, "torch.sort", "tuple_output"),
    (torch.argmax, "torch.argmax", "non_float_output"),
    (nn.Bilinear, "torch.nn.Bilinear", "unknown_required_arg"),
    (nn.MultiheadAttention, "torch.nn.MultiheadAttention", "multiple_inputs"),
    (torch.ravel, "torch.ravel", "view_only"),
])
def test_ops_that_cannot_be_tasks_are_listed_with_a_reason(obj, name, reason):
    result = probe(obj, name, "torch")
    assert isinstance(result, SkippedOp) and result.reason == reason


def test_an_op_whose_output_ignores_its_input_is_listed_as_input_independent():
    result = probe(torch.fill, "torch.fill", "torch", {"value": 0.5})  # the recipe OpInfo supplies
    assert isinstance(result, SkippedOp) and result.reason == "input_independent"
    assert isinstance(probe(torch.floor, "torch.floor", "torch"), OpSpec)  # constant on [0, 1) alone


def test_torch_crawl_covers_modules_functional_and_tensor_ops(torch_catalog):
    specs, skipped = torch_catalog
    names = {spec.name for spec in specs}
    assert {"torch.nn.Conv2d", "torch.nn.functional.gelu", "torch.cumsum"} <= names
    assert len(specs) >= 150
    assert names.isdisjoint(s.name for s in skipped)
    assert all(spec.seed_code for spec in specs)


@pytest.mark.parametrize("name, identity, recipe", [
    ("nn.functional.pixel_shuffle", {"upscale_factor": 1}, {"upscale_factor": 3}),
    ("nn.functional.softshrink", {"lambd": 0.0}, {"lambd": 0.5}),
    ("diff", {"__args__": [0, 0, None, None]}, {"__args__": [1, 0, None, None]}),
])
def test_an_opinfo_sample_that_returns_its_input_is_passed_over(name, identity, recipe):
    """OpInfo's first sample of pixel_shuffle has a factor of 1: every task built on it moved
    no element. The next sample that computes something is the recipe."""
    from torch.testing._internal.common_methods_invocations import op_db

    from operators.sources import _resolve, _sample_recipe
    info = next(info for info in op_db if info.name == name)
    assert _sample_recipe(info, lambda x, *args, **kwargs: x) is None  # an op that is the identity on every sample
    assert _sample_recipe(info, _resolve("torch." + name)) == recipe != identity


def test_the_torch_catalog_binds_no_op_as_an_identity(torch_catalog):
    names = {spec.name for spec in torch_catalog[0]}
    assert "torch.nn.PixelShuffle" in names and "torch.nn.functional.pixel_shuffle" not in names


def test_opinfo_samples_supply_arguments_that_signature_probing_cannot(torch_catalog):
    specs = {spec.name: spec for spec in torch_catalog[0]}
    roll = specs["torch.roll"]
    assert roll.call_args.get("__args__") and "torch.roll(x, " in roll.seed_code
    namespace = {}
    exec(roll.seed_code, namespace)
    namespace["Model"](*namespace["get_init_inputs"]())(*namespace["get_inputs"]())
    assert len(specs) >= 300 and any(name.startswith("torch.special.") for name in specs)
