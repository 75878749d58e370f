"""What a task may reach: every name it uses resolves to an object on the allowlist.

- An import binds a name to an allowed module (`torch`, `torch.nn.functional`, `math`, a module
  holding the run's library ops) or to an allowed object of one. Nothing is imported to decide.
- An attribute chain from an import is walked on the real modules, object by object: every
  module on the way is an allowed namespace reached by its own name (`F.torch` is torch under
  another name, and refused), and every object on the way is on the allowlist
  (filters/grammar/allowlist.py). A module is never a value.
- An attribute of a value (a tensor, a module the task built, a list) is a name the allowlist
  lets a task use on values, or the task's own; an own name that is also something of a
  tensor's or a module's the allowlist leaves out is refused where it is defined.
- Builtins: those in SAFE_BUILTINS, never shadowed; nothing reaches an attribute by a computed
  name (getattr, `.format`, a name built for register_buffer); no dunder but `__init__`.
- No stochastic op outside __init__, reset_parameters and the input builders.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import re
import sys
import types

import torch

from filters.grammar.allowlist import (EXCLUDED, RNN_WEIGHT, Allowlist, allowlist, foreign_attributes,
                                      private_internals, tensor_slots)
from filters.grammar.syntax import Rejected, chain, position

SAFE_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "callable", "chr", "complex", "dict", "divmod", "enumerate", "filter", "float",
    "frozenset", "hasattr", "hash", "input", "int", "isinstance", "issubclass", "len", "list", "map", "max",
    "min", "object", "ord", "pow", "print", "property", "range", "repr", "reversed", "round", "set", "slice",
    "sorted", "staticmethod", "classmethod", "str", "sum", "super", "tuple", "zip", "NotImplemented", "Ellipsis",
    "True", "False", "None", "Exception", "ValueError", "TypeError", "RuntimeError", "NotImplementedError",
    "AssertionError", "KeyError", "IndexError", "AttributeError", "ZeroDivisionError", "ArithmeticError",
    "StopIteration", "bytes", "format", "UserWarning", "Warning",
})  # not iter or next: an iterator kept between calls is state; not id: an address differs run to run
DANGEROUS_BUILTINS = frozenset(name for name in dir(builtins) if name not in SAFE_BUILTINS)
FUTURE_FEATURES = frozenset({"annotations"})
ALLOWED_DUNDERS = frozenset({"__init__"})
# Calls that name an attribute of a module by a string: the name must be written out.
NAME_ARGUMENTS = {"hasattr": (1, "name"), "register_buffer": (0, "name"), "register_parameter": (0, "name"),
                  "add_module": (0, "name"), "register_module": (0, "name")}
# What the task's own code may set on a tensor or module it holds (everything else a tensor
# or nn.Module has is a method the checks call).
SETTABLE = frozenset({"data", "requires_grad", "grad"})
MODULE_OVERRIDABLE = frozenset({"__init__", "forward", "extra_repr", "reset_parameters"})
STOCHASTIC_CALLS = frozenset({
    "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli", "bernoulli_", "multinomial",
    "randperm", "normal", "normal_", "uniform_", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_",
    "poisson", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "rrelu",
    "rrelu_", "gumbel_softmax", "dropout_", "alpha_dropout_", "feature_alpha_dropout_", "native_dropout"})
DUNDER = re.compile(r"__\w+__")
MODULE_ATTRIBUTES = frozenset(dir(torch.nn.Module()))  # an instance's: `training` too
TENSOR_AND_MODULE_ATTRIBUTES = frozenset(dir(torch.Tensor)) | MODULE_ATTRIBUTES
# what an nn.Module or a tensor keeps under a private name, its instance state included
PRIVATE_INTERNALS = frozenset(name for name in {*dir(torch.nn.Module()), *dir(torch.empty(0))} if name.startswith("_"))
_MISSING = object()


class Policy:
    """The names a task binds and what they resolve to; `check` refuses the first name or
    chain that leaves the allowlist.

    It stays one class of about 400 lines: every rule reads the same bindings (the imports,
    the task's own classes, names and attributes, each node's parent), and `_walk` is the
    one place that says what a name or chain is. Rules split into classes of their own would
    each need that view passed and kept the same, and one that resolved a name otherwise than
    `_walk` would be a way around the allowlist."""

    def __init__(self, tree: ast.Module, library_ops: frozenset[str]):
        self.tree = tree
        self.allowlist: Allowlist = allowlist().with_library_ops(library_ops) if library_ops else allowlist()
        self.modules: dict[str, str] = {}  # a name an import binds to a module -> the module's name
        self.objects: dict[str, str] = {}  # a name a from-import binds to an object -> its canonical name
        self.bound: dict[str, object] = {}  # ... and to the object itself
        self.classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        self.parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        self.own_attributes = _own_attributes(tree)
        # private names the task itself gives its objects (`self._scale = ...`, a method `_helper`)
        self.own_private = {name for name in self.own_attributes if name.startswith("_")}
        # methods of the task's classes that take their instance: called on it, never through the class
        self.instance_methods = {item.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                                 for item in node.body if isinstance(item, ast.FunctionDef) and not any(
                                     isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod")
                                     for d in item.decorator_list)}

    def check(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._import(node)
        self.instance_attributes = self._instance_attributes()
        for name, node in sorted(self.own_attributes.items(), key=lambda item: position(item[1])):
            self._own_attribute(name, node)
        for node in ast.walk(self.tree):
            self._node(node)

    # -- what a name or chain resolves to ---------------------------------------------------

    def resolve(self, node: ast.AST):
        """(object, canonical name) of a name or attribute chain rooted at an import, walked
        object by object; None when `node` is not such a chain. Raises Rejected where the
        chain leaves the allowlist."""
        root, dotted = chain(node)
        parts = dotted.split(".")[1:]
        if root in self.modules:
            return self._walk(sys.modules[self.modules[root]], self.modules[root], parts, node)
        if root in self.objects:
            return self._walk(self.bound[root], self.objects[root], parts, node)
        return None

    def canonical(self, node: ast.AST) -> str:
        """The canonical dotted name of what `node` names (`F.relu` -> torch.nn.functional.relu),
        or its text when it names no import (a builtin, a local, `self.conv`)."""
        resolved = self.resolve(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if resolved is not None:
            return resolved[1]
        return chain(node)[1] if isinstance(node, (ast.Name, ast.Attribute)) else ""

    def _walk(self, found, spelled: str, parts: list[str], node):
        for part in parts:
            step_name = f"{spelled}.{part}"
            if part.startswith("_") and part not in ALLOWED_DUNDERS:
                raise Rejected("forbidden_call", node, f"{step_name!r}: {part!r} is private")
            if isinstance(found, types.ModuleType):
                step = vars(found).get(part, _MISSING)
                if isinstance(step, types.ModuleType):
                    self._namespace(step, step_name, node)
                    found, spelled = step, step_name
                    continue
            elif part == "__init__" and isinstance(found, type) and issubclass(found, torch.nn.Module):
                found, spelled = found.__init__, step_name  # nn.Module.__init__(self): a layer's constructor
                continue
            else:
                step = inspect.getattr_static(found, part, _MISSING)
            name = None if step is _MISSING else self.allowlist.name_of(step)
            if name is None:
                raise Rejected("forbidden_call", node, self._not_allowed(step_name, step, found))
            found, spelled = step, name
        return found, spelled

    def _namespace(self, module: types.ModuleType, spelled: str, node) -> None:
        if module.__name__ not in self.allowlist.namespaces:
            raise Rejected("forbidden_call", node, f"the module {module.__name__!r} is outside the allowed namespaces")
        if module.__name__ != spelled:
            raise Rejected("forbidden_call", node, f"{spelled} is the module {module.__name__} under another name: "
                                                   f"name it {module.__name__}")

    def _not_allowed(self, spelled: str, step, holder) -> str:
        if id(holder) in self.allowlist.objects and self.allowlist.objects[id(holder)] in self.allowlist.library_ops:
            return f"{spelled}: a library op is called, not looked into"
        holder_name = spelled.rpartition(".")[0]
        if holder_name in self.allowlist.namespaces and holder_name.split(".")[0] not in ("torch", "math"):
            allowed = sorted(self.allowlist.library_ops)
            return (f"{spelled!r} is not one of the run's {len(allowed)} ops from its library "
                    f"({', '.join(allowed[:4])}{', ...' if len(allowed) > 4 else ''})")
        if step is _MISSING:
            return f"{spelled!r} names nothing a task may use"
        return (f"{spelled!r} is not on the allowlist of tensor functions, layers and math a task may name "
                "(filters/grammar/allowlist.py): it is no tensor op, or it sets state outside the task")

    # -- imports ------------------------------------------------------------------------

    def _import(self, node) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.level or not node.module:
                raise Rejected("forbidden_import", node, "relative import")
            if node.module == "__future__":
                if any(alias.name not in FUTURE_FEATURES for alias in node.names):
                    raise Rejected("forbidden_import", node, "only `from __future__ import annotations` is allowed")
                return
            self._importable(node.module, node)
            for alias in node.names:
                if alias.name == "*":
                    raise Rejected("forbidden_import", node, f"`from {node.module} import *`")
                found, name = self._walk(sys.modules[node.module], node.module, [alias.name], node)
                bound = alias.asname or alias.name
                if isinstance(found, types.ModuleType):
                    self.modules[bound] = found.__name__
                else:
                    self.objects[bound], self.bound[bound] = name, found
            return
        for alias in node.names:
            self._importable(alias.name, node)
            if alias.asname:
                self.modules[alias.asname] = alias.name
            else:
                self.modules[alias.name.split(".")[0]] = alias.name.split(".")[0]

    def _importable(self, name: str, node) -> None:
        if name not in self.allowlist.namespaces or name not in sys.modules:
            allowed = sorted(self.allowlist.namespaces)
            hint = " (annotate with `torch.Tensor | None`, not typing's Optional)" if name == "typing" else ""
            raise Rejected("forbidden_import", node, f"import of {name!r}{hint} (allowed: {', '.join(allowed)})")

    # -- every node ---------------------------------------------------------------------

    def _node(self, node: ast.AST) -> None:
        if isinstance(node, (ast.AsyncFunctionDef, ast.AsyncFor, ast.AsyncWith, ast.Await)):
            raise Rejected("forbidden_call", node, "async code")
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            raise Rejected("forbidden_call", node, "global state")
        if isinstance(node, ast.Match):
            raise Rejected("forbidden_call", node, "match statements")
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            raise Rejected("forbidden_call", node, "no try/except: let errors propagate (an exception a task holds "
                                                   "reaches what raised it, and a try tells modes apart)")
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
        elif isinstance(node, ast.Attribute):
            self._attribute(node)
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                self._store(node)  # an assignment's, a for's, a with's or a comprehension's target alike
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            self._store(node)
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
            layers = self._torch_bases(node)
            for item in node.body:
                names = ([item.name] if isinstance(item, ast.FunctionDef) else
                         [t.id for t in item.targets if isinstance(t, ast.Name)] if isinstance(item, ast.Assign) else [])
                for name in names:
                    if name in MODULE_ATTRIBUTES and name not in MODULE_OVERRIDABLE:
                        raise Rejected("forbidden_call", item, f"overrides nn.Module.{name}, which the checks call")
                    layer = next((layer for layer in layers if hasattr(layer, name)), None)
                    if layer is not None and name not in MODULE_OVERRIDABLE:
                        raise Rejected("forbidden_call", item, f"overrides {layer.__name__}.{name}, which torch's own "
                                                               f"forward calls where the purity rules do not look: "
                                                               "derive from nn.Module and call the layer")

    def _torch_bases(self, node: ast.ClassDef, seen: frozenset = frozenset()) -> list[type]:
        """The torch layer classes a task class derives from, through its own classes too."""
        found = []
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in self.classes and base.id not in seen:
                found += [layer for definition in ast.walk(self.tree) if isinstance(definition, ast.ClassDef)
                          and definition.name == base.id for layer in self._torch_bases(definition, seen | {base.id})]
            elif isinstance(base, (ast.Name, ast.Attribute)):
                resolved = self.resolve(base)
                if resolved is not None and isinstance(resolved[0], type) and resolved[0] is not torch.nn.Module:
                    found.append(resolved[0])
        return found

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
        if node.id == "input" and not self._bound_in_scope(node):
            raise Rejected("forbidden_call", node, "input() reads its consumer's standard input: a task takes its "
                                                   "inputs from get_inputs()")
        if node.id in self.modules and not isinstance(self.parents.get(node), ast.Attribute):
            raise Rejected("forbidden_call", node, f"the module {self.modules[node.id]!r} used as a value")

    def _attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if attr.startswith("__") and attr not in ALLOWED_DUNDERS:
            raise Rejected("forbidden_call", node, f"dunder access {attr!r}")
        if attr == "type":
            self._type_method(node)
        if isinstance(node.value, (ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)):
            raise Rejected("forbidden_call", node, f".{attr} of a comprehension: consume it (tuple(...), "
                                                   "torch.stack([...])) and use the result")
        root, _ = chain(node)
        if root in self.modules or root in self.objects:
            if isinstance(self.parents.get(node), ast.Attribute):
                return  # walked whole, at the end of the chain
            found, _ = self.resolve(node)
            if isinstance(found, types.ModuleType):
                raise Rejected("forbidden_call", node, f"the module {found.__name__!r} used as a value")
            if attr == "__init__":
                self._called_on_receiver(node)  # nn.Module.__init__(self)
            return
        if isinstance(node.value, ast.Name) and root in self.classes and (
                attr in self.instance_methods or attr == "__init__"):
            self._called_on_receiver(node)  # Block.forward(self, x), Base.__init__(self)
        if attr.startswith("_") and attr not in ALLOWED_DUNDERS:
            if root not in self.classes and not (root in ("self", "cls") and self._method_receiver(node, root)):
                raise Rejected("forbidden_call", node, f"private attribute {attr!r}")
            if attr not in self.own_private:
                raise Rejected("forbidden_call", node, f"private attribute {attr!r}: a task reads only the private "
                                                       "names it gives its own objects")
            return
        if not (self.allowlist.allows_value_attribute(attr) or attr in self.own_attributes or attr in ALLOWED_DUNDERS):
            raise Rejected("forbidden_call", node, _value_attribute_refusal(attr))

    def _called_on_receiver(self, node: ast.Attribute) -> None:
        """A method taken from a class (`Block.forward`, `nn.Module.__init__`) is called, with the
        receiver of the method it is called in (`self`) first: given any other object, its
        `self` is that object, and a red team's unbound call set attributes on torch.Tensor."""
        call = self.parents.get(node)
        first = call.args[0] if isinstance(call, ast.Call) and call.func is node and call.args else None
        if not (isinstance(first, ast.Name) and first.id == "self" and self._method_receiver(first, "self")):
            raise Rejected("forbidden_call", node, f"{ast.unparse(node)} is a method: call it on the task's own object "
                                                   f"(self.{node.attr}(...), super().{node.attr}(...))")

    def _own_attribute(self, name: str, node: ast.AST) -> None:
        """An attribute the task sets or defines may not also be something of a tensor's, a
        module's, a Python value's or the interpreter's that the allowlist leaves out
        (allowlist.foreign_attributes): a task that names its own method `storage`, or its
        class constant `gi_frame`, could read a tensor's or a generator's through the name."""
        if name.startswith("_"):
            if name in PRIVATE_INTERNALS or name in private_internals():
                raise Rejected("forbidden_call", node, f"the task's own attribute {name!r} is named like an internal "
                                                       "of nn.Module, a tensor or a torch layer: rename it")
        elif name in foreign_attributes() and not self.allowlist.allows_value_attribute(name):
            raise Rejected("forbidden_call", node, f"the task's own attribute {name!r} is named like an attribute of "
                                                   "a tensor, a layer, a Python value or the interpreter that a task "
                                                   "may not use: rename it")

    def _bound_in_scope(self, node: ast.Name) -> bool:
        """Whether a function around `node` binds its name (a parameter, an assignment, a loop)."""
        scope = self.parents.get(node)
        while scope is not None:
            if isinstance(scope, (ast.FunctionDef, ast.Lambda)):
                if node.id in {a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg)} or any(
                        isinstance(n, ast.Name) and n.id == node.id and isinstance(n.ctx, ast.Store)
                        for n in ast.walk(scope)):
                    return True
            scope = self.parents.get(scope)
        return False

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
        """Tensor.type and Module.type import the dotted name a string gives them; given a
        torch dtype (`.type(torch.float32)`) they convert, as `.to(dtype)` does."""
        call = self.parents.get(node)
        given = call.args + [kw.value for kw in call.keywords] if isinstance(call, ast.Call) and call.func is node else None
        if given is None or not all(isinstance(arg, (ast.Name, ast.Attribute)) and isinstance(
                (self.resolve(arg) or (None,))[0], torch.dtype) for arg in given):
            raise Rejected("forbidden_call", node, ".type() imports what a string names: convert with .to(dtype), "
                                                   "or give .type a torch dtype (x.type(torch.float32))")

    def _store(self, target: ast.AST) -> None:
        """What an assignment, augmented assignment or `del` writes into: a local name, an item
        of a container, or an attribute of the task's own object (`self.scale = ...`) or of an
        instance it built (`self.linear.weight = ...`). Never an attribute of anything else: an
        alias of a class (`layer = nn.Linear; layer.reset_parameters = f`) reached every instance
        of it in the consumer's process, and so would a method of a torch class."""
        if isinstance(target, (ast.Tuple, ast.List, ast.Starred)):
            for element in target.elts if not isinstance(target, ast.Starred) else [target.value]:
                self._store(element)
            return
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return
        root, dotted = chain(target.value if isinstance(target, ast.Subscript) else target)
        if root in self.modules or root in self.objects:
            raise Rejected("forbidden_call", target, f"assignment into {dotted!r}, which an import bound")
        if not isinstance(target, ast.Attribute):
            return
        root = _root_name(target)
        if root not in ("self", "cls") or not self._method_receiver(target, root):
            raise Rejected("forbidden_call", target, f"assignment to {ast.unparse(target)[:60]}: a task sets attributes "
                                                     "only on its own object (self.name = ...) and the instances it built")
        first = _first_attribute(target)
        if first is not target and first.attr not in self.instance_attributes:
            raise Rejected("forbidden_call", target, f"assignment to {ast.unparse(target)[:60]}: self.{first.attr} is not "
                                                     "an instance the task built (a layer, a tensor, a parameter)")
        slots = tensor_slots()
        if any(not (name in slots or RNN_WEIGHT.fullmatch(name)) for name in _attributes_after(target, first)):
            raise Rejected("forbidden_call", target, f"assignment to {ast.unparse(target)[:60]}: inside a layer the task "
                                                     "built, only its weights and their data are set (.weight, .bias, "
                                                     ".data, a running statistic): a red team set a method of "
                                                     "nn.Conv2d through a class it kept on a layer")
        if target.attr in SETTABLE:
            return
        on_self = first is target
        if target.attr in (MODULE_ATTRIBUTES if on_self else TENSOR_AND_MODULE_ATTRIBUTES):
            raise Rejected("forbidden_call", target, f"assignment to .{target.attr}, a method the checks call")

    def _instance_attributes(self) -> set[str]:
        """`self.X` that hold instances the task built: every value given to it is a call of a
        layer, a task class or a torch function (or None), or it was registered by name."""
        given: dict[str, list] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id == "self":
                        given.setdefault(target.attr, []).append(node.value)
        registered = {node.args[0].value for node in ast.walk(self.tree) if isinstance(node, ast.Call)
                      and isinstance(node.func, ast.Attribute) and node.func.attr in NAME_ARGUMENTS
                      and node.func.attr != "hasattr" and node.args and isinstance(node.args[0], ast.Constant)}
        return {name for name, values in given.items() if all(map(self._builds_instance, values))} | registered

    def _builds_instance(self, value: ast.AST) -> bool:
        if isinstance(value, ast.Constant) and value.value is None:
            return True
        if not isinstance(value, ast.Call) or not isinstance(value.func, (ast.Name, ast.Attribute)):
            return False
        if isinstance(value.func, ast.Name) and value.func.id in self.classes:
            return True
        try:
            resolved = self.resolve(value.func)
        except Rejected:
            return False
        return resolved is not None and (isinstance(resolved[0], type) or resolved[1].startswith("torch."))

    def _stochastic(self, node: ast.Call) -> None:
        """A random op outside every function (the purity rules refuse one that forward reaches)."""
        if self.random_op(node) and self._enclosing_function(node) is None:
            raise Rejected("stochastic_op", node, f"{self.random_op(node)} outside __init__ and get_inputs makes "
                                                  "the output random")

    def random_op(self, node: ast.Call) -> str:
        """The name of the random op `node` calls (`torch.randn`, `x.normal_`, a layer kept as
        `self.dropout`), or ''."""
        func = node.func
        name = self.canonical(func) if isinstance(func, (ast.Name, ast.Attribute)) else ""
        leaf = name.rsplit(".", 1)[-1]
        return leaf if leaf in STOCHASTIC_CALLS else ""

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


