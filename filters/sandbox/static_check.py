"""The static check: a grammar of pure tensor programs, decided from the source alone.

A task is refused unless it is one: three passes, each raising the first refusal it finds.
- _Policy, what a task may reach: imports of torch's op namespaces, math and the run's library
  ops, every alias and attribute chain resolved on the real modules; no computed attribute
  name (getattr, .format, names built at run time for register_buffer and the like); no
  dunder, frame or private internals; no stochastic op outside __init__ and the input builders;
- _Grammar, the shape of the module: imports, constants, nn.Module classes and plain functions;
- _Purity, forward and everything it reaches: no state written or kept, no control flow on
  tensor values, no questions about how it runs (device, dtype, compiling, storage).
docs/sandbox.md says why each rule is there.

Returns None for a task that may go to the sandbox, or (reason, detail) for one that may
not; the detail says what to write instead. Reason codes: syntax_error, bad_interface,
forbidden_import, forbidden_call, stochastic_op, impure_forward.
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
# No stdlib helper that reaches attributes by name or runs source built from strings
# (functools.update_wrapper, dataclasses, typing, operator.attrgetter, itertools' state):
# math is pure functions of numbers.
STDLIB_MODULES = frozenset({"math"})
FUTURE_FEATURES = frozenset({"annotations"})
# Reachable through an allowed namespace, and still denied: files, processes, global state,
# code from strings, dynamic attribute access.
DENIED = frozenset({
    # returns a module by name (`torch.get_device_module("cuda").os`): found by a red team's
    # call of every allowed function (tests/filters/test_reachable.py now walks call results)
    "torch.get_device_module",
    "torch.load", "torch.save", "torch.from_file", "torch.compile", "torch.manual_seed", "torch.seed",
    "torch.initial_seed", "torch.set_rng_state", "torch.get_rng_state", "torch.use_deterministic_algorithms",
    "torch.set_default_device", "torch.set_default_dtype", "torch.set_default_tensor_type", "torch.set_num_threads",
    "torch.set_num_interop_threads", "torch.set_flush_denormal", "torch.set_warn_always", "torch.set_printoptions",
    "torch.set_float32_matmul_precision", "torch.set_deterministic_debug_mode", "torch.set_anomaly_enabled",
    "torch.fork_rng", "torch.typename", "torch.register_module_forward_hook", "torch.nn.utils.stateless",
    "torch.prepare_multiprocessing_environment",
    # its subscript is getattr on itself with the key: a computed attribute name
    "torch.nn.ParameterDict",
})
# Attribute names denied on any object: files, shared memory, leaving torch, frames and code.
DENIED_ATTRIBUTES = frozenset({
    "tofile", "numpy", "dump", "dumps", "from_file", "save", "load", "system", "popen", "share_memory_",
    "share_memory", "mro", "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "ag_frame", "ag_code",
    "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "tb_next", "co_code", "co_consts",
    "func_globals", "register_module_forward_hook", "register_module_forward_pre_hook",
    "register_module_full_backward_hook", "register_module_buffer_registration_hook",
    "register_module_parameter_registration_hook", "register_module_module_registration_hook",
    "with_traceback",
    # the format mini-language reaches attributes by name ("{0.__globals__}" built at run time)
    "format", "format_map",
    # an nn.Module's members by a dotted name held in a string
    "get_submodule", "get_parameter", "get_buffer", "set_submodule",
    # a Python function called on each element, its result written where no op runs (a red
    # team's `y.map_(h, lambda a, b: b)` copied a layer's output past the trace)
    "apply_", "map_", "map2_",
})
# The random generators' seeds and states: which seed the checks drew from, read by
# `torch.default_generator.initial_seed()`, gated a layer that a trace, drawn otherwise, never saw.
RNG_STATE_ATTRIBUTES = frozenset({
    "default_generator", "default_generators", "initial_seed", "get_state", "set_state", "graphsafe_get_state",
    "graphsafe_set_state", "get_offset", "set_offset", "clone_state", "get_rng_state", "set_rng_state",
    "get_rng_state_all", "set_rng_state_all",
})
SAFE_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "callable", "chr", "complex", "dict", "divmod", "enumerate", "filter", "float",
    "frozenset", "hasattr", "hash", "input", "int", "isinstance", "issubclass", "len", "list", "map", "max",
    "min", "object", "ord", "pow", "print", "property", "range", "repr", "reversed", "round", "set", "slice",
    "sorted", "staticmethod", "classmethod", "str", "sum", "super", "tuple", "zip", "NotImplemented", "Ellipsis",
    "True", "False", "None", "Exception", "ValueError", "TypeError", "RuntimeError", "NotImplementedError",
    "AssertionError", "KeyError", "IndexError", "AttributeError", "ZeroDivisionError", "ArithmeticError",
    "StopIteration", "bytes", "id", "format", "UserWarning", "Warning",
})  # not iter or next: an iterator kept between calls is state
DANGEROUS_BUILTINS = frozenset(name for name in dir(builtins) if name not in SAFE_BUILTINS)
ALLOWED_DUNDERS = frozenset({"__init__"})
# Calls that name an attribute of a module by a string: the name must be written out.
NAME_ARGUMENTS = {"hasattr": (1, "name"), "register_buffer": (0, "name"), "register_parameter": (0, "name"), "add_module": (0, "name"),
                  "register_module": (0, "name"), "weight_norm": (1, "name"), "spectral_norm": (1, "name"),
                  "remove_weight_norm": (1, "name"), "remove_spectral_norm": (1, "name"), "orthogonal": (1, "name"),
                  "register_parametrization": (1, "tensor_name"), "remove_parametrizations": (1, "tensor_name"),
                  "is_parametrized": (1, "tensor_name"), "transfer_parametrizations_and_params": (2, "tensor_name")}
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
    """What the task may reach first, then the shape of the module, then forward's purity."""
    try:
        policy = _Policy(tree, library_ops)
        policy.check()
        _Grammar(policy).check()
        _Purity(policy).check()
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
            self._name_argument(node)

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
        if attr in RNG_STATE_ATTRIBUTES:
            raise Rejected("forbidden_call", node, f".{attr} reads or sets a random generator's seed or state: "
                           "draw with torch.rand/randn instead")
        if attr == "type":
            self._type_method(node)
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
            if root not in self.classes and not (root in ("self", "cls") and self._method_receiver(node, root)):
                raise Rejected("forbidden_call", node, f"private attribute {attr!r}")
            if attr in _PRIVATE_INTERNALS and attr not in self.own_private:
                raise Rejected("forbidden_call", node, f"private attribute {attr!r} of nn.Module or a tensor")

    def _method_receiver(self, node: ast.AST, name: str) -> bool:
        """Whether `name` where `node` reads it is the receiver of a method of the task's own
        class, never rebound: a module-level function's parameter called `self` may be a
        tensor, and a red team reached its storage by `self._typed_storage()`."""
        function = self.parents.get(node)
        while function is not None and not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(function, ast.Lambda) and name in {a.arg for a in ast.walk(function.args)
                                                             if isinstance(a, ast.arg)}:
                return False
            function = self.parents.get(function)
        if function is None or not isinstance(self.parents.get(function), ast.ClassDef) or any(
                isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list):
            return False  # a static method's first parameter is whatever it is given
        positional = [*function.args.posonlyargs, *function.args.args]
        rebound = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del))
                      or isinstance(n, ast.arg) and n.arg == name and n not in positional
                      for n in ast.walk(function))
        return bool(positional) and positional[0].arg == name and not rebound

    def _type_method(self, node: ast.Attribute) -> None:
        """Tensor.type and Storage.type import the dotted name a string gives them; given a
        torch dtype (`.type(torch.float32)`) they convert, as `.to(dtype)` does."""
        call = self.parents.get(node)
        given = call.args + [kw.value for kw in call.keywords] if isinstance(call, ast.Call) and call.func is node else None
        if given is None or not all(isinstance(_resolve(self._dotted(arg)), torch.dtype) for arg in given):
            raise Rejected("forbidden_call", node, ".type() imports what a string names: convert with .to(dtype), "
                                                   "or give .type a torch dtype (x.type(torch.float32))")

    def _dotted(self, node: ast.AST) -> str:
        root, dotted = _chain(node)
        if root in self.modules:
            return self.modules[root] + dotted[len(root):]
        return self.objects[root] + dotted[len(root):] if root in self.objects else "?"

    def _module_chain(self, dotted: str, node) -> None:
        """`torch.nn.functional.relu`: every module on the way allowed, the end not a module."""
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

    def _name_argument(self, node: ast.Call) -> None:
        """`self.register_buffer(name, t)` and the like reach an attribute by the string they
        are given; a name built at run time would be a computed attribute name."""
        leaf = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id if isinstance(
            node.func, ast.Name) else ""
        if leaf not in NAME_ARGUMENTS:
            return
        index, keyword = NAME_ARGUMENTS[leaf]
        given = [kw.value for kw in node.keywords if kw.arg == keyword]
        given += node.args[index:index + 1] if len(node.args) > index else []
        for value in given:
            if not (isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value.isidentifier()
                    and not value.value.startswith("_")):
                raise Rejected("forbidden_call", node, f"{leaf} takes the attribute's name as a string: write it "
                                                       f"out as a public name literal ({leaf}('weight', ...))")

    def _enclosing_function(self, node) -> str | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.Lambda)):
                return getattr(node, "name", "<lambda>")
        return None


