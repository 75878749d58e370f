"""What runs when a task's code is executed, before any of its functions is called.

`exec(row["code"])` runs a task's module level, its class bodies and, for every function, its
decorators, its default values and (without `from __future__ import annotations`) its
annotations; `typing.get_type_hints` evaluates the annotations written as strings. A consumer
does this on its own machine, outside any jail, so every one of those is held to a grammar
that leaves nothing to run:
- module level: imports, a docstring, constants (numbers, bools, None, tuples and lists of
  them, arithmetic of them, math's functions of them), classes and functions;
- a class: derives from an allowed nn.Module class or an earlier task class, has no keywords
  and no decorator, and its body holds a docstring, methods and constants;
- a decorator: staticmethod, classmethod, property or torch.no_grad(), called with nothing;
- a default value: a constant, or a name or attribute chain, and data of those (no call);
- an annotation: a type written as names, attributes, subscripts and `|` (no call).
What the functions do when called (__init__, forward, get_inputs, get_init_inputs) is the
policy's and the purity rules' to judge.
"""
from __future__ import annotations

import ast
import builtins
import math
import operator

import torch

from filters.grammar.syntax import Rejected, chain, docstring, target_names

CONSTANT_CALLS = frozenset({"int", "float", "min", "max", "abs", "round"})  # of constants, at module level
DECORATORS = frozenset({"staticmethod", "classmethod", "property", "torch.no_grad"})
# What a default value may be built of: names and data, nothing that calls.
DEFAULT_NODES = (ast.Constant, ast.Name, ast.Attribute, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.UnaryOp,
                 ast.BinOp, ast.Subscript, ast.Slice, ast.Load, ast.operator, ast.unaryop)
# What an annotation may be built of: a type, written out.
ANNOTATION_NODES = (ast.Constant, ast.Name, ast.Attribute, ast.Subscript, ast.Tuple, ast.List, ast.BinOp,
                    ast.BitOr, ast.Load, ast.Slice)


# How large what loading the code computes may grow: an int of this many bits, a list, tuple or
# text of this many items (`9 ** 9 ** 9` took the red team's consumer past its time limit).
MAX_BITS = 256
MAX_ITEMS = 1 << 16
MAX_LOOP = 1 << 20  # steps of a loop over a constant range
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert, ast.Not: operator.not_}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift,
           ast.RShift: operator.rshift, ast.BitOr: operator.or_, ast.BitAnd: operator.and_, ast.BitXor: operator.xor,
           ast.MatMult: operator.matmul}
_OPAQUE = object()  # a name or object whose value is not computed here (a class, a function)


def _bounded(node: ast.AST, function, *values):
    """`function(*values)`, when neither it nor its result can grow past MAX_BITS or MAX_ITEMS;
    otherwise the code is refused, since loading it would compute it."""
    if any(value is _OPAQUE for value in values):
        if function in (operator.neg, operator.pos) or not all(isinstance(v, (int, float)) or v is _OPAQUE
                                                               for v in values):
            return _OPAQUE
        raise Rejected("forbidden_call", node, f"{ast.unparse(node)[:60]}: arithmetic of what is no constant, "
                                               "computed when the code is loaded")
    if not _cheap(function, values):
        raise Rejected("forbidden_call", node, f"{ast.unparse(node)[:60]} is too large to compute when the code is "
                                               f"loaded (more than {MAX_BITS} bits or {MAX_ITEMS} items)")
    try:
        result = function(*values)
    except (ArithmeticError, ValueError, TypeError) as error:
        raise Rejected("forbidden_call", node, f"{ast.unparse(node)[:60]} fails when the code is loaded "
                                               f"({type(error).__name__})") from None
    if isinstance(result, int) and result.bit_length() > MAX_BITS:
        raise Rejected("forbidden_call", node, f"{ast.unparse(node)[:60]} is too large to compute when the code is "
                                               f"loaded (more than {MAX_BITS} bits)")
    return result


def _cheap(function, values) -> bool:
    """Whether computing `function(*values)` stays within the bounds, judged before it runs."""
    ints = [abs(value) for value in values if isinstance(value, int)]
    sizes = [len(value) for value in values if isinstance(value, (list, tuple, str, bytes))]
    if function is operator.pow and len(values) == 2 and all(isinstance(v, int) for v in values):
        base, exponent = values
        return exponent <= 0 or abs(base) <= 1 or exponent * abs(base).bit_length() <= MAX_BITS
    if function is operator.lshift:
        return all(value <= MAX_BITS for value in ints[1:])
    if function is operator.mul and sizes:
        return max(sizes) * max(ints, default=1) <= MAX_ITEMS
    if function in (math.factorial, math.comb, math.perm, math.prod, math.lcm):
        return all(value <= 1_000 for value in ints) and not sizes
    return True


