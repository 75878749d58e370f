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
module namespace (`execution.load_task`), so a task's own names are never another's. Each
task has as long as it would alone (`task_limit_s`, the worker's TRACE_LIMIT_S): one still
tracing then is stopped (`OutOfTime`, raised by SIGALRM in its trace) and is untraced, as it
would be alone, and the batch ends with its checks done and every trace before it kept. Tasks
share the child's memory limit too: what a task's garbage holds is collected before the next
task, and the batch ends where a task keeps memory it still reaches (`holds_memory`). What
none of these sees (a task that edits a container deep inside torch that only some later
task's op reads) is the residual risk: such a task can steer traces in its own batch of
32, not its verdicts (dedupe has none).
"""
from __future__ import annotations

import builtins
import contextlib
import ctypes
import gc
import os
import signal
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
# Memory the tasks of a batch may leave in use: past it, the batch ends there and the rest go
# to a fresh child (`holds_memory`)
HELD_BYTES = 256 << 20
# A batch starts no task after this long (its child's limit is `batch_limit_s`): a batch of
# large networks ends well inside it and keeps every trace it made.
BATCH_BUDGET_S = 5.0
# The child's own limit: a task started before BATCH_BUDGET_S has its whole time, and the
# checks at the batch's ends (under a second each) have this much more.
END_CHECKS_S = 5.0
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


def batch_limit_s(task_limit_s: float) -> float:
    """How long a batch's child may take when each task may take `task_limit_s`."""
    return BATCH_BUDGET_S + task_limit_s + END_CHECKS_S


def trace_batch(codes: list[str], task_limit_s: float, under_way=lambda index: None) -> dict:
    """{"traced": k, "steered": bool, "op_graph_0": ..., ..., "op_graph_{k-1}": ...}: the
    traces of the first k tasks, which no earlier task of the batch can have steered, and
    `partial_i` where the i-th is a partial reading (harness.Reading). k is
    less than len(codes) when a task changed the process (`steered`: the rest must be traced
    alone), when a task was still tracing after `task_limit_s` (`timed_out`: its index; it is
    untraced, as it would be alone, and the rest may be batched again), or when the batch used
    its time or its answer's room (the rest may be batched again). (A slow network had run the
    child out of its time and cost every trace of its batch: 45 of the 250 KernelBench tasks
    of a CPU build were traced one per child after it.) `under_way(i)` is told the index of
    each task as its trace starts, and -1 when it ends: where the child dies (its memory, a C
    call no alarm stops), its parent traces that task alone and batches the rest again."""
    began = time.monotonic()
    sentinel, before, whole = trace(WARM_UP_TASK), process_state(), torch_state()
    room = memory_in_use()
    readings, trusted, steered, moved, timed_out, held = [], 0, False, [], None, False
    with _alarm() as alarm, _collected_apart():
        for i, code in enumerate(codes):
            under_way(i)
            try:
                with alarm.armed(task_limit_s):
                    readings.append(read(code, untrusted=False))  # batches trace the reference and `dedupe`'s tasks
            except OutOfTime:
                timed_out = i
            held = holds_memory(room)  # collecting its garbage is still the task's
            under_way(-1)
            over = time.monotonic() - began > BATCH_BUDGET_S
            if timed_out is not None or held or (i + 1) % CHECK_EVERY == 0 or i + 1 == len(codes) or over:
                now = process_state()
                steered = changed(before, now)  # by one of the tasks since the last look
                if steered:
                    moved = what_changed(before, now)
                    break
                trusted = len(readings)
                if timed_out is not None or held or over or sum(len(r.graph or "") for r in readings) > MAX_BATCH_CHARS:
                    break
    deep = torch_state()
    if trace(WARM_UP_TASK) != sentinel or changed(whole, deep):
        # steered where the digest does not look, deeper in torch or in its dispatcher, by a task unknown: none is kept
        trusted, steered = 0, True
        moved = what_changed(whole, deep) or ["the sentinel's trace"]
    return {"traced": trusted, "steered": steered, "moved": ", ".join(moved)[:200], "held_memory": held,
            **({"timed_out": timed_out} if timed_out is not None and not steered else {}),
            **{f"op_graph_{i}": r.graph for i, r in enumerate(readings[:trusted])},
            **{f"partial_{i}": True for i, r in enumerate(readings[:trusted]) if r.partial}}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


# looked up when this module loads, before the child's audit hook refuses `ctypes.dlsym`
_MALLINFO2 = getattr(ctypes.CDLL(None), "mallinfo2", None)
if _MALLINFO2 is not None:
    _MALLINFO2.restype = _MallInfo2


def memory_in_use() -> int:
    """The bytes malloc has handed out and not had back (what tensors on the CPU hold), or 0
    where the C library has no mallinfo2. Not the address space: malloc keeps what is freed
    mapped, and that grew by 1.7 GiB over 11 KernelBench L3 networks traced in one process."""
    if _MALLINFO2 is None:
        return 0
    info = _MALLINFO2()
    return info.uordblks + info.hblkhd


def holds_memory(room: int) -> bool:
    """Whether the tasks traced so far, their garbage collected, hold more than HELD_BYTES
    over `room`. A red team's task kept 5.75 GiB in a reference cycle the collector had not
    reached: the next task had too little of the child's memory limit for its trace on real
    tensors, and its reading fell back to the meta device's (`mm add relu` read `mm add mul
    relu mul`, and was cached). What garbage held is collected after every task; memory a
    task keeps where it is still reached ends the batch there."""
    gc.collect()
    return memory_in_use() - room > HELD_BYTES


@contextlib.contextmanager
def _collected_apart():
    """While inside, the objects made before are left out of the collector's passes
    (`gc.freeze`): a collection after each task then takes microseconds, not 0.3 s."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class OutOfTime(BaseException):
    """Raised in a trace that ran past its batch's time. Not an Exception: the tracer's
    `except Exception` would take it for a task that cannot be traced."""


class _Alarm:
    """While `armed(seconds)`, SIGALRM raises OutOfTime in the trace under way when the
    seconds have passed; disarmed, nothing."""

    def __init__(self):
        self.on = False

    def ring(self, signum, frame) -> None:
        if self.on:
            self.on = False
            raise OutOfTime

    @contextlib.contextmanager
    def armed(self, seconds: float):
        self.on = True
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
        try:
            yield
        finally:
            self.on = False
            signal.setitimer(signal.ITIMER_REAL, 0)


@contextlib.contextmanager
def _alarm():
    """An _Alarm on SIGALRM while inside. SIGALRM, not a watchdog thread: a thread would change
    the process's thread count, which the batch's looks compare (the GPU gate's step limit,
    which also arms SIGALRM, runs in no batch: its traces are on the CPU)."""
    alarm = _Alarm()
    previous = signal.signal(signal.SIGALRM, alarm.ring)
    try:
        yield alarm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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


def what_changed(before: dict, now: dict) -> list[str]:
    """The names `changed` found changed, one level down (a namespace's names), for the log."""
    moved = []
    for name, value in before.items():
        if not _changed(value, now.get(name)):
            continue
        inner = now.get(name)
        if isinstance(value, dict) and isinstance(inner, dict):
            moved += [f"{name}: {key}" for key, held in value.items() if _changed(held, inner.get(key))] or [name]
        elif isinstance(value, _Namespace) and isinstance(inner, _Namespace):
            after = dict(zip(inner.names, inner.ids))
            moved += [f"{name}.{key}" for key, held in zip(value.names, value.ids) if after.get(key) != held] or [name]
        else:
            moved.append(name)
    return moved


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
