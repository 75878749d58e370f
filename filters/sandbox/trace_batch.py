"""Trace many tasks in one sandboxed child (`opsynth dedupe`, a reference set): a fork per
task costs several times the trace itself (tens of ms of page tables and copy-on-write on
a zygote that holds torch), which made 10,000 external tasks take half an hour.

Tasks that share a process could steer each other's traces: a task could rebind a torch
function, the tracer's tables or a builtin, start a thread, or push a dispatch mode. Only
tasks the static policy lets through share a child (pipeline/dedupe.py `shareable`): the
guards below run in the process they guard, and a red team's task holding the interpreter
replaced `changed` itself. For the rest, the child takes a digest of everything a trace
reads by name before the first task and again every CHECK_EVERY tasks, and traces a fixed
sentinel task at both ends of the batch; at both ends it also reads every namespace of
torch's modules and of the classes they hold, and the dispatcher's kernels (`torch_state`:
a red team steered a conv through `torch.nn.modules.conv.F`, a silu through
`torch._C._nn.silu` and through an `aten::silu` kernel registered with `torch.library`,
every conv through a name new to `nn.Conv2d`, any layer through a global forward hook).
When a digest changed, the batch ends there: the tasks since the last digest that held,
and every later one, are traced again alone, in a child of each. When the sentinel's trace
or `torch_state` changed, no trace of the batch is kept. Each task is loaded into a fresh
module namespace (`execution.load_task`), so a task's own names are never another's. What
none of these sees (a task that edits a container deep inside torch that only some later
task's op reads) is the residual risk: such a task can steer traces in its own batch of
32, not its verdicts (dedupe has none).
"""
from __future__ import annotations

import builtins
import os
import sys
import threading
import time

import torch
import torch.nn as nn

from filters.checks.harness import WARM_UP_TASK, read, trace

# A batch's answer stays well under what a worker's result may hold (worker.MAX_RESULT_BYTES).
MAX_BATCH_CHARS = 600_000
# Tasks traced between two digests (one takes 2-5 ms, a trace 20-40): when a digest changed,
# the traces since the last one are not kept and those tasks are traced alone.
CHECK_EVERY = 4
# A batch starts no task after this long (the child's hard limit is worker.TRACE_LIMIT_S): a
# batch of large networks that runs out of time loses none of the traces it made.
BATCH_BUDGET_S = 5.0
WATCHED_MODULES = ("torch", "torch.nn", "torch.nn.functional", "torch.fft", "torch.linalg", "torch.special",
                   "torch.nn.init", "torch.ops", "torch.utils._python_dispatch", "torch.utils._pytree", "math")
# The modules a trace runs (harness.trace): their tables are read by content as well, every
# other module of opsynth's by identity only (reading all by content took 9 ms a task).
OWN_PACKAGES = ("filters.", "operators.")
TRACER_MODULES = frozenset({"filters.computation.graph", "filters.computation.equivalences",
                            "filters.computation.recognise", "filters.computation.names", "filters.computation.record",
                            "filters.computation.memory", "filters.computation.values", "filters.checks.harness",
                            "filters.checks.measure.execution", "filters.checks.measure.resize",
                            "filters.sandbox.trace_batch"})


def trace_batch(codes: list[str]) -> dict:
    """{"traced": k, "steered": bool, "op_graph_0": ..., ..., "op_graph_{k-1}": ...}: the
    traces of the first k tasks, which no earlier task of the batch can have steered, and
    `partial_i` where the i-th is a partial reading (harness.Reading). k is
    less than len(codes) when a task changed the process (`steered`: the rest must be traced
    alone), or when the batch used its time or its answer's room (the rest may be batched again)."""
    began = time.monotonic()
    sentinel, before, whole = trace(WARM_UP_TASK), process_state(), torch_state()
    readings, trusted, steered = [], 0, False
    for i, code in enumerate(codes):
        readings.append(read(code, untrusted=False))  # batches trace the reference and `dedupe`'s tasks
        if (i + 1) % CHECK_EVERY == 0 or i + 1 == len(codes) or time.monotonic() - began > BATCH_BUDGET_S:
            steered = changed(before, process_state())  # by one of the tasks since the last look
            if steered:
                break
            trusted = i + 1
            if sum(len(r.graph or "") for r in readings) > MAX_BATCH_CHARS or time.monotonic() - began > BATCH_BUDGET_S:
                break
    if trace(WARM_UP_TASK) != sentinel or changed(whole, torch_state()):
        # steered where the digest does not look, deeper in torch or in its dispatcher, by a task unknown: none is kept
        trusted, steered = 0, True
    return {"traced": trusted, "steered": steered,
            **{f"op_graph_{i}": r.graph for i, r in enumerate(readings[:trusted])},
            **{f"partial_{i}": True for i, r in enumerate(readings[:trusted]) if r.partial}}