# -- the grammar: what the module, its classes and its functions may hold -------------------

CONSTANT_CALLS = frozenset({"int", "float", "min", "max", "abs", "round"})  # of constants, at module level
DECORATORS = frozenset({"staticmethod", "classmethod", "property", "torch.no_grad", "torch.inference_mode"})
ITERATOR_MAKERS = frozenset({"map", "filter", "zip", "enumerate", "reversed"})


class _Grammar:
    """Module level: imports, docstrings, `from __future__ import annotations`, constants
    (numbers, bools, None, tuples of them, arithmetic of them and of earlier constants, and
    lists of them: KernelBench's sizes for get_init_inputs), classes deriving from nn.Module
    and plain functions. Nothing else runs when the task is loaded, so nothing else can hold
    state between calls (and forward may change none of it, _Purity)."""

    def __init__(self, policy: _Policy):
        self.policy = policy
        self.constants: set[str] = set()
        self.classes: set[str] = set()

    def check(self) -> None:
        for statement in self.policy.tree.body:
            if isinstance(statement, (ast.Import, ast.ImportFrom)) or _docstring(statement):
                continue
            if isinstance(statement, ast.Assign):
                self._constant_assignment(statement, self.constants, "module level", lists=True)
            elif isinstance(statement, ast.ClassDef):
                self._class(statement)
            elif isinstance(statement, ast.FunctionDef):
                self._function(statement)
            else:
                raise Rejected("forbidden_call", statement, f"a {type(statement).__name__} statement at module level: "
                               "the module holds only imports, constants, classes and functions; "
                               "build tensors in get_inputs or __init__")
        for node in ast.walk(self.policy.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node not in self.policy.tree.body:
                raise Rejected("forbidden_import", node, "an import inside a definition: import at the top of the file")

    def _constant_assignment(self, node: ast.Assign, known: set[str], where: str, lists: bool = False) -> None:
        if not all(isinstance(t, (ast.Name, ast.Tuple)) for t in node.targets) or not self._constant(
                node.value, known, lists):
            held = "tuples and lists" if lists else "tuples"
            raise Rejected("forbidden_call", node, f"{where} holds only constants (numbers, bools, None, {held} of "
                           "them, and arithmetic of those): build containers and tensors in __init__ or get_inputs")
        known.update(name for target in node.targets for name in _target_names(target))

    def _constant(self, node: ast.AST, known: set[str], lists: bool) -> bool:
        constant = lambda child: self._constant(child, known, lists)  # noqa: E731
        if isinstance(node, ast.Constant):
            return node.value is None or isinstance(node.value, (bool, int, float, complex))
        if isinstance(node, ast.Name):
            return node.id in known
        if isinstance(node, ast.UnaryOp):
            return constant(node.operand)
        if isinstance(node, ast.BinOp):
            return constant(node.left) and constant(node.right)
        if isinstance(node, ast.Tuple) or isinstance(node, ast.List) and lists:
            return all(map(constant, node.elts))
        if isinstance(node, ast.Attribute):  # math.pi
            return self._dotted(node).startswith("math.")
        if isinstance(node, ast.Call) and not node.keywords:
            callee = node.func.id if isinstance(node.func, ast.Name) else self._dotted(node.func)
            return (callee in CONSTANT_CALLS or callee.startswith("math.")) and all(map(constant, node.args))
        return False

    def _dotted(self, node: ast.AST) -> str:
        root, dotted = _chain(node)
        if root in self.policy.modules:
            return self.policy.modules[root] + dotted[len(root):]
        if root in self.policy.objects:
            return self.policy.objects[root] + dotted[len(root):]
        return dotted

    def _class(self, node: ast.ClassDef) -> None:
        if node.decorator_list:
            raise Rejected("forbidden_call", node, f"class {node.name} is decorated: write a plain class")
        for base in node.bases:
            if not (isinstance(base, ast.Name) and base.id in self.classes or self._module_class(base)):
                raise Rejected("forbidden_call", node, f"class {node.name} must derive from nn.Module "
                               "(or from a class the task defined before it)")
        self.classes.add(node.name)
        if not node.bases:
            raise Rejected("forbidden_call", node, f"class {node.name} must derive from nn.Module")
        attributes = set(self.constants)
        for item in node.body:
            if _docstring(item) or isinstance(item, ast.Pass):
                continue
            if isinstance(item, ast.Assign):
                self._constant_assignment(item, attributes, f"the body of class {node.name}")
            elif isinstance(item, ast.FunctionDef):
                self._function(item)
            else:
                raise Rejected("forbidden_call", item, f"class {node.name} holds only methods and constants")

    def _module_class(self, base: ast.AST) -> bool:
        found = _resolve(self._dotted(base)) if isinstance(base, (ast.Name, ast.Attribute)) else _MISSING
        return isinstance(found, type) and issubclass(found, torch.nn.Module) and found.__module__.startswith("torch.")

    def _function(self, node: ast.FunctionDef) -> None:
        for decorator in node.decorator_list:
            if self._dotted(decorator.func if isinstance(decorator, ast.Call) else decorator) not in DECORATORS:
                raise Rejected("forbidden_call", decorator, f"{node.name} is decorated: only staticmethod, "
                               "classmethod, property and torch.no_grad() are allowed")


def _docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _target_names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple):
        return [name for element in target.elts for name in _target_names(element)]
    return []


