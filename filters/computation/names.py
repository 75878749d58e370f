"""One name for each op, whatever its spelling: overloads, in-place and internal forms, fused
forms split into their parts, one name for each family a rewrite moves between, layout and
identity dropped (`canonical`); the normalisations named by what they normalise over
(`norm_name`); a cat of the same computation on parts of one tensor read once
(`_merged_branches`); and a run of ops that is exactly a composite's decomposition named as
that composite (`named_composites`).
"""
from __future__ import annotations

import functools
import math
import dataclasses
import re
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
import torch.utils._pytree

from filters.computation.record import _Op, _Recorder

LAYOUT_ONLY = frozenset({
    "view", "unsafe_view", "reshape", "expand", "expand_as", "clone", "contiguous", "detach", "alias",
    "lift_fresh_copy", "lift_fresh", "to_copy", "to", "t", "transpose", "permute", "squeeze", "unsqueeze", "flatten",
    "unflatten", "view_as", "reshape_as", "empty", "empty_like", "zeros_like", "ones_like", "full_like", "copy",
    "slice", "select", "split", "split_with_sizes", "chunk", "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk",
    "unbind", "getitem", "type_as", "movedim", "as_strided",
    "resolve_conj", "resolve_neg", "dropout", "feature_dropout", "alpha_dropout", "identity", "scalar_tensor",
    "broadcast_in_dim", "full", "zeros", "ones", "empty_strided", "convert_element_type", "squeeze_copy",
    "unsqueeze_copy", "view_copy", "expand_copy", "permute_copy", "t_copy", "transpose_copy", "new_zeros",
    "new_ones", "new_empty", "new_full", "real", "tensor_split", "written_through_view",
    "repeat", "tile",  # copies of the value side by side, as `expand` then `contiguous` makes
})
# Bounds a task writes (a clamp, a minimum with a constant): kept where they do not bind on the
# trace's values, which say nothing of a kernel's inputs (KernelBench's Matmul_Min_Subtract
# traced as a bare Linear, and every Linear with an epilogue matched it at 1.0).
BOUNDING = frozenset({"clamp", "clamp_min", "clamp_max", "minimum", "maximum", "min", "max", "fmin", "fmax",
                      "hardtanh", "relu6"})
SELECTION = frozenset({"where", "gt", "lt", "ge", "le", "eq", "ne", "masked_fill", "logical_not", "logical_and",
                       "logical_or", "isnan", "isinf", "isfinite"})
SPLIT = {"addmm": ("mm", "add"), "addmv": ("mm", "add"), "baddbmm": ("mm", "add"), "addbmm": ("mm", "add"),
         "linear": ("mm", "add"), "matmul": ("mm",), "bmm": ("mm",), "mv": ("mm",), "dot": ("mm",),
         "mean": ("sum", "mul"), "log1p": ("add", "log"), "expm1": ("exp", "add"), "rsqrt": ("sqrt", "mul"),
         # a fused multiply-add is its parts (an adversary wrote a norm's weight and bias as one addcmul)
         "addcmul": ("mul", "add"), "addcdiv": ("mul", "add"), "lerp": ("add", "mul", "add")}
SAME_AS = {"sub": "add", "rsub": "add", "div": "mul", "true_divide": "mul", "neg": "mul", "reciprocal": "mul",
           "square": "mul", "clamp_min": "clamp", "clamp_max": "clamp", "amax": "max", "amin": "min",
           "conv_tbc": "convolution1d",  # a 1-D convolution of (time, batch, channels) values
           # attention is one op whichever kernel a device picks for it
           **dict.fromkeys(("scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_flash_attention",
                            "scaled_dot_product_efficient_attention", "scaled_dot_product_cudnn_attention",
                            "scaled_dot_product_fused_attention_overrideable"), "scaled_dot_product_attention")}
IDENTITY = {"mul": 1, "div": 1, "true_divide": 1, "add": 0, "sub": 0, "pow": 1}
SUFFIXES = ("_legit_no_training", "_legit_functional", "_legit", "_functional", "_backward")
MERGES = frozenset({"cat", "stack", "concat", "concatenate"})


def _primitives(recorder: "_Recorder", out) -> list[str]:
    nodes = recorder.reaching([t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)])
    spelled = set(nodes) - _merged_branches(nodes) - padded_by_convolutions(nodes)
    return [op for node in nodes if node in spelled for op in canonical(node, symbolic=True)]


def named_composites(ops: list[str]) -> list[str]:
    """`ops` with every run that is exactly a composite's decomposition named as the
    composite (the longest first)."""
    runs = _composite_runs()
    out, i = [], 0
    while i < len(ops):
        for run, name in runs:
            if tuple(ops[i:i + len(run)]) == run:
                out.append(name)
                i += len(run)
                break
        else:
            out.append(ops[i])
            i += 1
    return out


# What each composite is called with to learn its decomposition: (name, call on x of shape 4x8x6).
COMPOSITES = (
    ("gelu", lambda x: F.gelu(x)), ("gelu", lambda x: F.gelu(x, approximate="tanh")), ("silu", F.silu),
    ("mish", F.mish), ("softplus", F.softplus), ("sigmoid", torch.sigmoid), ("hardswish", F.hardswish),
    ("hardsigmoid", F.hardsigmoid), ("elu", F.elu), ("selu", F.selu), ("celu", F.celu),
    ("leaky_relu", F.leaky_relu), ("log_sigmoid", F.logsigmoid), ("hardtanh", F.hardtanh), ("relu6", F.relu6),
    ("softmax", lambda x: torch.softmax(x, -1)), ("log_softmax", lambda x: torch.log_softmax(x, -1)),
    ("logsumexp", lambda x: torch.logsumexp(x, -1)), ("glu", lambda x: F.glu(x, -1)),
    ("layer_norm", lambda x: F.layer_norm(x, (6,))),
    ("layer_norm", lambda x: F.layer_norm(x, (6,), torch.ones(6), torch.zeros(6))),
    ("group_norm", lambda x: F.group_norm(x, 2)),
    ("group_norm", lambda x: F.group_norm(x, 2, torch.ones(8), torch.zeros(8))),
    ("batch_norm", lambda x: F.batch_norm(x, torch.zeros(8), torch.ones(8))),
    ("batch_norm", lambda x: F.batch_norm(x, torch.zeros(8), torch.ones(8), torch.ones(8), torch.zeros(8))),
    ("instance_norm", lambda x: F.instance_norm(x)),
)
_COMPOSITE_NAMES = frozenset(name for name, _ in COMPOSITES)


