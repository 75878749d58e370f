"""Render a chain of bound operators as one task in the KernelBench format (docs/architecture.md).

A seed task is a chain of one op; the template composer renders chains of up to five.
"""
from __future__ import annotations

import ast
import functools
import re
import warnings
from dataclasses import dataclass, field

import torch

from operators.layouts import Layout, Weight, resolve
from operators.records import MODULE, OpSpec
from operators.roles import needs_conditioned_matrix

HEADER_IMPORTS = ("import torch", "import torch.nn as nn", "import torch.nn.functional as F")
ALIASES = (("torch.nn.functional.", "F."), ("torch.nn.", "nn."), ("torch.", "torch."))
COMPUTED = "$="  # a call argument computed from the chain's tensor: "$=position_ids(x)"


@dataclass(frozen=True)
class BoundOp:
    """An op with its recipe resolved to literal arguments for one place in a chain."""

    spec: OpSpec
    init_kwargs: dict = field(default_factory=dict)
    call_kwargs: dict = field(default_factory=dict)


def bind(spec: OpSpec, layout: Layout, shape: tuple[int, ...]) -> BoundOp:
    """Resolve the op's recipe against the shape of the tensor it will receive."""
    def literal(value):
        if isinstance(value, (tuple, list)):
            return tuple(literal(v) for v in value)
        return resolve(value, shape, layout.channel_axis)

    init_kwargs = {key: literal(value) for key, value in spec.init_args.items()}
    call_kwargs = {key: literal(value) for key, value in spec.call_args.items()}
    return BoundOp(spec, init_kwargs, call_kwargs)


MAX_STATE_ELEMENTS = 1 << 27  # parameters and buffers (512 MB in float32): a larger chain is never built


class ChainTooLarge(ValueError):
    """The chain's weights are past MAX_STATE_ELEMENTS: too large to probe or to make a task of."""


def chain_output(chain: list[BoundOp], layout: Layout, shape: tuple[int, ...], device: str | None = None,
                 input_seed: int | None = None):
    """Build and run the task the chain renders to, on shape-only tensors (the meta device),
    falling back to real CPU tensors for ops without a meta kernel. The code is our own
    rendering of crawled ops, never candidate code. Returns what Model.forward returns.
    With `input_seed` (real tensors), the weights are seeded alike and the inputs by it.
    Raises ChainTooLarge before the CPU fallback would allocate weights past the bound."""
    code = render_task(chain, layout, shape)
    if device is not None:
        return _run_task(code, torch.device(device), input_seed)
    try:
        model, inputs = _build_task(code, torch.device("meta"))
    except (NotImplementedError, RuntimeError):  # an __init__ that reads values (.item()) builds on the CPU only
        return _run_task(code, torch.device("cpu"))
    try:
        return _forward(model, inputs, torch.device("meta"))
    except (NotImplementedError, RuntimeError):  # a forward without a meta kernel (RNNs in torch 2.11)
        return _run_task(code, torch.device("cpu"))


def _run_task(code: str, device: torch.device, input_seed: int | None = None):
    model, inputs = _build_task(code, device, input_seed)
    return _forward(model, inputs, device)


def _forward(model, inputs: list, device: torch.device):
    with torch.device(device), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(*inputs)


def _build_task(code: str, device: torch.device, input_seed: int | None = None):
    namespace = {"__name__": "opsynth_chain"}
    with torch.device(device), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, "<chain>", "exec"), namespace)
        if input_seed is not None:
            torch.manual_seed(0)
        model = namespace["Model"](*namespace["get_init_inputs"]())
        state = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
        if state > MAX_STATE_ELEMENTS:
            raise ChainTooLarge(f"the chain's weights hold {state:,} elements (at most {MAX_STATE_ELEMENTS:,})")
        if input_seed is not None:
            torch.manual_seed(input_seed)
        return model, namespace["get_inputs"]()


