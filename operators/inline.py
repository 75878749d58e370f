"""Inline a class from an installed package into self-contained source (libcst).

A transformers layer lives in a modeling file full of framework glue: decorators that swap
in hub kernels, a config object, an attention dispatch table, a logger. A seed task must
run with torch alone, so the inliner copies the class and everything it references, from
its own module and, through imports, from other modules of the same package, and rewrites
the glue away:

- attributes of a constant object become literals (`config.hidden_size` -> `256`), and
  parameters and arguments that only carried that object disappear;
- branches whose condition is now a literal are folded (`if "eager" != "eager": ...`),
  including conditions on `self.x` attributes assigned a literal exactly once and, given the
  dtype a seed builds weights in, on a weight's dtype (`if self.weight.dtype in [torch.float16,
  ...]`: forward may not change its weights, and the policy refuses a branch on a dtype);
- the package's own decorators, all annotations and docstrings are dropped;
- dropout becomes the identity (a seed is an inference program) and logger calls go;
- torch's questions about how the code runs (`torch.jit.is_tracing()`, `torch.compiler.is_compiling()`)
  become `False` and their branches fold: a seed is the eager program, and the static policy
  refuses a forward that asks;
- an import inside a function goes: what it binds is brought along as a free name, imported
  at the top from the module's own imports (the policy allows imports only there);
- two stdlib helpers the static policy does not allow are spelled without them:
  `isinstance(v, collections.abc.Iterable)` tests for a tuple or list (what a config holds),
  `functools.partial(f, a, k=v)` is `lambda *args, **kwargs: f(a, *args, k=v, **kwargs)`;
- a package-specific hook rewrites what only it understands (an activation table lookup).

What remains must be torch, math, typing, a builtin or more inlined code; anything else
makes the op NotSelfContained, with the name that could not be brought along.

The module stays near 670 lines: the rewrites above are small libcst transformers applied in
one order to one copied class, each a few dozen lines, and read top to bottom in that order.
"""
from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import warnings
from dataclasses import dataclass, field
from typing import Callable

import libcst as cst

KEPT_IMPORT_ROOTS = {"torch", "math", "typing", "collections", "functools", "itertools", "operator", "numbers",
                     "dataclasses", "enum"}
KEPT_DECORATORS = {"staticmethod", "classmethod", "property"}
SILENCED_ROOTS = {"logger", "warnings"}
PRESENTATION_METHODS = {"__repr__", "__str__", "extra_repr"}
STANDARD_IMPORTS = {"torch": "import torch", "nn": "from torch import nn", "F": "import torch.nn.functional as F",
                    "math": "import math"}
# Asked by library code to take a tracing- or compiler-friendly path; a seed is eager.
RUN_MODE_QUERIES = frozenset({"torch.jit.is_tracing", "torch.jit.is_scripting", "torch.compiler.is_compiling",
                              "torch.compiler.is_dynamo_compiling", "torch._dynamo.is_compiling",
                              "torch.is_autocast_enabled"})
ITERABLE_TYPES = {"collections.abc.Iterable", "collections.abc.Sequence", "typing.Iterable", "typing.Sequence"}
MAX_DEFINITIONS = 24  # an op needing more than this many definitions is not a layer-level op


class NotSelfContained(Exception):
    """The op references something the inliner cannot bring along; args[0] names it."""


# A hook sees every expression and may return (replacement source, {name: object it needs}).
Hook = Callable[[cst.BaseExpression, str], "tuple[str, dict] | None"]


@dataclass
class InlineRules:
    package: str                                   # only this package's modules are inlined
    constants: dict[str, object] = field(default_factory=dict)  # name -> object read as literals
    framework_base: Callable[[type], bool] = lambda cls: False  # base classes replaced by nn.Module
    hook: Hook | None = None
    none_names: frozenset[str] = frozenset()  # parameters a seed always leaves None (a cache)
    weight_dtype: str | None = None  # the dtype a seed builds its weights in: `self.w.dtype` in a condition


