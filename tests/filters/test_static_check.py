import pytest

from filters.grammar import static_check
from tests.conftest import make_task


def test_a_plain_task_passes():
    assert static_check(make_task("return torch.relu(x)")) is None


@pytest.mark.parametrize("code, reason", [
    ("def broken(:\n", "syntax_error"),
    ("import torch\nclass Model: pass\ndef get_inputs(): return []\n", "bad_interface"),
    (make_task("return x", header="import os"), "forbidden_import"),
    (make_task("return x", header="from . import sibling"), "forbidden_import"),
    (make_task("open('/etc/passwd')\nreturn x"), "forbidden_call"),
    (make_task("return eval('x')"), "forbidden_call"),
    (make_task("return x.__class__"), "forbidden_call"),
    (make_task("return __builtins__"), "forbidden_call"),
    (make_task("torch.save(x, 'f')\nreturn x"), "forbidden_call"),
    (make_task("return torch.hub.load('a', 'b')"), "forbidden_call"),
    (make_task("return torch._C._get_tracing_state()"), "forbidden_call"),
    (make_task("torch.allclose = lambda *a, **k: True\nreturn x"), "forbidden_call"),
    (make_task("return getattr(torch, 'relu')(x)"), "forbidden_call"),
    (make_task("x.numpy().tofile('/etc/owned')\nreturn x"), "forbidden_call"),
    (make_task("return torch.from_file('/etc/passwd', size=4)"), "forbidden_call"),
    (make_task("return x * torch.rand_like(x)"), "stochastic_op"),
    (make_task("return torch.nn.functional.dropout(x, 0.5)"), "stochastic_op"),
])
def test_each_static_reason(code, reason):
    rejected = static_check(code)
    assert rejected is not None and rejected[0] == reason, rejected


def test_a_parameter_may_be_named_like_a_harmless_builtin_but_never_like_a_dangerous_one():
    helper = "def scaled(input, max):\n    return input * max\n"
    assert static_check(make_task("return scaled(x, 2.0)", header=helper)) is None
    shadowing = "def scaled(input, open):\n    return input * open\n"
    assert static_check(make_task("return scaled(x, 2.0)", header=shadowing)) == (
        "forbidden_call", "line 3: shadows the builtin 'open'")


def test_dropout_module_in_init_is_allowed_because_the_harness_runs_eval():
    code = make_task("return self.drop(x)", init="self.drop = nn.Dropout(0.1)")
    assert static_check(code) is None


BLUR = frozenset({"kornia.filters.GaussianBlur2d"})


@pytest.mark.parametrize("header, forward, verdict", [
    ("import kornia.filters", "return kornia.filters.GaussianBlur2d((3, 3), (1.5, 1.5))(x)", None),
    ("from kornia.filters import GaussianBlur2d", "return GaussianBlur2d((3, 3), (1.5, 1.5))(x)", None),
    ("import kornia.filters as kf", "return kf.GaussianBlur2d((3, 3), (1.5, 1.5))(x)", None),
    # the library's other names, however public, are not the run's ops
    ("import kornia.filters", "return kornia.filters.median_blur(x, 3)", "forbidden_call"),
    ("import kornia.filters", "return kornia.filters.GaussianBlur2d.forward(x)", "forbidden_call"),
    ("from kornia.filters import GaussianBlur2d", "return GaussianBlur2d.forward(x)", "forbidden_call"),
    ("import kornia.core.external", "return x", "forbidden_import"),
    ("import kornia", "return kornia.core.external.LazyLoader('os').getpid() * x", "forbidden_call"),
    ("from kornia.core.external import LazyLoader", "return x", "forbidden_import"),
    ("import einops", "return x", "forbidden_import"),
])
def test_an_added_library_gives_a_task_its_ops_and_nothing_else(header, forward, verdict):
    """kornia.core.external.LazyLoader('os') is the interpreter's os module: a whole-package
    allowlist let a task write its own verdict with it (see test_sandbox)."""
    code = make_task(forward.replace("(x)", "(x.reshape(1, 1, 8, 32))").replace("* x", "* x"), header=header)
    rejected = static_check(code, BLUR)
    assert (rejected and rejected[0]) == verdict, rejected
    if verdict is None:
        assert static_check(code)[0] == "forbidden_import"  # no library ops: not even the op


