"""Make a disguised copy of a task: what a contaminated generator would emit."""
import ast
import builtins

KEEP = {"torch", "nn", "F", "math", "self", "Model", "forward", "__init__", "get_inputs", "get_init_inputs",
        *dir(builtins)}


class _Disguise(ast.NodeTransformer):
    def __init__(self, assigned_attributes, renumber: bool = True):
        self.attributes, self.renumber = assigned_attributes, renumber

    def _new(self, name):
        return name if name in KEEP else f"renamed_{name}"

    def visit_Name(self, node):
        node.id = self._new(node.id)
        return node

    def visit_arg(self, node):
        node.arg = self._new(node.arg)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if node.attr in self.attributes:
            node.attr = f"renamed_{node.attr}"
        return node

    def visit_Constant(self, node):
        if self.renumber and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            node.value = node.value * 2 + 1 if isinstance(node.value, int) else node.value * 1.5
        return node

    def visit_FunctionDef(self, node):
        if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            node.body = node.body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node

    visit_ClassDef = visit_FunctionDef


def disguise(code: str, renumber: bool = True) -> str:
    """Rename every local name and attribute, change every number (unless `renumber` is
    False: then the computation is unchanged), drop docstrings and reformat (ast.unparse
    puts every statement in its canonical layout)."""
    tree = ast.parse(code)
    imported = {alias.asname or alias.name.split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for alias in n.names}
    attributes = {t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                  if isinstance(t, ast.Attribute)}
    KEEP.update(imported)
    return ast.unparse(_Disguise(attributes, renumber).visit(tree))


# -- one disguise of each kind, for decontamination's tests and benchmark -------------------

