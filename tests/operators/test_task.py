import ast

import pytest
import torch

from filters.grammar import static_check
from operators.layouts import LAYOUTS
from operators.records import OpSpec
from operators.records import normalized_code, task_id
from operators.task import ChainTooLarge, bind, chain_output, render_task


@pytest.fixture(scope="module")
def specs(torch_catalog):
    return {spec.name: spec for spec in torch_catalog[0]}


def test_rendered_chain_is_a_task_in_the_kernelbench_format(specs):
    layout = LAYOUTS["image"]
    conv = bind(specs["torch.nn.Conv2d"], layout, layout.sizes)
    after = tuple(chain_output([conv], layout, layout.sizes).shape)
    gelu = bind(specs["torch.nn.functional.gelu"], layout, after)
    code = render_task([conv, gelu], layout, layout.sizes)
    assert static_check(code) is None
    namespace = {}
    exec(code, namespace)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    out = model(*namespace["get_inputs"]())
    assert tuple(out.shape) == after
    assert "batch_size = 8" in code  # the re-sizable constant is at module level


def test_task_id_ignores_comments_docstrings_and_formatting():
    a = 'import torch\n\ndef f(x):\n    """doc"""\n    return x + 1  # note\n'
    b = "import torch\ndef f(x): return x+1\n"
    c = "import torch\ndef f(x): return x+2\n"
    assert task_id(a) == task_id(b) != task_id(c)
    assert "doc" not in normalized_code(a)


def test_meta_shape_matches_a_real_run(specs):
    layout = LAYOUTS["signal"]
    pool = bind(specs["torch.nn.MaxPool1d"], layout, layout.sizes)
    shape = tuple(chain_output([pool], layout, layout.sizes).shape)
    real = torch.nn.MaxPool1d(kernel_size=3)(torch.rand(layout.sizes))
    assert shape == tuple(real.shape)
    ast.parse(render_task([pool], layout, layout.sizes))


WIDE_LINEAR = OpSpec("torch.nn.Linear", "torch", "module", ("features",), ("features",),
                     init_args={"in_features": "$L", "out_features": 300_000})
# Its forward reads a value, which the meta device cannot: the probe falls back to the CPU.
VALUE_READING = OpSpec(
    "ValueReading", "torch", "module", ("features",), ("features",), init_args={"width": 300_000},
    definitions=("class ValueReading(nn.Module):\n"
                 "    def __init__(self, width):\n"
                 "        super().__init__()\n"
                 "        self.proj = nn.Linear(512, width)\n"
                 "    def forward(self, x):\n"
                 "        return x * float(x.abs().max().item())\n"))


@pytest.mark.parametrize("spec", [WIDE_LINEAR, VALUE_READING], ids=["meta-kernel", "cpu-fallback"])
def test_a_chain_with_weights_past_the_bound_is_refused_before_it_is_built_on_the_cpu(spec):
    layout = LAYOUTS["features"]  # 512 -> 300,000 weights: 153.6 million elements, past MAX_STATE_ELEMENTS
    with pytest.raises(ChainTooLarge, match="153,900,000 elements"):
        chain_output([bind(spec, layout, layout.sizes)], layout, layout.sizes)


def test_a_chain_without_a_meta_kernel_still_runs_on_the_cpu():
    layout = LAYOUTS["features"]
    small = OpSpec(**{**VALUE_READING.__dict__, "init_args": {"width": 16}})
    out = chain_output([bind(small, layout, layout.sizes)], layout, layout.sizes)
    assert out.device.type == "cpu" and tuple(out.shape) == layout.sizes
