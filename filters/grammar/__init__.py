"""The grammar of a task: a pure tensor program, decided from its source alone, before any of
it runs. Three passes, each raising the first refusal it finds:

- policy.py, what a task may reach: every name resolves to an object on the allowlist
  (allowlist.py), whatever its spelling; a module is never a value;
- exec_time.py, what runs when the code is executed: the module's shape, class bodies,
  decorators, default values and annotations hold nothing that runs;
- pure_forward.py, forward and everything it reaches: no state written or kept, no control
  flow on tensor values, no question of how it runs.

`static_check` returns None for a task that may go to the sandbox, or (reason, detail) for one
that may not; the detail says what to write instead. Reason codes: syntax_error,
bad_interface, forbidden_import, forbidden_call, stochastic_op, impure_forward.
docs/sandbox.md says why each rule is there.
"""
from __future__ import annotations

import ast

from filters.grammar.exec_time import ExecTime
from filters.grammar.policy import Policy
from filters.grammar.pure_forward import Purity
from filters.grammar.syntax import Rejected

INTERFACE = {"Model": ast.ClassDef, "get_inputs": ast.FunctionDef, "get_init_inputs": ast.FunctionDef}


def static_check(code: str, library_ops: frozenset[str] = frozenset()) -> tuple[str, str] | None:
    """None, or (reason, detail). `library_ops` are the dotted names of the run's ops from
    added libraries (`kornia.filters.GaussianBlur2d`, operators.task.library_ops): a task may
    import the modules that hold them and use exactly those objects."""
    try:
        tree = ast.parse(code)
    except SyntaxError as error:
        return "syntax_error", f"line {error.lineno}: {error.msg}"
    return _interface(tree) or _check(tree, frozenset(library_ops))


def screen_definitions(code: str) -> tuple[str, str] | None:
    """The static check for library code a crawl inlines into seeds (no task interface yet)."""
    return _check(ast.parse(code), frozenset())


def _interface(tree: ast.Module):
    defined = {node.name: type(node) for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    missing = [name for name, kind in INTERFACE.items() if defined.get(name) is not kind]
    if missing:
        return "bad_interface", f"the task must define {', '.join(missing)} at module level"
    return None


def _check(tree: ast.Module, library_ops: frozenset[str]):
    """What the task may reach first, then what runs when it loads, then forward's purity."""
    try:
        policy = Policy(tree, library_ops)
        policy.check()
        ExecTime(policy).check()
        Purity(policy).check()
    except Rejected as rejected:
        return rejected.reason, str(rejected)
    return None