def _root_name(node: ast.AST) -> str:
    """The name `self.a[0].b` starts from ('' when it starts from anything but a name)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _attributes_after(target: ast.Attribute, first: ast.Attribute) -> list[str]:
    """The attribute names of `self.a.b[0].c` after `self.a`: ['b', 'c']."""
    names, node = [], target
    while node is not first:
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        node = node.value
    return names[::-1]


def _first_attribute(target: ast.Attribute) -> ast.Attribute:
    """The attribute right after the root of `self.a[0].b.c`: `self.a`."""
    node = target
    while isinstance(node.value, (ast.Attribute, ast.Subscript)):
        node = node.value if isinstance(node.value, ast.Attribute) else node.value.value
        while isinstance(node, ast.Subscript):
            node = node.value
    return node


def _own_attributes(tree: ast.Module) -> dict[str, ast.AST]:
    """The attribute names a task gives its objects, each with where it first does: set on an
    object, defined in its classes (methods and constants), or registered by a literal name."""
    found: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.setdefault(node.attr, node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found.setdefault(item.name, item)
                elif isinstance(item, ast.Assign):
                    for target in item.targets:
                        if isinstance(target, ast.Name):
                            found.setdefault(target.id, item)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in NAME_ARGUMENTS \
                and node.func.attr != "hasattr" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            found.setdefault(node.args[0].value, node)
    return {name: node for name, node in found.items() if name not in ALLOWED_DUNDERS}


def _value_attribute_refusal(name: str) -> str:
    """Why a task may not use `.name` on a value, and what to write instead."""
    if name.startswith("is_"):
        return (f".{name} asks how the code runs (device, dtype, mode), not what it computes: write one path for "
                "every device, dtype and mode")
    for group, names in EXCLUDED.items():
        if name in names:
            return f".{name} is outside the allowlist ({_GROUP_REASONS[group]})"
    return (f".{name} is not an attribute a task may use on a value: tensor ops and properties, nn.Module's "
            "parameters/buffers/children/forward, torch layers' own attributes, list and dict methods and the "
            "task's own attributes are (filters/grammar/allowlist.py)")


_GROUP_REASONS = {
    "storage": "memory read or written around torch's ops, or shared: compute with tensor ops",
    "autograd": "autograd's graph and hooks run code later: a task computes its output and returns it",
    "callbacks": "a Python function per element writes where no op runs: use a tensor op",
    "devices": "the harness chooses the device: pass x.device to what you build",
    "layouts": "quantised and sparse layouts are not what a task computes: use dense tensors",
    "modes": "a task computes the same in every mode: write one path, with no branch on the module's mode",
}
