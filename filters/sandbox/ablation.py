"""Nothing is dead: every parameter moves the output, every submodule built in __init__ is
used, and no op of the chain can be dropped without changing the output (a ReLU after a
softmax, a clamp that never binds). Closes the "solve it by eliminating an operation" hole.

Each probe is measured, then decided at the verification tolerance. Models that torch.fx
cannot trace (data-dependent control flow) get the parameter probe only, and say so.
"""
from __future__ import annotations

import torch
import torch.fx as fx

MAX_PARAMETERS = 32  # probe at most this many parameters (the largest first)
ABLATED_OPS = ("call_module", "call_function", "call_method")
# Casts and copies are no-ops in float32 but real ops in the half precision a kernel may use
# (an RMSNorm's `.to(torch.float32)` ... `.to(input_dtype)`): never "redundant".
NOT_ABLATED = {"to", "float", "double", "half", "bfloat16", "type", "type_as", "contiguous", "clone", "detach"}
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


def find_unused_module(model, graph_module) -> str | None:
    used = {str(node.target).split(".")[0] for node in graph_module.graph.nodes
            if node.op in ("call_module", "get_attr")}
    return next((name for name, _ in model.named_children() if name not in used), None)


def find_redundant_op(model, inputs, out, forward, close, atol, rtol) -> str | None:
    """The first op whose removal (its output replaced by its input) keeps the output."""
    graph_module = trace(model)
    count = sum(node.op in ABLATED_OPS for node in graph_module.graph.nodes)
    for position in range(count):
        ablated, label = _without(model, position)
        if ablated is None:
            continue
        try:
            result = forward(ablated, inputs)
        except Exception:  # the op changed the shape, so it cannot be dropped: not redundant
            continue
        if close(out, result, atol, rtol):
            return label
    return None


def _without(model, position: int):
    graph_module = fx.symbolic_trace(model)
    ops = [node for node in graph_module.graph.nodes if node.op in ABLATED_OPS]
    node = ops[position]
    source = next((arg for arg in node.args if isinstance(arg, fx.Node)), None)
    if (source is None or node.op == "call_method" and node.target in NOT_ABLATED or node.target is getattr
            or _adds_an_epsilon(node)):
        return None, ""
    label = f"{node.op} {node.target if isinstance(node.target, str) else getattr(node.target, '__name__', node.target)}"
    node.replace_all_uses_with(source)
    graph_module.graph.erase_node(node)
    graph_module.recompile()
    return graph_module, label


def _adds_an_epsilon(node) -> bool:
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    constants = [arg for arg in node.args if isinstance(arg, (int, float)) and not isinstance(arg, bool)]
    return name in ("add", "sub", "iadd") and any(0 < abs(value) < EPSILON for value in constants)
