"""The static check: decide from the source alone, before any candidate code runs.

Returns None for a task that may go to the sandbox, or (reason, detail) for one that may
not. Reason codes: syntax_error, bad_interface, forbidden_import, forbidden_call,
stochastic_op.
"""
from __future__ import annotations

import ast

ALLOWED_IMPORTS = {"torch", "math", "typing", "numbers", "functools", "itertools", "collections",
                   "dataclasses", "enum", "operator"}
FORBIDDEN_NAMES = {"os", "sys", "subprocess", "socket", "shutil", "pathlib", "io", "ctypes", "importlib",
                   "builtins", "open", "eval", "exec", "compile", "__import__", "globals", "locals", "vars",
                   "getattr", "setattr", "delattr", "breakpoint", "input", "exit", "quit", "memoryview"}
FORBIDDEN_TORCH_ATTRS = {"hub", "save", "load", "ops", "classes", "library", "utils", "cuda", "backends",
                         "multiprocessing", "distributed", "compiler", "set_default_device", "set_default_dtype",
                         "manual_seed", "seed", "use_deterministic_algorithms", "set_num_threads"}
TORCH_ALIASES = {"torch", "nn", "F"}
# Methods on any object that write files or leave torch for a library with file access.
FORBIDDEN_METHODS = {"tofile", "numpy", "dump", "dumps", "from_file", "save", "load", "system", "popen",
                     "share_memory_", "_new_shared_filename"}
ALLOWED_DUNDERS = {"__init__"}
STOCHASTIC_CALLS = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli",
                    "multinomial", "randperm", "normal", "normal_", "uniform_", "exponential_", "geometric_",
                    "cauchy_", "log_normal_", "poisson", "dropout", "dropout1d", "dropout2d", "dropout3d",
                    "alpha_dropout", "feature_alpha_dropout", "rrelu", "gumbel_softmax"}
INTERFACE = {"Model": ast.ClassDef, "get_inputs": ast.FunctionDef, "get_init_inputs": ast.FunctionDef}


def static_check(code: str, extra_imports: frozenset[str] = frozenset()) -> tuple[str, str] | None:
    try:
        tree = ast.parse(code)
    except SyntaxError as error:
        return "syntax_error", f"line {error.lineno}: {error.msg}"
    return (_interface(tree) or _imports(tree, ALLOWED_IMPORTS | set(extra_imports))
            or _forbidden(tree) or _stochastic_forward(tree))


def screen_definitions(code: str) -> tuple[str, str] | None:
    """The static check for library code a crawl inlines into seeds (no task interface yet):
    the same import allowlist, forbidden routes and stochastic-forward rule."""
    tree = ast.parse(code)
    return _imports(tree, ALLOWED_IMPORTS) or _forbidden(tree) or _stochastic_forward(tree)


def _interface(tree: ast.Module):
    defined = {node.name: type(node) for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    missing = [name for name, kind in INTERFACE.items() if defined.get(name) is not kind]
    if missing:
        return "bad_interface", f"the task must define {', '.join(missing)} at module level"
    return None


def _imports(tree: ast.Module, allowed: set[str]):
    for node in ast.walk(tree):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            if name.split(".")[0] not in allowed or (isinstance(node, ast.ImportFrom) and node.level):
                return "forbidden_import", f"line {node.lineno}: import of {name!r} (allowed: {', '.join(sorted(allowed))})"
    return None


def _forbidden(tree: ast.Module):
    local = _local_references(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES and id(node) not in local:
            return "forbidden_call", f"line {node.lineno}: use of {node.id!r}"
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name.startswith("__") and name not in ALLOWED_DUNDERS:
                return "forbidden_call", f"line {node.lineno}: dunder access {name!r}"
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_METHODS:
            return "forbidden_call", f"line {node.lineno}: .{node.attr} reaches the file system or leaves torch"
        if isinstance(node, ast.Attribute) and _torch_root(node) and (
                node.attr in FORBIDDEN_TORCH_ATTRS or node.attr.startswith("_")):
            return "forbidden_call", f"line {node.lineno}: torch API {_dotted(node)!r} reaches outside the task"
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and _torch_root(target):
                    return "forbidden_call", f"line {node.lineno}: assignment to {_dotted(target)!r}"
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            return "forbidden_call", f"line {node.lineno}: global state"
    return None


def _local_references(tree: ast.Module) -> set[int]:
    """Names that refer to a parameter or local variable of their function (`def f(input)`
    reads `input`, not the builtin): the ids of those Name nodes."""
    local = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        args = fn.args
        bound = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
        body = fn.body if isinstance(fn.body, list) else [fn.body]
        names = [n for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)]
        bound |= {n.id for n in names if isinstance(n.ctx, ast.Store)}
        local |= {id(n) for n in names if n.id in bound}
    return local


def _stochastic_forward(tree: ast.Module):
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                    if name in STOCHASTIC_CALLS:
                        return "stochastic_op", f"line {node.lineno}: {name} in forward makes the output random"
    return None


def _torch_root(node: ast.Attribute) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in TORCH_ALIASES


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.append(getattr(node, "id", "?"))
    return ".".join(reversed(parts))
