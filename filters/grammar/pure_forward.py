"""forward is a pure function of its inputs and of what __init__ built, and so is everything it
can reach: it writes no state (self, module globals, its inputs, a closure), keeps none between
calls (iterators, generators), branches only on constants, config, shapes and `is None`, and
never asks how it runs (device, dtype, compiling). The functions forward does not reach
(__init__, get_inputs, get_init_inputs) keep the rules that tell the checks' run from the
trace's: no question of how the code runs, and no branch on tensor values. docs/sandbox.md
says why each rule is there.

The module stays over 600 lines, and `_FunctionPurity` near 400, on purpose: the rules are one
walk over one function, and every rule reads the facts that walk gathers as it goes (which
names hold tensors, config or the task's own objects, what was stored). Split by rule, each
part would keep its own copy of those facts, and a rule that read a stale copy would let a
write or a branch through: for a check that hostile code must not pass, one walk and one set
of facts is the safer shape.
"""
from __future__ import annotations

import ast

import torch

from filters.grammar.policy import SAFE_BUILTINS
from filters.grammar.syntax import Rejected, chain as _chain, position as _position, target_names as _target_names

ITERATOR_MAKERS = frozenset({"map", "filter", "zip", "enumerate", "reversed"})

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
                      "keys", "unfold", "tensor_split", "hsplit", "vsplit", "squeeze_", "unsqueeze_", "parameters",
                      "named_parameters", "buffers", "named_buffers", "children", "named_children", "modules",
                      "named_modules"})
# Builtins whose result holds what they were given (a list of a module's parameters is its parameters).
CARRIERS = frozenset({"list", "tuple", "set", "dict", "sorted", "reversed", "iter", "enumerate", "zip", "filter", "map"})
INIT_NAMESPACE = "torch.nn.init."


def _builds_module(func: ast.AST) -> bool:
    """`nn.Linear(...)`, `torch.nn.ModuleList(...)`, `MyBlock(...)`: a call of a class."""
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name[:1].isupper()


class Purity:
    """forward, and every function and method it can reach, is a pure function of its inputs
    and of what __init__ built: it writes no state (self, module globals, its inputs, a
    closure), keeps none between calls (iterators, generators), branches only on constants,
    config, shapes and `is None`, and never asks how it runs (device, dtype, compiling)."""

    def __init__(self, policy):
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
        self.passed_on_parameters = self._passed_on_parameters()
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

    def _passed_on_parameters(self) -> dict[int, set[str]]:
        """The parameters of the task's own functions that are given a device or a dtype
        (`self.mask(n, x.dtype)`, `self.block(x, x.device)`), by function: they may only be
        passed on there too. A call of a layer the task keeps (`self.block`) may be any of its
        classes' forward."""
        functions = [node for node in ast.walk(self.tree) if isinstance(node, ast.FunctionDef)]
        marked: dict[int, set[str]] = {}
        changed = True
        while changed:
            changed = False
            for function in functions:
                passed = _passed_on_locals(list(ast.walk(function))) | marked.get(id(function), set())
                for call in (node for node in ast.walk(function) if isinstance(node, ast.Call)):
                    for callee, skip in self._callees(call):
                        names = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args]][skip:]
                        given = {names[i] for i, arg in enumerate(call.args) if i < len(names) and _carries(arg, passed)}
                        given |= {kw.arg for kw in call.keywords if kw.arg and _carries(kw.value, passed)}
                        if given - marked.get(id(callee), set()):
                            marked.setdefault(id(callee), set()).update(given)
                            changed = True
        return marked

    def _callees(self, call: ast.Call) -> list[tuple[ast.FunctionDef, int]]:
        """(a task function `call` may run, how many of its leading parameters the call does not
        fill: 1 for a method called on an object)."""
        func = call.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name in self.constructors:
            return [(init, 1) for init in self.constructors[name]]
        if name in self.definitions:
            skip = 1 if isinstance(func, ast.Attribute) else 0
            return [(definition, skip) for definition in self.definitions[name]]
        if isinstance(func, ast.Attribute) and name in self.policy.own_attributes:
            return [(forward, 1) for forward in self.definitions.get("forward", [])]
        return []

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
                callee = self.policy.canonical(node.value.func)
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


