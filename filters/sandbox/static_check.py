"""The static check: decide from the source alone, before any candidate code runs.

An allowlist of what a task may reach, not a list of names it may not write:
- imports: torch and its op namespaces (nn, nn.functional, nn.init, fft, linalg, special),
  a few pure stdlib modules, and, of an added op library, the modules that hold the run's
  catalog ops; every alias and from-import is resolved, so `import torch as T; T.hub` is
  `torch.hub`;
- every attribute chain rooted at an import is resolved against the real module: it may pass
  only through allowed namespaces and end at a public object that is not a module (module
  objects are never values), not a denied call, and not something that leaves the run's
  libraries (`dataclasses.builtins`, `torch.os`); nothing private lies past that object
  (`torch.UntypedStorage._new_shared_filename_cpu`);
- of an added library, a chain must end at one of the catalog's ops, exactly: a library's
  other public names are its own business, and one helper is enough to hand a task the
  interpreter (kornia's `LazyLoader("os")`);
- builtins: a safe set; the rest (getattr, eval, open, type, vars, ...) may be neither used nor
  shadowed, and no name an import binds may be bound again;
- no dunder attribute, name or string ("__globals__" is a string too), no dunder method but
  `__init__`, no frame or code object attribute, no metaclass, no global state, no async;
- no private attribute of nn.Module's or a tensor's own (`self._modules`, `self._apply`),
  only the task's own private names;
- no attribute write rooted at a module, and none that replaces a tensor's or an
  nn.Module's own method (`self.t.float = ...`, `self.named_parameters = ...`);
- no stochastic op outside `__init__`, `reset_parameters`, `get_inputs` and
  `get_init_inputs` (helpers called from forward included).

Returns None for a task that may go to the sandbox, or (reason, detail) for one that may
not. Reason codes: syntax_error, bad_interface, forbidden_import, forbidden_call,
stochastic_op.
"""
from __future__ import annotations

import ast
import builtins
import importlib
import re
import types
from functools import lru_cache

import torch

TORCH_NAMESPACES = frozenset({"torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.fft",
                              "torch.linalg", "torch.special", "torch.masked", "torch.nn.utils", "torch.nn.utils.parametrize",
                              "torch.nn.utils.parametrizations"})
STDLIB_MODULES = frozenset({"math", "typing", "numbers", "functools", "itertools", "collections",
                            "collections.abc", "dataclasses", "enum", "operator"})
FUTURE_FEATURES = frozenset({"annotations"})
# Reachable through an allowed namespace, and still denied: files, processes, global state,
# code from strings, dynamic attribute access.
DENIED = frozenset({
    "torch.load", "torch.save", "torch.from_file", "torch.compile", "torch.manual_seed", "torch.seed",
    "torch.initial_seed", "torch.set_rng_state", "torch.get_rng_state", "torch.use_deterministic_algorithms",
    "torch.set_default_device", "torch.set_default_dtype", "torch.set_default_tensor_type", "torch.set_num_threads",
    "torch.set_num_interop_threads", "torch.set_flush_denormal", "torch.set_warn_always", "torch.set_printoptions",
    "torch.set_float32_matmul_precision", "torch.set_deterministic_debug_mode", "torch.set_anomaly_enabled",
    "torch.fork_rng", "torch.typename", "torch.register_module_forward_hook", "torch.nn.utils.stateless",
    "operator.attrgetter", "operator.methodcaller", "dataclasses.make_dataclass", "typing.get_type_hints",
    "typing.ForwardRef", "typing.evaluate_forward_ref", "functools.singledispatch", "functools.singledispatchmethod",
})
# Attribute names denied on any object: files, shared memory, leaving torch, frames and code.
DENIED_ATTRIBUTES = frozenset({
    "tofile", "numpy", "dump", "dumps", "from_file", "save", "load", "system", "popen", "share_memory_",
    "share_memory", "mro", "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "ag_frame", "ag_code",
    "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "tb_next", "co_code", "co_consts",
    "func_globals", "register_module_forward_hook", "register_module_forward_pre_hook",
    "register_module_full_backward_hook", "register_module_buffer_registration_hook",
    "register_module_parameter_registration_hook", "register_module_module_registration_hook",
    "with_traceback", "format_map",
})
SAFE_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "callable", "chr", "complex", "dict", "divmod", "enumerate", "filter", "float",
    "frozenset", "hasattr", "hash", "input", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max",
    "min", "next", "object", "ord", "pow", "print", "property", "range", "repr", "reversed", "round", "set", "slice",
    "sorted", "staticmethod", "classmethod", "str", "sum", "super", "tuple", "zip", "NotImplemented", "Ellipsis",
    "True", "False", "None", "Exception", "ValueError", "TypeError", "RuntimeError", "NotImplementedError",
    "AssertionError", "KeyError", "IndexError", "AttributeError", "ZeroDivisionError", "ArithmeticError",
    "StopIteration", "bytes", "id", "format", "UserWarning", "Warning",
})
DANGEROUS_BUILTINS = frozenset(name for name in dir(builtins) if name not in SAFE_BUILTINS)
ALLOWED_DUNDERS = frozenset({"__init__"})
# Reachable only through a denied namespace, and harmless: what transformers layers ask.
ALLOWED_OBJECTS = frozenset({"torch.jit.is_tracing", "torch.jit.is_scripting", "torch.compiler.is_compiling",
                             "torch.compiler.is_dynamo_compiling"})
