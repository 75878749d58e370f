"""An attacker's walk over everything the allowlist lets a task name.

A task holds the allowlist's objects (every tensor function, layer, initialiser and math
function, and the run's library ops) and the values it makes at run time (its module, a
tensor, a layer of each kind, a named tuple, a list). From each, it may follow only the
attribute names the allowlist lets a task use on a value (and its own). This walks that whole
graph, with no depth limit (an instance is walked once per type), and then again from what
each allowed function returns when called. Nothing on the way may be a module (a module is
never a value), a builtin the policy refuses, a function of a package outside torch, math and
the library, or one of torch's functions that are not tensor functions (global setters, loaders,
modes): any of those hands a task the interpreter or the state of the process that runs it."""
import builtins
import importlib
import json
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import torch
import torch.overrides

from filters.grammar import allowlist as allowed
from filters.grammar import policy, static_check
from filters.checks.measure.execution import load_task
from tests.conftest import make_task

LIBRARY_OPS = frozenset({"kornia.filters.GaussianBlur2d", "kornia.filters.gaussian_blur2d",
                         "einops.layers.torch.Rearrange", "einops.layers.torch.Reduce"})
ALLOWED_HOMES = {"torch", "builtins", "math", "opsynth_task", "kornia", "einops"}
# Packages torch's own objects come from (their functions are torch's, reached as such).
TORCH_HOMES = {"typing_extensions", "sympy", "numpy", "abc", "types", "weakref", "contextlib", "copy", "inspect",
               "warnings", "re", "enum", "dataclasses", "functools", "collections", "itertools", "operator"}
TASK = make_task("return self.linear(x)", init="self.linear = nn.Linear(256, 256)")


def _allowlist():
    return allowed.allowlist().with_library_ops(LIBRARY_OPS)


def _global_state_functions() -> set[int]:
    """torch's functions the allowlist leaves out: its setters, seeds, modes and loaders (what
    torch.overrides lists as ignored, and every other function of torch's namespaces)."""
    listed = _allowlist().objects
    candidates = [*torch.overrides.get_ignored_functions(),
                  *(found for namespace in allowed.NAMESPACES if namespace.startswith("torch")
                    for found in vars(importlib.import_module(namespace)).values())]
    return {id(function) for function in candidates
            if callable(function) and not isinstance(function, type) and id(function) not in listed}


def _starts():
    names = _allowlist().objects
    for namespace in sorted(_allowlist().namespaces):
        module = importlib.import_module(namespace)
        for name, found in vars(module).items():
            if id(found) in names and not name.startswith("_"):
                yield f"{namespace}.{name}", found
    model = load_task(TASK).Model()  # the task's own code: its module is opsynth_task
    tensor = torch.rand(3, 4)
    yield "self", model
    yield "tensor", tensor * 2
    yield "parameter", model.linear.weight
    yield "max", torch.max(tensor, 0)
    yield "size", tensor.shape
    yield "finfo", torch.finfo(torch.float32)
    yield "list", [tensor]
    yield "dict", {"a": tensor}
    yield "text", "a b"
    # what else Python hands a task: a generator, an exception, its own functions, classes and methods
    yield "generator", (value for value in [tensor])
    yield "exception", ValueError("x")
    yield "function", load_task(TASK).get_inputs
    yield "class", load_task(TASK).Model
    yield "method", model.forward
    yield "no_grad", torch.no_grad()
    yield "device", tensor.device
    yield "dtype", tensor.dtype
    yield "range", range(3)
    yield "slice", slice(1, 2)
    yield "map", map(abs, [1])
    yield "zip", zip([1], [2])
    for name, layer in vars(torch.nn).items():
        if id(layer) in names and isinstance(layer, type) and issubclass(layer, torch.nn.Module):
            for arguments in ((), (4,), (4, 4), (4, 4, 3)):
                try:
                    yield f"nn.{name}{arguments}", layer(*arguments)
                    break
                except Exception:
                    continue
    import einops.layers.torch
    import kornia.filters
    yield "blur", kornia.filters.GaussianBlur2d((3, 3), (1.5, 1.5))
    yield "rearrange", einops.layers.torch.Rearrange("b c h w -> b (c h w)")


