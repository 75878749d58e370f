import ast

import pytest
import torch

from filters.static_check import static_check
from operators.layouts import LAYOUTS
from operators.task import bind, chain_output, normalized_code, render_task, task_id


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