@functools.cache
def _composite_runs() -> list[tuple[tuple[str, ...], str]]:
    """Each composite's canonical decomposition, recorded once on the meta device, all the
    way down (`1 / (1 + exp(-x)) * x`) and one level down (`sigmoid(x) * x`: SiLU as
    KernelBench writes it); longest first."""
    runs: dict[tuple[str, ...], str] = {}
    for name, call in COMPOSITES:
        for depth in ("all", "outer"):
            recorder = _Recorder(decompose=depth)
            try:
                with torch.device("meta"):
                    x = torch.empty(4, 8, 6)
                    with torch.no_grad(), recorder:
                        out = call(x)
            except Exception:  # a composite this torch cannot run on meta: its ops stay as they are
                continue
            run = tuple(_primitives(recorder, out))
            named = any(op in _COMPOSITE_NAMES for op in run)
            if len(run) >= 3 or (named and len(run) == 2):  # two generic ops (`exp add`) are as often anything else
                runs.setdefault(run, name)
    return sorted(runs.items(), key=lambda item: -len(item[0]))


def _merged_branches(nodes: list, inputs_of=lambda node: node.inputs, names_of=None, resolve=lambda node: node) -> set:
    """The nodes to leave out: a cat or stack itself and every input branch but the first,
    where each branch is the same op sequence on its own part of the same tensors, and a cat or
    stack of one value with itself. `resolve` is the value a part is (a squeeze of a product
    is the product: an adversary's two towers of `baddbmm(...).squeeze(1)`, cat)."""
    names_of = names_of or functools.partial(canonical, symbolic=True)
    merges = [node for node in nodes if _name(node) in MERGES and node.args
              and isinstance(node.args[0], (list, tuple)) and len(node.args[0]) >= 2]
    if not merges:  # most tasks: no ancestry to work out
        return set()
    order = {node: index for index, node in enumerate(nodes)}
    ancestors: dict = {}
    for node in nodes:
        ancestors[node] = {node}.union(*(ancestors.get(arg, set()) for arg in inputs_of(node)))
    merged: set = set()
    for node in merges:
        parts = [resolve(part) if isinstance(part, _Op) else part for part in node.args[0]]
        if all(part is parts[0] for part in parts):  # one value side by side, as `repeat` makes it: layout
            merged.add(node)
            continue
        branches = [ancestors.get(part, set()) for part in parts]
        own = [branch - set().union(*(other for j, other in enumerate(branches) if j != i))
               for i, branch in enumerate(branches)]
        sequences = {tuple(op for n in sorted(part, key=order.get) for op in names_of(n)) for part in own}
        if len(sequences) == 1 and next(iter(sequences)):
            merged |= {node, *set().union(*own[1:])}
    return merged


def _name(node) -> str:
    """The op's name without overload, namespace, in-place or internal spellings."""
    name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
    packet = getattr(getattr(node.target, "overloadpacket", None), "__name__", name)
    name = packet.strip("_").removeprefix("native_")
    # a device library's kernel for an op (on an H200, an eval batch norm at its own sizes
    # read `cudnn_batch_norm` where the CPU runs `native_batch_norm`): the op
    name = name.removeprefix("cudnn_").removeprefix("miopen_")
    if name == "convolution_backward":
        # its arguments are no convolution's (a task's torch.nn.grad.conv3d_input, a transposed
        # convolution by another name, crashed the reading that took it for one): spelled as itself
        return name
    for suffix in SUFFIXES:
        name = name.removesuffix(suffix)
    return name.rstrip("_")


def canonical(node, symbolic: bool = False) -> list[str]:
    """The op names one traced node stands for (none for layout and identity). `symbolic`
    (a trace without values): selection ops are dropped too, since torch's decompositions
    add them for edge cases a hand-written form leaves out; with values, a selection that
    computes a composite is named as it (`_Equivalences`) and the rest is computation."""
    name = _name(node)
    if node.target is None or name in LAYOUT_ONLY or (symbolic and name in SELECTION) or _is_identity(name, node.args):
        return []
    if name in ("clamp", "clamp_min") and _scalar(node.args, 1) == 0 and _scalar(node.args, 2) is None:
        return ["relu"]
    if name == "pow" and _scalar(node.args, 1) == 2:
        return ["mul"]
    if not symbolic and name in NORMS:
        return NORMS[name](node.args)
    if POOLING.match(name):
        if _windows_tile(node, whole=True):  # one window over the whole value: a mean or a maximum of it
            return ["sum", "mul"] if name.startswith("avg") else ["max"]
        return [pooling_name(name, node.args)]
    if name == "convolution" and len(node.args) >= 9:
        return _read_convolution(node)
    if name == "convolution_backward" and len(node.args) >= 11 and isinstance(node.value, torch.Tensor):
        return _read_input_gradient(node)
    bound = _bound_by_a_constant_tensor(node)
    if bound:
        # max(u, c) is relu(u - c) + c, and min(u, c) is min(u - c, 0) + c: a bound per channel or
        # element (an adversary wrote KernelBench's `relu(conv(x)) + b` as `maximum(conv(x) + b, b)`)
        return ["add", "relu" if bound == "max" else "clamp", "add"]
    if name == "rsub" or (name == "sub" and not getattr(node.args[0], "variable", False)):
        # c - u: a negation, and a shift unless c is 0 (`0.0 - t` had read as t itself, `add`)
        return ["mul"] + (["add"] if _scalar(node.args, 1 if name == "rsub" else 0) != 0 else [])
    if name == "trilinear" and _bilinear_form(node.args) and \
            not all(getattr(node.args[i], "variable", False) for i in (0, 2)):
        # F.bilinear(x, c, W) with one side constant is linear in the other: a product by a
        # weight (an adversary wrote a Linear as a bilinear form against a column of ones)
        return ["mm"]
    if name == "batch_norm" and _training(node.args):
        # on meta too, where only the shapes say it: a task whose batch norm sees one sample
        # at the small problem alone (`x.reshape(width // 16, -1, ...)`) runs other norms there
        return [_batch_statistics_norm(node.args[0])]
    return [SAME_AS.get(op, op) for op in SPLIT.get(name, (name,))]


BILINEAR_FORM = ([1, 3], [0], [1, 2], [2, 3])  # _trilinear's expands and sums as F.bilinear calls it


def _bilinear_form(args) -> bool:
    """Whether a recorded _trilinear contracts as F.bilinear's does: both inputs' features
    against the weight's (a red team's own call, contracting nothing, is an elementwise
    product, and had read `mm`)."""
    return len(args) >= 7 and all(isinstance(arg, (list, tuple)) and list(arg) == form
                                  for arg, form in zip(args[3:7], BILINEAR_FORM))


_CONVOLUTIONS_READ: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # node -> (by values, by shapes)


def _read_convolution(node, values: bool = True) -> list[str]:
    """`convolution_names` of a recorded convolution, once per node (a reading asks it of
    each node several times, and it reads the node's tensors)."""
    if node not in _CONVOLUTIONS_READ:
        reading = _convolution_reading(node)
        _CONVOLUTIONS_READ[node] = (convolution_names(*reading), convolution_names(*reading, values=False))
    return list(_CONVOLUTIONS_READ[node][0 if values else 1])