def call_path(spec: OpSpec) -> str:
    """How the task source spells the op: nn.Conv2d, F.gelu, torch.cumsum, pkg.mod.op, or the
    class name of an op whose definitions travel with the task."""
    if spec.definitions:
        return spec.name.rsplit(".", 1)[-1]
    for prefix, alias in ALIASES:
        if spec.name.startswith(prefix):
            return alias + spec.name[len(prefix):]
    return spec.name


def extra_import(spec: OpSpec) -> str | None:
    if spec.name.startswith("torch.") or spec.definitions:
        return None
    return f"import {spec.name.rsplit('.', 1)[0]}"


def library_ops(specs) -> frozenset[str]:
    """The ops, by dotted name, that tasks built from these specs reach in a library other
    than torch: the static check lets a task import their modules and use exactly them."""
    return frozenset(spec.name for spec in specs if extra_import(spec))


def render_task(chain: list[BoundOp], layout: Layout, sizes: tuple[int, ...]) -> str:
    """The chain as a task whose inputs have `sizes`. A constructor argument, call argument or
    weight that the recipe sized from the input (`$C`, `$L`, `$W`, `$M`) names the layout's
    constant (`linear_in_features = features`), so that re-sizing a layout constant re-sizes
    the model with it (filters/checks/measure/resize.py)."""
    slugs = _unique_slugs(chain)
    dims = _DimNames(layout, sizes)
    init_constants = [
        (f"{slug}_{param}", dims.source(value, bound.spec.init_args.get(param)))
        for slug, bound in zip(slugs, chain)
        if bound.spec.kind == MODULE
        for param, value in bound.init_kwargs.items()
    ]
    lines = _header(chain)
    definitions = merge_definitions([bound.spec for bound in chain])
    if definitions:
        lines += [definitions, "", ""]
    lines += [f"{dim} = {size}" for dim, size in zip(layout.dims, sizes)]
    lines += [f"{name} = {source}" for name, source in init_constants]
    lines += ["", "", *_model_class(chain, slugs, [name for name, _ in init_constants], dims)]
    lines += ["", "", "def get_inputs():", f"    return [{_input_builder(chain, layout, sizes)}]"]
    lines += ["", "", "def get_init_inputs():", f"    return [{', '.join(name for name, _ in init_constants)}]"]
    return "\n".join(lines) + "\n"


class _DimNames:
    """How the task spells a value its recipe sized from the input: the name of the layout
    constant of that size, on the axis the recipe reads (`$C` the channels, `$L` the last),
    else the literal (an input of another shape, after a pooling or a flatten)."""

    def __init__(self, layout: Layout, sizes: tuple[int, ...]):
        self.layout, self.sizes = layout, tuple(sizes)

    def source(self, value, recipe) -> str:
        if isinstance(value, (tuple, list)) and isinstance(recipe, (tuple, list)) and len(value) == len(recipe):
            items = [self.source(v, r) for v, r in zip(value, recipe)]
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        if isinstance(value, Weight):
            return ", ".join(self.source(side, "$L") for side in value.shape)
        name = self._name(value, recipe)
        return name if name is not None else repr(value)

    def _name(self, value, recipe) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or recipe not in ("$C", "$L"):
            return None
        axis = self.layout.channel_axis if recipe == "$C" and len(self.sizes) > self.layout.channel_axis else -1
        return self.layout.dims[axis] if self.sizes[axis] == value else None


def _input_builder(chain: list[BoundOp], layout: Layout, sizes: tuple[int, ...]) -> str:
    """torch.rand over the layout; I + rand / n when the chain starts by inverting, factoring
    or exponentiating square matrices (operators/roles.py says why)."""
    uniform = f"torch.rand({', '.join(layout.dims)})"
    if chain and needs_conditioned_matrix(chain[0].spec.name) and len(sizes) >= 2 and sizes[-1] == sizes[-2]:
        side = layout.dims[-1]
        return f"torch.eye({side}) + {uniform} / {side}"
    return uniform


def _header(chain: list[BoundOp]) -> list[str]:
    extra = sorted({imp for b in chain if (imp := extra_import(b.spec))})
    return [*HEADER_IMPORTS, *extra, ""]


