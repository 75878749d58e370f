"""Is forward a pure function of its inputs and weights? Measured at run time, in the
task's process, for filters/checks/pure.py's `Pure` check.

A reference that mutates what it is given, moves an RNG, keeps state between calls or
returns memory it will overwrite cannot be matched by a kernel that computes the same thing:
the reward then hinges on the call order, not on the computation. Each probe here measures;
the check decides.
"""
from __future__ import annotations

import math
import os
import types

import torch

_clone, _equal, _get_rng_state = torch.Tensor.clone, torch.equal, torch.get_rng_state
_storage_ptr = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
FINGERPRINT_DEPTH = 6  # how deep the hidden-state walk follows containers and objects
FINGERPRINT_ITEMS = 4096  # at most this many objects walked: a bound on the walk's cost
CONTAINER_ITEMS = 256  # of a container, its length and this many first items


def rng_states() -> list[torch.Tensor]:
    """The CPU generator's state and each CUDA generator's (only where CUDA has started)."""
    states = [_get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += list(torch.cuda.get_rng_state_all())
    return states


def same_tensors(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and _equal(x, y) for x, y in zip(a, b))


def weights(model) -> list[torch.Tensor]:
    """Every parameter and buffer, in a fixed order."""
    return [t for _, t in model.named_parameters()] + [t for _, t in model.named_buffers()]


def tensors_held(model) -> list[torch.Tensor]:
    """Every tensor the model holds: its weights and any tensor kept as a plain attribute."""
    held = weights(model)
    for module in model.modules():
        held += [value for value in vars(module).values() if isinstance(value, torch.Tensor)]
    return held


def aliases(outputs: list, others: list) -> bool:
    """Whether an output shares memory with any of `others` (inputs, weights, held tensors)."""
    pointers = {_storage_ptr(t) for t in others if t.numel()}
    return any(t.numel() and _storage_ptr(t) in pointers for t in outputs)


def fingerprint(model, task) -> list:
    """A comparable summary of the state a forward could keep between calls: every module's
    attributes beside its weights, the task module's globals, and what they reach (function
    closures and defaults, class attributes, containers, iterators through their pickled
    state). A tensor is summed up by its identity and version counter, which in-place writes
    bump. Two fingerprints differ when a call changed any of it: a counter, a memo, a
    remembered input, an `itertools.count`."""
    walker = _Walker()
    for name, module in model.named_modules():
        walker.add(name, {k: v for k, v in vars(module).items() if k not in ("_parameters", "_buffers")})
        walker.add(name + ".children", list(module._modules))
    walker.add("globals", {k: v for k, v in vars(task).items() if not k.startswith("__")})
    return walker.items


class _Walker:
    def __init__(self):
        self.items: list = []
        self.seen: set[int] = set()
        self.alive: list = []  # what was walked, kept alive: a freed object's id is reused

    def add(self, label: str, value) -> None:
        self.items.append((label, self.walk(value, 0)))

    def walk(self, value, depth: int):
        if isinstance(value, (type(None), bool, int, float, complex, str, bytes)):
            return value
        if isinstance(value, torch.Tensor):  # with what the task may have hung on it (`t.calls = 1`)
            extra = self.walk(dict(vars(value)), depth + 1) if vars(value) else None
            return ("tensor", id(value), value._version, tuple(value.shape), extra)
        if id(value) in self.seen or depth > FINGERPRINT_DEPTH or len(self.seen) > FINGERPRINT_ITEMS:
            return ("seen", id(value))
        self.seen.add(id(value))
        self.alive.append(value)
        return self._walk_object(value, depth + 1)

    def _walk_object(self, value, depth: int):
        if isinstance(value, types.ModuleType):
            return ("module", value.__name__)  # an imported library: not the task's state
        if isinstance(value, torch.nn.Module):
            return ("nn.Module", id(value))  # walked on its own by fingerprint()
        if isinstance(value, torch.Generator):
            return ("generator", bytes(value.get_state().numpy()))
        if isinstance(value, dict):
            items = list(value.items())[:CONTAINER_ITEMS]
            return ("dict", len(value), [(self.walk(k, depth), self.walk(v, depth)) for k, v in items])
        if isinstance(value, (list, tuple, set, frozenset)):
            if isinstance(value, (list, tuple)):
                items = list(value)[:CONTAINER_ITEMS]
            else:  # a set's order is not its content's: sorted, when small enough to sort
                items = sorted(value, key=repr) if len(value) <= CONTAINER_ITEMS else []
            return (type(value).__name__, len(value), [self.walk(item, depth) for item in items])
        if isinstance(value, types.FunctionType):
            cells = [self._cell(cell, depth) for cell in value.__closure__ or ()]
            return ("function", cells, self.walk(value.__defaults__, depth), self.walk(vars(value), depth))
        if isinstance(value, types.GeneratorType):
            frame = value.gi_frame
            return ("generator", frame.f_lasti if frame else None, self.walk(dict(frame.f_locals) if frame else {}, depth))
        if isinstance(value, type):
            if value.__module__ != "opsynth_task":
                return ("class", value.__module__, value.__qualname__)
            return ("class", self.walk({k: v for k, v in vars(value).items() if not k.startswith("__")}, depth))
        if hasattr(value, "cache_info"):  # functools.lru_cache and cache: their hits and size
            return ("cached", tuple(value.cache_info()), self.walk(getattr(value, "__wrapped__", None), depth))
        if type(value).__module__ == "opsynth_task" or isinstance(value, types.SimpleNamespace):
            return ("object", self.walk(vars(value), depth))
        return ("other", type(value).__name__, self._reduced(value, depth))

    def _cell(self, cell, depth: int):
        try:
            return self.walk(cell.cell_contents, depth)
        except ValueError:  # an empty cell
            return ("empty",)

    def _reduced(self, value, depth: int):
        """A builtin object (an iterator, a deque, a counter) through the state it pickles with."""
        try:
            return self.walk(value.__reduce_ex__(4)[1:], depth)
        except Exception:
            return ("opaque", id(value))


def later_calls(budget_ms: float, eager_ms, most: int) -> int:
    """How many calls the history probe makes before its last: a number drawn at run time from
    the OS, so a task cannot know which call is checked, within the time budget."""
    affordable = int(budget_ms / max(float(eager_ms or 1.0), 1e-3))
    top = max(1, min(most, affordable))
    return 1 + int.from_bytes(os.urandom(2), "little") % top


def finite_or_inf(value: float) -> float:
    return math.inf if math.isnan(value) else value