# -- forward is a pure function -------------------------------------------------------------

# Methods that change their receiver in place (a tensor's `*_` methods are found by name;
# set.add and list.sort are not here: Tensor.add and Tensor.sort return new tensors).
MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem",
                      "discard", "reverse", "register_buffer", "register_parameter", "add_module",
                      "register_module", "train", "eval", "apply", "requires_grad_", "zero_grad", "load_state_dict",
                      "set_extra_state", "register_forward_hook", "register_forward_pre_hook",
                      "register_full_backward_hook", "register_full_backward_pre_hook", "register_hook", "set_",
                      "resize_", "resize_as_"})
_TENSOR_METHODS = frozenset(dir(torch.Tensor))
# Asking how the code runs rather than computing: the answer differs between eager, compiled,
# traced and meta runs, and a task could behave only while it is checked.
INTROSPECTION = frozenset({
    "data_ptr", "storage", "untyped_storage", "storage_offset", "get_device", "requires_grad", "grad_fn",
    "element_size", "itemsize", "nbytes", "are_deterministic_algorithms_enabled", "get_num_threads",
    "get_default_device", "get_autocast_dtype", "get_autocast_gpu_dtype", "get_autocast_cpu_dtype", "_version",
    "is_deterministic_algorithms_warn_only_enabled", "device_count", "current_device"})
# torch's own `is_*` questions (x.is_cuda, torch.is_grad_enabled, x.is_floating_point, ...); a
# layer's own `self.is_causal` is its config
INTROSPECTION |= frozenset(name for name in {*dir(torch), *dir(torch.Tensor), *dir(torch.nn.Module)}
                           if name.startswith("is_") and name != "is_same_size")
PASSED_ON = frozenset({"device", "dtype"})  # may be passed to a call, never inspected or branched on
DATA_TO_PYTHON = frozenset({"item", "tolist"})
# Builtins that turn a tensor into a Python number, bool or text (a red team printed a layer's
# output and parsed it back; another took its elements out with float()): given anything
# but constants, config and shapes, they are refused in forward, as .item() is.
VALUES_TO_PYTHON = frozenset({"float", "int", "bool", "complex", "round", "str", "repr", "format", "print", "bytes",
                              "all", "any", "min", "max", "sorted", "divmod", "chr", "ord", "hash"})
SHAPE_ATTRIBUTES = frozenset({"shape", "ndim"})
SHAPE_METHODS = frozenset({"size", "dim", "numel", "ndimension", "nelement"})
CLEAN_CALLS = frozenset({"hasattr", "len", "int", "float", "min", "max", "abs", "round", "tuple", "list", "range", "sum", "divmod",
                         "pow", "all", "any", "bool", "sorted", "reversed", "enumerate", "zip"})
