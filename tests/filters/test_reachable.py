"""An attacker's walk over everything the static policy lets a task name.

The policy allows a name by where it lives, then lets a task follow any public attribute of
what it holds. This walks that whole graph, as a task could: from every public object of
the allowed namespaces and of the run's library ops, and from the values a task holds at run
time (its module, a tensor and its autograd node, a storage, a generator, a hook handle, an
instance of each library op), through every attribute the policy lets it write, with no depth
limit (an instance is walked once per type). Nothing on the way may be a module outside the allowlist, a builtin the policy
refuses, or a function of a package outside the allowlist: any of those hands a task the
interpreter (as kornia's LazyLoader did, test_static_check)."""
import ast
import builtins
import functools
import importlib
import json
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import torch

from filters.sandbox import static_check as policy
from filters.sandbox.execution import load_task
from tests.conftest import make_task

LIBRARY_OPS = frozenset({"kornia.filters.GaussianBlur2d", "kornia.filters.gaussian_blur2d",
                         "einops.layers.torch.Rearrange", "einops.layers.torch.Reduce"})
ALLOWED_ROOTS = {"torch", "builtins", "opsynth_task", *(name.split(".")[0] for name in policy.STDLIB_MODULES),
                 *(name.split(".")[0] for name in LIBRARY_OPS)}
# Packages torch's own objects come from (their functions are torch's, reached as such).
TORCH_HOMES = {"typing_extensions", "sympy", "numpy", "abc", "types", "weakref", "contextlib", "copy", "inspect",
               "warnings", "re", "enum", "dataclasses", "functools", "collections", "itertools", "operator"}


TASK = make_task("return self.linear(x)", init="self.linear = nn.Linear(256, 256)")


def _starts():
    check = policy._Policy(ast.parse(""), LIBRARY_OPS)
    for namespace in sorted(policy.TORCH_NAMESPACES | policy.STDLIB_MODULES | check.library_ops.modules):
        module = importlib.import_module(namespace)
        for name in dir(module):
            dotted = f"{namespace}.{name}"
            try:
                found = getattr(module, name)
                check._allowed_object(dotted, found, None)
                check._library_op(dotted, found, [], None)
            except Exception:  # refused by the policy (or not there): a task cannot start here
                continue
            if not name.startswith("_") and not isinstance(found, types.ModuleType):
                yield dotted, found
    tensor = torch.rand(3, 4, requires_grad=True)
    model = load_task(TASK).Model()  # the task's own code: its module is opsynth_task
    yield "self", model
    yield "tensor", tensor * 2
    yield "tensor.grad_fn", (tensor * 2).grad_fn
    yield "storage", tensor.detach().untyped_storage()
    yield "generator", torch.Generator()
    yield "hook", model.register_forward_hook(lambda *args: None)
    yield "max", torch.max(tensor, 0)
    import einops.layers.torch
    import kornia.filters
    yield "blur", kornia.filters.GaussianBlur2d((3, 3), (1.5, 1.5))
    yield "rearrange", einops.layers.torch.Rearrange("b c h w -> b (c h w)")


def _walk(starts):
    """(path, what is wrong) for everything refused that a task can reach from `starts`,
    and how many objects the walk went through."""
    refused_builtins = {id(getattr(builtins, name)) for name in policy.DANGEROUS_BUILTINS
                        if callable(getattr(builtins, name)) and not isinstance(getattr(builtins, name), type)}
    seen, found = set(), []
    frontier = list(starts)
    while frontier:
        path, value = frontier.pop()
        # a class or function is itself; an instance is its type (`x.T.T...` makes new tensors
        # forever, and every tensor has the same attributes)
        key = id(value) if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)) else type(value)
        if key in seen:
            continue
        seen.add(key)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                names = dir(value)
            except Exception:
                continue
            for name in names:
                if name.startswith("_") or name in policy.DENIED_ATTRIBUTES:
                    continue  # the policy refuses both on any object
                try:
                    step = getattr(value, name)
                except Exception:
                    continue
                where = f"{path}.{name}"
                if isinstance(step, types.ModuleType):
                    if step.__name__ not in policy.TORCH_NAMESPACES | policy.STDLIB_MODULES:
                        found.append((where, f"the module {step.__name__}"))
                    continue  # a module is never a value: the policy checks chains through one by name
                if id(step) in refused_builtins:
                    found.append((where, f"the builtin {step.__name__}"))
                    continue
                home = getattr(step, "__module__", None) if callable(step) else None
                if isinstance(home, str) and home.split(".")[0].lstrip("_") not in ALLOWED_ROOTS | TORCH_HOMES:
                    found.append((where, f"a function of {home}"))
                    continue
                if not isinstance(step, (int, float, complex, str, bytes, bool, type(None))):
                    frontier.append((where, step))
    return found, len(seen)


