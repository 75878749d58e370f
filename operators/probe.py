"""Signature probing: make an operator run on each input layout, or say why it cannot.

A module's required constructor arguments and a function's required arguments are filled
from name recipes (`in_features` -> the input's last dimension, `kernel_size` -> 3, ...);
builtins without a signature are tried with a few call patterns. An op is kept for a
layout when it returns one floating tensor that is not a view of its input.
"""
from __future__ import annotations

import inspect
import json
import warnings

import torch
import torch.nn as nn

from filters.grammar.allowlist import allowlist
from operators.exclusions import exclusion_reason
from operators.layouts import LAYOUTS, Weight, layouts_for, resolve
from operators.records import FUNCTION, MODULE, InlinedOp, OpSpec, SkippedOp
from operators.task import BoundOp, bind, chain_output, render_task

ARG_RECIPES = {
    "in_features": "$L", "out_features": "$L", "normalized_shape": "$L",
    "num_features": "$C", "in_channels": "$C", "out_channels": "$C", "num_channels": "$C",
    "embed_dim": "$L", "d_model": "$L", "hidden_size": "$L", "input_size": "$L",
    "kernel_size": 3, "num_groups": 4, "num_heads": 4, "nhead": 4, "groups": 2,
    "output_size": 4, "upscale_factor": 2, "downscale_factor": 2, "size": 3,
    "lambd": 0.5, "threshold": 0.1, "value": 0.0, "padding": 1, "pad": (1, 1),
    "norm_type": 2.0, "dim": -1, "other": "$W", "end": "$W", "mat2": "$M",
}
# Optional arguments whose default is unusable in a task (`dim=None` warns and guesses).
OPTIONAL_OVERRIDES = {"dim": -1}
# Call patterns for builtins that expose no signature, tried in order: unary, reductions,
# binary ops with a learned operand (a vector or a square matrix), then bounds.
BUILTIN_PATTERNS = ({}, {"dim": -1}, {"other": "$W"}, {"other": "$M"}, {"mat2": "$M"}, {"weight": "$M"},
                    {"weight": "$W"}, {"exponent": "$W"}, {"end": "$W", "weight": 0.5}, {"min": 0.25},
                    {"max": 0.75})
PROBE_SIZES = {"features": (2, 64), "sequence": (2, 16, 64), "signal": (2, 16, 32),
               "image": (2, 16, 16, 16), "volume": (2, 8, 8, 8, 8)}
TENSOR_PARAM_NAMES = {"input", "x", "self", "tensor", "a", "A"}


class ProbeFailure(Exception):
    """The op ran (or failed to) in a way that rules it out; args[0] is the reason code."""

    @classmethod
    def crashed(cls, error: Exception) -> "ProbeFailure":
        return cls("probe_failed", f"{type(error).__name__}: {str(error)[:200]}")

    def code_and_detail(self) -> tuple[str, str]:
        return self.args[0], self.args[1] if len(self.args) > 1 else ""


def probe(obj, name: str, library: str, recipe: dict | None = None) -> OpSpec | SkippedOp:
    """`recipe`, when a source knows working call arguments, is tried instead of probing."""
    kind = MODULE if isinstance(obj, type) else FUNCTION
    reason = exclusion_reason(name)
    if reason:
        return SkippedOp(name, library, kind, reason)
    try:
        if recipe is not None:
            json.dumps(recipe)  # recipes are stored as JSON
            recipes = [recipe]
        else:
            recipes = module_recipes(obj) if kind == MODULE else function_recipes(obj)
    except ProbeFailure as failure:
        return SkippedOp(name, library, kind, *failure.code_and_detail())
    except TypeError as error:
        return SkippedOp(name, library, kind, "unstorable_args", str(error)[:200])
    spec = None
    failures = []
    for recipe in recipes:
        spec, failure = _probe_layouts(obj, name, library, kind, recipe)
        if spec and library == "torch" and allowlist().name_of(obj) is None:  # torch.nn.SyncBatchNorm
            return SkippedOp(name, library, kind, "not_allowed", "runs, but is not on the grammar's allowlist, so "
                                                                 "no task may name it (filters/grammar/allowlist.py)")
        if spec:
            return spec
        failures.append(failure)
    code, detail = _most_telling(failures)
    return SkippedOp(name, library, kind, code, detail)


def probe_inlined(op: InlinedOp) -> OpSpec | SkippedOp:
    """Run an inlined library class, as the seed task it renders to, on each of its layouts
    at a small batch. A tuple output is reduced to its first tensor."""
    spec = OpSpec(op.name, op.library, MODULE, op.layouts, (), op.init_args, op.call_args,
                  definitions=op.definitions)

    def run_on(layout_name):
        nonlocal spec
        layout = LAYOUTS[layout_name]
        shape = (2, *layout.sizes[1:])
        out, other = (_run_inlined(spec, layout, shape, seed) for seed in (1, 2))
        if isinstance(out, (tuple, list)) and spec.output_item is None:
            spec = OpSpec(**{**spec.__dict__, "output_item": 0})
            out, other = out[0], other[0]
        _check_output(out, None)
        _check_input_dependence(out, other)
        return out.dim(), len(shape)

    runs_on, keeps_rank, failures = _layouts_that_run(op.layouts, run_on)
    if not runs_on:
        code, detail = _most_telling(failures)
        return SkippedOp(op.name, op.library, MODULE, code, detail)
    return _with_seed(OpSpec(**{**spec.__dict__, "layouts": tuple(runs_on), "keeps_rank": tuple(keeps_rank)}))


def _run_inlined(spec: OpSpec, layout, shape, input_seed: int):
    try:
        return chain_output([bind(spec, layout, shape)], layout, shape, device="cpu", input_seed=input_seed)
    except Exception as error:  # the library's own code failing on this layout rules it out
        raise ProbeFailure.crashed(error)