@pytest.mark.parametrize("forward", [
    "return torch.UntypedStorage._new_shared_filename_cpu(64) and x",
    "return torch.Tensor._make_subclass(torch.Tensor, x)",
    "return torch.nn.Module._apply(self, lambda t: t) and x",
    "return x * len(self._modules)",
    "self._apply(lambda t: t)\nreturn x",
])
def test_nothing_private_past_an_object_nor_of_nn_modules_own(forward):
    rejected = static_check(make_task(forward))
    assert rejected is not None and rejected[0] == "forbidden_call", rejected


@pytest.mark.parametrize("header", [
    # a module-level function whose parameter is called self: a tensor, not the model
    "\n\ndef _typed_storage(self):\n    return self\n\n\ndef storage_of(self):\n    return self._typed_storage()\n",
    "\n\nclass Helper(nn.Module):\n    @staticmethod\n    def storage_of(self):\n        return self._typed_storage()\n",
    "\n\nclass Helper(nn.Module):\n    def storage_of(self, x):\n        self = x\n        return self._typed_storage()\n"
    "\n    def _typed_storage(self):\n        return self\n",
])
def test_a_private_name_is_the_tasks_own_only_on_its_methods_self(header):
    """A red team named a function `_typed_storage` (a name of the task's own) and called it
    as a tensor's method through a helper's parameter called `self`: the tensor's storage."""
    rejected = static_check(make_task("return x", header=header))
    assert rejected is not None and rejected[0] == "forbidden_call", rejected


@pytest.mark.parametrize("forward", ["y = torch.zeros(x.shape)\ny.map_(torch.relu(x), torch.maximum)\nreturn y",
                                     "y = torch.zeros(x.shape)\ny.map2_(x, x, torch.maximum)\nreturn y",
                                     "y = x.clone()\ny.apply_(abs)\nreturn y"])
def test_python_called_on_each_element_is_refused(forward):
    """map_, map2_ and apply_ run a Python function per element and write its results where
    no op is recorded: a red team copied a layer's output past the trace with map_."""
    rejected = static_check(make_task(forward))
    assert rejected is not None and rejected[0] == "forbidden_call", rejected


@pytest.mark.parametrize("forward", [
    "h = torch.relu(x)\nreturn torch.full_like(x, float(h[0, 0]))",
    "return torch.tensor([float(v) for v in str(torch.relu(x)).split()[1:3]])",
    "return x * int(x.sum())",
    "return x + len(repr(x))",
    "return x + len(f'{x}')",
    "return x + len('%s' % x)",
    "return max(x, x * 2)",
    "print(x)\nreturn x",
])
def test_tensor_values_turned_into_python_values_are_refused(forward):
    """float(), str(), f-strings and the like take values out of torch, where the trace does
    not follow them (a red team hid a layer so): refused in forward, as .item() is."""
    rejected = static_check(make_task(forward))
    assert rejected is not None and rejected[0] == "impure_forward", rejected


def test_python_values_of_shapes_and_config_stay_allowed():
    """Shapes, config and loops over them (a red team's fairness round: sizes scaled per
    spatial dimension, paddings of a list of kernel sizes) are no tensor values."""
    forward = ("scale = float(x.shape[-1]) ** -0.5\nwidth = int(self.ratio * x.size(1))\n"
               "sizes = [int(s * self.ratio) for s in x.shape[1:]]\npads = [int(k // 2) for k in self.kernels]\n"
               "name = f'{width}'\nreturn x[:, :max(width, 1)] * scale * round(self.ratio, 2) + len(str(self.ratio))"
               " + sum(sizes) + sum(pads)")
    assert static_check(make_task(forward, init="self.ratio = 0.5\nself.kernels = (3, 5)")) is None
    rows = "return torch.stack([torch.full_like(row, float(value)) for row in x for value in row[:1]])"
    assert static_check(make_task(rows))[0] == "impure_forward"  # a loop over a tensor gives its values