def _read_input_gradient(node) -> list[str]:
    """A convolution's gradient by its input (its first output: torch.nn.grad.conv3d_input) is
    the transposed convolution of the gradient by the same weight, or the plain one of a
    transposed convolution's: read as that."""
    gradient, _, weight, _, stride, padding, dilation, transposed, _, groups, mask = node.args[:11]
    # a node's value is its op's first output: the input's gradient only where the mask asks for it
    # (a red team's bias gradient, a sum of the gradient, had read as this convolution)
    asked = isinstance(mask, (list, tuple)) and len(mask) == 3 and bool(mask[0])
    if not (asked and isinstance(gradient, _Op) and isinstance(weight, _Op) and isinstance(gradient.value, torch.Tensor)
            and isinstance(weight.value, torch.Tensor)):
        return ["convolution_backward"]
    return convolution_names(gradient.value, weight.value, node.value, stride, padding, dilation, groups, False,
                             not transposed)


def _convolution_reading(node) -> tuple:
    """The arguments of `convolution_names` for a recorded convolution: explicit pads of its
    image are its padding (`explicit_padding`; `padded_by_convolutions` drops the pads)."""
    image, weight, bias, stride, padding, dilation, transposed, _, groups = node.args[:9]
    if transposed:
        image, padding = _transposed_padding(node)
    else:
        image, padding, _ = explicit_padding(node)
    return (getattr(image, "value", None), getattr(weight, "value", None), getattr(node, "value", None), stride,
            padding, dilation, groups, bias is not None, bool(transposed))


def _transposed_pads(conv) -> tuple:
    """(the image under a transposed convolution's explicit pads, their spatial widths, the pad
    and copy nodes) where they are its padding: pads of zeros, which paint nothing, or of any
    value or mode whose positions paint nowhere on the output (a red team's replicate pad under
    a stride-1 transposed convolution padded past it); (its image, None, []) where not."""
    image = conv.args[0]
    node, widths, taken, zeros = _explicit_pads(image)
    if widths is None or (not zeros and _pads_reach_output(conv, widths)):
        return image, None, []
    return node, widths, taken


def _pads_reach_output(conv, widths: tuple) -> bool:
    """Whether any output of a recorded convolution reads (a plain one) or is painted from (a
    transposed one) a position its image's pads of `widths` added, through its kernel's taps
    that are not zero."""
    settings = _tap_settings(conv)
    if settings is None:
        return True
    image, out, taps, strides, pads, dilations = settings
    for d, (before, after) in enumerate(widths):
        size, count = image.shape[2 + d], out.shape[2 + d]
        if conv.args[6]:
            added = torch.cat([torch.arange(before, device="cpu"), torch.arange(size - after, size, device="cpu")])
            landing = added[:, None] * strides[d] + taps[d][None, :] * dilations[d] - pads[d]
            reached = (landing >= 0) & (landing < count)
        else:
            read = torch.arange(count, device="cpu")[:, None] * strides[d] + taps[d][None, :] * dilations[d] - pads[d]
            read = read[(read >= 0) & (read < size)]
            reached = (read < before) | (read >= size - after)
        if bool(reached.any()):
            return True
    return False


def _tap_settings(conv) -> tuple | None:
    """(image, output, each spatial dimension's nonzero taps, strides, paddings, dilations) of
    a recorded convolution, for tracing where its taps land; None where its tensors are not all
    there."""
    image, weight, out = (getattr(n, "value", None) for n in (conv.args[0], conv.args[1], conv))
    if not all(isinstance(t, torch.Tensor) for t in (image, weight, out)) or not image.dim() == weight.dim() == out.dim():
        return None
    spatial = image.dim() - 2
    taps = [torch.arange(weight.shape[2 + d], device="cpu") if weight.is_meta else _nonzero_along(weight, 2 + d)
            for d in range(spatial)]
    return (image, out, taps, *(_spread(_ints(v), spatial) for v in (conv.args[3], conv.args[4], conv.args[5])))


def _transposed_padding(conv) -> tuple:
    """(the image under a transposed convolution's explicit pads, its padding less them): a
    pad's positions shift the rest by its width times the stride (`_transposed_pads`)."""
    image, stride, padding = conv.args[0], conv.args[3], conv.args[4]
    node, widths, _ = _transposed_pads(conv)
    if widths is None or isinstance(padding, str):
        return image, padding
    return node, tuple(p - a * s for p, (a, _), s in zip(_spread(_ints(padding), len(widths)), widths,
                                                          _spread(_ints(stride), len(widths))))


def named_by_values(node) -> bool:
    """Whether a recorded convolution's name depends on its values (a kernel's zero taps, an
    image's zero or repeated slices: `convolution_names`), which these sizes' may not share
    with the task's."""
    if _name(node) != "convolution" or len(node.args) < 9:
        return False
    return _read_convolution(node) != _read_convolution(node, values=False)


PADS = frozenset({"constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
                  "replication_pad1d", "replication_pad2d", "replication_pad3d"})
COPIES = frozenset({"view", "unsafe_view", "reshape", "clone", "contiguous", "alias", "detach", "to_copy",
                    "lift_fresh_copy", "copy"})  # at the same shape: the same values


def explicit_padding(conv) -> tuple:
    """(the image under a recorded convolution's explicit pads, its padding with theirs added:
    (before, after) pairs where they differ, the pad and copy nodes taken in). Pads of zeros
    (F.pad's default), one on another and through copies, are padding; pads of another value
    or mode are too where no output reads them (`_pads_reach_output`: a kernel's zero border, a
    stride that skips them). None may be negative (a crop), or on the batch or the channels:
    else the image is the pad, spelled (a red team cropped with F.pad(x, (-2,) * 4) and
    padded back)."""
    image, padding = conv.args[0], conv.args[4]
    if isinstance(padding, str):  # 'same' or 'valid'
        return image, padding, []
    node, widths, taken, zeros = _explicit_pads(image)
    if widths is None or (not zeros and _pads_reach_output(conv, widths)):
        return image, padding, []
    pads = _spread(_ints(padding), len(widths))
    if all(a == b for a, b in widths):
        return node, tuple(p + a for p, (a, _) in zip(pads, widths)), taken
    return node, tuple((p + a, p + b) for p, (a, b) in zip(pads, widths)), taken


def _explicit_pads(image) -> tuple:
    """(the node under the pads of `image`, the spatial widths they add as (before, after),
    the pad and copy nodes, whether all pad zeros); widths None where there are none to take."""
    spatial, node, taken, widths, zeros = _ndim(image) - 2, image, [], None, True
    while True:
        node, copies = _through_copies(node)
        pads = _pad_widths(node)
        if pads is None or spatial < 1:
            break
        taken += copies + [node]
        zeros = zeros and _name(node) == "constant_pad_nd" and _pad_value(node) == 0
        widths = pads if widths is None else tuple((a + c, b + d) for (a, b), (c, d) in zip(widths, pads))
        node = node.args[0]
    if widths is None or len(widths) != 2 + spatial or any(a or b for a, b in widths[:2]) or \
            any(a < 0 or b < 0 for a, b in widths):
        return image, None, [], zeros
    return node, widths[2:], taken, zeros