@dataclass(frozen=True)
class Inlined:
    """Self-contained source defining the class, and the constructor arguments it now takes
    in place of its config: the numbers its `__init__` read from it (`hidden_size=256`)."""
    code: str
    parameters: dict


def inline(obj: type, rules: InlineRules) -> Inlined:
    """The source of `obj` and every definition it needs, imports first, ready to exec."""
    inliner = _Inliner(rules, target=(obj.__module__, obj.__name__))
    inliner.visit(obj.__module__, obj.__name__)
    imports = sorted(inliner.imports)
    code = "\n".join(imports) + ("\n\n\n" if imports else "") + "\n\n\n".join(inliner.emitted) + "\n"
    return Inlined(code, inliner.parameters)


@dataclass
class _ModuleIndex:
    module: object
    definitions: dict[str, cst.CSTNode]
    import_lines: dict[str, str]   # local name -> the import statement that binds it


@functools.lru_cache(maxsize=16)  # a family's modeling file and the shared ones it imports
def _index(module_name: str) -> _ModuleIndex:
    module = importlib.import_module(module_name)
    tree = cst.parse_module(inspect.getsource(module))
    definitions, import_lines = {}, {}
    for statement in tree.body:
        if isinstance(statement, (cst.ClassDef, cst.FunctionDef)):
            definitions[statement.name.value] = statement
        elif isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, (cst.Assign, cst.AnnAssign)):
                    targets = small.targets if isinstance(small, cst.Assign) else [small]
                    for target in targets:
                        if isinstance(target.target, cst.Name):
                            definitions[target.target.value] = statement
                elif isinstance(small, (cst.Import, cst.ImportFrom)):
                    for name in _bound_by_import(small):
                        import_lines[name] = _import_line(small, name, module)
    return _ModuleIndex(module, definitions, import_lines)


def _bound_by_import(node) -> list[str]:
    if isinstance(node.names, cst.ImportStar):
        return []
    bound = []
    for alias in node.names:
        if alias.asname is not None:
            bound.append(alias.asname.name.value)
        else:
            bound.append(_dotted(alias.name).split(".")[0])
    return bound


def _import_line(node, name: str, module) -> str:
    """An absolute import statement binding `name` the way the module's own import did."""
    if isinstance(node, cst.Import):
        for alias in node.names:
            dotted = _dotted(alias.name)
            if alias.asname is not None and alias.asname.name.value == name:
                return f"import {dotted} as {name}"
            if alias.asname is None and dotted.split(".")[0] == name:
                return f"import {dotted}"
    source = ("." * len(node.relative)) + (_dotted(node.module) if node.module else "")
    absolute = importlib.util.resolve_name(source, module.__package__) if node.relative else source
    for alias in node.names:
        local = alias.asname.name.value if alias.asname is not None else _dotted(alias.name)
        if local == name:
            original = _dotted(alias.name)
            return f"from {absolute} import {original}" + (f" as {name}" if original != name else "")
    return ""


def _dotted(node) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


