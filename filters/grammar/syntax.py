"""The small things every pass of the grammar reads a task's syntax tree with."""
from __future__ import annotations

import ast


class Rejected(Exception):
    """A refusal: its reason code, and a detail that names the line and what to write instead."""

    def __init__(self, reason: str, node: ast.AST | None, detail: str):
        line = f"line {node.lineno}: " if node is not None and hasattr(node, "lineno") else ""
        super().__init__(line + detail)
        self.reason = reason


def chain(node: ast.AST) -> tuple[str, str]:
    """(root name, dotted text) of `a.b.c`; the root is '' when it is not a plain name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    root = node.id if isinstance(node, ast.Name) else ""
    return root, ".".join([root or "?", *reversed(parts)])


def target_names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in target_names(element)]
    if isinstance(target, ast.Starred):
        return target_names(target.value)
    return []


def docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def arguments(node: ast.FunctionDef | ast.Lambda) -> list[ast.arg]:
    args = node.args
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, [args.vararg, args.kwarg])]


def position(node: ast.AST | None) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0)) if node is not None else (0, 0)