def _walk(starts):
    """(path, what is wrong) for everything refused that a task can reach from `starts`
    through the attribute names it may use on a value, and how many objects the walk went
    through. A task's own attribute names are its to choose: any name no kind of object it
    could hold answers to (allowlist.foreign_attributes) is walked as if the task had made it
    its own, as a red team did with `gi_frame`."""
    names = _allowlist()
    foreign = allowed.foreign_attributes()
    refused_builtins = {id(getattr(builtins, name)) for name in policy.DANGEROUS_BUILTINS
                        if callable(getattr(builtins, name)) and not isinstance(getattr(builtins, name), type)}
    global_state = _global_state_functions()
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
                attributes = dir(value)
            except Exception:
                continue
            for name in attributes:
                if not (names.allows_value_attribute(name) or name not in foreign):
                    continue  # the policy refuses the name on any value, and as a task's own
                try:
                    step = getattr(value, name)
                except Exception:
                    continue
                where = f"{path}.{name}"
                problem = _problem(step, refused_builtins, global_state)
                if problem:
                    found.append((where, problem))
                elif not isinstance(step, (int, float, complex, str, bytes, bool, type(None))):
                    frontier.append((where, step))
    return found, len(seen)


def _problem(step, refused_builtins: set[int], global_state: set[int]) -> str | None:
    if isinstance(step, types.ModuleType):
        return f"the module {step.__name__}"
    if id(step) in refused_builtins:
        return f"the builtin {step.__name__}"
    if id(step) in global_state or id(getattr(step, "__func__", None)) in global_state:
        return f"torch's {getattr(step, '__name__', step)}, no tensor function"
    home = getattr(step, "__module__", None) if callable(step) else None
    if isinstance(home, str) and home.split(".")[0].lstrip("_") not in ALLOWED_HOMES | TORCH_HOMES:
        return f"a function of {home}"
    return None


def test_no_allowed_name_leads_out_of_the_allowlist():
    found, walked = _walk(_starts())
    assert walked > 1_500  # the walk really went through torch
    assert not found, "\n".join(f"{path}: {what}" for path, what in found[:20])


PROBE_ARGUMENTS = ((), ("cuda",), ("cpu",), ("os",), ("torch.os",))


def _call_results(starts):
    """What each function among `starts` returns when a task calls it with a few plausible
    arguments (a device name, a module's name, a tensor): `torch.get_device_module("cuda")`
    handed a task `torch.cuda`, and with it `os`, though no attribute chain reached it.
    Classes are left out (an instance of each kind a task holds is a start already)."""
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
    """What `_walk` finds refused from every call result, and a module a call returns."""
    found, results = [], []
    for where, result in _call_results(_starts()):
        if isinstance(result, types.ModuleType):
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
    """What the walk exists to find: an innocent-looking object one allowed attribute away
    from the interpreter or from the process's state."""
    apply = staticmethod(os.system)
    values = importlib
    add = torch.set_default_dtype


def test_the_walk_finds_a_route_where_there_is_one():
    found = dict(_walk([("leaky", _Leaky)])[0])
    assert found["leaky.apply"] == "a function of posix"
    assert found["leaky.values"] == "the module importlib"
    assert found["leaky.add"] == "torch's set_default_dtype, no tensor function"


DROPPED_STDLIB = ("functools", "itertools", "typing", "dataclasses", "collections", "enum", "operator", "numbers")


def test_no_stdlib_helper_is_a_start():
    """functools.update_wrapper sets attributes by name, dataclasses and typing run source
    built from strings: none of them is importable, and none is a start through torch
    either (`torch.nn.init.TypeVar` is typing's)."""
    assert "math" in allowed.NAMESPACES and not set(DROPPED_STDLIB) & set(allowed.NAMESPACES)
    for module in DROPPED_STDLIB:
        assert static_check(make_task("return x", header=f"import {module}"))[0] == "forbidden_import"
    homes = {getattr(found, "__module__", None) for _, found in _starts() if callable(found)}
    assert not {home for home in homes if isinstance(home, str) and home.split(".")[0] in DROPPED_STDLIB}
    assert static_check(make_task("return x", header="from torch.nn.init import TypeVar"))[0] == "forbidden_call"