TENSOR_VALUED = frozenset({"weight", "bias", "data", "grad", "T", "mT", "H", "mH", "real", "imag"})
# Methods that return a view or the same object: what they return belongs to their receiver.
ALIASING = frozenset({"view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t", "squeeze", "unsqueeze",
                      "expand", "expand_as", "narrow", "select", "detach", "contiguous", "flatten", "unflatten",
                      "as_strided", "to", "float", "half", "double", "bfloat16", "type_as", "unbind", "split",
                      "chunk", "movedim", "moveaxis", "swapaxes", "swapdims", "diagonal", "get", "values", "items",
                      "keys", "unfold", "tensor_split", "hsplit", "vsplit", "squeeze_", "unsqueeze_"})
INIT_NAMESPACE = "torch.nn.init."


def _builds_module(func: ast.AST) -> bool:
    """`nn.Linear(...)`, `torch.nn.ModuleList(...)`, `MyBlock(...)`: a call of a class."""
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name[:1].isupper()


class _Purity:
    """forward, and every function and method it can reach, is a pure function of its inputs
    and of what __init__ built: it writes no state (self, module globals, its inputs, a
    closure), keeps none between calls (iterators, generators), branches only on constants,
    config, shapes and `is None`, and never asks how it runs (device, dtype, compiling)."""

    def __init__(self, policy: _Policy):
        self.policy = policy
        self.tree = policy.tree
        self.parents = policy.parents
        self.definitions: dict[str, list[ast.FunctionDef]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef):
                self.definitions.setdefault(node.name, []).append(node)
        self.module_names = {name for node in self.tree.body for name in (
            [node.name] if isinstance(node, (ast.ClassDef, ast.FunctionDef)) else
            [n for t in node.targets for n in _target_names(t)] if isinstance(node, ast.Assign) else [])}
        self.constructors = {node.name: [item for item in node.body if isinstance(item, ast.FunctionDef)
                                         and item.name == "__init__"]
                             for node in ast.walk(self.tree) if isinstance(node, ast.ClassDef)}
        self.tensor_attributes = self._tensor_attributes()
        self.containers = {target.attr for node in ast.walk(self.tree) if isinstance(node, ast.Assign) and _container(
            node.value) for target in node.targets if isinstance(target, ast.Attribute)}

    def check(self) -> None:
        self._no_kept_iterators()
        self._add_data_attributes()
        reachable = self._reachable()
        for function, constructing in reachable:
            _FunctionPurity(self, function, constructing).check()
        # The checks build the model and its inputs under the GPU's device, the trace under
        # the CPU's or meta's: a question of how the code runs in __init__ or get_inputs
        # (`self.on_gpu = torch.empty(0).is_cuda`, then a branch on that config) gave the
        # trace decoy ops (a red team's). No function of the task asks it.
        seen = {id(function) for function, _ in reachable}
        for function in (node for node in ast.walk(self.tree) if isinstance(node, (ast.FunctionDef, ast.Lambda))):
            if id(function) not in seen:
                unreached = _FunctionPurity(self, function)
                unreached.reached = False
                unreached.outside_forward()

    # which functions forward can reach

    def _reachable(self) -> list[tuple[ast.AST, bool]]:
        """forward methods, the functions they name, lambdas kept as values and functions kept
        as values or handed to a hook: every function that may run inside a call of forward,
        each with whether it runs as the constructor of a task class built there (whose
        `self` is a new object, its own to set)."""
        roots = [(node, False) for node in self.definitions.get("forward", [])]
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Lambda) and not _handed_to_apply(node, self.parents):
                roots.append((node, False))  # even one given to a constructor, which may keep it
            elif self._kept_function(node):
                roots.extend((f, False) for f in self.definitions[node.id if isinstance(node, ast.Name) else node.attr])
        seen, order = set(), []
        while roots:
            function, constructing = roots.pop()
            if (id(function), constructing) in seen:
                continue
            seen.add((id(function), constructing))
            order.append((function, constructing))
            for node in ast.walk(function):
                name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
                if not (constructing and name == "__init__"):  # super().__init__() of a new object
                    roots.extend((f, False) for f in self.definitions.get(name, []))
                roots.extend((f, True) for f in self.constructors.get(name, []))
        return order

    def _kept_function(self, node: ast.AST) -> bool:
        """A task function named as a value, not called: kept to be called later, unless
        handed to nn.Module.apply (which calls it at once, in __init__)."""
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name not in self.definitions or not isinstance(getattr(node, "ctx", None), ast.Load):
            return False
        parent = self.parents.get(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            return False
        if isinstance(parent, ast.Attribute):
            return False  # `self.helper.x`: an attribute of it, read not kept
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.attr == "apply":
            return False
        return True

    def _add_data_attributes(self) -> None:
        """Attributes set to what values decide are not config forward may branch on (a red
        team's `self.on_gpu = float(torch.randn(1)) > 1.54`: the GPU's generator and the
        CPU's draw differently, and the trace read decoy ops)."""
        functions = [node for node in ast.walk(self.tree) if isinstance(node, ast.FunctionDef)]
        while True:
            found = set().union(*(_FunctionPurity(self, function).data_attributes() for function in functions))
            if found <= self.tensor_attributes:
                return
            self.tensor_attributes |= found

    def _tensor_attributes(self) -> set[str]:
        """`self.x` that hold tensors: set from nn.Parameter or a torch call, or registered."""
        found = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                callee = _Grammar(self.policy)._dotted(node.value.func)
                leaf = callee.rsplit(".", 1)[-1]
                if callee.startswith("torch.") and (leaf[:1].islower() or leaf in ("Parameter", "Buffer")):
                    found.update(t.attr for t in node.targets if isinstance(t, ast.Attribute))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "register_buffer", "register_parameter") and node.args and isinstance(node.args[0], ast.Constant):
                found.add(node.args[0].value)
        return found

    def _no_kept_iterators(self) -> None:
        """An iterator kept in a name or an attribute is state: each call would take the next
        value. Iterators are consumed where they are made."""
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Yield, ast.YieldFrom)):
                raise Rejected("impure_forward", node, "a generator keeps its place between calls: return a value")
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) else None
            unpacked = isinstance(node, ast.Assign) and all(isinstance(t, (ast.Tuple, ast.List)) for t in node.targets)
            if value is not None and _makes_iterator(value) and not unpacked:
                raise Rejected("impure_forward", node, "an iterator kept in a variable keeps state between calls: "
                               "consume it where it is made (for ... in, tuple(...), torch.stack([...]))")
            if isinstance(node, ast.Attribute) and self._kept_mutator(node):
                raise Rejected("impure_forward", node, f".{node.attr} kept as a value changes its object when called "
                               "later: call it where it is used")

    def _kept_mutator(self, node: ast.Attribute) -> bool:
        if not (node.attr in MUTATORS or _in_place(node.attr)) or not isinstance(node.ctx, ast.Load):
            return False
        parent = self.parents.get(node)
        return not (isinstance(parent, ast.Call) and parent.func is node)