def test_a_tasks_own_private_names_stay_allowed():
    code = make_task("return self._scaled(x) * self._gain", init="self._gain = 2.0",
                     header="\n\nclass Helper(nn.Module):\n    pass\n")
    code = code.replace("    def forward(self, x):", "    def _scaled(self, x):\n        return x * 3\n\n    def forward(self, x):")
    assert static_check(code) is None


def test_inlined_library_code_is_screened_like_a_task():
    """What a crawl inlines into seeds (no task interface yet) passes the same rules, or its
    op is listed as `unsafe_source`."""
    from filters.grammar import screen_definitions

    assert screen_definitions("import torch\n\ndef scaled(x):\n    return x * 2\n") is None
    assert screen_definitions("def pick(obj):\n    return getattr(obj, 'weight')\n")[0] == "forbidden_call"
    assert screen_definitions("import numpy as np\n")[0] == "forbidden_import"
    rejected = screen_definitions("import torch\nclass Noisy(torch.nn.Module):\n    def forward(self, x):\n        return torch.rand_like(x)\n")
    assert rejected[0] == "stochastic_op"


# Each route the attacker took past the old name-based check, and more of the same
# kind: the allowlist resolves where a name or chain leads, not how it is spelled.
ESCAPES = {
    "torch.os": "return torch.os.system('id')",
    "torch.sys": "return torch.sys.modules",
    "torch.builtins": "return torch.builtins.exec('1')",
    "torch.ctypes": "return torch.ctypes.CDLL(None)",
    "torch.importlib": "return torch.importlib.import_module('os')",
    "torch.inspect": "return torch.inspect.stack()",
    "torch.threading": "return torch.threading.Thread(target=print)",
    "nn.functional as a module value": "f = torch.nn.functional\nreturn f.relu(x)",
    "torch as a value": "t = torch\nreturn t.relu(x)",
    "module passed to a call": "return id(torch)",
    "dataclasses.builtins": "return dataclasses.builtins.exec('1')",
    "operator.attrgetter": "return operator.attrgetter('real')(x)",
    "comprehension variable named exec": "[0 for exec in range(1)]\nreturn exec('x')",
    "assigned builtin name": "getattr = max\nreturn x",
    "frame through a generator": "g = (i for i in [x])\nreturn g.gi_frame.f_back",
    "traceback frame": "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    return e.with_traceback(None)",
    "dunder in a string": "return hasattr(x, '__globals__')",
    "format string attribute": "return '{0.__class__}'.format(x)",
    "type()": "return type(x)",
    "vars()": "return vars(self)",
    "patching a tensor method": "T = torch.Tensor\nT.float = lambda t: t\nreturn x",
    "patching through self": "self.t = torch.Tensor\nself.t.allclose = print\nreturn x",
    "hiding parameters": "self.named_parameters = lambda: []\nreturn x",
    "torch.manual_seed": "torch.manual_seed(0)\nreturn x",
    # which seed the checks drew from, as a gate a trace's other draw zeroes (red team, session 13)
    "the default generator's seed": "return x * torch.default_generator.initial_seed()",
    "the default generator's state": "return x * torch.default_generator.get_state().float().mean()",
    "a generator's seed through a local": "g = torch.default_generator\nreturn x * g.initial_seed()",
    "the CUDA generators": "return x * torch.cuda.default_generators[0].initial_seed()",
    "torch.compile": "return torch.compile(self)(x)",
    "torch.jit.load": "return torch.jit.load('m.pt')",
    "torch.utils": "return torch.utils.data",
    "torch.library": "return torch.library.Library('x', 'DEF')",
    "private torch": "return torch._C._nn.gelu(x)",
    "private on a value": "return x._base",
    "share memory": "x.share_memory_()\nreturn x",
    "global hook": "return torch.nn.modules.module.register_module_forward_hook(print)",
}
ESCAPE_HEADERS = {"dataclasses.builtins": "import dataclasses", "operator.attrgetter": "import operator"}
IMPORTS = {
    "aliased torch.hub": "import torch.hub as h",
    "from torch.hub": "from torch.hub import download_url_to_file",
    "from torch import hub": "from torch import hub",
    "from torch import os": "from torch import os",
    "from dataclasses import builtins": "from dataclasses import builtins",
    "from builtins": "from builtins import exec",
    "star": "from torch import *",
    "os": "import os",
    "threading": "import threading",
    "signal": "import signal",
    "gc": "import gc",
    "weakref": "import weakref",
}