class _Inliner:
    def __init__(self, rules: InlineRules, target: tuple[str, str]):
        self.rules, self.target = rules, target
        self.seen: set[tuple[str, str]] = set()
        self.emitted: list[str] = []
        self.imports: set[str] = set()
        self.parameters: dict = {}

    def visit(self, module_name: str, name: str) -> None:
        if (module_name, name) in self.seen:
            return
        self.seen.add((module_name, name))
        if len(self.seen) > MAX_DEFINITIONS:
            raise NotSelfContained(f"needs more than {MAX_DEFINITIONS} definitions")
        index = _index(module_name)
        node = index.definitions.get(name)
        if node is None:
            raise NotSelfContained(f"{name} is not a top-level definition of {module_name}")
        extra_refs: dict[str, object] = {}
        if (module_name, name) == self.target and isinstance(node, cst.ClassDef):
            node = self._parameterize(node)
        code = _rewrite(node, index, self.rules, extra_refs)
        for ref in sorted(_free_names(code) - {name}):
            self._resolve(ref, index, extra_refs)
        self.emitted.append(code.strip("\n"))

    def _parameterize(self, node: cst.ClassDef) -> cst.ClassDef:
        """The numbers the class's `__init__` reads from a constant object become constructor
        parameters of the same name; the caller passes the values."""
        for name, holder in self.rules.constants.items():
            lifted = _ConstructorParameters(name, holder, _condition_attributes(node, name))
            node = node.visit(lifted)
            self.parameters.update(lifted.values)
        return node

    def _resolve(self, ref: str, index: _ModuleIndex, extra_refs: dict) -> None:
        if ref in extra_refs:
            target = extra_refs[ref]
            return self.visit(target.__module__, target.__name__)
        if ref in index.definitions:
            return self.visit(index.module.__name__, ref)
        line = index.import_lines.get(ref)
        if line:
            source = line.split()[1]
            if source.split(".")[0] in KEPT_IMPORT_ROOTS:
                self.imports.add(line)
                return None
            target = getattr(index.module, ref, None)
            if (source.split(".")[0] == self.rules.package and (inspect.isclass(target) or inspect.isfunction(target))
                    and target.__name__ == ref):
                return self.visit(target.__module__, ref)
            raise NotSelfContained(f"{ref} (from {source})")
        if hasattr(builtins, ref):
            return None
        if ref in STANDARD_IMPORTS:  # a base class rewritten to nn.Module in a module importing nn otherwise
            self.imports.add(STANDARD_IMPORTS[ref])
            return None
        raise NotSelfContained(ref)


def _rewrite(node: cst.CSTNode, index: _ModuleIndex, rules: InlineRules, extra_refs: dict) -> str:
    module = cst.Module(body=[node])
    dropout_attrs = _dropout_attributes(module.code)
    module = module.visit(_Glue(index, rules, extra_refs, dropout_attrs)).visit(_Fold())
    literals = _literal_self_attributes(module.code)
    module = module.visit(_SelfConstants(literals, rules.none_names, rules.weight_dtype))
    module = module.visit(_Fold())
    code = module.code
    for constant in rules.constants:
        if constant in _free_names(code) or f"self.{constant}" in code:
            raise NotSelfContained(f"{constant} is used beyond attribute reads")
    return code


class _ConstructorParameters(cst.CSTTransformer):
    """In the class's own `__init__`: `config.hidden_size` -> a parameter `hidden_size`. Only
    numbers, never read in a condition (those stay literals, so branches still fold), and
    never a name the method already binds."""

    def __init__(self, holder_name: str, holder, in_conditions: set[str]):
        self.holder_name, self.holder, self.in_conditions = holder_name, holder, in_conditions
        self.values: dict = {}
        self.depth = 0  # 1 inside the class's own __init__
        self.taken: set[str] = set()

    def visit_FunctionDef(self, node):
        if node.name.value == "__init__" and self.depth == 0:
            self.depth = 1
            self.taken = {p.name.value for p in node.params.params} | _stored_names(node)
            return True
        return self.depth == 1  # only the class's own __init__ (and what it nests)

    def leave_FunctionDef(self, original, updated):
        if original.name.value != "__init__" or self.depth != 1:
            return updated
        self.depth = 2  # done: nested classes and other methods are left alone
        params = list(updated.params.params)
        first_default = next((i for i, p in enumerate(params) if p.default is not None), len(params))
        added = [cst.Param(cst.Name(name)) for name in self.values]  # before any parameter with a default
        return updated.with_changes(params=updated.params.with_changes(
            params=[*params[:first_default], *added, *params[first_default:]]))

    def leave_Attribute(self, original, updated):
        return self._lift(updated, _dotted(updated)) or updated

    def leave_Call(self, original, updated):
        if _dotted(updated.func) == "getattr" and len(updated.args) >= 2:
            holder = _dotted(updated.args[0].value)
            key = cst.Module([]).code_for_node(updated.args[1].value).strip()
            if _unself(holder) == self.holder_name and key[:1] in "'\"":
                return self._lift(updated, f"{self.holder_name}.{ast.literal_eval(key)}") or updated
        return updated

    def _lift(self, node, path: str):
        if self.depth != 1:
            return None
        root, _, attr = _unself(path).partition(".")
        if root != self.holder_name or not attr.isidentifier() or attr in self.in_conditions:
            return None
        value = getattr(self.holder, attr, None)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or (attr in self.taken and attr not in self.values):
            return None
        self.values[attr] = value
        return cst.Name(attr)