def module_recipes(cls) -> list[dict]:
    if not issubclass(cls, nn.Module):
        raise ProbeFailure("not_an_op", "class is not an nn.Module")
    init = inspect.signature(cls.__init__)
    recipe = _fill(list(init.parameters.values())[1:])
    forward_required = [p for p in list(inspect.signature(cls.forward).parameters.values())[1:] if _required(p)]
    if len(forward_required) > 1:
        raise ProbeFailure("multiple_inputs", f"forward needs {[p.name for p in forward_required]}")
    return [recipe]


def function_recipes(fn) -> list[dict]:
    if not callable(fn):
        raise ProbeFailure("not_an_op", "not callable")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [dict(p) for p in BUILTIN_PATTERNS]
    if not params or params[0].name not in TENSOR_PARAM_NAMES:
        raise ProbeFailure("no_tensor_input", f"first parameter is {params[0].name if params else 'missing'}")
    return [_fill(params[1:])]


def _fill(params: list[inspect.Parameter]) -> dict:
    recipe = {}
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if _required(param):
            if param.name not in ARG_RECIPES:
                raise ProbeFailure("unknown_required_arg", param.name)
            recipe[param.name] = ARG_RECIPES[param.name]
        elif param.name in OPTIONAL_OVERRIDES and param.default is None:
            recipe[param.name] = OPTIONAL_OVERRIDES[param.name]
    return recipe


def _required(param: inspect.Parameter) -> bool:
    return param.default is param.empty and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)


def _layouts_that_run(layout_names, run_on) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """Try `run_on(layout) -> (output rank, input rank)` on each layout: the layouts it runs
    on, those of them where it keeps the input's rank, and why the others failed."""
    runs_on, keeps_rank, failures = [], [], []
    for layout_name in layout_names:
        try:
            out_rank, in_rank = run_on(layout_name)
        except ProbeFailure as failure:
            failures.append(failure.code_and_detail())
            continue
        runs_on.append(layout_name)
        if out_rank == in_rank:
            keeps_rank.append(layout_name)
    return runs_on, keeps_rank, failures


def _probe_layouts(obj, name, library, kind, recipe):
    def run_on(layout_name):
        out, x = _run_once(obj, kind, recipe, layout_name)
        return out.dim(), x.dim()

    runs_on, keeps_rank, failures = _layouts_that_run(layouts_for(name), run_on)
    if not runs_on:
        return None, _most_telling(failures)
    init_args, call_args = (recipe, {}) if kind == MODULE else ({}, recipe)
    spec = OpSpec(name, library, kind, tuple(runs_on), tuple(keeps_rank), init_args, call_args)
    return _with_seed(spec), None


def _run_once(obj, kind, recipe, layout_name):
    layout = LAYOUTS[layout_name]
    shape = PROBE_SIZES[layout_name]
    args = {key: _probe_value(resolve(value, shape, layout.channel_axis)) for key, value in recipe.items()}
    positional = args.pop("__args__", ())
    x = torch.rand(shape)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            op = obj(**args).eval() if kind == MODULE else (lambda t: obj(t, *positional, **args))
            out = op(x)
        except Exception as error:  # any failure of a foreign op on this input rules the layout out
            raise ProbeFailure.crashed(error)
        _check_output(out, x)
        # two wide-ranging inputs (signs, magnitudes), so floor or sign of [0, 1) is not mistaken
        try:
            wide, other_wide = op(torch.randn(shape) * 4), op(torch.randn(shape) * 4)
        except Exception:  # an op with a restricted domain: [0, 1) inputs already showed it runs
            return out, x
    _check_input_dependence(wide, other_wide)
    return out, x


def _probe_value(value):
    return torch.randn(value.shape) if isinstance(value, Weight) else value


def _check_input_dependence(out, other) -> None:
    """An op whose output is the same for two random inputs (a rotary table of positions)
    can never make an accepted task."""
    if isinstance(other, torch.Tensor) and out.shape == other.shape and torch.equal(out, other):
        raise ProbeFailure("input_independent", "the same output for two random inputs")


def _check_output(out, x) -> None:
    if not isinstance(out, torch.Tensor):
        raise ProbeFailure("tuple_output" if isinstance(out, (tuple, list)) else "non_tensor_output", type(out).__name__)
    if not out.is_floating_point():
        raise ProbeFailure("non_float_output", str(out.dtype))
    if out.dim() == 0 or out.numel() == 0:
        raise ProbeFailure("scalar_output", f"shape {tuple(out.shape)}")
    if x is not None and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        raise ProbeFailure("view_only", "output shares its storage with the input")


def _with_seed(spec: OpSpec) -> OpSpec:
    """Attach the seed task (the op alone, on its first layout at default sizes) and its output."""
    layout = LAYOUTS[spec.layouts[0]]
    bound = bind(spec, layout, layout.sizes)
    out = _meta_output(bound, layout)
    seed = render_task([bound], layout, layout.sizes)
    return OpSpec(**{**spec.__dict__, "seed_code": seed,
                     "output_shape": tuple(out.shape) if out is not None else (),
                     "output_dtype": str(out.dtype).replace("torch.", "") if out is not None else ""})


def _meta_output(bound: BoundOp, layout):
    try:
        return chain_output([bound], layout, layout.sizes)
    except Exception:  # the seed still goes to the filters, which say why it fails
        return None


def _most_telling(failures: list[tuple[str, str]]) -> tuple[str, str]:
    """Report the most specific failure: an output rule beats a plain crash."""
    for code, detail in failures:
        if code != "probe_failed":
            return code, detail
    return failures[0] if failures else ("probe_failed", "no layout to try")
