"""Re-sizing: scale a task's module-level size constant (libcst), keeping everything else."""
from __future__ import annotations

import libcst as cst

RESIZE_CONSTANT = "batch_size"


class NotResizable(ValueError):
    """The task has no integer `batch_size` constant at module level."""


def scale_constant(code: str, factor: float, name: str = RESIZE_CONSTANT) -> tuple[str, int, int]:
    """Return (new code, old value, new value) with `name = <int>` multiplied by `factor`."""
    module = cst.parse_module(code)
    finder = _ConstantValue(name)
    module.visit(finder)
    if finder.value is None:
        raise NotResizable(f"no module-level integer constant {name!r} to scale")
    new_value = max(1, round(finder.value * factor))
    return module.visit(_SetConstant(name, new_value)).code, finder.value, new_value


def with_constant(code: str, value: int, name: str = RESIZE_CONSTANT) -> str:
    """`code` with `name = <int>` set to `value` (a task the checks re-sized, rebuilt from its
    original code and the batch size they chose)."""
    return cst.parse_module(code).visit(_SetConstant(name, value)).code


def _is_constant(node: cst.SimpleStatementLine, name: str) -> cst.Assign | None:
    statement = node.body[0] if len(node.body) == 1 else None
    if (isinstance(statement, cst.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0].target, cst.Name)
            and statement.targets[0].target.value == name and isinstance(statement.value, cst.Integer)):
        return statement
    return None


class _ConstantValue(cst.CSTVisitor):
    def __init__(self, name: str):
        self.name, self.value = name, None

    def visit_Module(self, node: cst.Module) -> bool:
        for statement in node.body:
            if isinstance(statement, cst.SimpleStatementLine) and (assign := _is_constant(statement, self.name)):
                self.value = int(assign.value.value)
        return False


class _SetConstant(cst.CSTTransformer):
    def __init__(self, name: str, value: int):
        self.name, self.value = name, value

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body = []
        for statement in updated.body:
            if isinstance(statement, cst.SimpleStatementLine) and (assign := _is_constant(statement, self.name)):
                statement = statement.with_changes(body=[assign.with_changes(value=cst.Integer(str(self.value)))])
            body.append(statement)
        return updated.with_changes(body=body)