def _through_copies(node) -> tuple:
    copies = []
    while isinstance(node, _Op) and node.target is not None and _name(node) in COPIES and node.inputs and \
            _shape(node) == _shape(node.inputs[0]):
        copies.append(node)
        node = node.inputs[0]
    return node, copies


def _pad_widths(node) -> tuple | None:
    """A pad's widths per dimension as (before, after), the first dimension first; None for any other op."""
    if not isinstance(node, _Op) or node.target is None or _name(node) not in PADS or len(node.args) < 2:
        return None
    if _name(node) == "constant_pad_nd" and not isinstance(_pad_value(node), (int, float)):
        return None
    flat = tuple(_ints(node.args[1]))
    pairs = [tuple(flat[i:i + 2]) for i in range(0, len(flat), 2)][::-1]
    return tuple([(0, 0)] * (_ndim(node) - len(pairs)) + pairs)


def _pad_value(node):
    return node.args[2] if len(node.args) > 2 else 0


def _spread(values: tuple, count: int) -> tuple:
    return tuple(values) * count if len(values) == 1 else tuple(values)


def padded_by_convolutions(nodes: list, inputs_of=lambda node: node.inputs) -> set:
    """The pads (and the copies between them) of `nodes` that convolutions take as their
    padding (`explicit_padding`) and nothing else reads: each is that convolution's padding,
    spelled apart (a red team's zero-padded 1x1 kernel after an explicit F.pad read
    `constant_pad_nd convolution`, 0.0 against KernelBench's conv_pointwise_2D, and any padded
    convolution so written 0.667 against its original)."""
    readers: dict = {}
    for node in nodes:
        for read in inputs_of(node):
            readers.setdefault(read, set()).add(node)
    taken, by = set(), set()
    for node in nodes:
        if _name(node) == "convolution" and len(node.args) >= 9:
            absorbed = (_transposed_pads(node) if node.args[6] else explicit_padding(node))[2]
            taken.update(absorbed)
            by.update([node] if absorbed else [])
    return {node for node in taken if readers.get(node) and readers[node] <= taken | by}


ELEMENT_BOUNDS = {"maximum": "max", "fmax": "max", "minimum": "min", "fmin": "min", "clamp_min": "max",
                  "clamp_max": "min", "clamp": None}


def _bound_by_a_constant_tensor(node) -> str | None:
    """"max" or "min" for an element-wise maximum or minimum of one variable value and one
    constant whose elements differ (a uniform one is a clamp, and reads as one); clamp with a
    tensor bound on one side is one too."""
    name = _name(node)
    if name not in ELEMENT_BOUNDS or node.target is None:
        return None
    args = list(node.args[:3])
    if name == "clamp":  # clamp(u, min, max): a tensor on one side alone
        sides = [(kind, arg) for kind, arg in (("max", args[1] if len(args) > 1 else None),
                                               ("min", args[2] if len(args) > 2 else None)) if arg is not None]
        if len(sides) != 1:
            return None
        kind, constant = sides[0]
        variable = args[0]
    else:
        kind = ELEMENT_BOUNDS[name]
        nodes = [arg for arg in args[:2] if isinstance(arg, _Op)]
        variable = next((n for n in nodes if n.variable), None)
        constant = next((n for n in nodes if not n.variable), None)
    if not (isinstance(variable, _Op) and variable.variable and isinstance(constant, _Op) and not constant.variable):
        return None
    value = constant.value
    if not isinstance(value, torch.Tensor) or value.device.type == "meta" or not value.is_floating_point() \
            or value.numel() < 2 or bool((value == value.reshape(-1)[0]).all()):
        return None
    return kind


# Ops whose order a rewrite may swap without changing what is computed, put in one order
# (`canonical_order`) where one reads the other and nothing else does: a maximum (a max
# pooling, a max or min reduction) commutes with a monotone element-wise op (relu(max_pool(x))
# is max_pool(relu(x))); arithmetic by a constant the same at every position (a scalar, or one
# per channel of a batch of images in the layout the other op reads) with a pooling (a shift
# only where no padding or divisor of its own enters the mean), with a max pooling or (by a
# scalar) a max or min reduction unless a negative scale turns it into a minimum, with a clamp
# (by a scalar: its bounds move) and, a positive scale, with a relu. Each pair is put maximum
# first, then the element-wise op, then the arithmetic; two shifts or two scales are one, and
# a shift before a scale is spelled after it.
MAX_POOLS = frozenset({"max_pool1d", "max_pool2d", "max_pool3d"})
REDUCED = frozenset({"max", "min"})
MAXIMA = MAX_POOLS | REDUCED
LINEAR_POOLS = frozenset({"avg_pool1d", "avg_pool2d", "avg_pool3d"})
# non-decreasing everywhere (leaky_relu, elu and celu are not for every parameter: left out)
MONOTONE = frozenset({"relu", "clamp", "sigmoid", "tanh", "exp", "log", "softplus", "selu", "hardsigmoid",
                      "log_sigmoid", "softsign"})
GENERIC = frozenset({"add", "mul"})
# A negation passes back through an odd function (-tanh(u) is tanh(-u)) and turns a maximum
# into a minimum (-max(u) is min(-u)); where it then meets a matrix product or convolution,
# whose weights take any sign, it is theirs: the weights negated (an adversary wrote
# KernelBench L2 25's `tanh(tanh(min(conv(x))))` as `-tanh(tanh(max(conv'(x))))` of the
# weights negated: `... max tanh tanh mul` against `... min tanh tanh`).
ODD = frozenset({"tanh", "softsign", "erf", "sin", "sinh", "asinh", "atan", "atanh", "tan"})
# f(0) = 0, and f(u) has u's sign (or is 0): a relu before f is a relu after it, and is spelled
# first (relu(hardswish(y)) is hardswish(relu(y)): KernelBench's L2 57 and 69 are one function)
SIGN_KEEPING = frozenset({"tanh", "softsign", "erf", "hardswish", "silu", "gelu", "mish", "elu", "selu",
                          "leaky_relu", "sinh", "asinh", "atan"})
SIGN_FLIPS = {"max": "min", "min": "max"}
POOLED_REDUCTIONS = {(pool, "sum") for pool in LINEAR_POOLS} | {(pool, "max") for pool in MAX_POOLS}
_ORDER_RANK = {**dict.fromkeys(MAXIMA | LINEAR_POOLS, 0), **dict.fromkeys(MONOTONE, 1), **dict.fromkeys(GENERIC, 2)}
SCALAR, CHANNEL = "scalar", "channel"  # how far an arithmetic op's constant reaches
COUNT = (SCALAR, True, False)  # a mean's division by its count: a positive scalar (the `by` of its `mul`)