def _condition_attributes(node: cst.ClassDef, holder_name: str) -> set[str]:
    """Attributes of the holder that decide a condition of the class: read in it directly,
    or through a `self.x` the condition tests and `__init__` set from them."""
    tree = ast.parse(cst.Module(body=[node]).code)
    holders = (holder_name, f"self.{holder_name}")
    tests = [n.test for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp, ast.While, ast.Assert))]
    tested_self = {leaf.attr for test in tests for leaf in ast.walk(test)
                   if isinstance(leaf, ast.Attribute) and ast.unparse(leaf.value) == "self"}
    sources = tests + [n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self" and t.attr in tested_self for t in n.targets)]
    found = set()
    for expression in sources:
        for leaf in ast.walk(expression):
            if isinstance(leaf, ast.Attribute) and ast.unparse(leaf.value) in holders:
                found.add(leaf.attr)
            if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str):
                found.add(leaf.value)  # getattr(config, "x", ...)
    return found


def _stored_names(node: cst.FunctionDef) -> set[str]:
    tree = ast.parse(cst.Module(body=[node]).code)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


class _Glue(cst.CSTTransformer):
    """Pass 1: decorators, annotations, docstrings, constants, dropout, logging, bases, hook."""

    def __init__(self, index: _ModuleIndex, rules: InlineRules, extra_refs: dict, dropout_attrs: set[str]):
        self.index, self.rules, self.extra_refs, self.dropout_attrs = index, rules, extra_refs, dropout_attrs

    def leave_Decorator(self, original, updated):
        root = _dotted(_callee(updated.decorator)).split(".")[0]
        line = self.index.import_lines.get(root, "")
        if root in KEPT_DECORATORS or (line and line.split()[1].split(".")[0] in KEPT_IMPORT_ROOTS):
            return updated
        return cst.RemoveFromParent()

    def leave_Param(self, original, updated):
        return updated.with_changes(annotation=None)

    def leave_Parameters(self, original, updated):
        keep = [p for p in updated.params if p.name.value not in self.rules.constants]
        if len(keep) != len(updated.params) and keep:
            keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(params=keep)

    def leave_FunctionDef(self, original, updated):
        if updated.name.value in PRESENTATION_METHODS:
            return cst.RemoveFromParent()
        return updated.with_changes(returns=None)

    def leave_ClassDef(self, original, updated):
        bases = []
        for base in updated.bases:
            target = self._object(_dotted(base.value))
            bases.append(base.with_changes(value=cst.parse_expression("nn.Module"))
                         if inspect.isclass(target) and self.rules.framework_base(target) else base)
        return updated.with_changes(bases=bases)

    def leave_AnnAssign(self, original, updated):
        if updated.value is None:
            return cst.RemoveFromParent()
        return cst.Assign(targets=[cst.AssignTarget(updated.target)], value=updated.value)

    def leave_SimpleStatementLine(self, original, updated):
        if any(isinstance(small, (cst.Import, cst.ImportFrom)) for small in updated.body):
            return cst.RemoveFromParent()  # inside the definition: the free names come from the top
        for small in updated.body:
            if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
                return cst.RemoveFromParent()  # a docstring or a bare string
            if isinstance(small, cst.Expr) and _dotted(_callee(small.value)).split(".")[0] in SILENCED_ROOTS:
                return cst.RemoveFromParent()
            if isinstance(small, cst.Assign) and any(_is_constant_ref(t.target, self.rules) for t in small.targets):
                return cst.RemoveFromParent()  # self.config = config
            if (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Name)
                    and _dotted(small.targets[0].target) == small.value.value):
                return cst.RemoveFromParent()  # x = x, what a dropout call leaves behind
            if isinstance(small, cst.Assign) and any(
                    _dotted(t.target).startswith("self.") and _dotted(t.target)[5:] in self.dropout_attrs
                    for t in small.targets):
                return cst.RemoveFromParent()
        return updated

    def leave_IndentedBlock(self, original, updated):
        if not updated.body:
            return updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated

    def leave_Attribute(self, original, updated):
        return self._constant(updated) or updated

    def leave_Call(self, original, updated):
        name = _dotted(updated.func)
        leaf = name.rsplit(".", 1)[-1]
        if name in RUN_MODE_QUERIES and not updated.args:
            return cst.Name("False")
        if name == "isinstance" and len(updated.args) == 2 and self._imported(updated.args[1].value) in ITERABLE_TYPES:
            return updated.with_changes(args=[updated.args[0], updated.args[1].with_changes(
                value=cst.parse_expression("(tuple, list)"))])
        if self._imported(updated.func) == "functools.partial" and updated.args:
            return self._partial(updated)
        if name in ("getattr", "hasattr") and len(updated.args) >= 2 and _root_constant(updated.args[0].value, self.rules):
            holder = _root_constant(updated.args[0].value, self.rules)
            attr = ast.literal_eval(cst.Module([]).code_for_node(updated.args[1].value))
            if name == "hasattr":
                return cst.Name(str(hasattr(holder, attr)))
            if hasattr(holder, attr):
                return _literal(getattr(holder, attr), f"{attr}")
            return updated.args[2].value if len(updated.args) > 2 else cst.Name("None")
        if leaf in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout") and updated.args:
            return updated.args[0].value
        if name.startswith("self.") and name[5:] in self.dropout_attrs and updated.args:
            return updated.args[0].value
        args = [a for a in updated.args if not _is_constant_ref(a.value, self.rules)]
        if len(args) != len(updated.args):
            args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
            updated = updated.with_changes(args=args)
        return self._hooked(updated)

    def leave_Subscript(self, original, updated):
        return self._hooked(updated)

    def _imported(self, node) -> str:
        """The dotted name `node` spells, its root resolved through the module's imports
        (`abc.Iterable` after `from collections import abc` is `collections.abc.Iterable`)."""
        dotted = _dotted(node)
        root, _, rest = dotted.partition(".")
        words = self.index.import_lines.get(root, "").split()
        if words[:1] == ["import"] and "as" in words:  # import a.b as root
            return f"{words[1]}.{rest}" if rest else words[1]
        if words[:1] == ["from"]:
            return f"{words[1]}.{words[3]}" + (f".{rest}" if rest else "")
        return dotted

    @staticmethod
    def _partial(node: cst.Call):
        code = lambda part: cst.Module([]).code_for_node(part)  # noqa: E731
        func, *given = node.args
        positional = [code(arg.value) for arg in given if arg.keyword is None and not arg.star]
        keywords = [f"{arg.keyword.value}={code(arg.value)}" for arg in given if arg.keyword is not None]
        if len(positional) + len(keywords) != len(given):
            return node  # *args or **kwargs given to partial: left as it is, and refused
        call = ", ".join([*positional, "*args", *keywords, "**kwargs"])
        return cst.parse_expression(f"lambda *args, **kwargs: {code(func.value)}({call})")

    def _hooked(self, node):
        if self.rules.hook is None:
            return node
        result = self.rules.hook(node, cst.Module([]).code_for_node(node))
        if result is None:
            return node
        source, refs = result
        self.extra_refs.update(refs)
        return cst.parse_expression(source)

    def _constant(self, node: cst.Attribute):
        path = _unself(_dotted(node))
        root, _, rest = path.partition(".")
        if root not in self.rules.constants or not rest:
            return None
        value = self.rules.constants[root]
        for part in rest.split("."):
            if not hasattr(value, part):
                return None
            value = getattr(value, part)
        return _literal(value, path, missing_ok=True)

    def _object(self, dotted: str):
        value = self.index.module
        for part in dotted.split("."):
            value = getattr(value, part, None)
        return value