def _passed_on_locals(body: list) -> set[str]:
    """The locals a function keeps a device or dtype in (`q_type, k_type = q.dtype, k.dtype`)."""
    return {name for node in body if isinstance(node, ast.Assign) and _device_or_dtype(node.value)
            for target in node.targets for name in _target_names(target)}


def _carries(argument: ast.AST, passed: set[str]) -> bool:
    return _device_or_dtype(argument) or isinstance(argument, ast.Name) and argument.id in passed


def _makes_iterator(node: ast.AST) -> bool:
    if isinstance(node, ast.GeneratorExp):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ITERATOR_MAKERS)


def _in_place(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") and name in _TENSOR_METHODS


class _FunctionPurity:
    """The purity rules over one function that forward can reach."""

    def __init__(self, purity: Purity, function: ast.AST, constructing: bool = False):
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
        self.passed_on = _passed_on_locals(self.body) | purity.passed_on_parameters.get(id(function), set())

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
            if self.purity.policy.canonical(node.func).startswith("torch.") and not _builds_module(node.func):
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

    def _owner(self, node: ast.AST, at: ast.AST, seen: frozenset = frozenset(), element: bool = False
               ) -> tuple[str, str]:
        """Who owns the object `node` evaluates to: 'self', 'input' (a parameter not yet
        rebound), 'outer' (a name from outside the function) or 'fresh' (made here). With
        `element`, what is asked is an item taken out of it (a subscript, a loop's item): a
        list built here is fresh, and what it holds is its items' owners' (`[x]` holds the input)."""
        while True:
            if isinstance(node, ast.Subscript):
                node, element = node.value, True
            elif isinstance(node, (ast.Attribute, ast.Starred)):
                node = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ALIASING:
                node = node.func.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
                return "self", "self"
            elif isinstance(node, ast.Call) and self._own_function(node.func):
                # `self.cache_of(x).append(...)`: what a task function returns may be what it was given
                given = [*node.args, *(kw.value for kw in node.keywords)]
                given += [node.func.value] if isinstance(node.func, ast.Attribute) else []
                return self._first_owner(given, at, seen, element)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CARRIERS \
                    and node.func.id not in self.assignments:
                # `list(self.parameters())[0]`: a container built here holds what it was built from
                return self._first_owner(node.args, at, seen, True) if element else ("fresh", "")
            elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                return self._first_owner(node.elts, at, seen, False) if element else ("fresh", "")
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
        bound = [(value, element) for value in before] + [(loop, True) for loop in self._looped_over(name)]
        for value, of_element in bound:  # a loop's item is an element of what it loops over
            owner = ("fresh", name) if value is None else self._owner(value, at, seen | {name}, of_element)
            if owner[0] != "fresh":
                return owner[0], owner[1] or name
        return "fresh", name

    def _first_owner(self, nodes: list, at: ast.AST, seen: frozenset, element: bool) -> tuple[str, str]:
        owners = [self._owner(node, at, seen, element) for node in nodes]
        return next((owner for owner in owners if owner[0] != "fresh"), ("fresh", ""))

    def _call(self, node: ast.Call) -> None:
        random_op = self.purity.policy.random_op(node)
        if random_op:
            where = "forward" if self.name == "forward" else f"{self.name}, which forward runs"
            raise Rejected("stochastic_op", node, f"{random_op} in {where} makes the output random: draw in __init__ "
                                                  "or get_inputs, which forward does not run")
        dotted = self.purity.policy.canonical(node.func)
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
        root = _chain(node)[0]
        if root in self.purity.policy.modules or root in self.purity.policy.objects:
            return  # torch.dtype, torch.float32: an object the policy resolved, no tensor's attribute
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
        # str(x.device), print(...), bool(...): a builtin turns it into a value to inspect. A
        # function of the task's own receives it as a parameter these rules hold to the same
        # (Purity.passed_on_parameters: a red team's helper asked `d.index is None`).
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
            if self.purity.policy.canonical(func).startswith("math."):
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