@dataclasses.dataclass(frozen=True)
class Spelled:
    """One name of a spelled sequence: the node it spells, and for arithmetic by a constant the
    same at every position (`by`: its reach and whether it is positive); `linked` where it
    reads the name before it and nothing else reads that."""
    name: str
    node: object = None
    by: tuple | None = None
    linked: bool = False
    source: object = None  # the value it reads, as it reads it (a pooling's input)
    plain: bool = False  # an average pooling with no padding or divisor of its own
    channels_last: bool = False  # a pooling that reads its source's channels last (batch, *positions, channels)
    # for a product or convolution, whether its weights are read by nothing else (a sign is then
    # theirs), asked only where a negation reaches it
    free: Callable[[], bool] | None = None


# Where a spelled op does not read the one spelled before it, a branch begins: `max | tanh
# mul` is tanh(x) * amax(x), `max tanh mul` tanh(amax(x)) * x. The branches' order is what they
# compute (equivalences._in_canonical_order), not the order they ran in.
BRANCH = "|"


def spelled(nodes: list, names_of, reads_of, arithmetic_of=lambda node, name: None,
            pooled_source=lambda node: (None, False, False), free_weights=lambda node: False,
            branches: frozenset = frozenset()) -> list[Spelled]:
    """The names of `nodes` in order, with what `canonical_order` needs to know of each, and
    BRANCH before each node of `branches`."""
    users: dict = {}
    for node in nodes:
        for read in reads_of(node):
            users[read] = users.get(read, 0) + 1
    items, previous, passed = [], None, {}  # passed: an unspelled node -> the spelled one it passes on
    for node in nodes:
        names, reads = names_of(node), reads_of(node)
        if not names:
            # a map folded into the one before, or arithmetic merged into it, passes its value on;
            # a layout op does not (a per-channel constant is no longer one after a permute)
            if len(reads) == 1 and _name(node) not in LAYOUT_ONLY and users.get(reads[0]) == 1:
                passed[node] = passed.get(reads[0], reads[0])
            continue
        source, plain, channels_last = pooled_source(node)
        read = passed.get(reads[0], reads[0]) if len(reads) == 1 else None
        linked = previous is not None and read is previous and users.get(reads[0]) == 1
        if channels_last and not linked and read is not None:
            # a channels-last pooling of a (rows, channels) value reshaped or cut along its rows
            # reads it (`_channels_kept`): what the reshapes keep is its last dimension
            below = _through_reshapes(read, reads_of, users)
            linked = previous is not None and below is previous and users.get(below) == 1
        if node in branches:
            items.append(Spelled(BRANCH, node))
        free = functools.partial(free_weights, node) if ends_in_a_layer(names) else None
        items += [Spelled(name, node, arithmetic_of(node, name), linked or k > 0, source, plain, channels_last, free)
                  for k, name in enumerate(names)]
        previous = node
    return items


def _through_reshapes(node, reads_of, users: dict):
    """The value `node` is a reshape or a slice of, through ops that keep the last dimension
    as it is and that nothing else reads."""
    while _name(node) in RESHAPES | {"slice"} and len(reads := reads_of(node) or []) == 1 and \
            users.get(node) == 1 and _shape(reads[0]) and _shape(reads[0])[-1:] == _shape(node)[-1:]:
        node = reads[0]
    return node


def ends_in_a_layer(names: list[str]) -> bool:
    """Whether `names` end in a matrix product or a convolution: a layer whose weights a sign
    after it may be (`canonical_order`)."""
    return bool(names) and (names[-1] in ("mm", "addmm") or is_convolution(names[-1]))


def canonical_order(items: list[Spelled]) -> list[str]:
    """The names of `items` with each pair that commutes (see MAX_POOLS) in one order (an
    adversary moved a hardtanh before a max pooling, and a bias after an average pooling:
    0.83 and 0.74 against their originals)."""
    items = list(items)
    changed = True
    while changed:
        changed = False
        for i in range(len(items) - 1):
            a, b = items[i], items[i + 1]
            if not b.linked:
                continue
            if a.name == b.name and a.name in GENERIC and a.by and b.by:  # two shifts (or scales) are one
                reach = SCALAR if a.by[0] == b.by[0] == SCALAR else CHANNEL
                items[i:i + 2] = [Spelled(a.name, b.node, (reach, a.by[1] == b.by[1], False), a.linked)]
                changed = True
                break
            if a.name == b.name == "sum":  # a sum of a sum is one, over both
                items[i:i + 2] = [dataclasses.replace(b, linked=a.linked)]
                changed = True
                break
            # a scalar passes a sum: sum(c u) is c sum(u), and sum(u + c) is sum(u) + n c (a red
            # team shifted a mean of means between the two)
            if b.name == "sum" and a.name in GENERIC and a.by and a.by[0] == SCALAR:
                items[i], items[i + 1] = dataclasses.replace(b, linked=a.linked), dataclasses.replace(a, linked=True)
                changed = True
                continue
            if (a.name, b.name) in POOLED_REDUCTIONS and reduces_the_tiles(a.node, b.node):
                items[i:i + 2] = [dataclasses.replace(b, linked=a.linked)] + \
                    [Spelled("mul", b.node, COUNT, True)] * (b.name == "sum")
                changed = True
                break
            if _negation(b) and (a.name in ODD or a.name in SIGN_FLIPS):
                items[i], items[i + 1] = dataclasses.replace(b, linked=a.linked), \
                    dataclasses.replace(a, name=SIGN_FLIPS.get(a.name, a.name), linked=True)
                changed = True
                continue
            if _negation(b) and a.free is not None and a.free():
                del items[i + 1]
                changed = True
                break
            later_first = _ORDER_RANK.get(b.name, 3) < _ORDER_RANK.get(a.name, 3) or (a.name, b.name) == ("add", "mul") \
                or (b.name == "relu" and a.name in SIGN_KEEPING)
            if later_first and _commute(a, b):
                items[i], items[i + 1] = dataclasses.replace(b, linked=a.linked), dataclasses.replace(a, linked=True)
                changed = True
    names = [item.name for item in items]
    # a branch's first name carries the mark: two tasks alike in their branches share no cheap
    # token for each (a red team's four-branch sums scored 0.9 with one of four functions apart)
    return [BRANCH + name if marked else name for name, marked in zip(names, [False] + [n == BRANCH for n in names])
            if name != BRANCH]


def _negation(item: Spelled) -> bool:
    """Whether `item` is a product by -1 (only that passes an odd function: -2 tanh(u) is no
    tanh(-2 u), a red team's false positive)."""
    return item.name == "mul" and bool(item.by) and item.by[0] == SCALAR and not item.by[1] and \
        len(item.by) > 2 and item.by[2]


def _commute(a: Spelled, b: Spelled) -> bool:
    """Whether `b`, which reads `a`, may be spelled before it (see MAX_POOLS)."""
    if a.name in GENERIC and b.name in GENERIC:
        return bool(a.by and b.by)
    if a.name not in GENERIC and b.name not in GENERIC:
        return bool({a.name, b.name} & MAXIMA and {a.name, b.name} & MONOTONE) or \
            (b.name == "relu" and a.name in SIGN_KEEPING)
    generic, other = (a, b) if a.name in GENERIC else (b, a)
    if not generic.by or (generic.by[0] == CHANNEL and not _channels_kept(a, b, other)):
        return False
    reach, positive = generic.by[:2]
    order_kept = generic.name == "add" or positive  # a negative scale turns a maximum into a minimum
    if other.name in LINEAR_POOLS:
        return generic.name == "mul" or other.plain
    if other.name in MAX_POOLS:
        return order_kept
    if other.name in REDUCED:
        return reach == SCALAR and order_kept
    if other.name == "clamp":
        return reach == SCALAR
    return other.name == "relu" and generic.name == "mul" and positive


