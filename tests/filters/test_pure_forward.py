"""The grammar of a task and the purity of forward: each rule refuses one case and lets the
closest legitimate one through (filters/grammar/pure_forward.py)."""
import pytest

from filters.grammar import static_check
from tests.conftest import make_task

BUFFER = 'self.register_buffer("acc", torch.zeros(features))'
WEIGHT = "self.w = nn.Parameter(torch.ones(features, features))"
METHOD = "    def forward(self, x):"

# (name, refused task, close legitimate task, reason of the refusal)
PAIRS = [
    ("module-level tensor",
     make_task("return x + W", constants="batch_size = 64\nfeatures = 256\nW = torch.ones(256)"),
     make_task("return x + W", constants="batch_size = 64\nfeatures = 256\nW = 3 * features - 1"),
     "forbidden_call"),
    ("module-level statement",
     make_task("return x", constants="batch_size = 64\nfeatures = 256\nprint(features)"),
     make_task("return x", constants="batch_size = 64\nfeatures = 256\nsizes = [features, 2 * features]"),
     "forbidden_call"),
    ("class not an nn.Module",
     make_task("return x", header="class Helper:\n    pass"),
     make_task("return x", header="class Helper(nn.Module):\n    pass"),
     "forbidden_call"),
    ("container as a class attribute",
     make_task("return x", header="class Helper(nn.Module):\n    seen = {}"),
     make_task("return x", header="class Helper(nn.Module):\n    scale = 2.0"),
     "forbidden_call"),
    ("a list as a class attribute (shared by every instance)",
     make_task("return x", header="class Helper(nn.Module):\n    sizes = [1, 2]"),
     make_task("return x", header="class Helper(nn.Module):\n    sizes = (1, 2)"),
     "forbidden_call"),
    ("decorator",
     make_task("return twice(x)", header="def wrap(f):\n    return f\n@wrap\ndef twice(t):\n    return 2 * t"),
     make_task("return self.twice(x)").replace(METHOD, "    @staticmethod\n    def twice(t):\n        return 2 * t\n"
                                                        "\n" + METHOD),
     "forbidden_call"),
    ("import inside a function",
     make_task("import math\nreturn x * math.pi"),
     make_task("return x * math.pi", header="import math"),
     "forbidden_import"),
    ("mutable default",
     make_task("return x").replace("def forward(self, x):", "def forward(self, x, seen=[]):"),
     make_task("return x").replace("def forward(self, x):", "def forward(self, x, seen=None):"),
     "impure_forward"),
    ("write to self",
     make_task("self.calls = self.calls + 1\nreturn x * self.calls", init="self.calls = 0"),
     make_task("calls = self.calls + 1\nreturn x * calls", init="self.calls = 0"),
     "impure_forward"),
    ("container on self",
     make_task("self.seen.append(x)\nreturn x", init="self.seen = []"),
     make_task("seen = []\nseen.append(x)\nreturn torch.stack(seen).sum(0)"),
     "impure_forward"),
    ("in-place on a buffer",
     make_task("self.acc.add_(1)\nreturn x + self.acc", init=BUFFER),
     make_task("return x + (self.acc + 1)", init=BUFFER),
     "impure_forward"),
    ("in-place through an alias of self",
     make_task("a = self.acc\na.add_(1)\nreturn x + a", init=BUFFER),
     make_task("a = self.acc.clone()\na.add_(1)\nreturn x + a", init=BUFFER),
     "impure_forward"),
    ("in-place on the input",
     make_task("x.relu_()\nreturn x"),
     make_task("x = x * 2\nx.relu_()\nreturn x"),
     "impure_forward"),
    ("subscript store into the input",
     make_task("x[0] = 0\nreturn x"),
     make_task("y = x.clone()\ny[0] = 0\nreturn y"),
     "impure_forward"),
    ("augmented assignment to the input",
     make_task("x += 1\nreturn x"),
     make_task("y = x * 2\ny += 1\nreturn y"),
     "impure_forward"),
    ("inplace=True on the input",
     make_task("return torch.nn.functional.relu(x, inplace=True)"),
     make_task("y = x * 2\nreturn torch.nn.functional.relu(y, inplace=True)"),
     "impure_forward"),
    ("out=",
     make_task("torch.relu(x, out=x)\nreturn x"),
     make_task("return torch.relu(x)"),
     "impure_forward"),
    ("nn.init in forward",
     make_task("nn.init.zeros_(self.w)\nreturn x @ self.w", init=WEIGHT),
     make_task("return x @ self.w", init=WEIGHT + "\nnn.init.zeros_(self.w)"),
     "impure_forward"),
    ("lambda in forward",
     make_task("f = lambda t: t * 2\nreturn f(x)"),
     make_task("return (lambda t: t * 2)(x)"),
     "impure_forward"),
    ("closure kept by __init__",
     make_task("self.bump()\nreturn x", init="calls = []\nself.bump = lambda: calls.append(1)"),
     make_task("return self.twice(x)", init="self.twice = lambda t: t * 2"),
     "impure_forward"),
    ("helper that changes its argument",
     make_task("return fill(x)", header="def fill(t):\n    t.zero_()\n    return t"),
     make_task("return fill(x)", header="def fill(t):\n    return torch.zeros_like(t)"),
     "impure_forward"),
    ("generator kept on self",
     make_task("for i in self.steps:\n    break\nreturn x * i", init="self.steps = (i for i in range(10 ** 6))"),
     make_task("for i in range(3):\n    x = x * i\nreturn x"),
     "impure_forward"),
    ("data-dependent if",
     make_task("if x.sum() > 0:\n    return x\nreturn -x"),
     make_task("if x.shape[0] > 1:\n    return x\nreturn -x"),
     "impure_forward"),
    ("data-dependent value in a local",
     make_task("s = x.sum()\nif s > 0:\n    return x\nreturn -x"),
     make_task("n, d = x.shape\nif n * d > 1:\n    return x\nreturn -x"),
     "impure_forward"),
    # a while loop may never end: refused by the grammar before the purity rules
    ("data-dependent loop",
     make_task("while x.max() > 1:\n    x = x / 2\nreturn x"),
     make_task("for i, _ in enumerate(range(3)):\n    if i > 0:\n        x = x / 2\nreturn x"),
     "forbidden_call"),
    ("data-dependent range",
     make_task("for _ in range(int(x.sum())):\n    x = x / 2\nreturn x"),
     make_task("for _ in range(x.size(0) // 32):\n    x = x / 2\nreturn x"),
     "impure_forward"),
    ("data-dependent conditional expression",
     make_task("return x if bool(x.any()) else -x"),
     make_task("return x if self.flip else -x", init="self.flip = True"),
     "impure_forward"),
    (".item()",
     make_task("return x * x.mean().item()"),
     make_task("return x * x.mean()"),
     "impure_forward"),
    ("branch on dtype",
     make_task("if x.dtype == torch.float16:\n    return x\nreturn -x"),
     make_task("return x.to(torch.float32).to(x.dtype)"),
     "impure_forward"),
    ("inspecting the device",
     make_task("return x * (str(x.device) == 'cpu')"),
     make_task("device = x.device\nreturn x + torch.ones(features, device=device)"),
     "impure_forward"),
    # torch's is_* questions are on no allowlist
    ("is_meta",
     make_task("return x if x.is_meta else -x"),
     make_task("return x if x.dim() == 2 else -x"),
     "forbidden_call"),
    # torch.is_grad_enabled and data_ptr are on no allowlist: refused before the purity rules
    ("grad mode",
     make_task("return x if torch.is_grad_enabled() else -x"),
     make_task("return x if self.w is None else -x", init="self.w = None"),
     "forbidden_call"),
    ("data_ptr",
     make_task("return x * (x.data_ptr() % 7)"),
     make_task("return x * (x.numel() % 7)"),
     "forbidden_call"),
    ("forward calls __init__ again",
     make_task("self.__init__()\nreturn x @ self.w", init=WEIGHT),
     make_task("return x @ self.w", init=WEIGHT),
     "impure_forward"),
    ("computed hasattr",
     make_task("return x if hasattr(self, 'w' + 'eight') else -x"),
     make_task("return x if hasattr(self, 'w') else -x", init=WEIGHT),
     "forbidden_call"),
    ("computed register_buffer name",
     make_task("return x + self.acc", init='self.register_buffer("".join(["a", "cc"]), torch.zeros(features))'),
     make_task("return x + self.acc", init=BUFFER),
     "forbidden_call"),
    ("str.format",
     make_task("return x * len('{0}'.format(x))"),
     make_task("return x * len(f'{features}')"),
     "forbidden_call"),
    ("Tensor.type by name",
     make_task("return x.type('torch.DoubleTensor')"),
     make_task("return x.to(torch.float64)"),
     "forbidden_call"),
    ("nn.ParameterDict",
     make_task("return x * self.p['w']", init="self.p = nn.ParameterDict({'w': nn.Parameter(torch.ones(1))})"),
     make_task("return x * self.p[0]", init="self.p = nn.ParameterList([nn.Parameter(torch.ones(1))])"),
     "forbidden_call"),
    ("Tensor.type given a name held in a variable",
     make_task("return x.type(self.kind)", init="self.kind = 'torch.DoubleTensor'"),
     make_task("return x.type(torch.float64)"),
     "forbidden_call"),
    ("in-place through a view of a buffer",
     make_task("v = self.acc.view(-1)\nv.add_(1)\nreturn x + self.acc", init=BUFFER),
     make_task("v = self.acc.view(-1) + 1\nv.add_(1)\nreturn x + v", init=BUFFER),
     "impure_forward"),
    ("dtypes kept for a call, and compared",
     make_task("a, b = x.dtype, x.dtype\nreturn x if a == b else -x"),
     make_task("a, b = x.dtype, x.dtype\nreturn x.float().to(a) + x.to(b)"),
     "impure_forward"),
    ("a generator kept, and one unpacked at once",
     make_task("halves = (h * 2 for h in x.chunk(2, dim=1))\nreturn torch.cat(tuple(halves), dim=1)"),
     make_task("a, b = (h * 2 for h in x.chunk(2, dim=1))\nreturn torch.cat((a, b), dim=1)"),
     "impure_forward"),
    ("torch's is_* question, and a layer's own is_* config",
     make_task("return x if x.is_contiguous() else -x"),
     make_task("return x if self.is_causal else -x", init="self.is_causal = True"),
     "forbidden_call"),
    ("a helper handed a tensor decides a branch, one handed shapes",
     make_task("return x if positive(x) else -x", header="def positive(t):\n    return t.sum() > 0"),
     make_task("return x if wide(x.shape[1]) else -x", header="def wide(n):\n    return n > 128"),
     "impure_forward"),
    ("an input as a truth value, and an option with a default",
     make_task("return x if x else -x"),
     make_task("return x if flip else -x").replace("def forward(self, x):", "def forward(self, x, flip=False):"),
     "impure_forward"),
    ("a method handing back self's container",
     make_task("self.store().append(x)\nreturn x", init="self.seen = []").replace(
         METHOD, "    def store(self):\n        return self.seen\n\n" + METHOD),
     make_task("return self.twice(x)").replace(METHOD, "    def twice(self, t):\n        return t * 2\n\n" + METHOD),
     "impure_forward"),
    ("a closure handed to a module that keeps it",
     make_task("return self.keep(x)", init="calls = []\nself.keep = Keep(lambda t: calls.append(t) or t)",
               header="class Keep(nn.Module):\n    def __init__(self, fn):\n        super().__init__()\n"
                      "        self.fn = fn\n\n    def forward(self, x):\n        return self.fn(x)"),
     make_task("return self.keep(x)", init="self.keep = Keep(lambda t: t * 2)",
               header="class Keep(nn.Module):\n    def __init__(self, fn):\n        super().__init__()\n"
                      "        self.fn = fn\n\n    def forward(self, x):\n        return self.fn(x)"),
     "impure_forward"),
    ("set.add on self, and Tensor.add on the input",
     make_task("self.seen.add(1)\nreturn x * len(self.seen)", init="self.seen = set()"),
     make_task("return x.add(1).sort(dim=1).values"),
     "impure_forward"),
    ("reset_parameters called from forward",
     make_task("self.reset_parameters()\nreturn self.lin(x)", init="self.lin = nn.Linear(features, features)").replace(
         METHOD, "    def reset_parameters(self):\n        nn.init.zeros_(self.lin.bias)\n\n" + METHOD),
     make_task("return self.lin(x)", init="self.lin = nn.Linear(features, features)\nself.reset_parameters()").replace(
         METHOD, "    def reset_parameters(self):\n        nn.init.zeros_(self.lin.bias)\n\n" + METHOD),
     "impure_forward"),
    ("a task module built inside forward changes what outlives the call",
     make_task("return Scale()(x)", header="built = []\nclass Scale(nn.Module):\n    def __init__(self):\n"
               "        super().__init__()\n        built.append(1)\n        self.s = 2.0\n\n"
               "    def forward(self, x):\n        return x * self.s"),
     make_task("return Scale()(x)", header="class Scale(nn.Module):\n"
               "    def __init__(self):\n        super().__init__()\n        self.s = 2.0\n\n"
               "    def forward(self, x):\n        return x * self.s"),
     "impure_forward"),
    ("iter and next",
     make_task("return x * next(iter(self.parameters()))", init=WEIGHT),
     make_task("return x @ self.w", init=WEIGHT),
     "forbidden_call"),
]


