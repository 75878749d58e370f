"""Nothing is dead: every parameter moves the output, every submodule built in __init__ is
used, and no op of the chain can be dropped without changing the output (a ReLU after a
softmax, a clamp that never binds). Closes the "solve it by eliminating an operation" hole.

Ops are dropped alone and in runs of up to six consecutive ops (a chain, each feeding the
next): a pair that cancels (rfft then irfft, a transpose twice) survives any single drop. Two
runs apart are dropped together too: ops that cancel across others (a copy, an elementwise op,
an average over the copies; a scale, a ReLU, the unscale) survive any run.
A model torch.fx cannot trace symbolically (data-dependent control flow) is traced again on
its real inputs with make_fx, which records the aten ops the call ran, the branches it took
burned in; one that neither can trace is refused, never passed unablated.
"""
from __future__ import annotations

import contextlib
import functools
import io

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from filters.checks.measure.execution import ran_out_of_gpu_memory
from filters.computation.names import LAYOUT_ONLY

MAX_PARAMETERS = 32  # probe at most this many parameters (the largest first)
ABLATED_OPS = ("call_module", "call_function", "call_method")
# Casts and copies are no-ops in float32 but real ops in the half precision a kernel may use
# (an RMSNorm's `.to(torch.float32)` ... `.to(input_dtype)`): never "redundant".
NOT_ABLATED = {"to", "float", "double", "half", "bfloat16", "type", "type_as", "contiguous", "clone", "detach",
               # their aten forms, in a graph make_fx records
               "_to_copy", "_to_copy.default", "clone.default", "detach.default", "alias.default",
               "lift_fresh_copy.default", "_local_scalar_dense.default"}
# How many consecutive ops are dropped at once: runs up to six, as long as a chain of five ops
# with a layout op or two between them (four rolls that cancel passed runs of three)
WINDOWS = (1, 2, 3, 4, 5, 6)
# Two runs apart, each of up to three ops, are dropped together too: a copy, ops, then an
# average over the copies; a scale, a ReLU, the unscale (a red team's). At most MAX_PAIRS
# pairs a task, the shortest and nearest first.
PAIR_WINDOWS = (1, 2, 3)
MAX_PAIRS = 256
EPSILON = 1e-3  # adding a constant this small is a numerical-stability guard (`var + eps`), not an op


def find_dead_parameter(model, inputs, out, forward, close, atol, rtol, seed) -> str | None:
    """The name of a parameter whose perturbation leaves the output unchanged, if any."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    named = sorted(model.named_parameters(), key=lambda item: -item[1].numel())[:MAX_PARAMETERS]
    for name, parameter in named:
        saved = parameter.detach().clone()
        noise = torch.randn(parameter.shape, generator=generator).to(parameter.device, parameter.dtype)
        with torch.no_grad():
            parameter.add_(noise * max(float(saved.float().std()) if saved.numel() > 1 else 0.0, 0.1))
        try:
            unchanged = close(out, forward(model, inputs), atol, rtol)
        finally:
            with torch.no_grad():
                parameter.copy_(saved)
        if unchanged:
            return name
    return None


def trace(model):
    try:
        return fx.symbolic_trace(model)
    except Exception:  # data-dependent control flow and the like: no graph to ablate
        return None


def trace_on(model, inputs):
    """The aten ops one call on `inputs` runs, as a graph whose placeholders are the inputs;
    the branches the call took are burned in. None when even that fails; running out of GPU
    memory is not the task's failure, and goes to its gate (the job grows and tries again)."""
    try:
        with torch.no_grad():
            return make_fx(lambda *args: model(*args), _error_on_data_dependent_ops=False)(*inputs)
    except Exception as error:
        if ran_out_of_gpu_memory(error):
            raise
        return None


def find_unused_module(model, graph_module) -> str | None:
    used = {str(node.target).split(".")[0] for node in graph_module.graph.nodes
            if node.op in ("call_module", "get_attr")}
    return next((name for name, _ in model.named_children() if name not in used), None)


def find_redundant_op(graph_module, inputs, out, forward, close, atol, rtol) -> str | None:
    """The first run of ops (one to six in a chain, WINDOWS), or pair of runs apart from each
    other (PAIR_WINDOWS), whose removal, each run's output replaced by its input, keeps the
    output. `graph_module` is left as it was."""
    with contextlib.redirect_stderr(io.StringIO()):  # torch.fx prints each failed graph's code
        tensors = _tensor_nodes(graph_module, inputs)
        for drop in _drops(graph_module, tensors):
            ablated, label = _without(graph_module, drop)
            try:
                result = forward(ablated, inputs)
            except Exception:  # the ops changed a shape or dtype, so they cannot be dropped: not redundant
                continue
            if close(out, result, atol, rtol):
                return label
    return None