def products(code: str) -> str:
    """Module-level sizes written as products or sums: `batch_size = 64 * 2`."""
    tree = ast.parse(code)
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, int) and not isinstance(node.value.value, bool) and node.value.value > 1:
            n = node.value.value
            node.value = (ast.BinOp(ast.Constant(n // 2), ast.Mult(), ast.Constant(2)) if n % 2 == 0
                          else ast.BinOp(ast.Constant(n - 1), ast.Add(), ast.Constant(1)))
    return ast.unparse(tree)


def aliased(code: str) -> str:
    """`import torch.nn.functional as fn`, `from torch import nn as tnn`."""
    tree = ast.parse(code)
    renames = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch.nn.functional":
                    renames[alias.asname or alias.name] = alias.asname = "fn"
    body = []
    for node in tree.body:
        if isinstance(node, ast.Import) and [a.name for a in node.names] == ["torch.nn"]:
            renames[node.names[0].asname or "torch.nn"] = "tnn"
            node = ast.ImportFrom("torch", [ast.alias("nn", "tnn")], 0)
        body.append(node)
    tree.body = body
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in renames:
            node.id = renames[node.id]
    return ast.unparse(tree)


def identity(code: str) -> str:
    """One extra identity op before forward returns: `result = result * 1.0`."""
    tree = ast.parse(code)
    forward = _method(tree, "forward")
    last = forward.body[-1]
    if isinstance(last, ast.Return) and last.value is not None and not isinstance(last.value, ast.Tuple):
        forward.body[-1:] = ast.parse("result = VALUE\nresult = result * 1.0\nreturn result").body
        forward.body[-3].value = last.value
    return ast.unparse(tree)


def helper(code: str) -> str:
    """forward's body moved into a helper method that forward calls."""
    return _delegated(code, lambda names: f"return self.compute({', '.join(names)})")


def _delegated(code: str, forward_body) -> str:
    """forward's body moved into a method `compute`; forward's new body is
    `forward_body(its argument names)`."""
    tree = ast.parse(code)
    forward = _method(tree, "forward")
    compute = ast.parse(ast.unparse(forward)).body[0]
    compute.name = "compute"
    forward.body = ast.parse(forward_body([a.arg for a in forward.args.args[1:]])).body
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    model.body.append(compute)
    return ast.unparse(tree)


def reordered(code: str) -> str:
    """Definitions in another order: input builders first, the model, sizes last; and the
    model's methods reversed."""
    tree = ast.parse(code)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    rest = [n for n in tree.body if n not in imports + functions + classes]
    for cls in classes:
        cls.body.reverse()
    tree.body = imports + functions + classes + rest
    return ast.unparse(tree)


def renamed(code: str) -> str:
    """Every local name and attribute renamed, docstrings dropped, reformatted; the numbers
    kept, so the computation is the same."""
    return disguise(code, renumber=False)


def everything(code: str) -> str:
    """Every kind above at once, the computation unchanged."""
    return products(aliased(identity(helper(reordered(renamed(code))))))


# -- rewrites: the same computation in other ops, or in a form the tracer cannot follow ----------

# An activation written out in the ops it is made of; each a lambda so its argument runs once.
WRITTEN_OUT = {
    "gelu": "(lambda t: 0.5 * t * (1.0 + torch.erf(t / 1.4142135623730951)))",
    "silu": "(lambda t: t * (1.0 / (1.0 + torch.exp(-t))))",
    "sigmoid": "(lambda t: 1.0 / (1.0 + torch.exp(-t)))",
    "relu": "(lambda t: torch.clamp(t, min=0.0))",
    "mish": "(lambda t: t * torch.tanh(torch.log(1.0 + torch.exp(t))))",
    "softplus": "(lambda t: torch.log(1.0 + torch.exp(t)))",
    "softmax": "(lambda t: (lambda e: e / e.sum(dim=DIM, keepdim=True))(torch.exp(t - t.amax(dim=DIM, keepdim=True))))",
}


class _WriteOut(ast.NodeTransformer):
    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else None
        root = func.value if isinstance(func, ast.Attribute) else None
        while isinstance(root, ast.Attribute):  # torch.nn.functional.gelu: an API call, not a method
            root = root.value
        on_tensor = isinstance(func, ast.Attribute) and not (isinstance(root, ast.Name)
                                                             and root.id in ("torch", "F", "nn"))
        if name not in WRITTEN_OUT or (on_tensor and name in ("softmax",)):
            return node
        args = ([func.value] if on_tensor else []) + node.args
        if not args or (on_tensor and isinstance(func.value, ast.Name) and func.value.id in ("self",)):
            return node
        dim = next((k.value for k in node.keywords if k.arg == "dim"), args[1] if len(args) > 1 else ast.Constant(-1))
        written = ast.parse(WRITTEN_OUT[name].replace("DIM", ast.unparse(dim)), mode="eval").body
        return ast.copy_location(ast.Call(written, [args[0]], []), node)


def written_out(code: str) -> str:
    """Every functional activation (F.gelu, torch.sigmoid, x.relu(), torch.softmax, ...)
    written as the ops it is made of: the same function, other ops on the page."""
    return ast.unparse(_WriteOut().visit(ast.parse(code)))


def guarded(code: str) -> str:
    """forward's body under a condition on the data that always holds: a tracer on the meta
    device has no value to decide it by."""
    tree = ast.parse(code)
    forward = _method(tree, "forward")
    first = forward.args.args[1].arg
    condition = ast.parse(f"if {first}.sum() == {first}.sum():\n    pass\nreturn {first}").body
    condition[0].body = forward.body
    forward.body = condition
    return ast.unparse(tree)


def split(code: str) -> str:
    """The batch computed in two halves and concatenated: every op appears twice."""
    def halves(names):
        first, rest = names[0], "".join(f", {n}" for n in names[1:])
        return (f"half = {first}.shape[0] // 2\n"
                f"return torch.cat([self.compute({first}[:half]{rest}), self.compute({first}[half:]{rest})], dim=0)")
    return _delegated(code, halves)


def rewritten(code: str) -> str:
    """Every rewrite above at once, renamed too."""
    return split(guarded(written_out(renamed(code))))


KINDS = {"products": products, "aliased": aliased, "identity": identity, "helper": helper, "reordered": reordered,
         "renamed": renamed, "renumbered": disguise, "everything": everything}
REWRITES = {"written_out": written_out, "guarded": guarded, "split": split, "rewritten": rewritten}


def _method(tree: ast.Module, name: str) -> ast.FunctionDef:
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    return next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == name)


# -- equivalent computations: composites, GEMM and convolution in their common written forms ---
#
# Each kind swaps modules for subclasses of theirs whose forward computes the same function in
# other ops (same __init__, so the same weights from the same seed, in Sequential too), and
# calls of functions for helpers that do. The helpers are written into the task itself.

WRITTEN_FORMS = '''
import math as _math


def _where_relu(x, inplace=False):
    return torch.where(x > 0, x, torch.zeros_like(x))


def _max_relu(x, inplace=False):
    return torch.maximum(x, torch.zeros((), dtype=x.dtype))


def _abs_relu(x, inplace=False):
    return (x + x.abs()) / 2


def _where_leaky_relu(x, negative_slope=0.01, inplace=False):
    return torch.where(x >= 0, x, x * negative_slope)


def _minmax_hardtanh(x, min_val=-1.0, max_val=1.0, inplace=False):
    return torch.minimum(torch.maximum(x, torch.full((), min_val, dtype=x.dtype)), torch.full((), max_val, dtype=x.dtype))


def _clamp_hardswish(x, inplace=False):
    return x * (x + 3).clamp(0, 6) / 6


def _erfc_gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + torch.tanh(_math.sqrt(2 / _math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * torch.erfc(-x / _math.sqrt(2))


def _sigmoid_tanh(x):
    return 2 * torch.sigmoid(2 * x) - 1


def _tanh_sigmoid(x):
    return (torch.tanh(x / 2) + 1) / 2


def _lse_softmax(x, dim=None, *args, **kwargs):
    dim = -1 if dim is None else dim
    return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))


def _einsum_matmul(a, b):
    return torch.einsum("...ik,...kj->...ij", a, b) if a.dim() > 1 and b.dim() > 1 else a @ b


def _split_k_matmul(a, b):
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] < 2:
        return a @ b
    k = a.shape[-1] // 2
    return a[..., :k] @ b[..., :k, :] + a[..., k:] @ b[..., k:, :]


def _moments(x, dims):
    mean = x.mean(dim=dims, keepdim=True)
    return mean, ((x - mean) ** 2).mean(dim=dims, keepdim=True)


class _WrittenLayerNorm(nn.LayerNorm):
    def forward(self, x):
        dims = tuple(range(-len(self.normalized_shape), 0))
        mean, var = _moments(x, dims)
        y = (x - mean) / torch.sqrt(var + self.eps)
        return y * self.weight + self.bias if self.weight is not None and self.bias is not None else \\
            y * self.weight if self.weight is not None else y


class _WrittenGroupNorm(nn.GroupNorm):
    def forward(self, x):
        grouped = x.reshape(x.shape[0], self.num_groups, -1)
        mean, var = _moments(grouped, (2,))
        y = ((grouped - mean) / torch.sqrt(var + self.eps)).reshape(x.shape)
        if self.affine:
            shape = (1, -1) + (1,) * (x.dim() - 2)
            y = y * self.weight.reshape(shape) + self.bias.reshape(shape)
        return y


def _instance_norm_forward(self, x):
    if self.track_running_stats and not self.training:
        return type(self).__mro__[2].forward(self, x)
    mean, var = _moments(x, tuple(range(2, x.dim())))
    y = (x - mean) / torch.sqrt(var + self.eps)
    if self.affine:
        shape = (1, -1) + (1,) * (x.dim() - 2)
        y = y * self.weight.reshape(shape) + self.bias.reshape(shape)
    return y


def _batch_norm_forward(self, x):
    if self.training or not self.track_running_stats:
        return type(self).__mro__[2].forward(self, x)
    shape = (1, -1) + (1,) * (x.dim() - 2)
    scale = torch.rsqrt(self.running_var + self.eps)
    shift = -self.running_mean * scale
    if self.affine:
        scale, shift = scale * self.weight, shift * self.weight + self.bias
    return x * scale.reshape(shape) + shift.reshape(shape)


class _ScaleShiftBatchNorm1d(nn.BatchNorm1d):
    forward = _batch_norm_forward


class _ScaleShiftBatchNorm2d(nn.BatchNorm2d):
    forward = _batch_norm_forward


class _ScaleShiftBatchNorm3d(nn.BatchNorm3d):
    forward = _batch_norm_forward


class _WrittenInstanceNorm1d(nn.InstanceNorm1d):
    forward = _instance_norm_forward


class _WrittenInstanceNorm2d(nn.InstanceNorm2d):
    forward = _instance_norm_forward


class _WrittenInstanceNorm3d(nn.InstanceNorm3d):
    forward = _instance_norm_forward


class _EinsumLinear(nn.Linear):
    def forward(self, x):
        y = torch.einsum("...k,nk->...n", x, self.weight)
        return y + self.bias if self.bias is not None else y


class _BroadcastLinear(nn.Linear):
    def forward(self, x):
        y = (x.unsqueeze(-2) * self.weight).sum(-1)
        return y + self.bias if self.bias is not None else y


class _SplitKLinear(nn.Linear):
    def forward(self, x):
        k = self.in_features // 2
        y = x[..., :k] @ self.weight[:, :k].t() + x[..., k:] @ self.weight[:, k:].t()
        return y + self.bias if self.bias is not None else y


class _HomogeneousLinear(nn.Linear):
    def forward(self, x):
        if self.bias is None:
            return super().forward(x)
        ones = torch.ones_like(x[..., :1])
        return torch.cat([x, ones], -1) @ torch.cat([self.weight.t(), self.bias[None]], 0)


class _BiasFirstLinear(nn.Linear):
    def forward(self, x):
        if self.bias is None or self.in_features < 2:
            return super().forward(x)
        k = self.in_features // 2
        y = self.bias + x[..., k:] @ self.weight[:, k:].t()
        return y + x[..., :k] @ self.weight[:, :k].t()


class _UnfoldConv2d(nn.Conv2d):
    def forward(self, x):
        if self.groups != 1 or self.padding_mode != "zeros" or isinstance(self.padding, str):
            return super().forward(x)
        n, h, w = x.shape[0], x.shape[2], x.shape[3]
        kh, kw = self.kernel_size
        out_h = (h + 2 * self.padding[0] - self.dilation[0] * (kh - 1) - 1) // self.stride[0] + 1
        out_w = (w + 2 * self.padding[1] - self.dilation[1] * (kw - 1) - 1) // self.stride[1] + 1
        columns = torch.nn.functional.unfold(x, self.kernel_size, self.dilation, self.padding, self.stride)
        y = (self.weight.reshape(self.out_channels, -1) @ columns).reshape(n, self.out_channels, out_h, out_w)
        return y + self.bias.reshape(1, -1, 1, 1) if self.bias is not None else y


class _Conv1x1Linear(nn.Linear):
    def forward(self, x):
        image = x.reshape(-1, self.in_features, 1, 1)
        y = torch.nn.functional.conv2d(image, self.weight[:, :, None, None], self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)


class _LinearConv2d(nn.Conv2d):
    def forward(self, x):
        if self.kernel_size != (1, 1) or self.stride != (1, 1) or self.padding not in ((0, 0), "valid") \
                or self.groups != 1 or self.padding_mode != "zeros":
            return super().forward(x)
        y = torch.nn.functional.linear(x.permute(0, 2, 3, 1), self.weight[:, :, 0, 0], self.bias)
        return y.permute(0, 3, 1, 2)


def _pool_window(layer):
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    kernel, stride, padding = pair(layer.kernel_size), pair(layer.stride or layer.kernel_size), pair(layer.padding)
    return kernel, stride, padding


def _pool_columns(layer, x, fill):
    kernel, stride, padding = _pool_window(layer)
    n, c, h, w = x.shape
    out_h = (h + 2 * padding[0] - kernel[0]) // stride[0] + 1
    out_w = (w + 2 * padding[1] - kernel[1]) // stride[1] + 1
    padded = torch.nn.functional.pad(x, (padding[1], padding[1], padding[0], padding[0]), value=fill)
    columns = torch.nn.functional.unfold(padded, kernel, 1, 0, stride)
    return columns.reshape(n, c, kernel[0] * kernel[1], out_h, out_w)


class _UnfoldAvgPool2d(nn.AvgPool2d):
    def forward(self, x):
        if self.ceil_mode or not self.count_include_pad or self.divisor_override or x.dim() != 4:
            return super().forward(x)
        return _pool_columns(self, x, 0.0).mean(2)


class _UnfoldMaxPool2d(nn.MaxPool2d):
    def forward(self, x):
        if self.ceil_mode or self.return_indices or self.dilation not in (1, (1, 1)) or x.dim() != 4:
            return super().forward(x)
        return _pool_columns(self, x, float("-inf")).amax(2)


class _ConvAvgPool2d(nn.AvgPool2d):
    def forward(self, x):
        kernel, stride, padding = _pool_window(self)
        if self.ceil_mode or not self.count_include_pad or self.divisor_override or x.dim() != 4:
            return super().forward(x)
        box = x.new_full((x.shape[1], 1, *kernel), 1.0 / (kernel[0] * kernel[1]))
        return torch.nn.functional.conv2d(x, box, None, stride, padding, 1, x.shape[1])


def _squares_moments(x, dims):
    mean = x.mean(dim=dims, keepdim=True)
    return mean, (x * x).mean(dim=dims, keepdim=True) - mean * mean


class _SquaresLayerNorm(nn.LayerNorm):
    def forward(self, x):
        mean, var = _squares_moments(x, tuple(range(-len(self.normalized_shape), 0)))
        y = (x - mean) * torch.rsqrt(var + self.eps)
        return y * self.weight + self.bias if self.weight is not None and self.bias is not None else \
            y * self.weight if self.weight is not None else y


class _SquaresGroupNorm(nn.GroupNorm):
    def forward(self, x):
        grouped = x.reshape(x.shape[0], self.num_groups, -1)
        mean, var = _squares_moments(grouped, (2,))
        y = ((grouped - mean) * torch.rsqrt(var + self.eps)).reshape(x.shape)
        if self.affine:
            shape = (1, -1) + (1,) * (x.dim() - 2)
            y = y * self.weight.reshape(shape) + self.bias.reshape(shape)
        return y


def _distributed_gelu(x, approximate="none"):
    if approximate == "tanh":
        inner = _math.sqrt(2 / _math.pi) * x + _math.sqrt(2 / _math.pi) * 0.044715 * x * x * x
        return 0.5 * x + 0.5 * x * torch.tanh(inner)
    return 0.5 * x + 0.5 * x * torch.erf(x * (1 / _math.sqrt(2)))


def _log1p_softplus(x, beta=1.0, threshold=20.0):
    return torch.where(x * beta > threshold, x, torch.log1p(torch.exp(x * beta)) / beta)


def _closed_mish(x, inplace=False):
    e = torch.exp(x)
    return x * (e * e + 2 * e) / (e * e + 2 * e + 2)


def _where_elu(x, alpha=1.0, inplace=False):
    return torch.where(x > 0, x, alpha * torch.expm1(x))


def _closed_selu(x, inplace=False):
    return 1.0507009873554805 * torch.where(x > 0, x, 1.6732632423543772 * torch.expm1(x))


def _softplus_log_sigmoid(x):
    return -torch.nn.functional.softplus(-x)


def _quotient_silu(x, inplace=False):
    return x / (1 + torch.exp(-x))


class _Written(nn.Module):
    def __init__(self, function, **settings):
        super().__init__()
        self.function, self.settings = function, settings

    def forward(self, x):
        return self.function(x, **self.settings)
'''

# kind: ({function or method name: helper}, {module class: replacement}); a replacement that is
# a helper name wraps it in _Written with the module's own keyword arguments.
FORMS = {
    "relu_where": ({"relu": "_where_relu"}, {"ReLU": "_where_relu"}),
    "relu_maximum": ({"relu": "_max_relu"}, {"ReLU": "_max_relu"}),
    "relu_abs": ({"relu": "_abs_relu"}, {"ReLU": "_abs_relu"}),
    "leaky_relu": ({"leaky_relu": "_where_leaky_relu"}, {"LeakyReLU": "_where_leaky_relu"}),
    "hardtanh": ({"hardtanh": "_minmax_hardtanh"}, {"Hardtanh": "_minmax_hardtanh"}),
    "hardswish": ({"hardswish": "_clamp_hardswish"}, {"Hardswish": "_clamp_hardswish"}),
    "gelu_erfc": ({"gelu": "_erfc_gelu"}, {"GELU": "_erfc_gelu"}),
    "tanh_sigmoid": ({"tanh": "_sigmoid_tanh", "sigmoid": "_tanh_sigmoid"},
                     {"Tanh": "_sigmoid_tanh", "Sigmoid": "_tanh_sigmoid"}),
    "softmax_lse": ({"softmax": "_lse_softmax"}, {"Softmax": "_lse_softmax"}),
    "norms": ({}, {"LayerNorm": "_WrittenLayerNorm", "GroupNorm": "_WrittenGroupNorm",
                   **{f"InstanceNorm{n}d": f"_WrittenInstanceNorm{n}d" for n in (1, 2, 3)},
                   **{f"BatchNorm{n}d": f"_ScaleShiftBatchNorm{n}d" for n in (1, 2, 3)}}),
    "gemm_einsum": ({"matmul": "_einsum_matmul", "mm": "_einsum_matmul", "bmm": "_einsum_matmul"},
                    {"Linear": "_EinsumLinear"}),
    "gemm_broadcast": ({}, {"Linear": "_BroadcastLinear"}),
    "gemm_split_k": ({"matmul": "_split_k_matmul", "mm": "_split_k_matmul", "bmm": "_split_k_matmul"},
                     {"Linear": "_SplitKLinear"}),
    "conv_unfold": ({}, {"Conv2d": "_UnfoldConv2d"}),
    # session 27: a linear map written with another family of linear operators, norms from
    # other moments, products distributed over sums, activations in closed form
    "gemm_conv1x1": ({}, {"Linear": "_Conv1x1Linear"}),
    "conv1x1_linear": ({}, {"Conv2d": "_LinearConv2d"}),
    "pool_unfold": ({}, {"AvgPool2d": "_UnfoldAvgPool2d", "MaxPool2d": "_UnfoldMaxPool2d"}),
    "pool_conv": ({}, {"AvgPool2d": "_ConvAvgPool2d"}),
    "norm_squares": ({}, {"LayerNorm": "_SquaresLayerNorm", "GroupNorm": "_SquaresGroupNorm"}),
    "gelu_distributed": ({"gelu": "_distributed_gelu"}, {"GELU": "_distributed_gelu"}),
    # session 38: a bias as the weight's row for a column of ones; a bias first, then partial products
    "gemm_homogeneous": ({}, {"Linear": "_HomogeneousLinear"}),
    "gemm_bias_first": ({}, {"Linear": "_BiasFirstLinear"}),
    "closed_forms": ({"softplus": "_log1p_softplus", "mish": "_closed_mish", "elu": "_where_elu",
                      "selu": "_closed_selu", "logsigmoid": "_softplus_log_sigmoid", "silu": "_quotient_silu"},
                     {"Softplus": "_log1p_softplus", "Mish": "_closed_mish", "ELU": "_where_elu",
                      "SELU": "_closed_selu", "LogSigmoid": "_softplus_log_sigmoid", "SiLU": "_quotient_silu"}),
}
# functional settings a module keeps as attributes, passed to the helper that replaces it
MODULE_SETTINGS = {"LeakyReLU": ("negative_slope",), "Hardtanh": ("min_val", "max_val"), "GELU": ("approximate",),
                   "Softmax": ("dim",), "Softplus": ("beta", "threshold"), "ELU": ("alpha",)}
FUNCTION_ROOTS = {"torch", "F", "nn"}


class _Rewrite(ast.NodeTransformer):
    """Calls of `functions` (torch.relu, F.relu, x.relu()) become helper calls; modules of
    `modules` (nn.ReLU(), nn.Linear(...)) become their replacement. Counts what it rewrote."""

    def __init__(self, functions: dict, modules: dict):
        self.functions, self.modules, self.count = functions, modules, 0

    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        if not isinstance(func, ast.Attribute):
            return node
        root = func.value
        while isinstance(root, ast.Attribute):
            root = root.value
        api = isinstance(root, ast.Name) and root.id in FUNCTION_ROOTS
        if api and func.attr in self.modules and func.attr[0].isupper():
            return self._module(node, func.attr)
        if func.attr in self.functions and not (isinstance(func.value, ast.Name) and func.value.id == "self"):
            args = node.args if api else [func.value, *node.args]
            self.count += 1
            return ast.copy_location(ast.Call(ast.Name(self.functions[func.attr], ast.Load()), args,
                                              [k for k in node.keywords if k.arg != "inplace"] if api else node.keywords),
                                     node)
        return node

    def _module(self, node, name):
        replacement = self.modules[name]
        self.count += 1
        if replacement.startswith("_W") or replacement[1].isupper():  # a subclass: same arguments
            return ast.copy_location(ast.Call(ast.Name(replacement, ast.Load()), node.args, node.keywords), node)
        settings = MODULE_SETTINGS.get(name, ())
        keywords = [ast.keyword(settings[i], arg) for i, arg in enumerate(node.args[:len(settings)])]
        keywords += [k for k in node.keywords if k.arg in settings]
        return ast.copy_location(ast.Call(ast.Name("_Written", ast.Load()), [ast.Name(replacement, ast.Load())],
                                          keywords), node)


class NotApplicable(ValueError):
    """The task has nothing this kind of disguise rewrites."""


def _with_forms(code: str, functions: dict, modules: dict) -> str:
    """The task's own code rewritten (never the helpers of an earlier kind: tanh through
    sigmoid and sigmoid through tanh would call each other), the helpers written in once."""
    helpers = ast.parse(WRITTEN_FORMS).body
    own = {ast.unparse(node) for node in helpers}
    tree = ast.parse(code)
    tree.body = [node for node in tree.body if ast.unparse(node) not in own]
    rewrite = _Rewrite(functions, modules)
    tree = rewrite.visit(tree)
    if not rewrite.count:
        raise NotApplicable("nothing to rewrite")
    last_import = max(i for i, n in enumerate(tree.body) if isinstance(n, (ast.Import, ast.ImportFrom)))
    tree.body[last_import + 1:last_import + 1] = helpers
    return ast.unparse(tree)


def _form(kind: str):
    functions, modules = FORMS[kind]

    def rewrite(code: str) -> str:
        return _with_forms(code, functions, modules)
    rewrite.__name__ = rewrite.__qualname__ = kind
    rewrite.__doc__ = f"The task's {', '.join(sorted({*functions, *modules}))} in another written form."
    return rewrite


def round_trip(code: str) -> str:
    """forward's result scaled up and back down: `y * 4` then `* 0.25` (exact in floating point)."""
    tree = ast.parse(code)
    forward = _method(tree, "forward")
    returns = [n for n in ast.walk(forward) if isinstance(n, ast.Return) and n.value is not None
               and not isinstance(n.value, ast.Tuple)]
    if not returns:
        raise NotApplicable("no single value returned")
    for node in returns:
        node.value = ast.parse(f"(({ast.unparse(node.value)}) * 4.0) * 0.25", mode="eval").body
    return ast.unparse(tree)


def batch_twice(code: str) -> str:
    """The batch duplicated, computed once at twice the size, and the two halves averaged:
    the first input doubled, or else every input of its batch (a loss's prediction and
    target both). An output without that batch in front (a loss's scalar) cannot be halved,
    and is computed from the inputs as given."""
    def doubled(names):
        first = f"(torch.cat([{names[0]}, {names[0]}], dim=0), {''.join(n + ', ' for n in names[1:])})"
        every = "(" + "".join(f"torch.cat([{n}, {n}], dim=0) if isinstance({n}, torch.Tensor) and {n}.dim() "
                              f"and {n}.shape[0] == _n else {n}, " for n in names) + ")"
        return (f"_n = {names[0]}.shape[0]\n"
                f"for _inputs in ({first}, {every}):\n"
                f"    try:\n"
                f"        both = self.compute(*_inputs)\n"
                f"    except Exception:\n"
                f"        continue\n"
                f"    if isinstance(both, torch.Tensor) and both.dim() and both.shape[0] == 2 * _n:\n"
                f"        return (both[:_n] + both[_n:]) / 2\n"
                f"return self.compute({', '.join(names)})")
    return _delegated(code, doubled)


def all_at_once(code: str) -> str:
    """Every written form that applies, a round trip, the batch twice, renamed."""
    rewritten = renamed(code)
    for kind in ("relu_where", "leaky_relu", "hardtanh", "hardswish", "gelu_erfc", "tanh_sigmoid", "softmax_lse",
                 "norms", "gemm_split_k", "conv_unfold"):
        try:
            rewritten = FORM_KINDS[kind](rewritten)
        except NotApplicable:
            continue
    return batch_twice(round_trip(rewritten))


def new_at_once(code: str) -> str:
    """Session 27's kinds that apply, at once, with a round trip, renamed."""
    rewritten = renamed(code)
    for kind in ("gemm_conv1x1", "conv1x1_linear", "pool_unfold", "norm_squares", "gelu_distributed", "closed_forms"):
        try:
            rewritten = FORM_KINDS[kind](rewritten)
        except NotApplicable:
            continue
    return round_trip(rewritten)


FORM_KINDS = {kind: _form(kind) for kind in FORMS}
EQUIVALENTS = {**FORM_KINDS, "round_trip": round_trip, "batch_twice": batch_twice, "all_at_once": all_at_once,
               "new_at_once": new_at_once}