class _SelfConstants(cst.CSTTransformer):
    """Pass 2: in a condition, `self.x` becomes its literal when x is assigned one exactly
    once, and a parameter the seed always leaves None becomes None."""

    def __init__(self, literals: dict[str, str], none_names: frozenset[str], weight_dtype: str | None = None):
        self.literals, self.none_names, self.weight_dtype = literals, none_names, weight_dtype

    def leave_If(self, original, updated):
        return updated.with_changes(test=updated.test.visit(self._literals()))

    def leave_IfExp(self, original, updated):
        return updated.with_changes(test=updated.test.visit(self._literals()))

    def _literals(self):
        return _ConditionLiterals(self.literals, self.none_names, self.weight_dtype)


# torch's dtype names, as a condition compares them (an alias reads as its dtype's name)
DTYPE_NAMES = {"float16": "float16", "half": "float16", "bfloat16": "bfloat16", "float32": "float32",
               "float": "float32", "float64": "float64", "double": "float64", "int8": "int8", "uint8": "uint8",
               "int16": "int16", "int32": "int32", "int": "int32", "int64": "int64", "long": "int64", "bool": "bool"}


class _ConditionLiterals(cst.CSTTransformer):
    def __init__(self, literals: dict[str, str], none_names: frozenset[str], weight_dtype: str | None = None):
        self.literals, self.none_names, self.weight_dtype = literals, none_names, weight_dtype
        self.not_variables: set[int] = set()  # attribute and keyword names are not variable reads

    def visit_Attribute(self, node):
        self.not_variables.add(id(node.attr))

    def visit_Arg(self, node):
        if node.keyword is not None:
            self.not_variables.add(id(node.keyword))

    def leave_Name(self, original, updated):
        if updated.value in self.none_names and id(original) not in self.not_variables:
            return cst.Name("None")
        return updated

    def leave_Attribute(self, original, updated):
        path = _dotted(updated)
        if path == "self.training":
            return cst.Name("False")  # a seed is an inference program
        if path.startswith("self.") and path[5:] in self.literals:
            return cst.parse_expression(self.literals[path[5:]])
        if self.weight_dtype and path.startswith("self.") and path.endswith(".dtype"):
            return cst.SimpleString(repr(self.weight_dtype))
        if self.weight_dtype and path.startswith("torch.") and path[6:] in DTYPE_NAMES:
            return cst.SimpleString(repr(DTYPE_NAMES[path[6:]]))
        return updated


