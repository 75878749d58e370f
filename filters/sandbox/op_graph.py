"""What a task computes, whatever its spelling: the ordered ATen ops of one forward call.

Run inside the sandbox (it executes the task): the model and inputs are built on the meta
device (no memory, no arithmetic), and `make_fx` records every ATen op one forward call
dispatches. Python-level spelling is gone by then: aliases, helper methods, nn.Sequential
or explicit calls, module or functional form, size constants written as products or moved
into get_init_inputs all trace to the same ops. The trace is then canonicalised:
- layout-only ops (views, reshapes, transposes, copies, casts) and allocations are dropped;
- identity arithmetic is dropped (x * 1, x / 1, x + 0, x - 0, x ** 1);
- fused forms are split into their parts (addmm -> mm add, baddbmm -> bmm add), so that
  `nn.Linear` and `x @ w.t() + b` read the same;
- names lose their overload, in-place and internal spellings (`_softmax`, `relu_`,
  `native_batch_norm` -> softmax, relu, batch_norm).
Shapes and constant values are abstracted: the result is a sequence of op names.
"""
from __future__ import annotations

import torch

LAYOUT_ONLY = frozenset({
    "view", "unsafe_view", "reshape", "expand", "expand_as", "clone", "contiguous", "detach", "alias",
    "lift_fresh_copy", "lift_fresh", "to_copy", "to", "t", "transpose", "permute", "squeeze", "unsqueeze", "flatten",
    "unflatten", "view_as", "reshape_as", "empty", "empty_like", "zeros_like", "ones_like", "full_like", "copy",
    "slice", "select", "split", "split_with_sizes", "chunk", "unbind", "getitem", "type_as", "movedim", "as_strided",
    "resolve_conj", "resolve_neg", "dropout", "feature_dropout", "alpha_dropout", "identity", "scalar_tensor",
})
SPLIT = {"addmm": ("mm", "add"), "addmv": ("mv", "add"), "baddbmm": ("bmm", "add"), "addbmm": ("bmm", "sum", "add"),
         "linear": ("mm", "add"), "matmul": ("mm",), "bmm": ("mm",), "mv": ("mm",), "dot": ("mm",)}
IDENTITY = {"mul": 1, "div": 1, "true_divide": 1, "add": 0, "sub": 0, "pow": 1}
SUFFIXES = ("_legit_no_training", "_legit_functional", "_legit", "_functional", "_backward")


def op_graph(model: torch.nn.Module, inputs: list) -> list[str]:
    """The canonical op sequence of `model(*inputs)`; model and inputs on the meta device."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        traced = make_fx(lambda *args: model(*args))(*inputs)
    ops: list[str] = []
    for node in traced.graph.nodes:
        if node.op == "call_function":
            ops += canonical(node)
    return ops


def canonical(node) -> list[str]:
    """The op names one traced node stands for (none for layout and identity)."""
    name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
    packet = getattr(getattr(node.target, "overloadpacket", None), "__name__", name)
    name = packet.strip("_").removeprefix("native_")
    for suffix in SUFFIXES:
        name = name.removesuffix(suffix)
    name = name.rstrip("_")
    if name in LAYOUT_ONLY or _is_identity(name, node.args):
        return []
    return list(SPLIT.get(name, (name,)))


def _is_identity(name: str, args) -> bool:
    if name not in IDENTITY or len(args) < 2:
        return False
    scalars = [a for a in args[1:2] if isinstance(a, (int, float)) and not isinstance(a, bool)]
    return bool(scalars) and scalars[0] == IDENTITY[name]