# What the task's own code may set on a tensor or module it holds (everything else a tensor
# or nn.Module has is a method the checks call).
SETTABLE = frozenset({"data", "requires_grad", "training", "grad"})
MODULE_OVERRIDABLE = frozenset({"__init__", "forward", "extra_repr", "reset_parameters", "training"})
STOCHASTIC_CALLS = frozenset({
    "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli", "bernoulli_", "multinomial",
    "randperm", "normal", "normal_", "uniform_", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_",
    "poisson", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "rrelu",
    "rrelu_", "gumbel_softmax", "dropout_", "alpha_dropout_", "feature_alpha_dropout_"})
RANDOM_ALLOWED_IN = frozenset({"__init__", "reset_parameters", "_reset_parameters", "get_inputs", "get_init_inputs"})
INTERFACE = {"Model": ast.ClassDef, "get_inputs": ast.FunctionDef, "get_init_inputs": ast.FunctionDef}
DUNDER = re.compile(r"__\w+__")
_MODULE_ATTRIBUTES = frozenset(dir(torch.nn.Module))
_TENSOR_AND_MODULE_ATTRIBUTES = frozenset(dir(torch.Tensor)) | _MODULE_ATTRIBUTES
# what an nn.Module or a tensor keeps under a private name, its instance state included
_PRIVATE_INTERNALS = frozenset(name for name in {*dir(torch.nn.Module()), *dir(torch.empty(0))} if name.startswith("_"))


class Rejected(Exception):
    def __init__(self, reason: str, node: ast.AST | None, detail: str):
        line = f"line {node.lineno}: " if node is not None and hasattr(node, "lineno") else ""
        super().__init__(line + detail)
        self.reason = reason


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
    try:
        _Policy(tree, library_ops).check()
    except Rejected as rejected:
        return rejected.reason, str(rejected)
    return None


