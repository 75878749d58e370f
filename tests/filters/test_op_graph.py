"""What a task computes, read the same however it is written (filters/sandbox/op_graph.py).
Our own small modules, recorded in this process on the meta device."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from filters.sandbox.op_graph import op_graph


class Call(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x)


def ops(body, shape=(4, 8)) -> list[str]:
    with torch.device("meta"):
        return op_graph(Call(body).eval(), [torch.empty(*shape)])


@pytest.mark.parametrize("name, library, by_hand", [
    ("gelu", F.gelu, lambda x: 0.5 * x * (1.0 + torch.erf(x / 1.4142135623730951))),
    ("silu", F.silu, lambda x: x * torch.sigmoid(x)),
    ("silu", F.silu, lambda x: x * (1.0 / (1.0 + torch.exp(-x)))),
    ("sigmoid", torch.sigmoid, lambda x: 1.0 / (1.0 + torch.exp(-x))),
    ("mish", F.mish, lambda x: x * torch.tanh(F.softplus(x))),
    ("mish", F.mish, lambda x: x * torch.tanh(torch.log(1.0 + torch.exp(x)))),
    ("softmax", lambda x: torch.softmax(x, -1),
     lambda x: (lambda e: e / e.sum(-1, keepdim=True))(torch.exp(x - x.amax(-1, keepdim=True)))),
    ("relu", torch.relu, lambda x: torch.clamp(x, min=0.0)),
])
def test_a_composite_and_its_ops_written_out_read_the_same(name, library, by_hand):
    assert ops(library) == ops(by_hand) == [name]


def test_what_does_not_reach_the_output_is_not_computed():
    def guarded(x):
        unused = torch.exp(x).sum()  # computed, then dropped
        return torch.tanh(x) * 2.0 if unused is not None else x
    assert ops(guarded) == ["tanh", "mul"]


@pytest.mark.parametrize("merge", [
    lambda f, x: torch.cat([f(x[:2]), f(x[2:])], dim=0),
    lambda f, x: torch.stack([f(row) for row in x.unbind(0)]),
])
def test_the_same_ops_on_parts_of_one_tensor_are_those_ops_once(merge):
    layer = nn.Linear(8, 8, device="meta")
    assert ops(lambda x: merge(lambda part: torch.relu(layer(part)), x)) == ops(lambda x: torch.relu(layer(x)))
    assert ops(lambda x: torch.relu(layer(x))) == ["mm", "add", "relu"]


def test_different_work_on_two_parts_stays_two_works():
    assert ops(lambda x: torch.cat([torch.tanh(x[:2]), torch.relu(x[2:])], dim=0)) == ["tanh", "relu", "cat"]


def test_arithmetic_families_and_identities():
    assert ops(lambda x: (x - 1.0) / 3.0) == ops(lambda x: (x + 1.0) * 3.0) == ["add", "mul"]
    assert ops(lambda x: x.mean(-1)) == ["sum", "mul"]
    assert ops(lambda x: torch.tanh(x * 1.0 + 0.0)) == ["tanh"]
