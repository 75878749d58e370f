import pytest

from filters.static_check import static_check
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


def test_a_parameter_named_like_a_builtin_is_a_variable_not_the_builtin():
    helper = "def scaled(input, open):\n    return input * open\n"
    assert static_check(make_task("return scaled(x, 2.0)", header=helper)) is None
    # ...but only inside the function that binds it
    leaky = "def scaled(input):\n    return input\n"
    rejected = static_check(make_task("return input(x)", header=leaky))
    assert rejected is not None and rejected[0] == "forbidden_call"


def test_dropout_module_in_init_is_allowed_because_the_harness_runs_eval():
    code = make_task("return self.drop(x)", init="self.drop = nn.Dropout(0.1)")
    assert static_check(code) is None


def test_extra_imports_allow_a_plugin_library():
    code = make_task("return x", header="import mylib.ops")
    assert static_check(code)[0] == "forbidden_import"
    assert static_check(code, frozenset({"mylib"})) is None


def test_inlined_library_code_is_screened_like_a_task():
    """What a crawl inlines into seeds (no task interface yet) passes the same rules, or its
    op is listed as `unsafe_source`."""
    from filters.static_check import screen_definitions

    assert screen_definitions("import torch\n\ndef scaled(x):\n    return x * 2\n") is None
    assert screen_definitions("def pick(obj):\n    return getattr(obj, 'weight')\n")[0] == "forbidden_call"
    assert screen_definitions("import numpy as np\n")[0] == "forbidden_import"
    rejected = screen_definitions("import torch\nclass Noisy:\n    def forward(self, x):\n        return torch.rand_like(x)\n")
    assert rejected[0] == "stochastic_op"