class _Policy:
    def __init__(self, tree: ast.Module, library_ops: frozenset[str]):
        self.tree = tree
        self.library_ops = _LibraryOps.of(library_ops)
        self.modules: dict[str, str] = {}  # a name an import binds to a module -> the module's dotted name
        self.objects: dict[str, str] = {}  # a name a from-import binds to an object -> its dotted name
        self.classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        self.parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        # private names the task itself gives a value (`self._scale = ...`, `def _helper`)
        self.own_private = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                            and isinstance(node.ctx, ast.Store)} | {
            node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}

    def check(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._import(node)
        for node in ast.walk(self.tree):
            self._node(node)

    # -- imports ------------------------------------------------------------------------

    def _import(self, node) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.level or not node.module:
                raise Rejected("forbidden_import", node, "relative import")
            if node.module == "__future__":
                if any(alias.name not in FUTURE_FEATURES for alias in node.names):
                    raise Rejected("forbidden_import", node, "only `from __future__ import annotations` is allowed")
                return
            self._allowed_module(node.module, node)
            for alias in node.names:
                if alias.name == "*":
                    raise Rejected("forbidden_import", node, f"`from {node.module} import *`")
                dotted = f"{node.module}.{alias.name}"
                found = _resolve(dotted)
                if isinstance(found, types.ModuleType):
                    self._allowed_module(found.__name__, node)
                    self.modules[alias.asname or alias.name] = found.__name__
                else:
                    self._allowed_object(dotted, found, node)
                    self._library_op(dotted, found, [], node)
                    self.objects[alias.asname or alias.name] = dotted
            return
        for alias in node.names:
            self._allowed_module(alias.name, node)
            if alias.asname:
                self.modules[alias.asname] = alias.name
            else:
                root = alias.name.split(".")[0]
                self.modules[root] = root

    def _allowed_module(self, name: str, node, reached: bool = False) -> None:
        if name in TORCH_NAMESPACES or name in STDLIB_MODULES or name in self.library_ops.modules:
            return
        if reached:
            raise Rejected("forbidden_call", node, f"the module {name!r} is outside the allowed namespaces")
        allowed = sorted(TORCH_NAMESPACES | STDLIB_MODULES | self.library_ops.modules)
        raise Rejected("forbidden_import", node, f"import of {name!r} (allowed: {', '.join(allowed)})")

    def _allowed_object(self, dotted: str, found, node) -> None:
        leaf = dotted.rsplit(".", 1)[-1]
        if dotted in DENIED or leaf in DENIED_ATTRIBUTES:
            raise Rejected("forbidden_call", node, f"{dotted!r} reaches outside the task")
        if leaf.startswith("_"):
            raise Rejected("forbidden_call", node, f"{dotted!r} is private")
        if any(found is getattr(builtins, name, None) for name in DANGEROUS_BUILTINS):
            raise Rejected("forbidden_call", node, f"{dotted!r} is the builtin {found.__name__!r}")
        home = getattr(found, "__module__", None) if callable(found) else None
        if isinstance(home, str) and home.split(".")[0].lstrip("_") not in self._roots() and home != "builtins":
            raise Rejected("forbidden_call", node, f"{dotted!r} comes from {home!r}, outside the allowed libraries")

    def _roots(self) -> set[str]:
        return {"torch", *(m.split(".")[0] for m in STDLIB_MODULES), *self.library_ops.roots}

    def _library_op(self, dotted: str, found, rest: list[str], node) -> None:
        """An object reached through an added library's module is one of the run's ops, and
        the chain ends there: `kornia.filters.GaussianBlur2d`, not `.forward` or `._x`."""
        module = dotted.rsplit(".", 1)[0]
        if module not in self.library_ops.modules or module in TORCH_NAMESPACES or module in STDLIB_MODULES:
            return
        if not self.library_ops.holds(found):
            allowed = sorted(self.library_ops.names)
            raise Rejected("forbidden_call", node, f"{dotted!r} is not one of the run's {len(allowed)} ops from its "
                                                   f"library ({', '.join(allowed[:4])}{', ...' if len(allowed) > 4 else ''})")
        if rest:
            raise Rejected("forbidden_call", node, f"{dotted}.{'.'.join(rest)}: a library op is called, "
                                                   "not looked into")

    # -- every node ---------------------------------------------------------------------

    def _node(self, node: ast.AST) -> None:
        if isinstance(node, (ast.AsyncFunctionDef, ast.AsyncFor, ast.AsyncWith, ast.Await)):
            raise Rejected("forbidden_call", node, "async code")
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            raise Rejected("forbidden_call", node, "global state")
        if isinstance(node, ast.Match):
            raise Rejected("forbidden_call", node, "match statements")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            named = set(DUNDER.findall(node.value)) - ALLOWED_DUNDERS
            if named:
                raise Rejected("forbidden_call", node, f"dunder name in a string ({sorted(named)[0]})")
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            self._definition(node)
        elif isinstance(node, ast.Name):
            self._name(node)
        elif isinstance(node, ast.arg):
            self._binds(node.arg, node)
        elif isinstance(node, ast.alias) and node.asname:
            pass  # bound by the import itself
        elif isinstance(node, ast.Attribute):
            self._attribute(node)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            for target in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                self._store(target)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            self._binds(node.name, node)
        elif isinstance(node, ast.Call):
            self._stochastic(node)

    def _definition(self, node) -> None:
        if node.name.startswith("__") and node.name not in ALLOWED_DUNDERS:
            raise Rejected("forbidden_call", node, f"defines dunder method {node.name!r}")
        self._binds(node.name, node)
        if isinstance(node, ast.ClassDef):
            if node.keywords:
                raise Rejected("forbidden_call", node, "class keywords (a metaclass)")
            for item in node.body:
                names = ([item.name] if isinstance(item, ast.FunctionDef) else
                         [t.id for t in item.targets if isinstance(t, ast.Name)] if isinstance(item, ast.Assign) else [])
                for name in names:
                    if name in _MODULE_ATTRIBUTES and name not in MODULE_OVERRIDABLE:
                        raise Rejected("forbidden_call", item, f"overrides nn.Module.{name}, which the checks call")

    def _binds(self, name: str, node) -> None:
        if name in DANGEROUS_BUILTINS:
            raise Rejected("forbidden_call", node, f"shadows the builtin {name!r}")
        if name in self.modules or name in self.objects:
            raise Rejected("forbidden_call", node, f"rebinds {name!r}, which an import bound")

    def _name(self, node: ast.Name) -> None:
        if DUNDER.fullmatch(node.id):
            raise Rejected("forbidden_call", node, f"use of {node.id!r}")
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._binds(node.id, node)
            return
        if node.id in DANGEROUS_BUILTINS:
            raise Rejected("forbidden_call", node, f"use of {node.id!r}")
        if node.id in self.modules and not isinstance(self.parents.get(node), ast.Attribute):
            raise Rejected("forbidden_call", node, f"the module {self.modules[node.id]!r} used as a value")

    def _attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if attr.startswith("__") and attr not in ALLOWED_DUNDERS:
            raise Rejected("forbidden_call", node, f"dunder access {attr!r}")
        if attr in DENIED_ATTRIBUTES:
            raise Rejected("forbidden_call", node, f".{attr} reaches the file system, the interpreter or leaves torch")
        root, dotted = _chain(node)
        if root in self.modules:
            if isinstance(self.parents.get(node), ast.Attribute):
                return  # checked whole, at the end of the chain
            self._module_chain(self.modules[root] + dotted[len(root):], node)
        elif root in self.objects and not isinstance(self.parents.get(node), ast.Attribute):
            parts = dotted.split(".")[1:]
            self._library_op(self.objects[root], _resolve(self.objects[root]), parts, node)
            if attr.startswith("_") and attr not in ALLOWED_DUNDERS:
                raise Rejected("forbidden_call", node, f"private attribute {attr!r}")
        elif attr.startswith("_") and attr not in ALLOWED_DUNDERS:
            if root not in ("self", "cls", *self.classes):
                raise Rejected("forbidden_call", node, f"private attribute {attr!r}")
            if attr in _PRIVATE_INTERNALS and attr not in self.own_private:
                raise Rejected("forbidden_call", node, f"private attribute {attr!r} of nn.Module or a tensor")

    def _module_chain(self, dotted: str, node) -> None:
        """`torch.nn.functional.relu`: every module on the way allowed, the end not a module."""
        if dotted in ALLOWED_OBJECTS:
            return
        parts = dotted.split(".")
        for end in range(1, len(parts) + 1):
            prefix = ".".join(parts[:end])
            found = _resolve(prefix)
            if isinstance(found, types.ModuleType):
                self._allowed_module(found.__name__, node, reached=True)  # `torch.os` is the module `os`
                if end == len(parts):
                    raise Rejected("forbidden_call", node, f"the module {prefix!r} used as a value")
                continue
            self._allowed_object(prefix, found, node)
            rest = parts[end:]
            self._library_op(prefix, found, rest, node)
            private = [part for part in rest if part.startswith("_") and part not in ALLOWED_DUNDERS]
            if private:
                raise Rejected("forbidden_call", node, f"{dotted!r}: {private[0]!r} is private")
            return  # past a class or function: its attributes are checked by name

    def _store(self, target: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._store(element)
            return
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return
        root, dotted = _chain(target.value if isinstance(target, ast.Subscript) else target)
        if root in self.modules or root in self.objects:
            raise Rejected("forbidden_call", target, f"assignment into {dotted!r}, which an import bound")
        if not isinstance(target, ast.Attribute) or target.attr in SETTABLE:
            return
        on_self = isinstance(target.value, ast.Name) and target.value.id == "self"
        if target.attr in (_MODULE_ATTRIBUTES if on_self else _TENSOR_AND_MODULE_ATTRIBUTES):
            raise Rejected("forbidden_call", target, f"assignment to .{target.attr}, a method the checks call")

    def _stochastic(self, node: ast.Call) -> None:
        func = node.func
        name = (self.objects.get(func.id, func.id) if isinstance(func, ast.Name)
                else func.attr if isinstance(func, ast.Attribute) else "")
        leaf = name.rsplit(".", 1)[-1]
        if leaf in STOCHASTIC_CALLS and self._enclosing_function(node) not in RANDOM_ALLOWED_IN:
            raise Rejected("stochastic_op", node, f"{leaf} outside __init__ and get_inputs makes the output random")

    def _enclosing_function(self, node) -> str | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.Lambda)):
                return getattr(node, "name", "<lambda>")
        return None