def _container(node: ast.AST) -> bool:
    return isinstance(node, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)) or isinstance(
        node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("list", "dict", "set", "sorted")


def _handed_to_apply(node: ast.AST, parents: dict) -> bool:
    """`self.apply(lambda m: ...)`: nn.Module.apply calls it at once, in __init__."""
    call = parents.get(node)
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "apply"


def _immutable(node: ast.AST) -> bool:
    if isinstance(node, (ast.Constant, ast.Name, ast.Attribute)):
        return True
    if isinstance(node, ast.UnaryOp):
        return _immutable(node.operand)
    if isinstance(node, ast.BinOp):
        return _immutable(node.left) and _immutable(node.right)
    return isinstance(node, ast.Tuple) and all(_immutable(e) for e in node.elts)


def _names_outside_shapes(node: ast.AST):
    """The names `node` reads other than for a shape: `x` in `f(x)`, not in `f(x.shape[1])`."""
    if isinstance(node, ast.Attribute) and node.attr in SHAPE_ATTRIBUTES:
        return
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SHAPE_METHODS:
        for arg in node.args:
            yield from _names_outside_shapes(arg)
        return
    if isinstance(node, ast.Name):
        yield node.id
    for child in ast.iter_child_nodes(node):
        yield from _names_outside_shapes(child)


def _device_or_dtype(node: ast.AST) -> bool:
    """`x.dtype`, `q.dtype, k.dtype`, `a.device if a is not None else b.device`."""
    if isinstance(node, ast.Attribute):
        return node.attr in PASSED_ON
    if isinstance(node, ast.Tuple):
        return any(map(_device_or_dtype, node.elts))
    return isinstance(node, ast.IfExp) and (_device_or_dtype(node.body) or _device_or_dtype(node.orelse))


def _makes_iterator(node: ast.AST) -> bool:
    if isinstance(node, ast.GeneratorExp):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ITERATOR_MAKERS)