def _bind(target: ast.AST, value, known: dict) -> None:
    if isinstance(target, ast.Name):
        known[target.id] = value
    elif isinstance(target, ast.Tuple):
        values = list(value) if isinstance(value, (tuple, list)) and len(value) == len(target.elts) \
            else [_OPAQUE] * len(target.elts)
        for element, item in zip(target.elts, values):
            _bind(element, item, known)


class ExecTime:
    """The module's shape, and every expression evaluated when its code is executed."""

    def __init__(self, policy):
        self.policy = policy
        self.constants: dict[str, object] = {}  # module-level constants and their values
        self.classes: set[str] = set()
        self.class_constants: dict[ast.ClassDef, dict] = {}  # what a method's defaults may name

    def check(self) -> None:
        for statement in self.policy.tree.body:
            if isinstance(statement, (ast.Import, ast.ImportFrom)) or docstring(statement):
                continue
            if isinstance(statement, ast.Assign):
                self._constant_assignment(statement, self.constants, "module level", lists=True)
            elif isinstance(statement, ast.ClassDef):
                self._class(statement)
            elif isinstance(statement, ast.FunctionDef):
                pass  # its decorators, defaults and annotations are checked below, with every function's
            else:
                raise Rejected("forbidden_call", statement, f"a {type(statement).__name__} statement at module level: "
                               "the module holds only imports, constants, classes and functions; "
                               "build tensors in get_inputs or __init__")
        for node in ast.walk(self.policy.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node not in self.policy.tree.body:
                raise Rejected("forbidden_import", node, "an import inside a definition: import at the top of the file")
            if isinstance(node, (ast.FunctionDef, ast.Lambda)):
                self._signature(node)
            if isinstance(node, ast.FunctionDef):
                self._decorators(node)
            if isinstance(node, ast.AnnAssign):
                self._annotation(node.annotation)
            if isinstance(node, ast.While):
                raise Rejected("forbidden_call", node, "a while loop may never end: loop over range(...) of sizes")
            if isinstance(node, (ast.BinOp, ast.UnaryOp)) and self._of_constants(node):
                self._value(node, self.constants)  # `[0] * 10 ** 11` in __init__ hangs its consumer too
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
                self._loop_bound(node)

    def _of_constants(self, node: ast.AST) -> bool:
        return all(isinstance(part, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.Tuple, ast.List, ast.Load,
                                     ast.operator, ast.unaryop)) or isinstance(part, ast.Name)
                   and part.id in self.constants for part in ast.walk(node))

    def _loop_bound(self, call: ast.Call) -> None:
        """`range(10 ** 15)`: a loop no task needs, and its consumer would wait for it."""
        for argument in call.args:
            if self._of_constants(argument):
                value = self._value(argument, self.constants)
                if isinstance(value, int) and abs(value) > MAX_LOOP:
                    raise Rejected("forbidden_call", call, f"range({ast.unparse(argument)[:40]}) runs more than "
                                                           f"{MAX_LOOP} steps")

    # module level and class bodies

    def _constant_assignment(self, node: ast.Assign, known: dict, where: str, lists: bool = False) -> None:
        """`width = 4 * features`: a constant, computed here within bounds, so that loading the
        code cannot take minutes or gigabytes (`9 ** 9 ** 9`, `[0] * 10 ** 12`)."""
        if not all(isinstance(t, (ast.Name, ast.Tuple)) for t in node.targets) or not self._constant(
                node.value, known, lists):
            held = "tuples and lists" if lists else "tuples"
            raise Rejected("forbidden_call", node, f"{where} holds only constants (numbers, bools, None, {held} of "
                           "them, and arithmetic of those): build containers and tensors in __init__ or get_inputs")
        value = self._value(node.value, known)
        for target in node.targets:
            _bind(target, value, known)

    def _constant(self, node: ast.AST, known: dict, lists: bool) -> bool:
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
        if isinstance(node, ast.Attribute):  # math.pi, torch.float32
            resolved = self.policy.resolve(node)
            return resolved is not None and not callable(resolved[0])
        if isinstance(node, ast.Call) and not node.keywords:
            callee = node.func.id if isinstance(node.func, ast.Name) else self.policy.canonical(node.func)
            return (callee in CONSTANT_CALLS and callee not in known or callee.startswith("math.")) and all(
                map(constant, node.args))
        return False

    def _value(self, node: ast.AST, known: dict):
        """The value of a constant expression, each step held within LIMITS before it is taken."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return known[node.id] if node.id in known else _OPAQUE
        if isinstance(node, (ast.Tuple, ast.List)):
            values = [self._value(element, known) for element in node.elts]
            return tuple(values) if isinstance(node, ast.Tuple) else values
        if isinstance(node, ast.Attribute):
            resolved = self.policy.resolve(node)
            return resolved[0] if resolved is not None else _OPAQUE
        if isinstance(node, ast.UnaryOp):
            return _bounded(node, _UNARY[type(node.op)], self._value(node.operand, known))
        if isinstance(node, ast.BinOp):
            return _bounded(node, _BINARY[type(node.op)], self._value(node.left, known), self._value(node.right, known))
        if isinstance(node, ast.Call):
            callee = node.func.id if isinstance(node.func, ast.Name) else self.policy.canonical(node.func)
            function = getattr(builtins, callee) if callee in CONSTANT_CALLS else self.policy.resolve(node.func)[0]
            return _bounded(node, function, *(self._value(argument, known) for argument in node.args))
        return _OPAQUE

    def _class(self, node: ast.ClassDef) -> None:
        if node.decorator_list:
            raise Rejected("forbidden_call", node, f"class {node.name} is decorated: write a plain class")
        if not node.bases:
            raise Rejected("forbidden_call", node, f"class {node.name} must derive from nn.Module")
        for base in node.bases:
            if not (isinstance(base, ast.Name) and base.id in self.classes or self._module_class(base)):
                raise Rejected("forbidden_call", node, f"class {node.name} must derive from nn.Module "
                               "(or from a class the task defined before it)")
        self.classes.add(node.name)
        attributes = self.class_constants[node] = dict(self.constants)
        for item in node.body:
            if docstring(item) or isinstance(item, ast.Pass):
                continue
            if isinstance(item, ast.Assign):
                self._constant_assignment(item, attributes, f"the body of class {node.name}")
            elif not isinstance(item, ast.FunctionDef):
                raise Rejected("forbidden_call", item, f"class {node.name} holds only methods and constants")

    def _module_class(self, base: ast.AST) -> bool:
        resolved = self.policy.resolve(base) if isinstance(base, (ast.Name, ast.Attribute)) else None
        return resolved is not None and isinstance(resolved[0], type) and issubclass(resolved[0], torch.nn.Module)

    # what a def or lambda evaluates when it is made

    def _decorators(self, node: ast.FunctionDef) -> None:
        for decorator in node.decorator_list:
            called = isinstance(decorator, ast.Call)
            if called and (decorator.args or decorator.keywords) or self._name(
                    decorator.func if called else decorator) not in DECORATORS:
                raise Rejected("forbidden_call", decorator, f"{node.name} is decorated: only staticmethod, "
                               "classmethod, property and torch.no_grad() are allowed")

    def _name(self, node: ast.AST) -> str:
        if isinstance(node, ast.Name) and node.id not in self.policy.modules and node.id not in self.policy.objects:
            return node.id
        return self.policy.canonical(node)

    def _signature(self, node: ast.FunctionDef | ast.Lambda) -> None:
        for default in [*node.args.defaults, *filter(None, node.args.kw_defaults)]:
            if not all(isinstance(part, DEFAULT_NODES) for part in ast.walk(default)):
                raise Rejected("forbidden_call", default, f"a default value runs when the code is loaded "
                               f"({ast.unparse(default)[:60]}): default to a constant or a name, and compute "
                               "in the body")
            self._value(default, self.class_constants.get(self.policy.parents.get(node), self.constants))
        if isinstance(node, ast.FunctionDef):
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                        *filter(None, [node.args.vararg, node.args.kwarg])]:
                if arg.annotation is not None:
                    self._annotation(arg.annotation)
            if node.returns is not None:
                self._annotation(node.returns)

    def _annotation(self, annotation: ast.AST) -> None:
        """A type written out; a string is parsed and held to the same (get_type_hints runs it)."""
        for part in ast.walk(annotation):
            if not isinstance(part, ANNOTATION_NODES) or isinstance(part, ast.BinOp) and not isinstance(
                    part.op, ast.BitOr):
                raise Rejected("forbidden_call", annotation, f"an annotation is evaluated when the code is loaded "
                               f"({ast.unparse(annotation)[:60]}): annotate with a type (torch.Tensor, int, "
                               "tuple[int, ...]), or not at all")
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                try:
                    parsed = ast.parse(part.value, mode="eval").body
                except SyntaxError:
                    raise Rejected("forbidden_call", annotation, f"the annotation {part.value[:60]!r} is no type")
                self._annotation(parsed)
                self._resolvable(parsed)

    def _resolvable(self, annotation: ast.AST) -> None:
        """A name inside a string annotation is held to the policy too (the policy walks only the
        task's own syntax tree, and a string is a leaf of it)."""
        for part in ast.walk(annotation):
            if isinstance(part, (ast.Name, ast.Attribute)) and not isinstance(self.policy.parents.get(part), ast.Attribute):
                if chain(part)[0] in self.policy.modules or chain(part)[0] in self.policy.objects:
                    self.policy.resolve(part)
                elif isinstance(part, ast.Attribute) or not _plain_type(part.id, self.policy):
                    raise Rejected("forbidden_call", annotation, f"the annotation names {ast.unparse(part)!r}: name "
                                   "types through the task's imports (torch.Tensor) or builtins (int, float)")


def _plain_type(name: str, policy) -> bool:
    return name in {"int", "float", "bool", "str", "complex", "tuple", "list", "dict", "set", "None"} or \
        name in policy.classes