def _tensor_nodes(graph_module, inputs) -> set:
    """The nodes whose value is a tensor, on these inputs (not a size, nor its arithmetic). The
    graph is run node by node here: torch.fx's Interpreter starts a progress bar's thread."""
    values, found, given = {}, set(), iter(inputs)

    def load(arg):
        return fx.node.map_arg(arg, values.__getitem__)
    try:
        with torch.no_grad():
            for node in graph_module.graph.nodes:
                if node.op == "placeholder":
                    value = next(given)
                elif node.op == "get_attr":
                    value = functools.reduce(getattr, node.target.split("."), graph_module)
                elif node.op == "call_function":
                    value = node.target(*load(node.args), **load(node.kwargs))
                elif node.op == "call_method":
                    receiver, *rest = load(node.args)
                    value = getattr(receiver, node.target)(*rest, **load(node.kwargs))
                elif node.op == "call_module":
                    value = graph_module.get_submodule(node.target)(*load(node.args), **load(node.kwargs))
                else:
                    break
                values[node] = value
                if isinstance(value, torch.Tensor):
                    found.add(node)
    except Exception:  # no record, no pairs: the single runs are tried as before
        return set()
    return found


def _drops(graph_module, tensors: set):
    """What to drop, in the order tried: single runs by length, then pairs of runs that lie
    apart (a copy made, other ops, then the copies averaged; a scale, a ReLU, the unscale),
    the shortest and nearest first, MAX_PAIRS of them. Pairs are of ops whose values are
    tensors (`tensors`, not a size's arithmetic), and a pair of layout ops alone (a view around
    a linear that takes any leading dimensions) moves no data and is not tried."""
    ops = _ops(graph_module)
    runs = {window: [run for start in range(len(ops)) if (run := _run(ops, start, window))] for window in WINDOWS}
    for window in WINDOWS:
        yield from ([run] for run in runs[window])
    short = [run for window in PAIR_WINDOWS for run in runs[window] if all(node in tensors for node in run)]
    place = {node: index for index, node in enumerate(ops)}
    pairs = [(first, second) for first in short for second in short
             if place[first[-1]] < place[second[0]] and _source(second[0]) is not first[-1]
             and not all(_name(node).split(".")[0] in LAYOUT_ONLY for node in (*first, *second))]
    pairs.sort(key=lambda pair: (len(pair[0]) + len(pair[1]), place[pair[1][0]] - place[pair[0][-1]],
                                 place[pair[0][0]]))
    yield from (list(pair) for pair in pairs[:MAX_PAIRS])


def _ops(graph_module) -> list:
    """The ops the output depends on, in graph order (an op whose value nothing reads, such as
    a burned-in branch condition, is no part of the computation)."""
    needed, stack = set(), [node for node in graph_module.graph.nodes if node.op == "output"]
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    return [node for node in graph_module.graph.nodes if node.op in ABLATED_OPS and node in needed]


def _run(ops: list, start: int, window: int) -> tuple | None:
    """The chain of `window` droppable ops that starts at op `start`, or None when there is
    none: each op after the first is the only reader of the one before and takes it as its
    first input (other reads, such as a shape, may lie between them in the graph)."""
    run = [ops[start]]
    while len(run) < window:
        users = list(run[-1].users)
        if len(users) != 1 or users[0] not in ops or _source(users[0]) is not run[-1]:
            return None
        run.append(users[0])
    return tuple(run) if all(_droppable(node) for node in run) else None


def _without(graph_module, runs: list[tuple]):
    """A copy of the graph with each run dropped (its output replaced by its first op's input),
    and a label naming what was dropped."""
    new = fx.Graph()
    mapping: dict = {}
    new.output(new.graph_copy(graph_module.graph, mapping))
    copy = fx.GraphModule(graph_module, new)
    for run in runs:
        mapping[run[-1]].replace_all_uses_with(mapping[_source(run[0])])
    for node in sorted((node for run in runs for node in run), key=list(graph_module.graph.nodes).index, reverse=True):
        copy.graph.erase_node(mapping[node])
    copy.recompile()
    return copy, " and ".join(" then ".join(_label(node) for node in run) for run in runs)


def _source(node):
    return next((arg for arg in node.args if isinstance(arg, fx.Node)), None)


def _droppable(node) -> bool:
    name = _name(node)
    return (_source(node) is not None and node.target is not getattr and name not in NOT_ABLATED
            and not _adds_an_epsilon(node))


def _name(node) -> str:
    if isinstance(node.target, str):
        return node.target
    overload = getattr(node.target, "_overloadname", None)  # an aten op: aten.relu.default
    if overload is not None:
        return f"{node.target._opname}.{overload}"
    return getattr(node.target, "__name__", str(node.target))


def _label(node) -> str:
    return f"{node.op} {_name(node)}"


def _adds_an_epsilon(node) -> bool:
    name = _name(node).split(".")[0]
    constants = [arg for arg in node.args if isinstance(arg, (int, float)) and not isinstance(arg, bool)]
    return name in ("add", "sub", "iadd") and any(0 < abs(value) < EPSILON for value in constants)
