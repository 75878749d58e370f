"""Library code asks how it runs (`torch.jit.is_tracing()`, `torch.compiler.is_compiling()`)
to pick a tracing-friendly path; the static policy refuses a forward that asks. The inliner
answers False, the eager path, and folds the branch away, so such layers still become seeds."""
import sys
import textwrap

import pytest
import torch

from filters.sandbox.static_check import screen_definitions
from operators.inline import InlineRules, inline

LAYERS = textwrap.dedent('''
    import torch
    from torch import nn


    class Gated(nn.Module):
        def forward(self, x):
            if torch.jit.is_tracing() or torch.compiler.is_compiling():
                return x * 3
            if not torch.jit.is_scripting():
                x = x + 1
            return x * 2 if not torch.compiler.is_compiling() else x
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
    assert screen_definitions(textwrap.dedent(LAYERS))[0] in ("forbidden_call", "impure_forward")
    namespace = {}
    exec(code, namespace)
    x = torch.rand(4)
    assert torch.equal(namespace["Gated"]()(x), layers.Gated()(x))
