"""Every known way past the static policy, and systematic mutations of each: all refused.

Each attack is a task's forward (with what its header and __init__ need). Each mutation
moves the same attack somewhere else a task could put it: an aliased or from-imported
torch, a module-level helper, a method, a nested nn.Module, a lambda kept by __init__, a
comprehension. A rule that reads how an attack is spelled rather than what it does lets
one of the mutants through."""
import ast
import re
import textwrap

import pytest

from filters.grammar import static_check
from tests.conftest import make_task

DUNDER_GLOBALS = '"_" * 2 + "glob" + "als" + "_" * 2'
ATTACKS = {
    # reaching attributes or source by name (the issue's three, and the builtins' routes)
    "functools.update_wrapper": ("import functools", "",
                                 f"functools.update_wrapper(self, torch.relu, assigned=({DUNDER_GLOBALS},))\nreturn x"),
    "dataclasses exec": ("import dataclasses", "", "dataclasses.make_dataclass('K', ['a'])\nreturn x"),
    "typing.TypedDict": ("import typing", "", "typing.TypedDict('K', {'a': int})\nreturn x"),
    "format built at run time": ("", "", 'f = "{0." + ' + DUNDER_GLOBALS + ' + "}"\nreturn x * len(f.format(torch.relu))'),
    "format_map": ("", "", 'return x * len("{a}".format_map({"a": 1}))'),
    "getattr": ("", "", 'return getattr(x, "re" + "lu")()'),
    "type": ("", "", "return type(x)(x)"),
    "vars": ("", "", "return x * len(vars(self))"),
    "__class__": ("", "", "return x.__class__(x)"),
    "hasattr by concatenation": ("", "", 'return x if hasattr(x, "re" + "lu") else -x'),
    "name joined for register_buffer": ("", "", 'self.register_buffer("".join(["b", "uf"]), x)\nreturn x'),
    "name from chr for add_module": ("", "", "self.add_module(chr(102), nn.ReLU())\nreturn x"),
    "Tensor.type by dotted name": ("", "", 'return x.type("torch." + "DoubleTensor")'),
    "get_submodule": ("", "", 'return self.get_submodule("").forward(x)'),
    # state kept between calls
    "module-level list": ("seen = []", "", "seen.append(x)\nreturn x * len(seen)"),
    "itertools.count on self": ("import itertools", "self.counter = itertools.count()",
                                "return x * next(self.counter)"),
    "closure over a list": ("", "calls = []\nself.bump = lambda: calls.append(1)", "self.bump()\nreturn x"),
    "bound method kept": ("", "calls = []\nself.bump = calls.append", "self.bump(1)\nreturn x"),
    "closure handed to a constructor": ("", "calls = []\nself.keep = nn.Sequential()\nself.fn = max(lambda: calls.append(1), None, key=bool)",
                                         "self.fn()\nreturn x"),
    "self's container through a method": ("", "self.seen = []\nself.store = lambda: self.seen",
                                          "self.store().append(x)\nreturn x"),
    "counter on self": ("", "self.calls = 0", "self.calls += 1\nreturn x * self.calls"),
    "buffer changed in place": ("", 'self.register_buffer("acc", torch.zeros(256))',
                                "self.acc.add_(x.mean(0))\nreturn x + self.acc"),
    "generator kept on self": ("", "self.steps = (i for i in range(10 ** 9))",
                               "for i in self.steps:\n    break\nreturn x * i"),
    "iterator kept on self": ("", "self.steps = map(float, range(10 ** 9))",
                              "for i in self.steps:\n    break\nreturn x * i"),
    "input changed in place": ("", "", "x.mul_(2)\nreturn x"),
    "out= into the input": ("", "", "torch.relu(x, out=x)\nreturn x"),
    "init in forward": ("", "self.w = nn.Parameter(torch.ones(256, 256))",
                        "torch.nn.init.zeros_(self.w)\nreturn x @ self.w"),
    # data-dependent control flow and introspection
    "branch on values": ("", "", "if x.sum() > 0:\n    return x\nreturn -x"),
    "branch on item": ("", "", "return x if x.mean().item() > 0 else -x"),
    "branch on device": ("", "", "if x.is_cuda:\n    return x\nreturn -x"),
    "branch on dtype": ("", "", "if x.dtype == torch.float32:\n    return x\nreturn -x"),
    "is_meta": ("", "", "return x if not x.is_meta else x * 2"),
    "is_compiling": ("", "", "return x if torch.compiler.is_compiling() else -x"),
    "is_grad_enabled": ("", "", "return x if torch.is_grad_enabled() else -x"),
    "data_ptr": ("", "", "return x * (x.data_ptr() % 7)"),
    "storage": ("", "", "return x * x.untyped_storage().size()"),
}


