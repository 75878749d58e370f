"""What the inliner rewrites so that library layers pass the static policy.

Library code asks how it runs (`torch.jit.is_tracing()`, `torch.compiler.is_compiling()`)
to pick a tracing-friendly path; the static policy refuses a forward that asks. The inliner
answers False, the eager path, and folds the branch away. It also spells two stdlib helpers
the policy no longer allows (collections.abc.Iterable in isinstance, functools.partial)
without them, and moves a function's own import to the top."""
import sys
import textwrap

import pytest
import torch

from filters.grammar import screen_definitions
from operators.inline import InlineRules, inline

LAYERS = textwrap.dedent('''
    import collections.abc
    import functools
    from collections.abc import Iterable

    import torch
    from torch import nn


    class Gated(nn.Module):
        def forward(self, x):
            if torch.jit.is_tracing() or torch.compiler.is_compiling():
                return x * 3
            if not torch.jit.is_scripting():
                x = x + 1
            return x * 2 if not torch.compiler.is_compiling() else x


    class HalfAware(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))

        def forward(self, x):
            if self.weight.dtype in [torch.float16, torch.bfloat16]:
                x = x.to(self.weight.dtype)
            return self.weight * x


    def as_int(x):
        import torch

        return x.to(torch.int64) if torch.jit.is_tracing() else int(x)


    class Pairs(nn.Module):
        def __init__(self, size=3):
            super().__init__()
            self.size = size if isinstance(size, collections.abc.Iterable) else (size, size)
            self.wide = size if isinstance(size, Iterable) else (size, size, size)
            self.act = functools.partial(nn.functional.gelu, approximate="tanh")

        def forward(self, x):
            return self.act(x) * len(self.size) * as_int(len(self.wide))
''')


@pytest.fixture(scope="module")
def layers(tmp_path_factory):
    root = tmp_path_factory.mktemp("run_mode")
    (root / "opsynth_run_mode_demo").mkdir()
    (root / "opsynth_run_mode_demo" / "__init__.py").write_text("")
    (root / "opsynth_run_mode_demo" / "layers.py").write_text(LAYERS)
    sys.path.insert(0, str(root))
    import opsynth_run_mode_demo.layers as module
    yield module
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m.startswith("opsynth_run_mode_demo")]:
        del sys.modules[name]


def test_run_mode_queries_fold_to_the_eager_path_and_pass_the_policy(layers):
    code = inline(layers.Gated, InlineRules("opsynth_run_mode_demo")).code
    for asked in ("is_tracing", "is_scripting", "is_compiling", "x * 3"):
        assert asked not in code, (asked, code)
    assert screen_definitions(code) is None
    asking = "import torch\nfrom torch import nn\n" + LAYERS[LAYERS.index("class Gated"):LAYERS.index("class Pairs")]
    assert screen_definitions(asking)[0] in ("forbidden_call", "impure_forward")
    namespace = {}
    exec(code, namespace)
    x = torch.rand(4)
    assert torch.equal(namespace["Gated"]()(x), layers.Gated()(x))


def test_stdlib_helpers_are_spelled_without_them(layers):
    code = inline(layers.Pairs, InlineRules("opsynth_run_mode_demo")).code
    for gone in ("collections", "functools", "Iterable", "partial", "    import torch"):
        assert gone not in code, (gone, code)
    assert screen_definitions(code) is None
    namespace = {}
    exec(code, namespace)
    x = torch.rand(4)
    for size in (3, (2, 5)):
        assert torch.equal(namespace["Pairs"](size)(x), layers.Pairs(size)(x))


def test_a_branch_on_a_weights_dtype_folds_to_the_dtype_seeds_build_weights_in(layers):
    """forward may not change its weights, so in a seed `self.weight.dtype` is the dtype the
    seed builds weights in; the policy would refuse the branch."""
    asked = inline(layers.HalfAware, InlineRules("opsynth_run_mode_demo")).code
    assert screen_definitions(asked)[0] == "impure_forward"
    code = inline(layers.HalfAware, InlineRules("opsynth_run_mode_demo", weight_dtype="float32")).code
    assert "dtype" not in code and screen_definitions(code) is None
