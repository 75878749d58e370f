"""Trace many tasks in one sandboxed child (`opsynth dedupe`, a reference set): a fork per
task costs several times the trace itself (tens of ms of page tables and copy-on-write on
a zygote that holds torch), which made 10,000 external tasks take half an hour.

Tasks that share a process could steer each other's traces: a task from outside has passed
no static check, and could rebind a torch function, the tracer's tables or a builtin, start
a thread, or push a dispatch mode. So the child takes a digest of everything a trace reads
by name before the first task and again every CHECK_EVERY tasks, and traces a fixed
sentinel task at both ends of the batch. When a digest changed, the batch ends there: the
tasks since the last digest that held, and every later one, are traced again alone, in a
child of each (pipeline/dedupe.py). When the sentinel's trace changed, no trace of the batch
is kept. Each task is loaded into a fresh module namespace (`execution.load_task`), so a
task's own names are never another's. What the digest cannot see (a task that edits a
container deep inside torch that only some later task's op reads) is the residual risk:
such a task can steer traces in its own batch of 32, not its verdicts (dedupe has none).
"""
from __future__ import annotations

import builtins
import os
import sys
import threading
import time

import torch
import torch.nn as nn

from filters.sandbox.harness import WARM_UP_TASK, trace

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
TRACER_MODULES = frozenset({"filters.sandbox.op_graph", "filters.sandbox.harness", "filters.sandbox.execution",
                            "filters.sandbox.resize", "filters.sandbox.trace_batch"})


def trace_batch(codes: list[str]) -> dict:
    """{"traced": k, "steered": bool, "op_graph_0": ..., ..., "op_graph_{k-1}": ...}: the
    traces of the first k tasks, which no earlier task of the batch can have steered. k is
    less than len(codes) when a task changed the process (`steered`: the rest must be traced
    alone), or when the batch used its time or its answer's room (the rest may be batched again)."""
    began = time.monotonic()
    sentinel, before = trace(WARM_UP_TASK), process_state()
    graphs, trusted, steered = [], 0, False
    for i, code in enumerate(codes):
        graphs.append(trace(code))
        if (i + 1) % CHECK_EVERY == 0 or i + 1 == len(codes) or time.monotonic() - began > BATCH_BUDGET_S:
            steered = changed(before, process_state())  # by one of the tasks since the last look
            if steered:
                break
            trusted = i + 1
            if sum(len(graph or "") for graph in graphs) > MAX_BATCH_CHARS or time.monotonic() - began > BATCH_BUDGET_S:
                break
    if trace(WARM_UP_TASK) != sentinel:  # steered where the digest does not look, by a task unknown: none is kept
        trusted, steered = 0, True
    return {"traced": trusted, "steered": steered,
            **{f"op_graph_{i}": graph for i, graph in enumerate(graphs[:trusted])}}


def process_state() -> dict:
    """What a task could change for the tasks after it: every attribute of the torch
    namespaces a task reaches, of torch.Tensor, of every nn layer class, of builtins and of
    opsynth's modules, and every loaded module (by identity); the tracer's own tables (by
    content); torch's global modes; the process's threads. A few ms."""
    spaces = {name: vars(sys.modules[name]) for name in WATCHED_MODULES if name in sys.modules}
    spaces |= {"torch.Tensor": vars(torch.Tensor), "TensorBase": vars(torch._C.TensorBase),
               "builtins": vars(builtins), "sys.modules": sys.modules}
    spaces |= {f"nn.{name}": vars(cls) for name, cls in vars(nn).items() if isinstance(cls, type)}
    spaces |= {name: vars(module) for name, module in list(sys.modules.items()) if name.startswith(OWN_PACKAGES)}
    state: dict = {name: dict(zip(space, map(id, list(space.values())))) for name, space in spaces.items()}
    state["tables"] = [repr(list(vars(sys.modules[name]).values())) for name in TRACER_MODULES if name in sys.modules]
    state["modes"] = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled(),
                      torch.is_inference_mode_enabled(), torch._C._len_torch_dispatch_stack(),
                      torch._C._len_torch_function_stack(), torch.get_num_threads())
    state["threads"] = (threading.active_count(), len(os.listdir("/proc/self/task")))
    return state


def changed(before: dict, now: dict) -> bool:
    """Whether anything of `before` is gone or different in `now`. A name that is new is no
    change: a trace may import a module (libcst, for the small batch) or set a lazy attribute."""
    return any(not (value.items() <= now.get(name, {}).items()) if isinstance(value, dict) else value != now.get(name)
               for name, value in before.items())