class _LibraryOps:
    """The run's ops from added libraries: their names, the objects they name and the
    modules that hold them (every dotted prefix: `kornia`, `kornia.filters`)."""

    def __init__(self, names: frozenset[str]):
        self.names = names
        self.objects = {id(found) for found in map(_resolve, names) if found is not _MISSING}
        self.modules = frozenset(".".join(name.split(".")[:end]) for name in names
                                 for end in range(1, name.count(".") + 1))
        self.roots = frozenset(name.split(".")[0] for name in names)

    @classmethod
    @lru_cache(maxsize=64)
    def of(cls, names: frozenset[str]) -> "_LibraryOps":
        return cls(names)

    def holds(self, found) -> bool:
        return id(found) in self.objects


def _chain(node: ast.AST) -> tuple[str, str]:
    """(root name, dotted text) of `a.b.c`; the root is '' when it is not a plain name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    root = node.id if isinstance(node, ast.Name) else ""
    return root, ".".join([root or "?", *reversed(parts)])


_MISSING = object()


@lru_cache(maxsize=4096)
def _resolve(dotted: str):
    """The object `dotted` names, walking attributes from its root module (a submodule not
    yet imported is imported); _MISSING if there is none."""
    parts = dotted.split(".")
    try:
        found = importlib.import_module(parts[0])
    except Exception:  # not installed, or fails to import: nothing to resolve against
        return _MISSING
    for end, part in enumerate(parts[1:], start=2):
        step = getattr(found, part, _MISSING)
        if step is _MISSING and isinstance(found, types.ModuleType):
            try:
                step = importlib.import_module(".".join(parts[:end]))
            except Exception:
                return _MISSING
        if step is _MISSING:
            return _MISSING
        found = step
    return found