def _in_place(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") and name in _TENSOR_METHODS


class _FunctionPurity:
    """The purity rules over one function that forward can reach."""

    def __init__(self, purity: _Purity, function: ast.AST, constructing: bool = False):
        self.purity, self.function, self.constructing = purity, function, constructing
        self.reached = True  # False for a function forward does not reach (`outside_forward`)
        self.parents = purity.parents
        self.name = getattr(function, "name", "<lambda>")
        args = function.args
        self.parameters = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                           *filter(None, [args.vararg, args.kwarg])]}
        # forward's parameters without a default are the task's inputs, tensors: not config
        defaulted = {a.arg for a in [*args.posonlyargs, *args.args][len(args.posonlyargs) + len(args.args)
                                                                     - len(args.defaults):]}
        defaulted |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
        self.config_parameters = self.parameters if self.name != "forward" else (defaulted | {"self", "cls"})
        self.body = list(ast.walk(function))
        self.assignments: dict[str, list[ast.AST]] = {}  # local name -> the values bound to it (None: unknown)
        for node in self.body:
            for name, value in _bindings(node):
                self.assignments.setdefault(name, []).append(value)
        self.clean = self._clean_locals()
        self.passed_on = {name for node in self.body if isinstance(node, ast.Assign) and _device_or_dtype(node.value)
                          for target in node.targets for name in _target_names(target)}

    def check(self) -> None:
        for default in [*self.function.args.defaults, *filter(None, self.function.args.kw_defaults)]:
            if not _immutable(default):
                self._refuse(default, "a default argument is built once and shared by every call: default to None "
                                      "(or a constant) and build it in the body")
        for node in self.body:
            if node is self.function:
                continue
            self._node(node)

    def outside_forward(self) -> None:
        """The rules that keep a function forward does not reach (__init__, get_inputs) from
        telling the checks' run from the trace: no question of how the code runs (device,
        dtype, mode), and control flow on constants, config and shapes only (a random draw
        differs between the GPU's generator and the CPU's)."""
        for node in self.body:
            if isinstance(node, ast.Attribute):
                self._attribute(node, values=False)
            elif isinstance(node, ast.Name) and node.id in self.passed_on and isinstance(node.ctx, ast.Load):
                self._passed_on(node, node.id)
            test = node.test if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)) else None
            if test is not None and self._reads_values(test):
                self._refuse(test, f"the condition reads tensor values ({ast.unparse(test)[:60]}): the checks' GPU "
                                   "and the trace's CPU draw different random numbers, so a task may not choose by "
                                   "them; choose by constants, config and shapes")

    def data_attributes(self) -> set[str]:
        """`self.x` this function sets to what tensor values decide (`float(torch.randn(1)) >
        1.54`): no config, though no tensor either. A module it builds is neither."""
        found = set()
        for node in self.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and not (
                    isinstance(node.value, ast.Call) and _builds_module(node.value.func)) \
                    and self._reads_values(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found.update(t.attr for t in targets if isinstance(t, ast.Attribute) and _chain(t)[0] == "self")
        return found

    def _reads_values(self, node: ast.AST, seen: frozenset = frozenset()) -> bool:
        """Whether `node` reads a tensor's values, outside forward's stricter grammar: a torch
        call (other than a shape's), .item() or .tolist(), a tensor attribute (of self, or a
        weight or bias anywhere: `self.linear.weight.sum() > 0`), or a local bound to one of
        those or looping over one. `is None` reads nothing."""
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            return False
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Attribute) and node.func.attr in SHAPE_METHODS):
            if _Grammar(self.purity.policy)._dotted(node.func).startswith("torch.") and not _builds_module(node.func):
                return True
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and (
                node.attr in DATA_TO_PYTHON or node.attr in TENSOR_VALUED
                or isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in self.purity.tensor_attributes):
            return True
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in seen \
                and node.id in self.assignments and node.id not in self.parameters:
            bound = [value for value in self.assignments[node.id] if value is not None] + self._looped_over(node.id)
            if any(self._reads_values(value, seen | {node.id}) for value in bound):
                return True
        return any(self._reads_values(child, seen) for child in ast.iter_child_nodes(node))

    def _looped_over(self, name: str) -> list[ast.AST]:
        """What the loops that bind `name` iterate over."""
        return [loop.iter for loop in self.body if isinstance(loop, (ast.For, ast.comprehension))
                and name in _target_names(loop.target)]

    def _refuse(self, node: ast.AST, detail: str):
        where = "forward" if self.name == "forward" else f"{self.name}, which forward runs" if self.reached \
            else self.name
        raise Rejected("impure_forward", node, f"{detail} (in {where})")

    def _node(self, node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.Lambda, ast.ClassDef)) and not self._called_at_once(node):
            self._refuse(node, "a function made inside forward may close over state: define it at module level "
                               "or as a method (a lambda called where it is written is fine)")
        elif isinstance(node, ast.Try):
            self._refuse(node, "no try/except: let errors propagate")
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            self._write(node, node, "assigns to")
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            self._write(node, node.target, "changes in place")
        elif isinstance(node, ast.Call):
            self._call(node)
            self._values_to_python(node)
        elif isinstance(node, ast.Attribute):
            self._attribute(node)
        elif isinstance(node, ast.Name) and node.id in self.passed_on and isinstance(node.ctx, ast.Load):
            self._passed_on(node, node.id)
        elif isinstance(node, ast.FormattedValue) and not self._is_clean(node.value):
            self._refuse(node, f"an f-string formats tensor values ({ast.unparse(node.value)[:60]}) into text: keep "
                               "them tensors")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _text(node.left) \
                and not self._is_clean(node.right):
            self._refuse(node, f"% formats tensor values ({ast.unparse(node.right)[:60]}) into text: keep them tensors")
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            self._test(node.test, {ast.If: "if", ast.While: "while", ast.IfExp: "conditional expression",
                                   ast.Assert: "assert"}[type(node)])
        elif isinstance(node, ast.comprehension):
            for condition in node.ifs:
                self._test(condition, "comprehension's if")
            self._range(node.iter)
        elif isinstance(node, ast.For):
            self._range(node.iter)
        elif isinstance(node, ast.BoolOp):
            for operand in node.values[:-1]:
                self._test(operand, f"{type(node.op).__name__.lower()} operand")

    def _values_to_python(self, node: ast.Call) -> None:
        """`float(h[0, 0])`, `str(h)`, `max(a, b)` of tensors: values out of torch into Python,
        where no trace follows them (`int(x.shape[1] / 2)` reads only a shape)."""
        func = node.func
        if not (isinstance(func, ast.Name) and func.id in VALUES_TO_PYTHON and func.id not in self.assignments
                and func.id not in self.purity.module_names):
            return
        for argument in [*node.args, *(kw.value for kw in node.keywords)]:
            if not self._is_clean(argument):
                self._refuse(node, f"{func.id}() turns tensor values ({ast.unparse(argument)[:60]}) into Python "
                                   "values: keep them tensors (torch.where, torch.maximum, reductions)")

    def _called_at_once(self, node: ast.AST) -> bool:
        """`(lambda t: t * torch.sigmoid(t))(x)`: inline code, kept nowhere."""
        parent = self.parents.get(node)
        return isinstance(node, ast.Lambda) and isinstance(parent, ast.Call) and parent.func is node

    # writes

    def _write(self, node: ast.AST, target: ast.AST, how: str) -> None:
        owner, name = self._owner(target, node)
        if owner == "self":
            self._refuse(node, f"forward {how} {ast.unparse(target)}: a model keeps no state between calls; compute "
                               "it from the inputs (build buffers and caches once, in __init__)")
        if owner == "input":
            self._refuse(node, f"forward {how} its input {name!r}: work on a new tensor (y = {name}.clone(), or the "
                               "out-of-place op)")
        if owner == "outer":
            self._refuse(node, f"forward {how} {name!r}, which outlives the call: keep values local and return them")

    def _owner(self, node: ast.AST, at: ast.AST, seen: frozenset = frozenset()) -> tuple[str, str]:
        """Who owns the object `node` evaluates to: 'self', 'input' (a parameter not yet
        rebound), 'outer' (a name from outside the function) or 'fresh' (made here)."""
        while True:
            if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
                node = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ALIASING:
                node = node.func.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
                return "self", "self"
            elif isinstance(node, ast.Call) and self._own_function(node.func):
                # `self.cache_of(x).append(...)`: what a task function returns may be what it was given
                given = [*node.args, *(kw.value for kw in node.keywords)]
                given += [node.func.value] if isinstance(node.func, ast.Attribute) else []
                owners = [self._owner(arg, at, seen) for arg in given]
                return next((owner for owner in owners if owner[0] != "fresh"), ("fresh", ""))
            else:
                break
        if not isinstance(node, ast.Name):
            return "fresh", ""
        name = node.id
        if name in ("self", "cls") and name in self.parameters:
            return ("fresh", name) if self.constructing else ("self", name)
        if name in seen:
            return "fresh", name
        before = [value for value in self.assignments.get(name, []) if _position(value) < _position(at)] \
            if name in self.parameters else self.assignments.get(name, [])
        if name in self.parameters and not before:
            return "input", name
        if name not in self.parameters and name not in self.assignments:
            return "outer", name  # a module-level name, a builtin or a closure's
        for value in before:
            owner = ("fresh", name) if value is None else self._owner(value, at, seen | {name})
            if owner[0] != "fresh":
                return owner[0], owner[1] or name
        return "fresh", name

    def _call(self, node: ast.Call) -> None:
        dotted = _Grammar(self.purity.policy)._dotted(node.func)
        leaf = dotted.rsplit(".", 1)[-1]
        if dotted.startswith(INIT_NAMESPACE) or (isinstance(node.func, ast.Name) and dotted.startswith(INIT_NAMESPACE)):
            self._refuse(node, f"{dotted} re-draws or overwrites weights on every call: initialise in __init__")
        if any(kw.arg == "out" for kw in node.keywords):
            self._refuse(node, "out= writes into a tensor the caller holds: return the result instead")
        receiver = None
        if isinstance(node.func, ast.Attribute) and (node.func.attr in MUTATORS or _in_place(node.func.attr)):
            root, _ = _chain(node.func.value)
            through_module = root in self.purity.policy.modules or root in self.purity.policy.objects
            if through_module and _in_place(node.func.attr) or root in ("list", "dict", "set"):
                receiver = node.args[0] if node.args else None  # torch.Tensor.add_(t, 1), list.append(l, 1)
            elif not through_module:  # torch.add(x, y) adds; set.add would change the set
                receiver = node.func.value
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("add", "sort") and self._container(node.func.value):
            receiver = node.func.value  # set.add, list.sort: a container the task built, not a tensor
        elif isinstance(node.func, ast.Name) and _in_place(leaf) and node.args:
            receiver = node.args[0]
        elif (dotted.startswith("torch.") and _in_place(leaf) and node.args) or any(
                kw.arg == "inplace" and not (isinstance(kw.value, ast.Constant) and not kw.value.value)
                for kw in node.keywords):
            receiver = node.args[0] if node.args else None
        if receiver is not None:
            self._write(node, receiver, f"calls {leaf or 'an in-place op'} on")
            if leaf in MUTATORS and not _in_place(leaf) and not self._made_here(receiver):
                self._refuse(node, f"forward calls {leaf} on {ast.unparse(receiver)[:40]}, a container it did not "
                                   "build in this call: build lists and dicts locally (outs = []) and return results")

    # introspection

    def _attribute(self, node: ast.Attribute, values: bool = True) -> None:
        attr = node.attr
        if values and attr in DATA_TO_PYTHON:
            self._refuse(node, f".{attr}() turns tensor values into Python values forward then depends on: keep them "
                               "tensors (torch.where, masks, reductions)")
        if attr in INTROSPECTION and isinstance(node.ctx, ast.Load):
            self._refuse(node, f".{attr} asks how the code runs, not what it computes: write one path for every "
                               "device, dtype and mode (use x.shape, not x.device)")
        if attr in PASSED_ON and isinstance(node.ctx, ast.Load):
            self._passed_on(node, f".{attr}")

    def _passed_on(self, node: ast.AST, what: str) -> None:
        """x.device and x.dtype go straight into a call (torch.zeros(n, device=x.device)) or
        into a local kept for one; they are never inspected, compared or branched on."""
        parent = self.parents.get(node)
        while isinstance(parent, ast.Tuple) or isinstance(parent, ast.IfExp) and node is not parent.test:
            node, parent = parent, self.parents.get(parent)  # q_type, k_type = q.dtype, k.dtype
        if isinstance(parent, ast.Assign) and all(isinstance(n, (ast.Name, ast.Tuple, ast.Store))
                                                  for t in parent.targets for n in ast.walk(t)):
            return
        call = self.parents.get(parent) if isinstance(parent, ast.keyword) else parent
        # str(x.device), print(...), bool(...): a builtin turns it into a value to inspect
        if isinstance(call, ast.Call) and (node in call.args or parent in call.keywords) and not (
                isinstance(call.func, ast.Name) and call.func.id in SAFE_BUILTINS):
            return
        self._refuse(node, f"{what} may only be passed to a call (torch.zeros(n, device=x.device)); do not inspect, "
                           "compare or branch on it: write one path for every device and dtype")

    # control flow

    def _range(self, iterable: ast.AST) -> None:
        if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.func.id == "range":
            for arg in iterable.args:
                self._test(arg, "loop's range")

    def _test(self, node: ast.AST, kind: str) -> None:
        for leaf in ast.walk(node):  # name the introspection, when that is what the test reads
            if isinstance(leaf, ast.Attribute):
                self._attribute(leaf)
            elif isinstance(leaf, ast.Name) and leaf.id in self.passed_on:
                self._passed_on(leaf, leaf.id)
        if not self._is_clean(node):
            self._refuse(node, f"the {kind} reads tensor values ({ast.unparse(node)[:60]}): Python control flow may "
                               "depend only on constants, self's config, shapes (x.shape, x.size(), len) and `is None`; "
                               "choose by value with torch.where")

    def _is_clean(self, node: ast.AST) -> bool:
        """Known without looking at a tensor's values."""
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.config_parameters or node.id in self.clean or node.id in self.purity.module_names or (
                node.id not in self.assignments and node.id in SAFE_BUILTINS)
        if isinstance(node, ast.Attribute):
            if node.attr in SHAPE_ATTRIBUTES:
                return True
            root, dotted = _chain(node)
            if root in self.purity.policy.modules:
                return True
            if root == "self" and node.attr not in TENSOR_VALUED and node.attr not in self.purity.tensor_attributes:
                return all(isinstance(n, (ast.Attribute, ast.Name, ast.Load)) for n in ast.walk(node))
            return False
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            return True
        if isinstance(node, ast.Call):
            func = node.func
            arguments = [*node.args, *(kw.value for kw in node.keywords)]
            if isinstance(func, ast.Name) and func.id == "isinstance":
                return True
            if isinstance(func, ast.Attribute) and func.attr in SHAPE_METHODS:
                return all(map(self._is_clean, arguments))
            if isinstance(func, ast.Name) and func.id in CLEAN_CALLS and func.id not in self.assignments:
                return all(map(self._is_clean, arguments))
            if _Grammar(self.purity.policy)._dotted(func).startswith("math."):
                return all(map(self._is_clean, arguments))
            return self._own_function_of_config(func, arguments)
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Tuple, ast.List, ast.IfExp,
                             ast.Subscript, ast.Slice, ast.Starred, ast.NamedExpr)):
            return all(self._is_clean(child) for child in ast.iter_child_nodes(node)
                       if not isinstance(child, (ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context)))
        return False

    def _container(self, node: ast.AST) -> bool:
        """A module-level list, or a self attribute the task sets to a container."""
        if isinstance(node, ast.Name):
            return node.id in self.purity.module_names and node.id not in self.assignments
        return isinstance(node, ast.Attribute) and _chain(node)[0] == "self" and node.attr in self.purity.containers

    def _made_here(self, node: ast.AST) -> bool:
        """A local bound to a container built in this call (`outs = []`, `list(...)`); that
        none of its bindings is an outside object, _write has checked."""
        values = self.assignments.get(node.id) if isinstance(node, ast.Name) else None
        return bool(values) and node.id not in self.parameters and any(map(_container, values))

    def _own_function(self, func: ast.AST) -> bool:
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        return name in self.purity.definitions

    def _own_function_of_config(self, func: ast.AST, arguments: list[ast.AST]) -> bool:
        """`self.compute_padding(width, self.kernel_size[1])`: a task function (itself checked)
        given only constants, config and shapes, never a tensor it was handed."""
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name not in self.purity.definitions or isinstance(func, ast.Attribute) and _chain(func)[0] != "self":
            return False
        handed = {name for arg in arguments for name in _names_outside_shapes(arg)}
        return all(map(self._is_clean, arguments)) and not handed & (self.parameters - {"self", "cls"})

    def _clean_locals(self) -> set[str]:
        """Locals every binding of which is clean (a fixed point: `n = x.shape[0]; m = n * 2`)."""
        clean = {name for name in self.assignments if name not in self.parameters}
        changed = True
        while changed:
            changed = False
            self.clean = clean
            for name in list(clean):
                if not self._clean_bindings(name):
                    clean.discard(name)
                    changed = True
        return clean

    def _clean_bindings(self, name: str) -> bool:
        """Every binding of `name` is clean: a value known without looking at a tensor's
        values, or the item of a loop over one (`for k in self.kernel_sizes`, `for s in
        x.shape[2:]`; not `for row in h`)."""
        values, iterables = self.assignments[name], self._looped_over(name)
        unknown = sum(value is None for value in values)
        return all(value is None or self._is_clean(value) for value in values) and unknown <= len(iterables) and (
            unknown == 0 or all(map(self._is_clean, iterables)))