@pytest.mark.parametrize("name, refused, allowed, reason", PAIRS, ids=[pair[0] for pair in PAIRS])
def test_each_rule_refuses_its_case_and_lets_the_closest_legitimate_one_through(name, refused, allowed, reason):
    verdict = static_check(refused)
    assert verdict is not None and verdict[0] == reason, verdict
    assert static_check(allowed) is None, static_check(allowed)


def test_a_refusal_says_what_to_write_instead():
    reason, detail = static_check(make_task("self.seen.append(x)\nreturn x", init="self.seen = []"))
    assert reason == "impure_forward" and "in __init__" in detail and "self.seen" in detail
    reason, detail = static_check(make_task("if x.dtype == torch.float16:\n    return x\nreturn -x"))
    assert "torch.zeros(n, device=x.device)" in detail
    reason, detail = static_check(make_task("if x.sum() > 0:\n    return x\nreturn -x"))
    assert "torch.where" in detail and "x.shape" in detail


def test_init_may_write_self_and_initialise_in_place():
    """__init__ and what only it calls are not forward: they build the state forward reads."""
    code = make_task("return self.lin(x)", init="self.lin = nn.Linear(features, features)\nself.reset()")
    code = code.replace(METHOD, "    def reset(self):\n        nn.init.zeros_(self.lin.bias)\n"
                                "        self.lin.weight.data.mul_(0.5)\n\n" + METHOD)
    assert static_check(code) is None
    assert static_check(code.replace("return self.lin(x)", "self.reset()\n        return self.lin(x)"))[0] \
        == "impure_forward"