class _Fold(cst.CSTTransformer):
    """Pass 3: expressions of literals become one literal; literal branches are taken."""

    def __init__(self):
        self.elif_nodes: set[int] = set()

    def visit_If(self, node):
        if isinstance(node.orelse, cst.If):
            self.elif_nodes.add(id(node.orelse))

    def leave_BinaryOperation(self, original, updated):
        return _folded(updated)

    def leave_BooleanOperation(self, original, updated):
        known, value = _evaluate(updated.left)  # `False and cache.layers[...]`: the right side never runs
        if known and isinstance(value, bool) and value == isinstance(updated.operator, cst.Or):
            return updated.left
        return _folded(updated)

    def leave_Comparison(self, original, updated):
        return _folded(updated)

    def leave_UnaryOperation(self, original, updated):
        return _folded(updated)

    def leave_Subscript(self, original, updated):
        return _folded(updated)

    def leave_IfExp(self, original, updated):
        known, value = _evaluate(updated.test)
        if not known:
            return updated
        return updated.body if value else updated.orelse

    def leave_If(self, original, updated):
        if id(original) in self.elif_nodes:
            return updated
        return _taken_branch(updated)


def _taken_branch(node: cst.If):
    known, value = _evaluate(node.test)
    if not known:
        return node
    if value:
        return cst.FlattenSentinel(node.body.body)
    if node.orelse is None:
        return cst.RemoveFromParent()
    if isinstance(node.orelse, cst.Else):
        return cst.FlattenSentinel(node.orelse.body.body)
    return _taken_branch(cst.If(test=node.orelse.test, body=node.orelse.body, orelse=node.orelse.orelse))