def _bindings(node: ast.AST):
    """(name, the value it is bound to, or None when unknown) for what `node` binds."""
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Name):
                yield target.id, node.value
            else:
                for name in _target_names(target):  # a, b = x.shape[:2]
                    yield name, node.value if _is_shape_tuple(node.value) else None
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        yield node.target.id, node.value if isinstance(node, ast.AnnAssign) else ast.copy_location(
            ast.BinOp(node.target, node.op, node.value), node)
    elif isinstance(node, ast.NamedExpr):
        yield node.target.id, node.value
    elif isinstance(node, (ast.For, ast.comprehension)):
        maker = node.iter.func.id if isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Name) else ""
        names = _target_names(node.target)
        for index, name in enumerate(names):
            if maker == "range" and node.iter.args:
                yield name, node.iter.args[-1]
            elif maker == "enumerate" and index == 0 and isinstance(node.target, ast.Tuple):
                yield name, ast.Constant(0)  # the count, not the item
            else:
                yield name, None
    elif isinstance(node, (ast.With,)):
        for item in node.items:
            for name in _target_names(item.optional_vars) if item.optional_vars else []:
                yield name, None
    elif isinstance(node, ast.ExceptHandler) and node.name:
        yield node.name, None


def _text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes))


def _is_shape_tuple(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in SHAPE_ATTRIBUTES or isinstance(n, ast.Call) and isinstance(
        n.func, ast.Attribute) and n.func.attr in SHAPE_METHODS for n in ast.walk(node)) and not any(
        isinstance(n, ast.Call) and not (isinstance(n.func, ast.Attribute) and n.func.attr in SHAPE_METHODS)
        for n in ast.walk(node))


def _position(node: ast.AST | None) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0)) if node is not None else (0, 0)


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