def test_no_allowed_name_leads_out_of_the_allowlist():
    found, walked = _walk(_starts())
    assert walked > 2_500  # the walk really went through torch
    assert not found, "\n".join(f"{path}: {what}" for path, what in found[:20])


PROBE_ARGUMENTS = ((), ("cuda",), ("cpu",), ("os",), ("torch.os",))


def _call_results(starts):
    """What each function among `starts` returns when a task calls it with a few plausible
    arguments (a device name, a module's name): `torch.get_device_module("cuda")` handed a
    task `torch.cuda`, and with it `os`, though no attribute chain reached it. Classes are
    left out (an instance of each kind a task holds is a start already)."""
    import signal

    def too_long(*_):
        raise TimeoutError
    signal.signal(signal.SIGALRM, too_long)
    for path, value in starts:
        if isinstance(value, type) or not callable(value):
            continue
        for arguments in (*PROBE_ARGUMENTS, (torch.rand(3),)):
            signal.alarm(2)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    result = value(*arguments)
            except BaseException:
                continue
            finally:
                signal.alarm(0)
            yield f"{path}{arguments!r}", result


def _results_walk() -> tuple[list, int]:
    """What `_walk` finds refused from every call result, and a module outside the allowed
    namespaces returned by a call."""
    found, results = [], []
    for where, result in _call_results(_starts()):
        if isinstance(result, types.ModuleType) and result.__name__ not in policy.TORCH_NAMESPACES:
            found.append((where, f"the module {result.__name__}"))
            continue
        results.append((where, result))
    walked_found, walked = _walk(results)
    return found + walked_found, walked


def test_no_call_of_an_allowed_function_leads_out_of_the_allowlist():
    """Run in a process of its own: the calls change what global state the policy allows."""
    script = ("import json; from tests.filters.test_reachable import _results_walk; "
              "found, walked = _results_walk(); print(json.dumps([found, walked]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=str(Path(__file__).parents[2]))
    assert done.returncode == 0, done.stderr[-2000:]
    found, walked = json.loads(done.stdout.strip().splitlines()[-1])
    assert walked > 100
    assert not found, "\n".join(f"{path}: {what}" for path, what in found[:20])


def test_the_call_walk_finds_a_module_a_call_returns():
    found = dict((where, what) for where, result in _call_results([("torch.get_device_module",
                                                                     torch.get_device_module)])
                 for what in [f"the module {result.__name__}"] if isinstance(result, types.ModuleType))
    assert found.get("torch.get_device_module('cuda',)") == "the module torch.cuda"


class _Leaky:
    """What the walk exists to find: an innocent-looking object one attribute away from the
    interpreter (kornia.core.external holds `subprocess`, `sys` and a LazyLoader)."""
    helper = functools.partial(os.system)
    loader = importlib


def test_the_walk_finds_a_route_where_there_is_one():
    found, _ = _walk([("leaky", _Leaky), ("kornia.core.external", importlib.import_module("kornia.core.external"))])
    found = dict(found)
    assert found["leaky.helper.func"] == "a function of posix"
    assert found["leaky.loader"] == "the module importlib"
    assert found["kornia.core.external.subprocess"] == "the module subprocess"


DROPPED_STDLIB = ("functools", "itertools", "typing", "dataclasses", "collections", "enum", "operator", "numbers")


def test_no_stdlib_helper_is_a_start():
    """functools.update_wrapper sets attributes by name, dataclasses and typing run source
    built from strings: none of them is importable, and none is a start through torch
    either (`torch.nn.init.TypeVar` is typing's)."""
    assert policy.STDLIB_MODULES == {"math"}
    for module in DROPPED_STDLIB:
        assert policy.static_check(make_task("return x", header=f"import {module}"))[0] == "forbidden_import"
    homes = {getattr(found, "__module__", None) for _, found in _starts() if callable(found)}
    assert not {home for home in homes if isinstance(home, str) and home.split(".")[0] in DROPPED_STDLIB}
    assert policy.static_check(make_task("return x", header="from torch.nn.init import TypeVar"))[0] == "forbidden_call"