def _model_class(chain: list[BoundOp], slugs: list[str], init_params: list[str], dims: _DimNames) -> list[str]:
    summary = " -> ".join(b.spec.name for b in chain)
    lines = [
        "class Model(nn.Module):",
        f'    """{summary}"""',
        "",
        f"    def __init__(self{''.join(', ' + p for p in init_params)}):",
        "        super().__init__()",
    ]
    for slug, bound in zip(slugs, chain):
        if bound.spec.kind == MODULE:
            args = ", ".join(f"{param}={slug}_{param}" for param in bound.init_kwargs)
            lines.append(f"        self.{slug} = {call_path(bound.spec)}({args})")
        for key, value in bound.call_kwargs.items():
            if isinstance(value, Weight):
                lines.append(f"        self.{slug}_{key} = nn.Parameter(torch.randn({dims.source(value, None)}))")
    lines += ["", "    def forward(self, x):"]
    for slug, bound in zip(slugs, chain):
        lines.append(f"        x = {_call_expr(slug, bound, dims)}")
    lines.append("        return x")
    return lines


def _call_expr(slug: str, bound: BoundOp, dims: _DimNames) -> str:
    kwargs, recipes = dict(bound.call_kwargs), bound.spec.call_args
    first = f"{kwargs.pop('__input__')}=x" if "__input__" in kwargs else "x"
    positional = "".join(f", {dims.source(value, recipe)}"
                         for value, recipe in zip(kwargs.pop("__args__", ()), _padded(recipes.get("__args__", ()))))
    keywords = "".join(f", {key}={_argument_source(value, f'self.{slug}_{key}', dims, recipes.get(key))}"
                       for key, value in kwargs.items())
    callee = f"self.{slug}" if bound.spec.kind == MODULE else call_path(bound.spec)
    item = f"[{bound.spec.output_item}]" if bound.spec.output_item is not None else ""
    return f"{callee}({first}{positional}{keywords}){item}"


def _argument_source(value, weight_attribute: str, dims: _DimNames, recipe) -> str:
    if isinstance(value, Weight):
        return weight_attribute
    if isinstance(value, str) and value.startswith(COMPUTED):
        return value[len(COMPUTED):]
    return dims.source(value, recipe)


def _padded(recipes):
    """Positional recipes, then None for ever: a recipe list shorter than its values names no size."""
    yield from recipes if isinstance(recipes, (tuple, list)) else ()
    while True:
        yield None


def merge_definitions(specs: list[OpSpec]) -> str:
    """The definitions of every op in a chain as one block: imports first, each top-level
    name once. Two ops defining one name differently cannot share a task (ValueError)."""
    imports, definitions = [], {}
    for spec in specs:
        for name, text in _statements(spec.definitions):
            if name is None:
                if text not in imports and text not in HEADER_IMPORTS:
                    imports.append(text)
                continue
            if definitions.setdefault(name, text) != text:
                raise ValueError(f"{name} is defined differently by two ops of the chain")
    if not imports and not definitions:
        return ""
    return "\n".join(imports) + ("\n\n\n" if imports else "") + "\n\n\n".join(definitions.values())


@functools.lru_cache(maxsize=4096)
def _statements(definitions: str) -> tuple[tuple[str | None, str], ...]:
    """The top-level statements of an op's definitions as (name it defines, source text);
    imports have no name. Cached: the composer renders the same ops over and over."""
    source = definitions.splitlines()
    statements = []
    for node in ast.parse(definitions).body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        text = "\n".join(source[first - 1:node.end_lineno])
        is_import = isinstance(node, (ast.Import, ast.ImportFrom))
        statements.append((None if is_import else _defined_name(node), text))
    return tuple(statements)


def _defined_name(node: ast.stmt) -> str:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
        return node.name
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return ast.unparse(node)


def _unique_slugs(chain: list[BoundOp]) -> list[str]:
    slugs, seen = [], {}
    for bound in chain:
        base = re.sub(r"[^a-z0-9]+", "_", bound.spec.name.rsplit(".", 1)[-1].lower()).strip("_") or "op"
        seen[base] = seen.get(base, 0) + 1
        slugs.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
    return slugs