@pytest.mark.parametrize("route", sorted(ESCAPES))
def test_each_escape_route_is_refused(route):
    code = make_task(ESCAPES[route], header=ESCAPE_HEADERS.get(route, ""))
    rejected = static_check(code)
    # dataclasses and operator are no longer importable at all
    expected = "forbidden_import" if route in ESCAPE_HEADERS else "forbidden_call"
    assert rejected is not None and rejected[0] == expected, (route, rejected)


@pytest.mark.parametrize("route", sorted(IMPORTS))
def test_each_import_route_is_refused(route):
    rejected = static_check(make_task("return x", header=IMPORTS[route]))
    assert rejected is not None and rejected[0] in ("forbidden_import", "forbidden_call"), (route, rejected)


def test_an_alias_of_torch_keeps_every_torch_rule():
    aliased = make_task("return T.hub.load('a', 'b')", header="import torch as T")
    assert static_check(aliased)[0] == "forbidden_call"
    assert static_check(make_task("return T.relu(x)", header="import torch as T")) is None
    assert static_check(make_task("return fn.gelu(x)", header="import torch.nn.functional as fn")) is None
    assert static_check(make_task("return gelu(x)", header="from torch.nn.functional import gelu")) is None


@pytest.mark.parametrize("method", ["__del__", "__getattr__", "__setattr__", "__init_subclass__", "__eq__"])
def test_no_dunder_method_but_init(method):
    code = make_task("return x").replace("    def forward(self, x):", f"    def {method}(self, *a):\n"
                                                                        "        return None\n\n    def forward(self, x):")
    assert static_check(code)[0] == "forbidden_call"


def test_no_metaclass_and_no_async():
    assert static_check(make_task("return x", header="class M(type):\n    pass\nclass K(metaclass=M):\n    pass"))[0] \
        == "forbidden_call"
    assert static_check(make_task("return x", header="async def f():\n    pass"))[0] == "forbidden_call"


@pytest.mark.parametrize("where, code", [
    ("a helper forward calls", make_task("return noisy(x)", header="def noisy(t):\n    return t + torch.randn_like(t)")),
    ("a from-import alias", make_task("return x + r(3)", header="from torch import rand as r")),
    ("an in-place method", make_task("return x.clone().uniform_()")),
    ("another method of the model", make_task("return self.noise(x)").replace(
        "    def forward(self, x):", "    def noise(self, t):\n        return t.bernoulli()\n\n    def forward(self, x):")),
    ("module level", make_task("return x + W", constants="batch_size = 64\nfeatures = 256\nW = torch.randn(256)")),
])
def test_random_ops_are_found_wherever_forward_can_reach_them(where, code):
    assert static_check(code)[0] == "stochastic_op", where


def test_random_initialisation_in_init_and_inputs_is_allowed():
    code = make_task("return x @ self.w", init="self.w = nn.Parameter(torch.randn(features, features))")
    assert static_check(code) is None


def test_a_tasks_own_attributes_may_be_named_like_tensor_methods():
    """`self.dim = dim` is ordinary layer code; only the model's own methods are protected."""
    assert static_check(make_task("return x.sum(self.dim)", init="self.dim = -1")) is None