FOLDABLE = (ast.Expression, ast.Constant, ast.BinOp, ast.BoolOp, ast.Compare, ast.UnaryOp, ast.Tuple, ast.List,
            ast.Dict, ast.Subscript, ast.Load, ast.operator, ast.boolop, ast.cmpop, ast.unaryop, ast.Slice)


def _evaluate(node: cst.BaseExpression) -> tuple[bool, object]:
    """(True, value) for an expression made only of literals and operators."""
    try:
        tree = ast.parse(cst.Module([]).code_for_node(node).strip(), mode="eval")
    except SyntaxError:
        return False, None
    if not all(isinstance(n, FOLDABLE) for n in ast.walk(tree)):
        return False, None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # `None is not None` warns about comparing literals
            return True, eval(compile(tree, "<fold>", "eval"), {"__builtins__": {}})
    except Exception:  # a literal expression that fails (1 / 0) is left for runtime
        return False, None


def _folded(node):
    known, value = _evaluate(node)
    if known and isinstance(value, (int, float, str, bool, type(None))):
        folded = _literal(value, "", missing_ok=True)
        return folded if folded is not None else node
    return node


def _literal(value, path: str, missing_ok: bool = False):
    text = repr(value)
    try:
        literal_ok = ast.literal_eval(text) == value
    except (ValueError, SyntaxError):
        literal_ok = False
    if not literal_ok:
        if missing_ok:
            return None
        raise NotSelfContained(f"{path} is not a literal ({type(value).__name__})")
    return cst.parse_expression(text)


def _callee(node):
    return node.func if isinstance(node, cst.Call) else node


def _unself(path: str) -> str:
    """`self.config.x` -> `config.x`: a constant object the class keeps reads like the parameter."""
    return path[5:] if path.startswith("self.") else path


def _is_constant_ref(node, rules: InlineRules) -> bool:
    return _unself(_dotted(node)) in rules.constants


def _root_constant(node, rules: InlineRules):
    return rules.constants.get(_unself(_dotted(node)))


def _dropout_attributes(code: str) -> set[str]:
    """`self.x = nn.Dropout(...)`: attributes that only hold a dropout module."""
    found = set()
    for node in ast.walk(ast.parse(code)):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func).rsplit(".", 1)[-1].endswith("Dropout")):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                    found.add(target.attr)
    return found


def _literal_self_attributes(code: str) -> dict[str, str]:
    """self attributes assigned exactly once, to a literal expression: name -> its source."""
    assigned: dict[str, list[ast.expr]] = {}
    for node in ast.walk(ast.parse(code)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                    assigned.setdefault(leaf.attr, []).append(node.value if target is leaf else None)
    literals = {}
    for name, values in assigned.items():
        if len(values) == 1 and values[0] is not None:
            try:
                literals[name] = repr(ast.literal_eval(values[0]))
            except (ValueError, SyntaxError, TypeError):
                continue
    return literals


def _free_names(code: str) -> set[str]:
    """Names read but never bound in `code` (an over-approximation of what it needs)."""
    tree = ast.parse(code)
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound

