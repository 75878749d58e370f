"""Call counts in real model code, the weights of the template composer's draws."""
import textwrap

import pytest

from operators.roles import ANCHOR, EPILOGUE, LAYOUT, NORMALISATION, REDUCTION, role_of
from operators.usage import CallCounts, op_usage

MODELING = textwrap.dedent('''
    import torch
    from torch import nn
    import torch.nn.functional as F
    from ..llama.modeling_llama import LlamaRMSNorm as Norm
    from ...utils import (
        helper,
        other as renamed,
    )


    class ToyMLP(nn.Module):
        def __init__(self):
            self.up = nn.Linear(4, 4)
            self.norm = Norm(4)

        def forward(self, x):
            y = F.gelu(self.up(x)).softmax(dim=-1)
            z = torch.nn.functional.gelu(y) + (y * 2).sum(-1, keepdim=True)
            return ToyMLP() if helper(z) else renamed(torch.softmax(z, -1))
''')


def counted():
    counts = CallCounts()
    counts.add_file(MODELING, "transformers.models.toy.modeling_toy")
    return counts


def test_calls_are_resolved_through_the_files_imports():
    counts = counted()
    assert counts.of("torch.nn.Linear") == 1
    assert counts.of("torch.nn.functional.gelu") == 2  # F.gelu and the spelled-out path
    assert counts.of("torch.softmax") == 2  # torch.softmax(...) and the method y.softmax(...)
    assert counts.of("torch.sum") == 1  # a method on an expression: (y * 2).sum(...)
    assert counts.of("transformers.models.llama.modeling_llama.LlamaRMSNorm") == 1  # imported relatively, renamed
    assert counts.of("transformers.models.toy.modeling_toy.ToyMLP") == 1
    assert counts.qualified["transformers.utils.other"] == 1
    assert counts.of("torch.nn.Conv2d") == 0


def test_the_real_corpus_ranks_linear_over_a_special_function():
    usage = op_usage(["torch.nn.Linear", "torch.special.bessel_j0"], ["torch", "transformers"])
    assert usage["torch.nn.Linear"] > 1000 and usage["torch.special.bessel_j0"] == 0


def test_an_added_library_counts_its_own_calls():
    usage = op_usage(["kornia.filters.gaussian_blur2d", "kornia.filters.no_such_op"], ["kornia.filters"])
    assert usage["kornia.filters.gaussian_blur2d"] > 0 and usage["kornia.filters.no_such_op"] == 0


@pytest.mark.parametrize("name, role", [
    ("torch.nn.Conv2d", ANCHOR), ("torch.nn.ConvTranspose3d", ANCHOR), ("torch.matmul", ANCHOR),
    ("transformers.models.llama.modeling_llama.LlamaAttention", ANCHOR), ("torch.nn.GRUCell", ANCHOR),
    ("transformers.models.llama.modeling_llama.LlamaRMSNorm", NORMALISATION), ("torch.nn.GroupNorm", NORMALISATION),
    ("torch.nn.functional.gelu", EPILOGUE), ("torch.special.erfcx", EPILOGUE), ("torch.norm", REDUCTION),
    ("torch.nn.MaxPool1d", REDUCTION), ("torch.logsumexp", REDUCTION), ("torch.nn.ZeroPad3d", LAYOUT),
    ("torch.nn.functional.upsample_bilinear", LAYOUT), ("kornia.filters.box_blur", ANCHOR),
    ("transformers.models.bert.modeling_bert.BertPooler", ANCHOR),
])
def test_roles(name, role):
    assert role_of(name) == role