def test_init_and_get_inputs_may_not_ask_how_the_code_runs():
    """The checks build a task under the GPU's device and the trace under the CPU's or meta's:
    a device asked in __init__ or get_inputs gave a trace decoy ops (red team)."""
    asked_in_init = make_task("        return torch.relu(x) if self.on_gpu else torch.sigmoid(x)",
                              init="        self.on_gpu = torch.empty(0).is_cuda")
    assert static_check(asked_in_init)[0] == "forbidden_call"  # is_cuda is on no allowlist
    asked_in_inputs = make_task("        return torch.relu(x)", inputs="[torch.rand(batch_size, features)] if "
                                "torch.empty(0).is_cuda else [torch.rand(batch_size, 1)]")
    assert static_check(asked_in_inputs)[0] == "forbidden_call"
    passed_on = make_task("        return x + self.b", init="        self.b = torch.zeros(features, device=torch.empty(0).device)")
    assert static_check(passed_on) is None


# What a random draw or a weight decides in __init__ differs between the checks (built under
# the GPU's generator) and the trace (the CPU's): config forward branches on may not hold it.
DRAWN_CONFIG = {
    "float": "self.on_gpu = float(torch.randn(1)) > 1.54",
    "item": "self.on_gpu = torch.randn(1).item() > 1.54",
    "tensor": "self.on_gpu = torch.randn(1) > 1.54",
    "weight": "self.linear = nn.Linear(features, features)\nself.on_gpu = bool(self.linear.weight.sum() > 0)",
    "branch_in_init": "self.on_gpu = False\nif torch.randn(1) > 1.54:\n    self.on_gpu = True",
    "loop_in_init": "self.on_gpu = False\nfor v in torch.randn(3):\n    self.on_gpu = v > 1.0",
}


@pytest.mark.parametrize("kind", sorted(DRAWN_CONFIG))
def test_forward_may_not_branch_on_what_a_value_decided_in_init(kind):
    task = make_task("        return torch.relu(x) if self.on_gpu else torch.sigmoid(x)", init=DRAWN_CONFIG[kind])
    assert static_check(task)[0] == "impure_forward", kind


def test_config_computed_from_sizes_and_modules_built_in_init_stay_config():
    honest = make_task("        y = self.linear(x) * self.scale\n        return torch.relu(y) if self.use_bias else y",
                       init="self.linear = nn.Linear(features, features)\nself.scale = 1.0 / math.sqrt(features)\n"
                            "self.use_bias = self.linear.bias is not None and features > 8",
                       header="import math")
    assert static_check(honest) is None