def _channels_kept(a: Spelled, b: Spelled, other: Spelled) -> bool:
    """Whether `b` reads `a`'s value in its layout, a batch of images whose channels are its
    second dimension as `other` (a pooling) sees them: a per-channel constant is one there (a
    red team pooled across channels after a permute, and over an unbatched image's rows). A
    pooling of a channels-last view keeps the channels of a (rows, channels) value: its last
    dimension (the seventh adversary's L2 11 ran a BatchNorm1d over NHWC pixel rows)."""
    if b.source is None:
        return False
    if other.channels_last:
        rows, source = _shape(a.node), _shape(b.source)
        return rows is not None and source is not None and len(rows) == 2 and rows[-1] == source[-1]
    if _shape(b.source) != _shape(a.node):
        return False
    spatial = POOLING.match(other.name)
    return spatial is None or _ndim(other.node) == int(spatial.group(2)) + 2


def _windows_tile(node, whole: bool = False) -> bool:
    """Whether a recorded pooling's windows tile its input exactly, each position in one
    window: no padding, strides as wide as the windows and sizes they divide (`whole`: one
    window as large as the input). A red team wrote a global mean as `avg_pool2d` over the
    whole image, then a mean (`avg_pool2d sum mul` against `sum mul`)."""
    if not POOLING.match(_name(node)) or len(node.args) < 2 or _shape(node.args[0]) is None:
        return False
    spatial = int(POOLING.match(_name(node)).group(2))
    sizes = _shape(node.args[0])[-spatial:]
    kernel = _spread(_ints(node.args[1]), spatial)
    stride = _spread(_ints(node.args[2]), spatial) if len(node.args) > 2 and node.args[2] else kernel
    padding = node.args[3] if len(node.args) > 3 else 0
    dilation = node.args[4] if len(node.args) > 4 and _name(node).startswith("max") else 1
    if len(kernel) != spatial or len(stride) != spatial or any(_ints(padding)) or any(d != 1 for d in _ints(dilation)):
        return False
    if whole:
        return tuple(kernel) == tuple(sizes)
    return all(s == k and n % k == 0 for n, k, s in zip(sizes, kernel, stride))


# (not `max` along a dimension: it returns positions too, of the pooled grid, not of the input)
TILE_REDUCTIONS = {"avg": ("sum", "mean"), "max": ("amax",)}


def reduces_the_tiles(pool, reduction) -> bool:
    """Whether `reduction` (a sum or mean of an average pooling, a maximum of a max pooling)
    reads every position `pool`'s windows tile exactly (`_windows_tile`): the mean of the
    windows' means is the value's mean, the largest of their maxima its maximum (a red team's
    average pooling before a global mean). The pooled value may be read through reshapes that
    keep its dimensions before the pooled ones (`avg_pool2d(x, 2).flatten(2).mean(2)`)."""
    if not POOLING.match(_name(pool)) or _name(reduction) not in TILE_REDUCTIONS[_name(pool)[:3]] \
            or not _windows_tile(pool) or len(reduction.args) < 2 or _shape(pool) is None:
        return False
    source = reduction.args[0]
    while source is not pool and isinstance(source, _Op) and _name(source) in RESHAPES and source.args:
        source = source.args[0]
    if source is not pool or _shape(reduction.args[0]) is None:
        return False
    spatial = int(POOLING.match(_name(pool)).group(2))
    block = math.prod(_shape(pool)[-spatial:])  # one (sample, channel)'s pooled positions, contiguous in any reshape
    shape = _shape(reduction.args[0])
    dims = {d % len(shape) for d in _ints(reduction.args[1])} if reduction.args[1] not in (None, []) else \
        set(range(len(shape)))
    first = len(shape)
    while first > 0 and first - 1 in dims:
        first -= 1
    return first < len(shape) and math.prod(shape[first:]) % block == 0


RESHAPES = frozenset({"view", "unsafe_view", "reshape", "flatten", "unflatten", "view_as", "reshape_as", "view_copy"})


def plain_average(node) -> bool:
    """An average pooling whose every window's mean is of its own elements: no padding counted
    and no divisor of its own, so that a shift passes through it."""
    if not POOLING.match(_name(node)) or len(node.args) < 2:
        return False
    padding = node.args[3] if len(node.args) > 3 else 0
    divisor = node.args[6] if len(node.args) > 6 else None
    return not any(_ints(padding)) and divisor is None


def bound_reach(node) -> tuple | None:
    """(CHANNEL, True) for an element-wise bound by a constant per channel (`canonical` spells
    its shifts, `add ... add`); None for any other."""
    if not _bound_by_a_constant_tensor(node):
        return None
    value = next(a.value for a in node.args[:3] if isinstance(a, _Op) and not a.variable)
    ndim = node.value.dim()
    if ndim < 3 or value.dim() > ndim:
        return None
    full = value.reshape((1,) * (ndim - value.dim()) + tuple(value.shape))
    per_channel = full.reshape(*full.shape[:2], -1)
    same = bool((per_channel == per_channel[..., :1]).all() and (per_channel == per_channel[:1]).all())
    return (CHANNEL, True) if same else None


# How a convolution reads along one spatial dimension (`_along`)
POINTWISE = "pointwise"  # no output reads two positions there: a selection, a scatter or a repeat
CONTRACTS = "contracts"  # one output reads them all: a sum over the dimension, as over channels
SLIDES = "slides"  # windows: outputs read overlapping runs of positions
# windows a strided transposed convolution paints (or a plain one over a zero-stuffed image)
SLIDES_TRANSPOSED = "slides transposed"