def process_state() -> dict:
    """What a task could change for the tasks after it: every attribute of the torch
    namespaces a task reaches, of builtins and of opsynth's modules, and every loaded module
    (by identity); of torch.Tensor and every nn layer class, no name added either; the
    tracer's own tables (by content); nn's global hooks; torch's global modes and the
    dispatch keys this thread includes or excludes; the process's threads. A few ms."""
    spaces = {name: vars(sys.modules[name]) for name in WATCHED_MODULES if name in sys.modules}
    spaces |= {"torch.Tensor": vars(torch.Tensor), "TensorBase": vars(torch._C.TensorBase),
               "builtins": vars(builtins), "sys.modules": sys.modules}
    spaces |= {name: vars(module) for name, module in list(sys.modules.items()) if name.startswith(OWN_PACKAGES)}
    state: dict = {name: dict(zip(space, map(id, list(space.values())))) for name, space in spaces.items()}
    # a class gains no name lazily: a new one shadows an inherited one (`nn.Conv2d.__call__`)
    state |= {f"class {cls.__name__}": _Namespace(vars(cls), closed=True)
              for cls in [torch.Tensor, torch._C.TensorBase, *(c for c in vars(nn).values() if isinstance(c, type))]}
    state["global hooks"] = {name: len(value) for name, value in vars(torch.nn.modules.module).items()
                             if name.startswith("_global") and isinstance(value, dict)}
    state["tables"] = [repr(list(vars(sys.modules[name]).values())) for name in TRACER_MODULES if name in sys.modules]
    state["modes"] = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled(),
                      torch.is_inference_mode_enabled(), torch._C._len_torch_dispatch_stack(),
                      torch._C._len_torch_function_stack(), torch.get_num_threads(),
                      str(torch._C._dispatch_tls_local_include_set()), str(torch._C._dispatch_tls_local_exclude_set()))
    state["threads"] = (threading.active_count(), len(os.listdir("/proc/self/task")))
    return state


def torch_state() -> dict:
    """What `process_state` does not read, read at the batch's ends (0.2-0.4 s): every torch
    module and class namespace (`torch_namespaces`) and the dispatcher (`dispatcher_state`)."""
    modules, classes = torch_namespaces()
    return {"modules": modules, "classes": classes, "dispatcher": dispatcher_state()}


def torch_namespaces() -> tuple[dict, dict]:
    """A fingerprint of every loaded torch module's namespace and of every class one of them
    holds, by name: torch's own code reads its module globals and class attributes when it
    runs (nn.Conv2d calls its module's `F.conv2d`, F.silu calls `torch._C._nn.silu`). A module
    may gain a name lazily; a class may not: a new name there shadows an inherited one
    (`nn.Conv2d.__call__`)."""
    modules = {name: module for name, module in list(sys.modules.items())
               if name.partition(".")[0] == "torch" and module is not None}
    classes = {}
    for module in modules.values():
        for value in list(vars(module).values()):
            if issubclass(type(value), type):  # not isinstance: a deprecated object warns when asked its class
                classes.setdefault(id(value), value)
    return ({name: _Namespace(vars(module)) for name, module in modules.items()},
            {key: _Namespace(vars(cls), closed=True) for key, cls in classes.items()})


class _Namespace:
    """A namespace's names and the identities they hold, read once. A later reading `holds` it
    when no name is gone or rebound (nor, in a `closed` one, added); the common case, nothing
    moved, is one comparison of tuples, in C."""
    __slots__ = ("names", "ids", "closed")

    def __init__(self, space, closed: bool = False):
        values = list(space.values())
        self.names, self.ids, self.closed = tuple(space), tuple(map(id, values)), closed

    def held_by(self, now: "_Namespace | None") -> bool:
        if now is None:
            return False
        if self.ids == now.ids and self.names == now.names:
            return True
        before, after = dict(zip(self.names, self.ids)), dict(zip(now.names, now.ids))
        return before == after if self.closed else before.items() <= after.items()


def dispatcher_state() -> dict:
    """Every operator's kernels as the dispatcher lists them: a kernel registered from Python
    (`torch.library.Library("aten", "IMPL").impl("silu", ...)`) replaces torch's own for
    every later task, and no Python namespace shows it. 0.2 s: read at the batch's ends only."""
    return {name: torch._C._dispatch_dump(name) for name in torch._C._dispatch_get_all_op_names()}


def changed(before: dict, now: dict) -> bool:
    """Whether anything of `before` is gone or different in `now`. A name that is new is no
    change: a trace may import a module (libcst, for the small batch) or set a lazy attribute."""
    return any(_changed(value, now.get(name)) for name, value in before.items())


def _changed(before, now) -> bool:
    if isinstance(before, _Namespace):
        return not before.held_by(now if isinstance(now, _Namespace) else None)
    if not isinstance(before, dict):
        return before != now
    if not isinstance(now, dict):
        return True
    if any(isinstance(value, _Namespace) for value in before.values()):
        return not all(space.held_by(now.get(name)) for name, space in before.items())
    return not before.items() <= now.items()
