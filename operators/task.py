"""Render a chain of bound operators as one task in the KernelBench format (DESIGN.md).

A seed task is a chain of one op; the template composer renders chains of up to five.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import re
import warnings
from dataclasses import dataclass, field

import torch

from operators.layouts import Layout, resolve
from operators.records import MODULE, OpSpec

HEADER_IMPORTS = ("import torch", "import torch.nn as nn", "import torch.nn.functional as F")
ALIASES = (("torch.nn.functional.", "F."), ("torch.nn.", "nn."), ("torch.", "torch."))


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


def load_op(op_name: str):
    """Import the object an OpSpec name points at (torch.nn.Conv2d, torch.cumsum, pkg.mod.op)."""
    module_path, _, attr = op_name.rpartition(".")
    return getattr(importlib.import_module(module_path), attr)


def chain_output(chain: list[BoundOp], shape: tuple[int, ...]) -> torch.Tensor:
    """Run a chain on shape-only tensors (the meta device), falling back to real CPU tensors
    for ops without a meta kernel. Only our own crawled ops run here, never candidate code."""
    try:
        return _run_chain(chain, shape, torch.device("meta"))
    except (NotImplementedError, RuntimeError):
        return _run_chain(chain, shape, torch.device("cpu"))


def _run_chain(chain, shape, device):
    with torch.device(device), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = torch.rand(shape) if device.type != "meta" else torch.empty(shape)
        for bound in chain:
            op = load_op(bound.spec.name)
            if bound.spec.kind == MODULE:
                op = op(**bound.init_kwargs).eval()
            kwargs = dict(bound.call_kwargs)
            x = op(x, *kwargs.pop("__args__", ()), **kwargs)
    return x


def call_path(op_name: str) -> str:
    """How the task source spells the op: nn.Conv2d, F.gelu, torch.cumsum, pkg.mod.op."""
    for prefix, alias in ALIASES:
        if op_name.startswith(prefix):
            return alias + op_name[len(prefix):]
    return op_name


def extra_import(op_name: str) -> str | None:
    if op_name.startswith("torch."):
        return None
    return f"import {op_name.rsplit('.', 1)[0]}"


def render_task(chain: list[BoundOp], layout: Layout, sizes: tuple[int, ...]) -> str:
    slugs = _unique_slugs(chain)
    init_constants = [
        (f"{slug}_{param}", value)
        for slug, bound in zip(slugs, chain)
        if bound.spec.kind == MODULE
        for param, value in bound.init_kwargs.items()
    ]
    lines = _header(chain)
    lines += [f"{dim} = {size}" for dim, size in zip(layout.dims, sizes)]
    lines += [f"{name} = {value!r}" for name, value in init_constants]
    lines += ["", "", *_model_class(chain, slugs, [name for name, _ in init_constants])]
    lines += ["", "", "def get_inputs():", f"    return [torch.rand({', '.join(layout.dims)})]"]
    lines += ["", "", "def get_init_inputs():", f"    return [{', '.join(name for name, _ in init_constants)}]"]
    return "\n".join(lines) + "\n"


def _header(chain: list[BoundOp]) -> list[str]:
    extra = sorted({imp for b in chain if (imp := extra_import(b.spec.name))})
    return [*HEADER_IMPORTS, *extra, ""]


def _model_class(chain: list[BoundOp], slugs: list[str], init_params: list[str]) -> list[str]:
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
            lines.append(f"        self.{slug} = {call_path(bound.spec.name)}({args})")
    lines += ["", "    def forward(self, x):"]
    for slug, bound in zip(slugs, chain):
        lines.append(f"        x = {_call_expr(slug, bound)}")
    lines.append("        return x")
    return lines


def _call_expr(slug: str, bound: BoundOp) -> str:
    positional = "".join(f", {value!r}" for value in bound.call_kwargs.get("__args__", ()))
    kwargs = positional + "".join(f", {key}={value!r}" for key, value in bound.call_kwargs.items() if key != "__args__")
    if bound.spec.kind == MODULE:
        return f"self.{slug}(x{kwargs})"
    return f"{call_path(bound.spec.name)}(x{kwargs})"


def _unique_slugs(chain: list[BoundOp]) -> list[str]:
    slugs, seen = [], {}
    for bound in chain:
        base = re.sub(r"[^a-z0-9]+", "_", bound.spec.name.rsplit(".", 1)[-1].lower()).strip("_") or "op"
        seen[base] = seen.get(base, 0) + 1
        slugs.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
    return slugs


def normalized_code(code: str) -> str:
    """The code with comments, docstrings and formatting taken out: what a task *is*."""
    tree = ast.parse(code)
    drop_docstrings(tree)
    return ast.unparse(tree)


def drop_docstrings(tree: ast.AST) -> None:
    """Remove every module, class and function docstring from `tree`, in place."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]


def task_id(code: str) -> str:
    return hashlib.sha256(normalized_code(code).encode()).hexdigest()[:16]


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