def convolution_names(image, weight, out, stride, padding, dilation, groups: int, bias: bool, transposed: bool,
                      values: bool = True) -> list[str]:
    """A convolution of `image` by `weight` into `out` (tensors; their shapes alone on the
    meta device or where `values` is False), read as what it computes: named, as a pooling is,
    by the spatial dimensions its windows slide along (`_along`: where outputs read runs of
    two or more image positions), whether it is transposed (a strided transposed convolution
    whose windows overlap, or a plain one over a zero-stuffed image) and whether each output
    channel reads one input channel alone (`_depthwise`): `convolution2d`,
    `convolution_depthwise_transpose3d`. One whose windows slide along no dimension is a
    matrix product over its channels (and over the dimensions it sums whole): `mm`, and `add`
    for its bias, or a scale per channel (`mul`) if it is depthwise too. A Conv3d of a
    (1, k, k) kernel, or of a (3, k, k) one over an image 1 deep, reads `convolution2d`; a
    1x1 one, padded or strided, and a ConvTranspose2d of a kernel as wide as its stride, `mm`.
    Values decide where they can: a kernel's zero taps and the image's zero slices are not
    read, and an image repeated along a dimension is one position there (red teams wrote a
    Conv2d as a Conv3d over the image repeated along a new depth, a Linear as a zero-bordered
    kernel's convolution, and a ConvTranspose2d as a convolution of a zero-stuffed image)."""
    tensors = (image, weight, out)
    if not all(isinstance(t, torch.Tensor) for t in tensors) or image.dim() < 3 or \
            not image.dim() == weight.dim() == out.dim():
        return ["convolution"]
    spatial = image.dim() - 2
    strides, dilations = _spread(_ints(stride), spatial), _spread(_ints(dilation), spatial)
    lefts = _left_pads(padding, tuple(weight.shape[2:]), dilations)
    if len(strides) != spatial or len(dilations) != spatial or lefts is None:
        return ["convolution"]
    values = values and not any(t.is_meta or not t.numel() for t in tensors)  # an empty batch: its shapes
    kinds = [_along(image, weight, out, d, strides[d], dilations[d], lefts[d], transposed, values)
             for d in range(spatial)]
    depthwise = _depthwise(image, weight, groups, transposed, values)
    windows = sum(kind in (SLIDES, SLIDES_TRANSPOSED) for kind in kinds)
    if not windows:  # a depthwise one that sums a dimension whole is a weighted sum per channel, no product of channels
        reduced = ["mul", "sum"] if CONTRACTS in kinds else ["mul"]
        return (reduced if depthwise else ["mm"]) + (["add"] if bias else [])
    return [f"convolution{'_depthwise' if depthwise else ''}{'_transpose' if SLIDES_TRANSPOSED in kinds else ''}"
            f"{windows}d"]


