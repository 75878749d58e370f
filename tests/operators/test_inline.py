"""The inliner on a small package made on the fly: framework glue out, config in as literals,
dependencies brought along, and a clear refusal for what cannot come along."""
import subprocess
import sys
import textwrap

import pytest
import torch

from operators.inline import InlineRules, NotSelfContained, inline

HELPERS = textwrap.dedent('''
    import torch


    def scaled_silu(x, scale):
        return torch.nn.functional.silu(x) * scale


    TABLE = {"a": 1.5}


    def kernel_hub(name):
        def wrap(cls):
            return cls
        return wrap
''')

LAYERS = textwrap.dedent('''
    import logging

    import torch
    from torch import nn

    from .helpers import TABLE, kernel_hub, scaled_silu

    logger = logging.getLogger(__name__)


    class DemoConfig:
        hidden_size = 32
        act_scale = 2.0
        use_bias = False
        mode = "fast"
        rope = {"kind": "default", "theta": 10000.0}


    @kernel_hub("demo")
    class DemoMLP(nn.Module):
        """A docstring that does not travel."""

        def __init__(self, config: DemoConfig):
            super().__init__()
            self.config = config
            self.kind = config.rope["kind"]
            self.proj = nn.Linear(config.hidden_size, getattr(config, "inner_size", config.hidden_size * 2),
                                  bias=config.use_bias)
            self.dropout = nn.Dropout(0.1)
            if config.mode != "fast":
                self.slow = TABLE["a"]
            if self.kind != "default":
                self.other = TABLE["a"]

        def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
            logger.info("forward")
            if cache is not None:
                x = cache.update(x)
            return self.dropout(scaled_silu(self.proj(x), self.config.act_scale))


    class NeedsTable(nn.Module):
        def forward(self, x):
            return x * TABLE["a"]


    class KeepsConfig(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.settings = config

        def forward(self, x):
            return x * self.settings.act_scale
''')


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("inline")
    (root / "opsynth_inline_demo").mkdir()
    (root / "opsynth_inline_demo" / "__init__.py").write_text("")
    (root / "opsynth_inline_demo" / "helpers.py").write_text(HELPERS)
    (root / "opsynth_inline_demo" / "layers.py").write_text(LAYERS)
    sys.path.insert(0, str(root))
    import opsynth_inline_demo.layers as layers
    yield layers
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m.startswith("opsynth_inline_demo")]:
        del sys.modules[name]


def rules(layers, **extra):
    return InlineRules("opsynth_inline_demo", {"config": layers.DemoConfig()}, none_names=frozenset({"cache"}), **extra)


def test_framework_glue_goes_and_config_becomes_constructor_arguments_and_literals(package):
    inlined = inline(package.DemoMLP, rules(package))
    code = inlined.code
    assert inlined.parameters == {"hidden_size": 32}
    for gone in ("config", "kernel_hub", "logger", "TABLE", "Dropout", "cache.update", "docstring", ": torch.Tensor"):
        assert gone not in code, gone
    # the config's numbers read in __init__ are constructor parameters; a missing attribute's
    # getattr default is taken; choices (a bool here) are literals
    assert "nn.Linear(hidden_size, hidden_size * 2, bias=False)" in " ".join(code.split())
    assert "def __init__(self, hidden_size):" in code
    assert "def scaled_silu(x, scale)" in code       # a dependency from another module of the package
    assert "scaled_silu(self.proj(x), 2.0)" in code


def test_the_inlined_class_computes_what_the_original_does_in_eval_mode(package):
    namespace = {}
    exec(inline(package.DemoMLP, rules(package)).code, namespace)
    x = torch.rand(4, 32)
    torch.manual_seed(0)
    inlined = namespace["DemoMLP"](hidden_size=32)
    torch.manual_seed(0)
    original = package.DemoMLP(package.DemoConfig()).eval()
    assert torch.equal(inlined(x), original(x))


def test_inlined_code_runs_in_a_process_that_cannot_import_the_package(package, tmp_path):
    script = tmp_path / "alone.py"
    script.write_text(inline(package.DemoMLP, rules(package)).code
                      + "import sys, torch\nprint(tuple(DemoMLP(32)(torch.rand(2, 32)).shape), "
                        "any(m.startswith('opsynth_inline_demo') for m in sys.modules))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(2,", "64)", "False"]


def test_what_cannot_come_along_is_named(package):
    with pytest.raises(NotSelfContained, match="TABLE"):
        inline(package.NeedsTable, rules(package))


def test_a_config_kept_as_an_object_is_not_self_contained(package):
    with pytest.raises(NotSelfContained, match="config is used beyond attribute reads"):
        inline(package.KeepsConfig, rules(package))