def _indent(code: str, spaces: int) -> str:
    return textwrap.indent(code, " " * spaces)


def as_written(header, init, body):
    return make_task(body, header=header, init=init)


def aliased_torch(header, init, body):
    return make_task(re.sub(r"\btorch\.", "T.", body), header=header + "\nimport torch as T", init=init)


def from_imported(header, init, body):
    """`torch.a.b(` becomes `b(` with `from torch.a import b`; the rest stays."""
    found = re.search(r"\btorch\.((?:\w+\.)*)(\w+)\(", body)
    if not found:
        return aliased_torch(header, init, body)
    module = ("torch." + found.group(1)).rstrip(".")
    return make_task(body.replace(found.group(0), found.group(2) + "("),
                     header=f"{header}\nfrom {module} import {found.group(2)}", init=init)


def module_helper(header, init, body):
    helper = f"def run(self, x):\n{_indent(body, 4)}"
    return make_task("return run(self, x)", header=f"{header}\n{helper}", init=init)


def method(header, init, body):
    return make_task("return self.run(x)", header=header, init=init).replace(
        "    def forward(self, x):", f"    def run(self, x):\n{_indent(body, 8)}\n\n    def forward(self, x):")


def nested_module(header, init, body):
    inner = (f"class Inner(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             f"{_indent(init or 'pass', 8)}\n\n    def forward(self, x):\n{_indent(body, 8)}")
    return make_task("return self.inner(x)", header=f"{header}\n{inner}", init="self.inner = Inner()")


def kept_lambda(header, init, body):
    helper = f"def run(self, x):\n{_indent(body, 4)}"
    return make_task("return self.run(x)", header=f"{header}\n{helper}",
                     init=f"{init}\nself.run = lambda t: run(self, t)")


def comprehension(header, init, body):
    helper = f"def run(self, x):\n{_indent(body, 4)}"
    return make_task("return [run(self, t) for t in (x,)][0]", header=f"{header}\n{helper}", init=init)


MUTATIONS = [as_written, aliased_torch, from_imported, module_helper, method, nested_module, kept_lambda,
             comprehension]
CASES = [(attack, mutation) for attack in ATTACKS for mutation in MUTATIONS]


@pytest.mark.parametrize("attack, mutation", CASES, ids=[f"{a}-{m.__name__}" for a, m in CASES])
def test_every_mutant_of_every_attack_is_refused(attack, mutation):
    code = mutation(*ATTACKS[attack])
    ast.parse(code)  # the mutant is a program, refused for what it does
    verdict = static_check(code)
    assert verdict is not None and verdict[0] not in ("syntax_error", "bad_interface"), (verdict, code)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.__name__ for m in MUTATIONS])
def test_every_mutation_of_a_harmless_forward_passes(mutation):
    """The mutations alone are legitimate: the attacks are refused for the attack, not the place."""
    code = mutation("", "self.scale = 2.0", "y = torch.relu(x) * self.scale\nif y.shape[0] > 1:\n    y = y + 1\nreturn y")
    assert static_check(code) is None, static_check(code)