def _left_pads(padding, kernel: tuple, dilations: tuple) -> tuple | None:
    """Each spatial dimension's padding before its first position."""
    if padding == "valid":
        return (0,) * len(kernel)
    if padding == "same":  # torch puts the odd one after
        return tuple(d * (k - 1) // 2 for k, d in zip(kernel, dilations))
    if isinstance(padding, str):
        return None
    if isinstance(padding, tuple) and padding and isinstance(padding[0], tuple):  # (before, after) pairs: `explicit_padding`
        return tuple(before for before, _ in padding)
    pads = _spread(_ints(padding), len(kernel))
    return pads if len(pads) == len(kernel) else None


def _along(image, weight, out, d: int, stride: int, dilation: int, left: int, transposed: bool, values: bool) -> str:
    """How a convolution reads along spatial dimension `d` (POINTWISE, CONTRACTS, SLIDES,
    SLIDES_TRANSPOSED): which image positions each output position reads, through the
    kernel's taps and the padding, counting only taps that are not zero and positions of the
    image that are not zero everywhere (with `values`)."""
    size, count, width = image.shape[2 + d], out.shape[2 + d], weight.shape[2 + d]
    taps = _nonzero_along(weight, 2 + d) if values else torch.arange(width, device="cpu")
    positions = _nonzero_along(image, 2 + d) if values else torch.arange(size, device="cpu")
    if transposed:
        # each image position paints the kernel's taps: an output reads what lands on it
        landing = (positions[:, None] * stride + taps[None, :] * dilation - left).flatten()
        reads = torch.bincount(landing[(landing >= 0) & (landing < count)], minlength=count)
    else:
        read = torch.arange(count, device="cpu")[:, None] * stride + taps[None, :] * dilation - left
        inside = (read >= 0) & (read < size)
        if values and bool(inside.all()) and _repeated_along(image, 2 + d):
            return POINTWISE  # every output sums the kernel's taps over the same values
        live = torch.zeros(size + 1, dtype=torch.bool, device="cpu")
        live[positions] = True
        reads = (inside & live[read.clamp(0, size)]).sum(1)
    if len(reads) == 0 or int(reads.max()) < 2:
        return POINTWISE
    if int((reads > 0).sum()) < 2:
        return CONTRACTS
    return SLIDES_TRANSPOSED if _painted_between(positions, stride, dilation, transposed) else SLIDES


def _painted_between(positions: torch.Tensor, stride: int, dilation: int, transposed: bool) -> bool:
    """Whether sliding windows are a transposed convolution's: an image position's taps land
    between the next one's, at a stride over 1 of the image's nonzero positions. Those are
    spaced `spacing` apart in a zero-stuffed image (a transposed convolution written out), so
    a plain convolution is a transposed one of the unstuffed image where neither its stride nor
    its dilation steps over the zeros, and a transposed one paints at stride x spacing; a
    dilation the painting stride divides paints one lattice, a plain convolution on it."""
    gaps = positions[1:] - positions[:-1]
    spacing = int(gaps.min()) if len(gaps) else 1
    if spacing < 2 or bool((gaps % spacing).any()):
        spacing = 1
    if not transposed:
        return spacing > 1 and stride % spacing != 0 and dilation % spacing != 0
    return stride * spacing > 1 and dilation % (stride * spacing) != 0


NEGLIGIBLE = 1e-6  # of a tensor's largest magnitude: a value no float32 sum with it can tell from zero


def _nonzero_along(value: torch.Tensor, dim: int) -> torch.Tensor:
    """The positions along `dim` (2 or more) where `value` is not zero somewhere (on the CPU):
    not negligible beside its largest magnitude (a red team stuffed an image with 1e-30)."""
    floor = _negligible(value)
    for part in (value[:1], value):  # most images are nonzero everywhere in their first sample already
        others = tuple(d for d in range(value.dim()) if d != dim)
        found = (part.abs() > floor).any(others[-1])
        for d in reversed(others[:-1]):
            found = found.any(d)
        if bool(found.all()):
            break
    return found.nonzero().flatten().cpu()


def _negligible(value: torch.Tensor) -> float:
    return float(value.detach().abs().amax()) * NEGLIGIBLE if value.numel() and value.is_floating_point() else 0.0


def _repeated_along(image: torch.Tensor, dim: int) -> bool:
    """Whether the image's values are the same at every position along `dim`."""
    corner = image[:1, :1]  # most images differ there already: the whole is compared only if not
    return image.shape[dim] > 1 and bool((corner == corner.narrow(dim, 0, 1)).all()) and \
        bool((image == image.narrow(dim, 0, 1)).all())


def _depthwise(image: torch.Tensor, weight: torch.Tensor, groups, transposed: bool, values: bool) -> bool:
    """Whether each output channel reads one input channel alone: groups as many as the
    image's channels, or (with `values`) a kernel zero across all other channels (a dense
    convolution by a block-diagonal weight computes the depthwise one), the image's channels
    that are zero or copies of another taken as one (`_distinct_channels`: a red team
    convolved `cat([x, x])` by weights that cancel off the diagonal)."""
    groups, channels = groups if isinstance(groups, int) and groups > 0 else 1, image.shape[1]
    if not values:
        return channels > 1 and channels // groups == 1
    if not transposed and groups == 1:
        weight, channels = _distinct_channels(image, weight)
    if channels < 2:
        return False
    reads = (weight.abs() > _negligible(weight)).flatten(2).any(2)  # (out, in per group), or (in, out per group) transposed
    if transposed:
        reads = reads.reshape(groups, channels // groups, -1).transpose(1, 2).reshape(-1, channels // groups)
    return bool((reads.sum(1) <= 1).all())


def _distinct_channels(image: torch.Tensor, weight: torch.Tensor) -> tuple:
    """(the weight over the image's distinct channels, their count): a copy's taps added to its
    original's, a channel zero everywhere left out."""
    first = image[0].reshape(image.shape[1], -1)[:, :16]  # most images' channels differ there already
    if len(torch.unique(first, dim=0)) == image.shape[1] and bool((first != 0).any(1).all()):
        return weight, image.shape[1]
    flat = image.detach().transpose(0, 1).reshape(image.shape[1], -1)
    kept = (flat.abs() > _negligible(flat)).any(1)
    distinct, which = torch.unique(flat[kept], dim=0, return_inverse=True)
    merged = torch.zeros(weight.shape[0], len(distinct), *weight.shape[2:], dtype=weight.dtype, device=weight.device)
    merged.index_add_(1, which.to(weight.device), weight[:, kept.to(weight.device)])
    return merged, len(distinct)


def is_convolution(name: str) -> bool:
    return name.startswith("convolution")


POOLING = re.compile(r"(max|avg)_pool([123])d(_with_indices)?$")


def pooling_name(name: str, args) -> str:
    """A pooling is named by its kind and the dimensions its windows span, however torch runs
    it: F.max_pool1d with a dilation runs `max_pool2d_with_indices` over a (1, k) window, which
    is a 1-D pooling (KernelBench's Max_Pooling_1D read as the 2-D op's internal name)."""
    kind, declared = POOLING.match(name).group(1, 2)
    kernel = _ints(args[1]) if len(args) > 1 and args[1] is not None else ()
    stride = _ints(args[2]) if len(args) > 2 and args[2] else kernel
    if len(kernel) == 1:  # one number for every dimension
        return f"{kind}_pool{declared}d"
    spanned = sum(k > 1 or s > 1 for k, s in zip(kernel, stride))
    return f"{kind}_pool{spanned or declared}d"


def _ints(value) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _shape(node) -> tuple | None:
    value = getattr(node, "value", None)
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _scalar(args, index: int):
    value = args[index] if len(args) > index else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _is_identity(name: str, args) -> bool:
    if name not in IDENTITY or len(args) < 2:
        return False
    scalar = _scalar(args, 1)
    return scalar is not None and scalar == IDENTITY[name]


# -- normalisations: one name for each set of dimensions normalised over, whatever computes it ----

def norm_name(ndim: int, dims: tuple[int, ...], groups: int = 0) -> str:
    """`batch_norm` (every dimension but the channels'), `group_norm` (channels in `groups`),
    `instance_norm` (the spatial dimensions of one channel), else `layer_norm` (trailing
    dimensions: nn.LayerNorm, InstanceNorm1d, a norm over one row)."""
    dims = tuple(sorted(d % ndim for d in dims))
    if groups > 1:
        return "group_norm"
    if ndim >= 3 and dims == (0, *range(2, ndim)):
        return "batch_norm"
    if ndim >= 4 and dims == tuple(range(2, ndim)):
        return "instance_norm"
    return "layer_norm"


def _affine(weight, bias) -> list[str]:
    """A norm's own scale and shift, as the multiplication and addition a hand-written norm has."""
    return (["mul"] if weight is not None else []) + (["add"] if bias is not None else [])


def _ndim(node) -> int:
    return node.value.dim() if node is not None and node.value is not None else 0


def _layer_norm(args) -> list[str]:
    ndim = _ndim(args[0])
    return [norm_name(ndim, tuple(range(ndim - len(args[1]), ndim)))] + _affine(*(list(args[2:4]) + [None, None])[:2])


def _group_norm(args) -> list[str]:
    ndim, channels, groups = _ndim(args[0]), args[4], args[6]
    name = norm_name(ndim, tuple(range(1 if groups == 1 else 2, ndim)) if groups in (1, channels) else (), groups
                     if 1 < groups < channels else 0)
    return [name] + _affine(args[1], args[2])


def norm_affine_reach(node, name: str) -> tuple | None:
    """(CHANNEL, whether positive) of a group norm's or a training batch norm's own scale
    (`mul`) or shift (`add`): its weight and bias are per channel, as a hand-written norm's
    `y * w + b` is, and move past a pooling as that does (`canonical_order`; a copy of
    KernelBench's L2 85 with its group norm written out read `max_pool2d mul add` against
    `mul add max_pool2d`, 0.833, on the values a reading redraws)."""
    if not (_name(node) == "group_norm" or _name(node) == "batch_norm" and _training(node.args)):
        return None
    weight = getattr(node.args[1] if len(node.args) > 1 else None, "value", None)
    if not isinstance(weight, torch.Tensor) or weight.is_meta or weight.dim() != 1:
        return None
    return CHANNEL, bool((weight > 0).all()) if name == "mul" else True


def _batch_norm(args) -> list[str]:
    """In eval mode a batch norm is a scale and a shift per channel (from its running
    statistics): that is what it computes, and what a hand-written one reads as. Over a
    batch of one sample it normalises each channel of that sample: an instance norm, which
    F.instance_norm computes so (the samples' channels side by side, as one sample)."""
    if not _training(args):
        return ["mul", "add"]
    return [_batch_statistics_norm(args[0])] + _affine(args[1], args[2])


def _training(args) -> bool:
    return args[5] if len(args) > 5 and isinstance(args[5], bool) else False


def _batch_statistics_norm(node) -> str:
    """The norm a batch norm on batch statistics computes of `node`, its input: an instance
    norm where that input is F.instance_norm's own view, every (sample, channel) of a
    contiguous tensor side by side as the channels of one sample; else a batch norm (a
    batch norm of one sample viewed otherwise, `x.transpose(0, 1).reshape(1, C, -1)`, is
    the batch norm of x)."""
    ndim = _ndim(node)
    base = node.args[0] if node.target is not None and _name(node) in ("view", "reshape") and node.args else None
    instance = (isinstance(base, _Op) and base.value is not None and base.value.dim() == ndim >= 3
                and base.value.is_contiguous() and tuple(node.value.shape) ==
                (1, base.value.shape[0] * base.value.shape[1], *base.value.shape[2:]))
    return norm_name(ndim, tuple(range(2, ndim)) if instance else (0, *range(2, ndim)))


NORMS = {"layer_norm": _layer_norm, "group_norm": _group_norm, "batch_norm": _batch_norm}
NORM_NAMES = frozenset({"batch_norm", "instance_norm", "layer_norm", "group_norm"})  # what norm_name calls a norm
