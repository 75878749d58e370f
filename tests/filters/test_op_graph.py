"""What a task computes, read the same however it is written (filters/computation/).
Our own small modules, recorded in this process: on real CPU tensors (values: what a run of
ops computes is compared with what came before it) and on the meta device (spelling only)."""
import itertools
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from filters.checks.harness import trace
from filters.checks.measure.resize import small_problem
from filters.computation.graph import ValuesThroughPython, op_graph, op_graph_and_drops
from filters.computation.linear import CHECKED_ROWS, SPARE_ROWS, solve_convolution
from filters.computation.memory import OVERLAP_SEARCH_NODES, UntracedAliasing, _offsets_meet, _overlap
from filters.computation.recognise import GROUP_COUNTS_TRIED, TraceTooLong, _dim_tests, _matmul_shape
from filters.computation.values import ELEMENT_TOLERANCE, _apart, _apart_values, close
from filters.grammar import static_check
from filters.similarity.score import encode, sequence_similarity
from tests.disguise import EQUIVALENTS, NotApplicable
from tests.conftest import make_task

FIXTURES = Path(__file__).parents[1] / "fixtures" / "reference" / "level2"


class Call(nn.Module):
    def __init__(self, body, *modules):
        super().__init__()
        self.body, self.modules_ = body, nn.ModuleList(modules)

    def forward(self, x):
        return self.body(x)


def ops(body, *modules, shape=(4, 8, 6, 5), device="cpu") -> list[str]:
    torch.manual_seed(0)
    with torch.device(device):
        return op_graph(Call(body, *modules).eval(), [torch.randn(*shape)])


def unmarked(reading: list[str]) -> list[str]:
    """The names of a reading without the marks where branches begin."""
    return [name.lstrip("|") for name in reading]


torch.manual_seed(0)
LINEAR, CONV = nn.Linear(5, 7), nn.Conv2d(8, 4, 3, padding=1)
BN = nn.BatchNorm2d(8).eval()
with torch.no_grad():
    BN.running_mean.normal_(), BN.running_var.uniform_(0.5, 1.5), BN.weight.normal_(), BN.bias.normal_()
SCALE = BN.weight / torch.sqrt(BN.running_var + BN.eps)
SHIFT = BN.bias - BN.running_mean * SCALE


@pytest.mark.parametrize("name, library, written", [
    ("relu", torch.relu, lambda x: torch.where(x > 0, x, torch.zeros_like(x))),
    ("relu", torch.relu, lambda x: torch.maximum(x, torch.tensor(0.0))),
    ("relu", torch.relu, lambda x: (x + x.abs()) / 2),
    ("relu", torch.relu, lambda x: torch.clamp(x, min=0.0)),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.1), lambda x: torch.where(x > 0, x, 0.1 * x)),
    ("clamp", F.hardtanh, lambda x: torch.minimum(torch.maximum(x, torch.tensor(-1.0)), torch.tensor(1.0))),
    ("hardswish", F.hardswish, lambda x: x * torch.clamp(x + 3, 0, 6) / 6),
    ("gelu", F.gelu, lambda x: 0.5 * x * (1.0 + torch.erf(x / 1.4142135623730951))),
    ("gelu", F.gelu, lambda x: 0.5 * x * torch.erfc(-x / math.sqrt(2))),
    ("tanh", torch.tanh, lambda x: 2 * torch.sigmoid(2 * x) - 1),
    ("sigmoid", torch.sigmoid, lambda x: (torch.tanh(x / 2) + 1) / 2),
    ("sigmoid", torch.sigmoid, lambda x: 1.0 / (1.0 + torch.exp(-x))),
    ("silu", F.silu, lambda x: x * torch.sigmoid(x)),
    ("mish", F.mish, lambda x: x * torch.tanh(torch.log(1.0 + torch.exp(x)))),
    ("softmax", lambda x: torch.softmax(x, 1), lambda x: torch.exp(x - torch.logsumexp(x, 1, keepdim=True))),
    ("softmax", lambda x: torch.softmax(x, -1),
     lambda x: (lambda e: e / e.sum(-1, keepdim=True))(torch.exp(x - x.amax(-1, keepdim=True)))),
    ("instance_norm", F.instance_norm,
     lambda x: (x - x.mean((2, 3), keepdim=True)) / torch.sqrt(x.var((2, 3), unbiased=False, keepdim=True) + 1e-5)),
    ("layer_norm", lambda x: F.layer_norm(x, (8, 6, 5)),
     lambda x: (x - x.mean((1, 2, 3), keepdim=True)) / (x.var((1, 2, 3), unbiased=False, keepdim=True) + 1e-5) ** 0.5),
    ("group_norm", lambda x: F.group_norm(x, 2),
     lambda x: (lambda g: ((g - g.mean(2, keepdim=True)) / torch.sqrt(g.var(2, unbiased=False, keepdim=True) + 1e-5))
                .reshape(x.shape))(x.reshape(4, 2, -1))),
])
def test_a_composite_and_its_written_forms_read_the_same(name, library, written):
    assert ops(library) == ops(written) == [name]


@pytest.mark.parametrize("dim, keep", [(1, False), (1, True), (-1, False), (0, True)])
def test_a_log_sum_exp_written_out_reads_as_one_along_any_dimension(dim, keep):
    def written(x):
        top = x.amax(dim, keepdim=True)
        out = top + torch.log(torch.exp(x - top).sum(dim, keepdim=True))
        return out if keep else out.squeeze(dim)
    assert ops(written) == ops(lambda x: torch.logsumexp(x, dim, keepdim=keep)) == ["logsumexp"]


def test_a_test_on_a_few_elements_rules_out_only_what_the_whole_comparison_would():
    """`_apart` (or `_apart_values`) on any elements implies `close` fails on the tensors
    holding them: it may save a comparison, never change one."""
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(64, 64, generator=generator) * torch.logspace(-4, 4, 64)
    pairs = [(base, base + scale * torch.randn(64, 64, generator=generator) * base.abs())
             for scale in (0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1.0)]
    for special_here, special_there in ((float("nan"), float("nan")), (float("nan"), 0.0), (float("inf"), 1e30),
                                        (float("inf"), float("inf")), (float("-inf"), float("inf"))):
        here, there = base.clone(), base.clone()
        here[3, 5], there[3, 5] = special_here, special_there
        pairs.append((here, there))
    for a, b in pairs:
        for rows in (slice(0, 1), slice(3, 4), slice(None)):
            assert not (_apart(a[rows], b[rows]) and close(a, b))
            assert not (_apart_values(a[rows].flatten().tolist(), b[rows].flatten().tolist()) and close(a, b))
    far = base.clone()
    far[0, 0] += 1.0 + 2 * ELEMENT_TOLERANCE * (1 + far[0, 0].abs())
    assert _apart(base[:1], far[:1]) and _apart_values(base[0, :1].tolist(), far[0, :1].tolist())
    assert not close(base, far)
    assert not _apart(base[:1], base[:1].clone()) and not _apart_values(base[0].tolist(), base[0].tolist())


def test_the_shape_of_a_product_broadcasts_as_torch_does():
    shapes = [(2, 3), (1, 3, 2), (4, 1, 2, 3), (0, 3, 3), (5, 3, 3), (4, 5, 3, 4), (1, 0, 3, 1)]
    for a, b in [(a, b) for a in shapes for b in shapes]:
        x, y = torch.empty(a, device="meta"), torch.empty(b, device="meta")
        try:
            expected = (*torch.broadcast_shapes(a[:-2], b[:-2]), a[-2], b[-1])
        except RuntimeError:
            expected = ()
        assert _matmul_shape(x, y) == expected, (a, b)


def test_silu_only_when_the_multiplication_takes_the_sigmoids_own_input():
    assert ops(lambda x: torch.sigmoid(x) * (x + 1.0)) == ["add", "|sigmoid", "mul"]



@pytest.mark.parametrize("library, written", [
    (lambda x: torch.tanh(x - 0.5), lambda x: 2 * torch.sigmoid(2 * (x - 0.5)) - 1),
    (lambda x: torch.tanh(x * 3.0), lambda x: 2 * torch.sigmoid(2 * (x * 3.0)) - 1),
    (lambda x: torch.sigmoid(x + 3.0), lambda x: (torch.tanh((x + 3.0) / 2) + 1) / 2),
    (lambda x: torch.tanh(torch.clamp(F.silu(x) / 2, -1, 1)),
     lambda x: 2 * torch.sigmoid(2 * torch.clamp(F.silu(x) / 2, -1, 1)) - 1),
])
def test_a_written_composite_of_scaled_or_shifted_input_is_that_composite(library, written):
    """The written form's own first step (2 (x - s)) is an affine map of x, or a clamp of an
    earlier value: the composite reads the value that step took in."""
    assert ops(written) == ops(library)
    assert ops(library)[-1] in ("tanh", "sigmoid")



def test_a_value_inside_a_written_composite_is_not_named_for_equalling_it():
    """2 sigmoid(x) equals the 1 + tanh(x / 2) a written sigmoid passes through: a relu of
    that (it is all positive) would be nothing at all, not a composite."""
    assert ops(lambda x: (torch.tanh(x / 2) + 1) / 2 * 2.0 + x) == ops(lambda x: torch.sigmoid(x) * 2.0 + x) \
        == ["sigmoid", "mul", "add"]


def test_values_all_near_zero_are_compared_by_their_own_size():
    """A softmax over 8,192 values is all under 1e-3: one of a GELU is not one of its input."""
    assert ops(lambda x: torch.softmax(F.gelu(x), -1), shape=(4, 8192)) == ["gelu", "softmax"]
    assert ops(lambda x: torch.softmax(x, -1), shape=(4, 8192)) == ["softmax"]


def test_values_clustered_far_from_zero_scaled_are_no_clamp_of_themselves():
    """A batch's log-sum-exps of channel means plus a bias lie within a few millionths of each
    other: four times them is within `close`'s tolerance of them clamped to their own range,
    which passes none of them through (a disguised L2 42 read `clamp` for `* 4.0`)."""
    clustered = lambda x: torch.logsumexp(x.mean((2, 3)) * 1e-3 + 5.0, 1) * 10.0  # noqa: E731
    assert ops(lambda x: clustered(x) * 4.0 * 0.25, shape=(16, 8, 6, 5)) == ops(clustered, shape=(16, 8, 6, 5))
    assert ops(lambda x: clustered(x) * 4.0, shape=(16, 8, 6, 5))[-2:] == ["logsumexp", "mul"]


def test_a_clamp_that_passes_no_value_through_is_still_a_clamp():
    """relu6 of `x * 1e6` puts every value on a bound: a clamp all the same, as where some
    value lands between its bounds (a red team's saturated relu6 read `hardtanh`, its own
    spelling, at the small problem and `clamp` at its own sizes)."""
    assert ops(lambda x: F.relu6(x * 1e6)) == ops(lambda x: F.relu6(x * 3.0)) \
        == ops(lambda x: F.hardtanh(x * 1e6, -2.0, 2.0)) == ["clamp", "mul"]


@pytest.mark.parametrize("eps", [1e-5, 1e-6, 1e-12, 1e-3])
def test_a_norm_is_named_whatever_its_eps_on_values_of_small_variance(eps):
    small = lambda x: x * 0.003  # noqa: E731  a variance (1e-5) the eps weighs on
    written = lambda x: (lambda y: (y - y.mean((2, 3), keepdim=True))  # noqa: E731
                         / torch.sqrt(y.var((2, 3), unbiased=False, keepdim=True) + eps))(small(x))
    library = ops(lambda x: F.instance_norm(small(x), eps=eps))
    assert ops(written) == library and library[-1] == "instance_norm"  # the scale: nothing, where eps is nothing


def test_centering_alone_is_not_a_norm():
    assert "instance_norm" not in ops(lambda x: (x * 0.5) - (x * 0.5).mean((2, 3), keepdim=True))


def test_a_group_norm_of_features_is_a_group_norm_however_written():
    written = lambda x: (lambda g: ((g - g.mean(2, keepdim=True))  # noqa: E731
                                    / torch.sqrt(g.var(2, unbiased=False, keepdim=True) + 1e-5)).reshape(x.shape))(
        x.reshape(x.shape[0], 4, -1))
    assert ops(written, shape=(4, 16)) == ops(lambda x: F.group_norm(x, 4), shape=(4, 16)) == ["group_norm"]


GROUPS_LINEAR = nn.Linear(5, 32)  # (batch, 32) written straight into (batch, 4 groups, 8)
GAIN, OFFSET = torch.randn(4, 8), torch.randn(4, 8)


def _moments_norm(h):
    return (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)


@pytest.mark.parametrize("norm", [_moments_norm, lambda h: F.layer_norm(h, (8,))], ids=["moments", "layer_norm"])
def test_a_norm_in_a_layout_of_groups_reshaped_into_channels_is_a_group_norm(norm):
    # the fourth adversary's L2 37 (session 35): an einsum into (batch, groups, size), a norm
    # over its last dimension and an affine per element there, flattened only at the end
    grouped = lambda x: torch.einsum("ni,gki->ngk", x, GROUPS_LINEAR.weight.view(4, 8, 5)) + GROUPS_LINEAR.bias.view(4, 8)  # noqa: E731
    written = lambda x: (norm(grouped(x)) * GAIN + OFFSET).flatten(1)  # noqa: E731
    library = lambda x: F.group_norm(GROUPS_LINEAR(x), 4, GAIN.flatten(), OFFSET.flatten())  # noqa: E731
    assert ops(written, shape=(6, 5)) == ops(library, shape=(6, 5)) == ["mm", "add", "group_norm", "mul", "add"]
    # the fifth adversary's L2 88 (session 38): a silu written out, reading the norm twice, between
    gated = lambda x: (lambda v: 0.5 * v * (1.0 + torch.tanh(0.5 * v)))(norm(grouped(x)) * GAIN + OFFSET)  # noqa: E731
    assert ops(lambda x: gated(x).flatten(1), shape=(6, 5)) == ops(lambda x: F.silu(library(x)), shape=(6, 5)) == \
        ["mm", "add", "group_norm", "mul", "add", "silu"]
    # left in its groups' layout, or read by something else before the reshape, it is a norm of rows
    assert ops(lambda x: norm(grouped(x)) * GAIN + OFFSET, shape=(6, 5))[2] == "layer_norm"
    assert ops(lambda x: (lambda y: torch.cat([y.flatten(1), y[:, 0].exp()], 1))(norm(grouped(x))), shape=(6, 5))[2] == \
        "layer_norm"


def test_a_norm_of_a_permuted_value_keeps_its_name_whatever_reshape_follows():
    # session 38's red team: a norm over the channels at each position (NHWC) is no group norm
    # of the flattened value, nor, transposed back into a square image, an instance norm
    assert ops(lambda x: F.layer_norm(x.permute(0, 2, 3, 1), (8,)).flatten(1)) == ["layer_norm"]
    assert ops(lambda x: F.layer_norm(x.reshape(4, 4, 4).transpose(1, 2), (4,)).transpose(1, 2).reshape(x.shape),
               shape=(4, 4, 2, 2)) == ["layer_norm"]


def test_a_norm_of_each_channels_positions_reshaped_into_an_image_is_an_instance_norm():
    flat = lambda x: F.layer_norm(torch.exp(x.reshape(*x.shape[:2], -1)), (30,))  # noqa: E731
    assert ops(lambda x: torch.relu(flat(x).view(x.shape))) == ops(
        lambda x: torch.relu(F.instance_norm(torch.exp(x)))) == ["exp", "instance_norm", "relu"]
    assert ops(lambda x: torch.relu(flat(x))) == ["exp", "layer_norm", "relu"]  # (batch, channels, positions)

@pytest.mark.parametrize("written", [
    lambda x: torch.einsum("...k,nk->...n", x, LINEAR.weight) + LINEAR.bias,
    lambda x: (x.unsqueeze(-2) * LINEAR.weight).sum(-1) + LINEAR.bias,
    lambda x: x[..., :2] @ LINEAR.weight[:, :2].T + x[..., 2:] @ LINEAR.weight[:, 2:].T + LINEAR.bias,
    # the fifth adversary's L2 76 (session 38): the bias first, then partial products
    lambda x: LINEAR.bias + x[..., 3:] @ LINEAR.weight[:, 3:].T + x[..., :3] @ LINEAR.weight[:, :3].T,
])
def test_a_gemm_in_its_written_forms_is_a_gemm(written):
    assert ops(LINEAR, LINEAR) == ops(written, LINEAR) == ["mm", "add"]


def test_a_convolution_as_unfold_and_a_matrix_product_is_a_convolution():
    unfolded = lambda x: (CONV.weight.reshape(4, -1) @ F.unfold(x, 3, padding=1)).reshape(4, 4, 6, 5) \
        + CONV.bias[None, :, None, None]  # noqa: E731
    assert ops(CONV, CONV) == ops(unfolded, CONV) == ["convolution2d"]


POINTWISE, LINEAR_8 = nn.Conv2d(8, 12, 1), nn.Linear(8, 12)
with torch.no_grad():
    LINEAR_8.weight.copy_(POINTWISE.weight[:, :, 0, 0]), LINEAR_8.bias.copy_(POINTWISE.bias)


@pytest.mark.parametrize("written, shape", [
    (POINTWISE, (4, 8, 6, 5)),  # a 1x1 convolution mixes the channels of every pixel: a Linear of each
    (lambda x: LINEAR_8(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2), (4, 8, 6, 5)),
    (LINEAR_8, (4, 8)),
    (lambda x: POINTWISE(x[:, :, None, None]).flatten(1), (4, 8)),  # a fully connected layer as a 1x1 convolution
    (lambda x: F.conv2d(x.reshape(4, 2, 2, 2), POINTWISE.weight.reshape(12, 2, 2, 2), POINTWISE.bias).flatten(1),
     (4, 8)),  # one window over the whole image: a Linear of the flattened image
    (lambda x: (POINTWISE.weight.reshape(12, 8) @ F.unfold(x, 1)).reshape(4, 12, 6, 5)
     + POINTWISE.bias[None, :, None, None], (4, 8, 6, 5)),
])
def test_a_linear_map_reads_as_one_whichever_family_of_linear_operators_writes_it(written, shape):
    assert ops(written, POINTWISE, LINEAR_8, shape=shape) == ["mm", "add"]


def test_a_pointwise_kernel_zero_padded_to_a_window_is_still_a_linear_map():
    """A red team's 1x1 kernel inside a 3x3 of zeros with padding 1 (session 27: 0.0 against
    KernelBench's conv_pointwise_2D): the border taps read the padding or multiply by zero."""
    padded = nn.Conv2d(8, 12, 3, padding=1)
    with torch.no_grad():
        padded.weight.zero_()
        padded.weight[:, :, 1, 1] = POINTWISE.weight[:, :, 0, 0]
        padded.bias.copy_(POINTWISE.bias)
    assert ops(padded, shape=(4, 8, 6, 5)) == ops(POINTWISE, shape=(4, 8, 6, 5)) == ["mm", "add"]
    off_centre = nn.Conv2d(8, 12, 3, padding=1)
    with torch.no_grad():
        off_centre.weight[:, :, :, 2] = 0  # a shift: not the same map
    assert ops(off_centre, shape=(4, 8, 6, 5)) == ["convolution2d"]


ZERO_BORDERED = F.pad(POINTWISE.weight.detach(), (1, 1, 1, 1))  # a 1x1 kernel inside a 3x3 of zeros


def _viewed(x):
    return x.view(x.shape)


@pytest.mark.parametrize("written", [
    lambda x: F.conv2d(F.pad(x, (1, 1, 1, 1)), ZERO_BORDERED, POINTWISE.bias),  # the padding an explicit F.pad
    lambda x: F.conv_transpose2d(x, ZERO_BORDERED.transpose(0, 1), POINTWISE.bias, padding=1),
    # session 29's red team: through a copy, one pad on another, pads no tap of the kernel reads
    lambda x: F.conv2d(_viewed(F.pad(x, (1, 1, 1, 1))), ZERO_BORDERED, POINTWISE.bias),
    lambda x: F.conv2d(F.pad(F.pad(x, (1, 1, 0, 0)), (0, 0, 1, 1)), ZERO_BORDERED, POINTWISE.bias),
    lambda x: F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), ZERO_BORDERED, POINTWISE.bias),
    lambda x: F.conv2d(F.pad(x, (1, 1, 1, 1), value=1.0), ZERO_BORDERED, POINTWISE.bias),
])
def test_a_zero_border_is_trimmed_however_the_padding_is_written(written):
    """A red team's explicit F.pad before the convolution, and a transposed convolution (at
    stride 1 the convolution of its mirrored kernel), each 0.0 against conv_pointwise_2D
    (session 28)."""
    assert torch.allclose(written(torch.ones(1, 8, 6, 5)), POINTWISE(torch.ones(1, 8, 6, 5)), atol=1e-5)
    assert ops(written, shape=(4, 8, 6, 5)) == ["mm", "add"]


def test_a_crop_written_as_a_negative_pad_is_no_padding():
    """A red team zeroed a border with F.pad(x, (-2,) * 4) and padding 2: not the pointwise map alone."""
    cropped = ops(lambda x: F.conv2d(F.pad(x, (-2,) * 4), POINTWISE.weight, padding=2), shape=(4, 8, 12, 12))
    assert cropped == ["constant_pad_nd", "mm"]
    # a pad of ones that the kernel's taps read stays
    assert ops(lambda x: F.conv2d(F.pad(x, (1,) * 4, value=1.0), CONV.weight), shape=(4, 8, 6, 5))[0] == \
        "constant_pad_nd"


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_an_explicit_zero_pad_is_the_convolutions_own_padding(device):
    padded, bare = nn.Conv2d(8, 12, 3, padding=1), nn.Conv2d(8, 12, 3)
    assert ops(lambda x: bare(F.pad(x, (1, 1, 1, 1))), bare, device=device) == ops(padded, device=device) \
        == ["convolution2d"]
    assert ops(lambda x: bare(F.pad(x, (0, 2, 0, 2))), bare, device=device) == ["convolution2d"]  # uneven: still one
    # a pad something else reads too is no padding of the convolution's alone
    def shared(x):
        padded_x = F.pad(x, (1, 1, 1, 1))
        return bare(padded_x) + padded_x.mean()
    assert ops(shared, bare, device=device)[:2] == ["constant_pad_nd", "convolution2d"]
    # a transposed convolution that is no convolution of the same size stays transposed
    assert ops(nn.ConvTranspose2d(8, 12, 3, stride=2), device=device) == ["convolution_transpose2d"]


def test_values_whose_difference_float32_cannot_hold_are_compared():
    """A red team's `-(tanh(x) * 3e38)`: finite values 6e38 apart recursed without end."""
    assert ops(lambda x: -(torch.tanh(x) * 3e38), shape=(4, 8)) == ["tanh", "mul"]


BIAS = torch.randn(1, 8, 1, 1)
X_IMAGE = torch.randn(4, 8, 6, 5)


@pytest.mark.parametrize("original, written", [
    # an adversary's rewrites of KernelBench level 2 (session 29), each 0.74-0.83 against its original
    (lambda x: F.hardtanh(F.max_pool2d(x, 2)), lambda x: F.max_pool2d(F.hardtanh(x), 2)),
    (lambda x: F.avg_pool2d(torch.tanh(x) - 0.5, 2), lambda x: F.avg_pool2d(torch.tanh(x), 2) - 0.5),
    (lambda x: F.max_pool2d(torch.tanh(x) * 2.0 + BIAS, 2), lambda x: torch.addcmul(BIAS, F.max_pool2d(torch.tanh(x), 2),
                                                                                   torch.tensor(2.0))),
    (lambda x: torch.tanh(torch.amin(x, 1)), lambda x: -torch.amax(-torch.tanh(x), 1)),  # a minimum as -max(-x)
    (lambda x: torch.relu(x) + BIAS, lambda x: torch.maximum(x + BIAS, BIAS.expand(4, 8, 6, 5))),
    (lambda x: torch.relu(x) + BIAS, lambda x: torch.clamp(x + BIAS, min=BIAS.expand(4, 8, 6, 5))),
    # a pooling written out moves as the layer does (on the H200, pool_unfold copies of L2 46 and 82 did not)
    (lambda x: F.avg_pool2d(torch.tanh(x) - BIAS, 2), lambda x: F.unfold(torch.tanh(x) - BIAS, 2, stride=2)
     .reshape(4, 8, 4, 3, 2).mean(2)),
    (lambda x: F.max_pool2d(torch.tanh(x) * 2.0 + BIAS, 2), lambda x: F.unfold(torch.tanh(x) * 2.0 + BIAS, 2, stride=2)
     .reshape(4, 8, 4, 3, 2).amax(2)),
    # a group norm's own scale and shift move past a pooling as a written-out norm's do (on the
    # H100, new_at_once's copy of L2 85 read `group_norm max_pool2d mul add`, 0.833)
    (lambda x: F.max_pool2d(F.group_norm(x, 2, BIAS.flatten().abs() + 0.5, BIAS.flatten()), 2),
     lambda x: F.max_pool2d(F.group_norm(x, 2) * (BIAS.abs() + 0.5) + BIAS, 2)),
    # and an eval batch norm, a scale and a shift per channel, still moves as one
    (lambda x: F.avg_pool2d(BN(x), 2), lambda x: F.avg_pool2d(x, 2) * SCALE.view(1, -1, 1, 1) + SHIFT.view(1, -1, 1, 1)),
    # a relu and a function that keeps signs and 0 (KernelBench's L2 57 and 69), a relu and a tanh
    (lambda x: F.hardswish(torch.relu(x)), lambda x: torch.relu(F.hardswish(x))),
    (lambda x: torch.tanh(torch.relu(x * 3.0)), lambda x: torch.relu(torch.tanh(x * 3.0))),
    # the fourth adversary's L2 81 at its own sizes: the scale of a silu written out moves past a clamp
    (lambda x: torch.tanh(torch.clamp(F.silu(4.0 * x) / 2.0, max=1.0)),
     lambda x: torch.tanh(torch.minimum((y := 4.0 * x) / (2.0 + 2.0 * torch.exp(-y)), torch.ones_like(x)))),
    # session 36's red team: a shift between a mean of means; a global mean as an average pooling
    # over the whole image, or over windows that tile it, then a mean; a maximum as a sort's last
    (lambda x: torch.sigmoid(x.mean((1, 2, 3)) + 0.3), lambda x: torch.sigmoid((x.mean((2, 3)) + 0.3).mean(1))),
    (lambda x: torch.sigmoid(x.mean((1, 2, 3))), lambda x: torch.sigmoid(F.avg_pool2d(x, (6, 5)).mean((1, 2, 3)))),
    (lambda x: torch.tanh(x[..., :4].mean((2, 3))), lambda x: torch.tanh(F.avg_pool2d(x[..., :4], 2).mean((2, 3)))),
    (lambda x: torch.tanh(x[..., :4].amax((2, 3))), lambda x: torch.tanh(F.max_pool2d(x[..., :4], 2).amax((2, 3)))),
    # session 37's red team: the tiles' values reshaped before the mean
    (lambda x: torch.tanh(x[..., :4].mean((2, 3))), lambda x: torch.tanh(F.avg_pool2d(x[..., :4], 2).flatten(2).mean(2))),
    (lambda x: torch.tanh(x[..., :4].mean((1, 2, 3))), lambda x: torch.tanh(F.avg_pool2d(x[..., :4], 2).flatten(1).mean(1))),
    (lambda x: torch.tanh(x.amax(1)), lambda x: torch.tanh(x.sort(1).values[:, -1])),
    (lambda x: torch.tanh(x.amax(1)), lambda x: torch.tanh(-(-x).sort(1, descending=True).values[:, -1])),
])
def test_ops_that_commute_and_bounds_by_a_constant_read_alike_however_ordered(original, written):
    assert torch.allclose(original(X_IMAGE), written(X_IMAGE), atol=1e-6)
    score = sequence_similarity(encode(ops(original)), encode(ops(written)))
    assert score > 0.9, (ops(original), ops(written))


def test_the_positions_of_the_largest_of_tiles_are_no_positions_of_the_input():
    # session 38's red team: `.max(dim)` returns positions in the pooled grid
    assert ops(lambda x: F.max_pool2d(x[..., :4], 2).flatten(2).max(2).indices.float())[0] == "max_pool2d"


def test_a_pooling_stays_where_a_reduction_of_its_reshaped_value_misses_whole_tiles():
    tiles = lambda x: F.avg_pool2d(x[..., :4], 2)  # noqa: E731  (4, 8, 3, 2)
    assert ops(lambda x: torch.tanh(tiles(x).reshape(4, 8, 3, 2).mean(3)))[0] == "avg_pool2d"
    assert ops(lambda x: torch.tanh(tiles(x).flatten(2)[..., :3].mean(2)))[0] == "avg_pool2d"
    assert ops(lambda x: torch.tanh(tiles(x).flatten(0, 1).mean(1)))[0] == "avg_pool2d"


@pytest.mark.parametrize("original, written", [
    # an adversary's rewrite of KernelBench L2 28, `(x + y) * y` as `x * y + y * y` (session 29)
    (lambda x: (torch.tanh(x) + (s := torch.sigmoid(x))) * s, lambda x: torch.tanh(x) * (s := torch.sigmoid(x)) + s * s),
    (lambda x: (torch.tanh(x) - (s := torch.sigmoid(x))) * s, lambda x: torch.tanh(x) * (s := torch.sigmoid(x)) - s ** 2),
    (lambda x: (s := torch.sigmoid(x), (x.exp() + torch.tanh(x)) * s)[1],
     lambda x: (s := torch.sigmoid(x), x.exp() * s + s * torch.tanh(x))[1]),
])
def test_a_product_distributed_over_a_sum_reads_as_the_sum_times_the_shared_factor(original, written):
    assert torch.allclose(original(X_IMAGE), written(X_IMAGE), atol=1e-6)
    assert ops(original) == ops(written)


BIAS_C = torch.randn(1, 4, 1, 1)  # per channel of CONV's output


@pytest.mark.parametrize("written", [
    lambda y: y * (y + y + (BIAS_C + 1.0)),  # the fifth adversary's L2 20 (session 38)
    lambda y: 2.0 * y * y + (BIAS_C + 1.0) * y,
    lambda y: (2.0 * y + BIAS_C) * y + y,
    lambda y: y * (2.0 * y + 1.0) + BIAS_C * y,
])
def test_a_quadratic_of_one_value_reads_in_horners_form_however_distributed(written):
    # KernelBench L2 20: `((y + b) + y) * y + y` of a layer's y and a clone of it, b per channel
    original = lambda x: (lambda y: ((y + BIAS_C) + y.clone().detach()) * y + y)(CONV(x))  # noqa: E731
    with torch.no_grad():
        assert torch.allclose(original(X_IMAGE), written(CONV(X_IMAGE)), atol=1e-5)
    assert ops(lambda x: written(CONV(x)), CONV) == ops(original, CONV) == ["convolution2d", "mul", "add", "mul"]


def test_a_value_of_three_levels_in_a_channel_is_no_quadratic_of_it():
    # session 38's red team: each channel's mean broadcast over a batch of three; a cubic of it
    # fitted a quadratic per channel exactly
    channel_mean = lambda x: x.mean((2, 3), keepdim=True) + torch.zeros_like(x)  # noqa: E731
    cubic = ops(lambda x: (lambda s: s * s * s + s)(channel_mean(x)), shape=(3, 8, 6, 5))
    quadratic = ops(lambda x: (lambda s: (s * 2.0 + 1.0) * s + BIAS_C[:, :1])(channel_mean(x)), shape=(3, 8, 6, 5))
    assert cubic != quadratic


def test_polynomials_that_differ_read_apart():
    def read(polynomial):
        return ops(lambda x: polynomial(CONV(x)), CONV)[1:]
    assert read(lambda y: (y + BIAS_C) * y) == ["add", "mul"]  # y^2 + b y
    assert read(lambda y: y * y + BIAS_C) == ["mul", "add"]  # y^2 + b
    assert read(lambda y: (y * y + 1.0) * y) == ["mul", "add", "mul"]  # a cubic, as written
    assert read(lambda y: (y * y + 1.0) * y * 3.0) != read(lambda y: (y + 1.0) * y * 3.0)
    # a value of three levels: any function of it fits a quadratic, and none is read as one
    assert ops(lambda x: (lambda s: (s * s * s + s) * 2.0 + s * s)(torch.sign(x)))[1:] != ["mul", "add", "mul"]


def test_a_product_of_a_value_and_a_function_of_it_reads_alike_however_grouped():
    # an adversary's L2 26: y * hardswish(y) as y * y * hardsigmoid(y)
    gate = lambda x: torch.clamp(x + 3.0, 0.0, 6.0) / 6.0  # noqa: E731
    assert ops(lambda x: x * F.hardswish(x)) == ops(lambda x: x * x * gate(x)) == ops(lambda x: x * (x * gate(x))) \
        == ["hardswish", "mul"]
    # the sixth adversary's (session 41): the square a factor, the gate's scale outside the product
    assert ops(lambda x: x.square() * F.relu6(x + 3.0) / 6.0) == ["hardswish", "mul"]
    # of a value that is itself a scale by a weight (a red team's, against the rule's first
    # version, which took y = x * w for x)
    weight = torch.randn(8, 1, 1)
    of_scaled = lambda f: ops(lambda x: f(x * weight))  # noqa: E731
    assert of_scaled(lambda y: y * F.hardswish(y)) == of_scaled(lambda y: y * y * gate(y)) \
        == of_scaled(lambda y: y.square() * F.relu6(y + 3.0) / 6.0) == ["mul", "hardswish", "mul"]
    assert "hardswish" not in ops(lambda x: (x + 1.0).square() * F.relu6(x + 3.0) / 6.0)
    assert "hardswish" not in ops(lambda x: x.square() * F.relu6(x + 3.0) / 5.0)


def test_a_scaled_function_of_a_value_never_made_alone_reads_as_the_function_and_its_scale():
    # the third adversary's L2 59 (session 35): silu(t) * s as s / 2 * t * (1 + tanh(t / 2))
    written = lambda x: (t := torch.tanh(x), 1.5 * t * (1.0 + torch.tanh(0.5 * t)))[1]  # noqa: E731
    original = lambda x: F.silu(torch.tanh(x)) * 3.0  # noqa: E731
    assert torch.allclose(original(X_IMAGE), written(X_IMAGE), atol=1e-6)
    assert ops(written) == ops(original) == ["tanh", "silu", "mul"]
    # a product by a value not made of the same one is no such function
    assert "silu" not in ops(lambda x: (t := torch.tanh(x), 1.5 * t * (1.0 + torch.tanh(0.5 * x)))[1])


@pytest.mark.parametrize("original, written", [
    # the fourth adversary's L2 69 (session 36): relu(hardswish(y)) through y.clamp(0, 3)
    (lambda x: torch.relu(F.hardswish(x)),
     lambda x: (t := x.clamp(0.0, 3.0), t * (t + 3.0) / 6.0 + (x - t).clamp(min=0.0))[1]),
    (lambda x: torch.tanh(torch.tanh(x)),  # tanh twice, each through expm1
     lambda x: (s := lambda t: -torch.sign(t) * torch.expm1(-2.0 * t.abs()) / (2.0 + torch.expm1(-2.0 * t.abs())),
                s(s(x)))[1]),
    (lambda x: torch.tanh(F.softplus(x)), lambda x: (q := (1.0 + torch.exp(x)) ** 2, (q - 1.0) / (q + 1.0))[1]),
    # softsign(sigmoid(u)) is sigmoid(log_sigmoid(u)): one pair named for either (the red team's)
    (lambda x: F.softsign(torch.sigmoid(x)), lambda x: 1.0 / (2.0 + torch.exp(-x))),
    (lambda x: F.hardtanh(F.silu(x), -0.1, 0.5), lambda x: torch.minimum(x / (1.0 + torch.exp(-x)), torch.tensor(0.5))
     .clamp(min=-0.1)),
])
def test_two_functions_of_a_value_written_as_one_closed_form_read_as_the_two(original, written):
    assert torch.allclose(original(X_IMAGE), written(X_IMAGE), atol=1e-6)
    assert ops(written) == ops(original) and len(ops(original)) == 2


def test_three_functions_of_a_value_written_as_one_closed_form_read_as_the_three():
    # the red team's (session 36): sigmoid(tanh(softplus(y))), whose intermediates are no catalog function
    def closed(x, e=math.exp(-1.0)):
        q = (1.0 + torch.exp(x)) ** 2
        return 1.0 / (1.0 + e * torch.exp(2.0 / (q + 1.0)))
    original = lambda x: torch.sigmoid(torch.tanh(F.softplus(x)))  # noqa: E731
    assert torch.allclose(original(X_IMAGE), closed(X_IMAGE), atol=1e-6)
    assert ops(closed) == ops(original) == ["softplus", "tanh", "sigmoid"]
    # a closed form a little off is none, though within `close`'s tolerance (the red team's
    # log(3.005 + e^u), 1.7e-3 from three softplus of 4x)
    assert ops(lambda x: torch.log(3.0 + torch.exp(4.0 * x))) == ["mul", "softplus", "softplus", "softplus"]
    assert "softplus" not in ops(lambda x: torch.log(3.005 + torch.exp(4.0 * x)))
    # a constant a little off is another function: no three of the catalog
    assert torch.sigmoid(torch.tanh(F.softplus(X_IMAGE))).sub(closed(X_IMAGE, 0.35)).abs().max() > 1e-3
    assert "softplus" not in ops(lambda x: closed(x, 0.35))


def test_a_relu_moves_only_past_a_function_that_keeps_signs_and_zero():
    # sigmoid(0) is 1/2: sigmoid(relu(x)) is no relu(sigmoid(x)), which is sigmoid(x)
    assert ops(lambda x: torch.sigmoid(torch.relu(x))) == ["relu", "sigmoid"]
    assert ops(lambda x: torch.relu(torch.sigmoid(x) - 0.6)) == ["sigmoid", "add", "relu"]


def test_a_closed_form_that_is_no_two_functions_is_not_named_as_them():
    assert ops(lambda x: torch.exp(-x * x)) == ["mul", "mul", "exp"]  # a Gaussian bump: no g(h(x)) of the catalog


class _Slabs(nn.Module):  # a Linear's weight kept as four slabs of its rows: a parameter of three dimensions
    def __init__(self, linear, blocks: str):
        super().__init__()
        rows = linear.weight.detach().t().reshape(4, 4, linear.out_features)
        self.slabs = nn.Parameter((rows.transpose(0, 1) if blocks == "strided" else rows).clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())
        self.blocks = blocks

    def forward(self, x):  # each block of features (in order, or every fourth) by its own slab, summed
        if self.blocks == "broadcast":  # one block a row of its own, the product broadcast over the slabs
            return (x.reshape(x.shape[0], 4, 1, 4) @ self.slabs).sum(1).squeeze(1) + self.bias
        blocks = x.reshape(x.shape[0], 4, 4)
        blocks = blocks.permute(2, 0, 1) if self.blocks == "strided" else blocks.transpose(0, 1)
        return torch.bmm(blocks, self.slabs).sum(0) + self.bias


SLABBED = nn.Linear(16, 12)


@pytest.mark.parametrize("blocks", ["in order", "strided", "broadcast"])
def test_a_linear_as_partial_products_of_feature_blocks_summed_reads_as_one(blocks):
    # the fourth adversary's L2 81 (session 36): `bmm(chunks, slabs).sum(0)`, `mm sum add` against
    # `mm add`; the red teams' blocks `x[:, i::4]` and broadcast product (`mm sum add`, 0.857)
    slabs, x = _Slabs(SLABBED, blocks), torch.randn(4, 16)
    assert torch.allclose(slabs(x), SLABBED(x), atol=1e-5)
    assert ops(lambda x: torch.tanh(slabs(x)), slabs, shape=(4, 16)) == \
        ops(lambda x: torch.tanh(SLABBED(x)), SLABBED, shape=(4, 16)) == ["mm", "add", "tanh"]


def test_a_linear_split_over_its_inputs_and_accumulated_by_addmm_reads_as_one():
    # the seventh adversary's L2 39 (session 41): `acc = addmm(b, x[:, :8], w[:8])`, then
    # `addmm(acc, x[:, 8:], w[8:])`, read `mm add mm add`: the second adds a product to a value
    # that varies, and no bias was looked for there
    w, b = SLABBED.weight.T, SLABBED.bias
    split = lambda x: torch.addmm(torch.addmm(b, x[:, :8], w[:8]), x[:, 8:], w[8:])  # noqa: E731
    assert torch.allclose(split(torch.ones(4, 16)), SLABBED(torch.ones(4, 16)), atol=1e-5)
    assert ops(lambda x: torch.tanh(split(x)), SLABBED, shape=(4, 16)) == \
        ops(lambda x: torch.tanh(SLABBED(x)), SLABBED, shape=(4, 16)) == ["mm", "add", "tanh"]
    # a product added to a value that varies otherwise (a residual) is no bias
    assert ops(lambda x: torch.tanh(torch.addmm(torch.relu(x[:, :12]), x, w)), SLABBED, shape=(4, 16)) != \
        ["mm", "add", "tanh"]


def test_a_bilinear_form_against_a_constant_is_a_linear_and_of_two_values_is_not():
    # the seventh adversary's L2 95 (session 42): a Linear as `F.bilinear(x, ones, W[..., None], b)`
    # read `trilinear add` against `mm add`
    w, b = SLABBED.weight[..., None], SLABBED.bias
    against_ones = lambda x: F.bilinear(x, x.new_ones(x.shape[0], 1), w, b)  # noqa: E731
    assert torch.allclose(against_ones(torch.ones(4, 16)), SLABBED(torch.ones(4, 16)), atol=1e-5)
    assert ops(lambda x: torch.tanh(against_ones(x)), SLABBED, shape=(4, 16)) == \
        ops(lambda x: torch.tanh(SLABBED(x)), SLABBED, shape=(4, 16)) == ["mm", "add", "tanh"]
    # a form of two values that vary is quadratic in the input: no product by a weight
    square = torch.randn(3, 16, 16)
    assert ops(lambda x: torch.tanh(F.bilinear(x, x, square)), shape=(4, 16))[0] != "mm"
    # session 42's red team: a _trilinear that contracts nothing is an elementwise product
    scale = torch.randn(16)
    assert ops(lambda x: torch.tanh(torch._trilinear(x, scale.expand(4, 16), torch.ones_like(x), [], [], [], [])),
               shape=(4, 16))[0] != "mm"


def _unfold_then_bias(x):  # unfold and a product, the bias added to the positions flattened
    return torch.matmul(PLANE.weight.flatten(1), F.unfold(x, 3)) + PLANE.bias[:, None]


def test_a_bias_added_after_a_run_solved_as_a_convolution_is_the_convolutions_own():
    # the fourth adversary's L2 25 and 69 (session 36): `convolution2d add` against `convolution2d`
    x = torch.randn(*X_PLANE)
    assert torch.allclose(_unfold_then_bias(x), PLANE(x).flatten(2), atol=1e-5)
    original = ops(lambda x: torch.tanh(PLANE(x).flatten(2)), PLANE, shape=X_PLANE)
    assert ops(lambda x: torch.tanh(_unfold_then_bias(x)), PLANE, shape=X_PLANE) == original == \
        ["convolution2d", "tanh"]
    # a shift that differs by position is no bias: it stays an addition
    shifted = lambda x: _unfold_then_bias(x) + torch.linspace(0, 1, (x.shape[2] - 2) * (x.shape[3] - 2))  # noqa: E731
    assert ops(lambda x: torch.tanh(shifted(x)), PLANE, shape=X_PLANE) == ["convolution2d", "add", "tanh"]


def test_a_negation_passes_back_through_odd_functions_and_a_maximum_into_the_weights():
    # the fourth adversary's L2 25 (session 36): tanh(tanh(min(conv(x)))) as -tanh(tanh(max(conv'(x))))
    # of the weights negated
    negated = nn.Conv2d(8, 4, 3)
    with torch.no_grad():
        negated.weight.copy_(-CONV.weight), negated.bias.copy_(-CONV.bias)
    unpadded = nn.Conv2d(8, 4, 3)
    with torch.no_grad():
        unpadded.weight.copy_(CONV.weight), unpadded.bias.copy_(CONV.bias)
    original = ops(lambda x: torch.tanh(torch.tanh(unpadded(x).amin(1))), unpadded, shape=(4, 8, 9, 9))
    assert original == ["convolution2d", "min", "tanh", "tanh"]
    assert ops(lambda x: -torch.tanh(torch.tanh(negated(x).amax(1))), negated, shape=(4, 8, 9, 9)) == original
    # a sigmoid is no odd function: the sign stays where it is written
    assert ops(lambda x: -torch.sigmoid(negated(x).amax(1)), negated, shape=(4, 8, 9, 9)) == \
        ["convolution2d", "max", "sigmoid", "mul"]
    # nor does a negation of the input itself vanish: it is spelled where it reaches
    assert ops(lambda x: -torch.tanh(x.amax(1))) == ops(lambda x: torch.tanh((-x).amin(1))) == ["mul", "min", "tanh"]
    # `0.0 - t` is a negation too (it had read as t, `add`)
    assert ops(lambda x: 0.0 - torch.tanh(torch.tanh(negated(x).amax(1))), negated, shape=(4, 8, 9, 9)) == original
    # 1 - sigmoid(u) is sigmoid(-u) (the red team's, session 36): the sign the weights'
    assert ops(lambda x: 1.0 - torch.sigmoid(negated(x)), negated) == ops(unpadded, unpadded) + ["sigmoid"]
    assert ops(lambda x: 1.0 - torch.sigmoid(x)) == ["sigmoid", "mul", "add"]  # no layer to take the sign: as written
    assert ops(lambda x: 2.0 - torch.sigmoid(negated(x)), negated)[-1] == "add"  # a shift stays
    assert ops(lambda x: 1.0 - 2.0 * torch.sigmoid(negated(x)), negated)[:2] != ["convolution2d", "tanh"]
    # and where it vanishes it is read so even when the shift stays (`0.5 - sigmoid`: the red team's)
    assert ops(lambda x: 0.5 - torch.sigmoid(negated(x)), negated) == ops(lambda x: torch.sigmoid(unpadded(x)) - 0.5,
                                                                          unpadded)


@pytest.mark.parametrize("reflected, plain", [
    # the red team's false positives (session 37): a reflection that brings in a sign no reading
    # shows (-2 against 2; the tanh form's -1/2 against 1/2) made these read alike, at 1.0
    (lambda x: 1.0 - torch.sigmoid(2.0 * torch.relu(x)), lambda x: torch.sigmoid(2.0 * torch.relu(x))),
    (lambda x: 1.0 - 2.0 * torch.sigmoid(torch.relu(x)), lambda x: 2.0 * torch.sigmoid(torch.relu(x)) - 1.0),
    (lambda x: (y := CONV(x)) * (1.0 - torch.sigmoid(2.0 * torch.relu(y))),
     lambda x: (y := CONV(x)) * torch.sigmoid(2.0 * torch.relu(y))),
])
def test_a_reflection_brings_in_no_sign_a_reading_cannot_show(reflected, plain):
    assert not torch.allclose(reflected(X_IMAGE), plain(X_IMAGE), atol=1e-2)
    assert sequence_similarity(encode(ops(reflected, CONV)), encode(ops(plain, CONV))) < 0.9, \
        (ops(reflected, CONV), ops(plain, CONV))


def test_a_sign_is_a_layers_only_where_it_is_minus_one_and_the_weights_are_the_layers_alone():
    # the red team's false positives (session 36): -0.5 tanh(u) is no tanh(0.5 u); x x^T has no
    # weights to take a sign, and a weight tied to two products flips both
    assert ops(lambda x: -0.5 * torch.tanh(CONV(x))) != ops(lambda x: torch.tanh(0.5 * CONV(x)))
    flat = (4, 6)
    assert ops(lambda x: torch.relu(x @ x.T), shape=flat) != ops(lambda x: torch.relu(-(x @ x.T)), shape=flat)
    tied = nn.Linear(6, 5, bias=False)
    assert ops(lambda x: torch.tanh(x @ tied.weight.T @ tied.weight), tied, shape=flat) != \
        ops(lambda x: torch.tanh(-(x @ tied.weight.T @ tied.weight)), tied, shape=flat)
    assert ops(lambda x: 1.0 - F.gelu(x)) == ["gelu", "mul", "add"]  # c - u keeps its sign


STRIDED_UP = nn.ConvTranspose2d(4, 3, 4, stride=2)
X_STRIDED = (4, 4, 7, 6)


def _phases_shuffled(x):  # each of the stride's 2 x 2 output phases a 2 x 2 convolution, laid out by a pixel shuffle
    c, o = STRIDED_UP.weight.shape[:2]
    phases = STRIDED_UP.weight.view(c, o, 2, 2, 2, 2).flip(2, 4).permute(1, 3, 5, 0, 2, 4).reshape(o * 4, c, 2, 2)
    return F.pixel_shuffle(F.conv2d(F.pad(x, (1, 1, 1, 1)), phases, STRIDED_UP.bias.repeat_interleave(4)), 2)


PADDED_UP = nn.ConvTranspose2d(4, 3, 4, stride=2, padding=1)


def _columns_folded(x, layer=STRIDED_UP):  # each position's patch of outputs painted by F.fold, overlaps summed
    n, c, h, w = x.shape
    cols = torch.einsum("nchw,cm->nmhw", x, layer.weight.reshape(c, -1)).reshape(n, -1, h * w)
    size = [layer(x).shape[2], layer(x).shape[3]]
    return F.fold(cols, size, 4, stride=2, padding=layer.padding) + layer.bias.view(1, -1, 1, 1)


@pytest.mark.parametrize("layer, written", [
    (STRIDED_UP, _phases_shuffled), (STRIDED_UP, _columns_folded),
    (PADDED_UP, lambda x: _columns_folded(x, PADDED_UP)),  # the red team's: past the settings tried, behind (2, 3) kernels
])
def test_a_transposed_convolution_written_out_reads_as_one(layer, written):
    # the fourth adversary's L2 93 and 5 (session 36): `convolution2d pixel_shuffle`, `mm col2im`
    x = torch.randn(*X_STRIDED)
    assert torch.allclose(written(x), layer(x), atol=1e-5)
    assert ops(lambda x: torch.tanh(written(x)), layer, shape=X_STRIDED) == \
        ops(lambda x: torch.tanh(layer(x)), layer, shape=X_STRIDED) == ["convolution_transpose2d", "tanh"]


def _phases_woven(x, layer):  # each of the stride's 2 x 2 x 2 output phases its own small convolution, woven by a reshape
    n = x.shape[2]
    padded = F.pad(x, (0, 1, 0, 1, 0, 1))
    # along one dimension: an even output reads tap 1 at x[m]; an odd one taps 2 and 0 at x[m], x[m + 1]
    taps = {0: ([1], slice(0, n)), 1: ([2, 0], slice(0, n + 1))}
    weight = layer.weight.transpose(0, 1)
    phase = lambda a, b, c: F.conv3d(padded[:, :, taps[a][1], taps[b][1], taps[c][1]],  # noqa: E731
                                     weight[:, :, taps[a][0]][:, :, :, taps[b][0]][:, :, :, :, taps[c][0]])
    woven = torch.stack([torch.stack([torch.stack([phase(a, b, c) for c in (0, 1)], -1) for b in (0, 1)], -3)
                         for a in (0, 1)], -5)  # (batch, out, depth, a, height, b, width, c)
    return woven.reshape(*x.shape[:1], -1, 2 * n, 2 * n, 2 * n) + layer.bias.view(1, -1, 1, 1, 1)


# the sixth adversary's L2 26 (session 41): its ConvTranspose3d as 8 phase convolutions; the
# odd phase reads 8 of 27 taps, and rows drawn from every phase at once were too few for them
# at 16 channels; SPARE_ROWS for each phase were too many for a red team's 4 x 4 x 4 image
@pytest.mark.parametrize("channels, size", [(16, 6), (4, 4)])
def test_a_transposed_convolution_as_its_phases_reads_as_one_whatever_its_busiest_phase_reads(channels, size):
    layer, shape = nn.ConvTranspose3d(channels, 4, 3, stride=2, padding=1, output_padding=1), (2, channels, *[size] * 3)
    x = torch.randn(*shape)
    assert torch.allclose(_phases_woven(x, layer), layer(x), atol=1e-5)
    assert ops(lambda x: torch.tanh(_phases_woven(x, layer)), layer, shape=shape) == \
        ops(lambda x: torch.tanh(layer(x)), layer, shape=shape) == ["convolution_transpose3d", "tanh"]


def test_phases_with_a_bias_of_their_own_are_no_transposed_convolution():
    # a bias per phase is none that one output channel's convolution adds everywhere
    phased = lambda x: _phases_shuffled(x) + torch.tensor([0.0, 1.0]).repeat(x.shape[3] + 1)  # noqa: E731
    assert ops(lambda x: torch.tanh(phased(x)), STRIDED_UP, shape=X_STRIDED) != ["convolution_transpose2d", "tanh"]


SPLIT = nn.Conv2d(8, 4, 3, padding=1)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_convolution_split_over_its_input_channels_and_summed_reads_as_one(transposed):
    # an adversary's L2 26: its ConvTranspose3d as two over the halves of its input's channels
    conv, weight = (F.conv_transpose2d, torch.randn(8, 4, 3, 3)) if transposed else (F.conv2d, SPLIT.weight)
    halves = weight[:4], weight[4:]
    if not transposed:
        halves = weight[:, :4], weight[:, 4:]
    whole = lambda x: torch.tanh(conv(x, weight, SPLIT.bias, padding=1))  # noqa: E731
    split = lambda x: torch.tanh(conv(x[:, :4], halves[0], SPLIT.bias, padding=1)  # noqa: E731
                                 + conv(x[:, 4:], halves[1], None, padding=1))
    assert torch.allclose(whole(X_IMAGE), split(X_IMAGE), atol=1e-5)
    assert ops(split) == ops(whole)


FULL = nn.ConvTranspose2d(8, 6, 3)


def test_a_convolution_averaged_over_every_position_reads_as_the_matrix_product_it_is():
    """An adversary's L2 42 (session 33): a ConvTranspose2d and global average pooling as the
    input's sums times the kernels' sums, `sum mm mul` against `convolution2d sum mul`: where
    every tap meets every position, the two are one function."""
    def closed(x):
        area = (x.shape[2] + 2) * (x.shape[3] + 2)
        return torch.tanh(x.sum((2, 3)) @ FULL.weight.sum((2, 3)) / area + FULL.bias)
    original = lambda x: torch.tanh(FULL(x).mean((2, 3)))  # noqa: E731
    padded = lambda x: torch.tanh(F.conv2d(x, FULL.weight.transpose(0, 1), FULL.bias, padding=2).mean((2, 3)))  # noqa: E731
    assert torch.allclose(original(X_IMAGE), closed(X_IMAGE), atol=1e-5)
    assert ops(original) == ops(closed) == ops(padded) == ["sum", "mm", "mul", "add", "tanh"]
    assert ops(lambda x: torch.tanh(FULL(x).sum((2, 3)))) == ["sum", "mm", "add", "tanh"]


@pytest.mark.parametrize("mean", [
    # a red team's respellings of the global mean (session 34), each read as L2 42's own had been
    lambda t: t.flatten(2).mean(-1), lambda t: t.mean(3).mean(2), lambda t: torch.einsum("nchw->nc", t) / 56.0,
    lambda t: t.reshape(t.shape[0], t.shape[1], -1).mean(-1), lambda t: (t * 2.0).mean((2, 3)),
])
def test_a_full_convolution_averaged_however_written_reads_as_the_matrix_product(mean):
    reading = ops(lambda x: torch.tanh(mean(FULL(x))))
    assert reading[:2] == ["sum", "mm"] and "convolution2d" not in reading, reading


@pytest.mark.parametrize("conv", [nn.Conv2d(8, 6, 3, padding=1), nn.ConvTranspose2d(8, 6, 3, padding=1),
                                  nn.Conv2d(8, 6, 3, padding=2, stride=2),
                                  nn.ConvTranspose2d(8, 8, 3, groups=8)])  # depthwise: a scale per channel, summed
def test_a_convolution_whose_taps_miss_some_positions_summed_stays_a_convolution(conv):
    # the edges' taps fall outside: the sum reads more than the input's sums
    assert "mm" not in ops(lambda x: torch.tanh(conv(x).mean((2, 3))), conv)


def test_a_full_convolution_by_a_kernel_made_from_the_input_summed_stays_a_convolution():
    # a red team's (session 34): a kernel or bias computed from the batch is no matrix of constants
    made = lambda x: F.conv_transpose2d(x, FULL.weight * torch.sigmoid(x.mean()), FULL.bias)  # noqa: E731
    assert "convolution2d" in ops(lambda x: torch.tanh(made(x).mean((2, 3))))
    biased = lambda x: F.conv_transpose2d(x, FULL.weight, FULL.bias * x.mean())  # noqa: E731
    assert "convolution2d" in ops(lambda x: torch.tanh(biased(x).mean((2, 3))))


CHUNKED = torch.randn(4, 4, 3, 3), torch.randn(4, 4, 3, 3)  # two weights of their own, not slices of one


@pytest.mark.parametrize("halves", [lambda x: x.chunk(2, 1), lambda x: x.split(4, 1), lambda x: x.chunk(2, 1)[::-1]])
def test_a_convolution_split_by_chunk_or_split_and_summed_reads_as_one(halves):
    # a red team's evasion (session 33): the halves from one op of two outputs
    def split(x):
        a, b = halves(x)
        return torch.tanh(F.conv2d(a, CHUNKED[0], SPLIT.bias, padding=1) + F.conv2d(b, CHUNKED[1], padding=1))
    # reversed, it is one convolution of other weights (each half's channels meet the other's)
    assert ops(split) == ops(lambda x: torch.tanh(SPLIT(x))) == ["convolution2d", "tanh"]


GROUPED = nn.Conv2d(8, 12, 3, padding=1, groups=2)


def test_a_grouped_convolutions_output_halves_added_read_as_one_convolution():
    # a red team's evasion (session 33): each group's outputs, added, read every input channel
    joined = torch.cat(GROUPED.weight.chunk(2, 0), 1)
    halves = lambda x: (lambda y: torch.relu(y[:, :6] + y[:, 6:]))(GROUPED(x))  # noqa: E731
    whole = lambda x: torch.relu(F.conv2d(x, joined, GROUPED.bias[:6] + GROUPED.bias[6:], padding=1))  # noqa: E731
    assert torch.allclose(halves(X_IMAGE), whole(X_IMAGE), atol=1e-5)
    assert ops(halves, GROUPED) == ops(whole) == ["convolution2d", "relu"]
    # halves of other channels (the first group's outputs against themselves) are no such sum
    assert ops(lambda x: (lambda y: torch.relu(y[:, :3] + y[:, 3:6]))(GROUPED(x)), GROUPED) != ["convolution2d", "relu"]


# A convolution written as a run of linear ops of its input, solved for its weights from
# the values (filters/computation/linear.py): the third adversary's spellings (session 35).
PLANE = nn.Conv2d(4, 6, 3)
VOLUME = nn.Conv3d(3, 5, 3)
X_PLANE, X_VOLUME = (4, 4, 12, 11), (2, 3, 7, 9, 8)


def _shifted_einsums(x):  # nine shifted products by each tap's (out, in) matrix, and the bias
    rows, columns = x.shape[2] - 2, x.shape[3] - 2
    out = PLANE.bias.view(1, -1, 1, 1)
    for i, j in itertools.product(range(3), range(3)):
        out = out + torch.einsum("oc,nchw->nohw", PLANE.weight[:, :, i, j], x[:, :, i:i + rows, j:j + columns])
    return out


def _unfold_product(x):  # im2col, a product by the flattened bank, the positions flattened
    cols = torch.matmul(PLANE.weight.flatten(1), F.unfold(x, 3)) + PLANE.bias[:, None]
    return cols.view(x.shape[0], 6, x.shape[2] - 2, x.shape[3] - 2)


def _row_convolutions(x):  # one (1, 3) convolution per kernel row, over rows shifted
    rows = x.shape[2] - 2
    return sum(F.conv2d(x[:, :, r:r + rows], PLANE.weight[:, :, r:r + 1], PLANE.bias if r == 0 else None)
               for r in range(3))


ASYMMETRIC = nn.Conv2d(4, 6, (3, 5), padding=(1, 2))


def _asymmetric_unfold(x):  # a 3 x 5 kernel's windows, padded, as one product
    cols = ASYMMETRIC.weight.flatten(1) @ F.unfold(x, (3, 5), padding=(1, 2)) + ASYMMETRIC.bias[:, None]
    return cols.view(x.shape[0], 6, *x.shape[2:])


def _per_depth_planes(x):  # a Conv3d as a Conv2d per depth tap over frames, summed
    n, c, d, h, w = x.shape
    depth = d - 2
    total = sum(F.conv2d(x[:, :, t:t + depth].transpose(1, 2).reshape(n * depth, c, h, w), VOLUME.weight[:, :, t])
                for t in range(3)) + VOLUME.bias.view(1, -1, 1, 1)
    return total.view(n, depth, 5, h - 2, w - 2).transpose(1, 2)


def _depth_taps_stacked(x):  # the depth taps stacked into channels, then a (1, 3, 3) convolution
    depth = x.shape[2] - 2
    stacked = torch.cat([x[:, :, t:t + depth] for t in range(3)], 1)
    weight = VOLUME.weight.permute(0, 2, 1, 3, 4).reshape(5, 9, 1, 3, 3)
    return F.conv3d(stacked, weight, VOLUME.bias)


@pytest.mark.parametrize("layer, written, shape", [
    (PLANE, _shifted_einsums, X_PLANE), (PLANE, _unfold_product, X_PLANE), (PLANE, _row_convolutions, X_PLANE),
    (ASYMMETRIC, _asymmetric_unfold, X_PLANE),
    (VOLUME, _per_depth_planes, X_VOLUME), (VOLUME, _depth_taps_stacked, X_VOLUME)])
def test_a_convolution_written_as_a_run_of_linear_ops_reads_as_the_convolution(layer, written, shape):
    x = torch.randn(*shape)
    assert torch.allclose(layer(x), written(x), atol=1e-5)
    assert ops(lambda x: torch.tanh(written(x)), layer, shape=shape) == \
        ops(lambda x: torch.tanh(layer(x)), layer, shape=shape) == [f"convolution{x.dim() - 2}d", "tanh"]


def _stacked_einsums(x):  # the nine partial products stacked and summed, not added one by one
    rows, columns = x.shape[2] - 2, x.shape[3] - 2
    parts = [torch.einsum("oc,nchw->nohw", PLANE.weight[:, :, i, j], x[:, :, i:i + rows, j:j + columns])
             for i, j in itertools.product(range(3), range(3))]
    return torch.stack(parts).sum(0) + PLANE.bias.view(1, -1, 1, 1)


def _with_a_side_use(x):  # a partial sum read elsewhere too, by a term too small to count
    out = _shifted_einsums(x)
    partial = torch.einsum("oc,nchw->nohw", PLANE.weight[:, :, 0, 0], x[:, :, :-2, :-2])
    return out + torch.tanh(partial).mean() * 1e-20


@pytest.mark.parametrize("written", [_stacked_einsums, _with_a_side_use])
def test_a_convolutions_partial_products_joined_otherwise_read_as_the_convolution(written):
    # the red team's evasions (session 35)
    assert ops(lambda x: torch.tanh(written(x)), PLANE, shape=X_PLANE) == ["convolution2d", "tanh"]


def test_a_value_that_is_a_convolution_but_at_positions_the_solve_never_drew_is_none():
    # a red team's (session 35): solved on some rows and checked on others, the map differed at
    # the 6% of positions neither drew; the whole value is compared with the convolution solved
    x, weight = torch.randn(4, 2, 48, 48), torch.randn(3, 2, 3, 3)
    value = F.conv2d(x, weight)
    rows, unknowns = value.shape[0] * value.shape[2] * value.shape[3], 2 * 9 + 1
    drawn = torch.randperm(rows, generator=torch.Generator().manual_seed(rows))[:2 * unknowns + SPARE_ROWS + CHECKED_ROWS]
    undrawn = sorted(set(range(rows)) - set(drawn.tolist()))[0]  # rows are (batch, position), row-major
    assert solve_convolution(x, value, lambda: None) is not None
    batch, position = divmod(undrawn, 46 * 46)
    value[batch, 0, position // 46, position % 46] += 100.0
    assert solve_convolution(x, value, lambda: None) is None


def test_honest_layers_padded_before_their_convolution_are_read_without_a_solve_each():
    # the red team's (session 35): nine Conv2d of an even kernel, padding="same" (a
    # constant_pad_nd before each), spent the reading's solves and were untraced
    layers = nn.Sequential(*[m for _ in range(9) for m in (nn.Conv2d(8, 8, 4, padding="same"), nn.ReLU())])
    assert ops(layers, layers, shape=(4, 8, 16, 16)) == ["convolution2d", "relu"] * 9
    dense = nn.ModuleList([nn.Linear(64, 64) for _ in range(10)])  # fc1(x) + fc2(x) of a (4, 8, 64) value, five times
    def blocks(x):
        for first, second in zip(dense[::2], dense[1::2]):
            x = F.gelu(first(x) + second(x))
        return x
    assert ops(blocks, dense, shape=(4, 8, 64)) == ["mm", "add", "|mm", "add", "add", "gelu"] * 5  # as before


def _locally_connected(x):  # a kernel of its own at each position (made here: test_gpu_memory counts
    # the process's large tensors, and one at module level is alive through every test)
    local = torch.randn(6, 4, 9, 10, 9, generator=torch.Generator().manual_seed(0))
    return torch.einsum("nkhw,okhw->nohw", F.unfold(x, 3).view(4, 36, 10, 9), local.flatten(1, 2))


@pytest.mark.parametrize("body", [
    lambda x: torch.tanh(PLANE(x) + x[:, :1, 1:-1, 1:-1]),  # a residual beside the layer: no second convolution
    lambda x: torch.tanh(PLANE(x) + PLANE(x).flip(-1)),  # one layer's products twice: not two of one input
    lambda x: torch.tanh(_locally_connected(x)),
    lambda x: torch.tanh(PLANE(x) + F.conv2d(torch.relu(x), PLANE.weight)),  # of two values, not one
])
def test_a_run_of_linear_ops_that_no_one_convolution_is_keeps_its_ops(body):
    assert ops(body, PLANE, shape=X_PLANE) != ["convolution2d", "tanh"]


NORMED = nn.GroupNorm(4, 8, affine=False)


def _moments_group_norm_mean(y):  # each channel's mean of the normalised value, from moments alone
    n, c = y.shape[:2]
    channel = y.flatten(2).mean(-1).view(n, 4, 2)
    grouped = y.reshape(n, 4, -1)
    spread = (grouped * grouped).mean(-1, keepdim=True) - grouped.mean(-1, keepdim=True) ** 2
    return ((channel - grouped.mean(-1, keepdim=True)) * torch.rsqrt(spread + 1e-5)).view(n, c)


def test_a_group_norms_mean_over_positions_from_moments_reads_as_the_norm_and_the_mean():
    # the third adversary's L2 27 (session 35): GroupNorm then a mean, fused in closed form
    original = lambda x: torch.sigmoid(NORMED(torch.tanh(x)).mean((2, 3)))  # noqa: E731
    fused = lambda x: torch.sigmoid(_moments_group_norm_mean(torch.tanh(x)))  # noqa: E731
    assert torch.allclose(original(X_IMAGE), fused(X_IMAGE), atol=1e-5)
    assert ops(fused) == ops(original) == ["tanh", "group_norm", "sum", "mul", "sigmoid"]
    # as (batch, channels, 1, 1), or its offset and the group's mean each times the scale
    assert ops(lambda x: torch.sigmoid(_moments_group_norm_mean(torch.tanh(x))[:, :, None, None])) == ops(original)
    # a scale of centred means is no norm, however small their spread against an eps (a red team's)
    means = lambda x: (torch.tanh(x) * 1e-3).mean((2, 3))  # noqa: E731
    assert "layer_norm" not in ops(lambda x: (m := means(x), torch.sigmoid((m - m.mean(1, keepdim=True)) * 20.0))[1])
    # centred by the group's mean but not scaled by its spread is no norm
    centred = lambda y: (y.flatten(2).mean(-1).view(4, 4, 2) - y.reshape(4, 4, -1).mean(-1, keepdim=True)).view(4, 8)
    assert "group_norm" not in ops(lambda x: torch.sigmoid(centred(torch.tanh(x)) * 3.0))


def test_a_mean_of_means_reads_as_one_mean_over_both():
    # the third adversary's L2 23 (session 36): GroupNorm's channel means from moments, then
    # their mean over channels, against one mean over channels and positions
    original = lambda x: torch.sigmoid(NORMED(torch.tanh(x)).mean((1, 2, 3)))  # noqa: E731
    fused = lambda x: torch.sigmoid(_moments_group_norm_mean(torch.tanh(x)).mean(-1))  # noqa: E731
    assert torch.allclose(original(X_IMAGE), fused(X_IMAGE), atol=1e-5)
    # each group's normalised values average to zero, so the output is a constant (as L2 23's
    # is), read through what made it
    assert ops(fused) == ops(original) == ["tanh", "group_norm", "sum", "mul"]
    # sums of sums and scales between them, however grouped
    assert ops(lambda x: (x.sum(1) * 3.0).sum((1, 2))) == ops(lambda x: x.mean((2, 3)).mean(1)) == ["sum", "mul"]
    # a maximum between is no sum; a scalar shift passes one (sum(u + c) is sum(u) + n c)
    assert ops(lambda x: x.mean((2, 3)).amax(1)) == ["sum", "max", "mul"]  # the scale after: canonical_order
    assert ops(lambda x: (x.sum((2, 3)) + 1.0).sum(1)) == ["sum", "add"]


HALVES_K = torch.randn(3, 7), torch.randn(2, 7)  # two weights of their own
BIAS_7, X_ROWS = torch.randn(7), torch.randn(16, 5)


def test_a_product_split_over_its_inner_dimension_by_two_weights_reads_as_one():
    # an adversary's L2 63 (session 34): two parameters, one per half of K, and relu / d as (v + |v|) / (2 d)
    def split(x):
        v = x[:, :3] @ HALVES_K[0]
        v = v + x[:, 3:] @ HALVES_K[1] + BIAS_7
        return (v + v.abs()) * 0.25
    whole = lambda x: torch.relu(x @ torch.cat(HALVES_K) + BIAS_7) * 0.5  # noqa: E731
    assert torch.allclose(split(X_ROWS), whole(X_ROWS), atol=1e-5)
    assert ops(split, shape=X_ROWS.shape) == ops(whole, shape=X_ROWS.shape) == ["mm", "add", "relu", "mul"]
    # of one half and another value: two products
    assert ops(lambda x: x[:, :3] @ HALVES_K[0] + torch.tanh(x[:, 3:]) @ HALVES_K[1], shape=X_ROWS.shape).count("mm") == 2


def test_two_convolutions_of_other_values_or_settings_stay_two():
    assert unmarked(ops(lambda x: F.conv2d(x[:, :4], SPLIT.weight[:, :4], padding=1) + F.conv2d(
        x[:, :4] * 2, SPLIT.weight[:, 4:], padding=1))).count("convolution2d") == 2  # not the halves of one value
    assert unmarked(ops(lambda x: F.conv2d(x[:, :4], SPLIT.weight[:, :4], padding=1) + F.conv2d(
        x[:, 4:], SPLIT.weight[:, 4:], padding=2, dilation=2))).count("convolution2d") == 2  # two settings


def test_two_convolutions_over_channel_halves_read_as_what_their_joined_weights_are():
    """A red team's pairs (session 33): two depthwise halves whose sum reads two channels per
    output (c and c + 4), and kernels (2, 1) and (1, 2) at stride 2, read as one depthwise
    convolution and one (2, 1) convolution."""
    diagonal = torch.randn(4, 4, 3, 3) * torch.eye(4)[:, :, None, None]
    halves = ops(lambda x: torch.relu(F.conv2d(x[:, :4], diagonal, padding=1) + F.conv2d(x[:, 4:], diagonal, padding=1)))
    assert halves != ops(lambda x: torch.relu(F.conv2d(x, torch.randn(8, 1, 3, 3), padding=1, groups=8)))
    columns, rows = torch.randn(6, 4, 2, 1), torch.randn(6, 4, 1, 2)
    shapes = ops(lambda x: torch.relu(F.conv2d(x[:, :4], columns, stride=2) + F.conv2d(x[:, 4:], rows, stride=2)),
                 shape=(4, 8, 6, 6))
    assert shapes.count("relu") == 1 and len([n for n in unmarked(shapes) if n.startswith("convolution")]) == 2, shapes


def test_a_convolution_of_some_channels_beside_another_of_the_rest_reads():
    # 6 of 8 channels and the other 2: no grouped convolution of the whole (raised at 3c86517)
    reading = ops(lambda x: F.conv2d(x[:, :6], torch.randn(6, 6, 3, 3), padding=1) +
                  F.conv2d(x[:, 6:], torch.randn(6, 2, 3, 3), padding=1))
    assert reading == ["convolution2d"], reading


@pytest.mark.parametrize("written", [
    lambda t: torch.einsum("bchw,c->bhw", t, torch.ones(8)),  # an adversary's sum over L2 78's channels
    lambda t: t.permute(0, 2, 3, 1) @ torch.ones(8),
    lambda t: F.conv2d(t, torch.ones(1, 8, 1, 1))[:, 0],
])
def test_a_product_by_a_vector_of_ones_reads_as_the_sum_it_is(written):
    assert ops(lambda x: written(torch.tanh(x))) == ops(lambda x: torch.tanh(x).sum(1)) == ["tanh", "sum"]
    assert ops(lambda x: written(torch.tanh(x)) / 8) == ops(lambda x: torch.tanh(x).mean(1))


def test_a_product_by_a_matrix_of_equal_columns_of_ones_reads_as_the_sum_repeated():
    # a red team's evasion (session 33): the sum, once per column
    assert ops(lambda x: torch.tanh(x).transpose(1, 3) @ torch.ones(8, 2)) == ["tanh", "sum"]
    assert ops(lambda x: torch.tanh(x).transpose(1, 3) @ torch.ones(8, 2).cumsum(1)) == ["tanh", "mm"]  # 1s, 2s


def test_a_product_by_a_vector_that_is_not_uniform_is_a_product():
    assert ops(lambda x: torch.einsum("bchw,c->bhw", torch.tanh(x), torch.arange(8.0))) == ["tanh", "mm"]


@pytest.mark.parametrize("original, written", [
    # adversaries' rewrites: KernelBench L2 70's `s * sigmoid(y)` as `s / 2 * (1 + tanh(y / 2))`,
    # L2 82's `2 tanh(y) + b` as `4 sigmoid(2y) + (b - 2)` (session 33)
    (lambda x: torch.sigmoid(x) * 1.5 + x, lambda x: 0.75 * (1 + torch.tanh(x / 2)) + x),
    (lambda x: torch.tanh(x) * 2 + BIAS, lambda x: 4 * torch.sigmoid(2 * x) + (BIAS - 2)),
    (lambda x: torch.sigmoid(x), lambda x: 0.5 + 0.5 * torch.tanh(0.5 * x)),
    (lambda x: torch.tanh(x - 1.0) * 3, lambda x: 6 * torch.sigmoid(2 * x - 2) - 3),
])
def test_a_sigmoid_or_a_tanh_in_arithmetic_reads_as_the_one_with_fewer_maps(original, written):
    assert torch.allclose(original(X_IMAGE), written(X_IMAGE), atol=1e-5)
    assert ops(original) == ops(written)


@pytest.mark.parametrize("body, reading", [
    (lambda x: torch.tanh(x), ["tanh"]),
    (lambda x: torch.sigmoid(x) * 3, ["sigmoid", "mul"]),
    (lambda x: 0.5 + 0.5 * torch.tanh(x), ["mul", "sigmoid"]),  # sigmoid(2x): one map against two
    (lambda x: torch.tanh(x) * x, ["tanh", "mul"]),  # a product of two values is no map
    # read again (its two branches in the order of what they compute, the exp's first)
    (lambda x: (t := torch.tanh(x)) * 0.5 + 0.5 + t.exp(), ["tanh", "exp", "|mul", "add", "add"]),
])
def test_a_sigmoid_or_a_tanh_keeps_what_is_no_map_of_it(body, reading):
    assert ops(body) == reading


def test_a_sum_of_products_that_share_no_factor_or_whose_product_is_read_again_stays():
    assert ops(lambda x: x.exp() * torch.tanh(x) + torch.sigmoid(x) * torch.cos(x)) == \
        ["cos", "|sigmoid", "mul", "|exp", "|tanh", "mul", "add"]
    assert ops(lambda x: (p := torch.tanh(x) * (s := torch.sigmoid(x))) + s * s + p.exp()).count("mul") == 2


def test_two_shifts_on_two_branches_are_not_one():
    # (x + 1)(x + 2) is x^2 + 3x + 2: Horner's `(x + 3) x + 2`, not the one shift of `(x + 3) x`
    assert ops(lambda x: (x + 1) * (x + 2)) == ["add", "mul", "add"] != ops(lambda x: (x + 3) * x)


@pytest.mark.parametrize("first, second", [
    (lambda x: F.avg_pool2d(x * x, 2), lambda x: F.avg_pool2d(x, 2) * F.avg_pool2d(x, 2)),  # a square is no scale
    (lambda x: F.max_pool2d(x * -2.0, 2), lambda x: F.max_pool2d(x, 2) * -2.0),  # a negative scale: a minimum
    (lambda x: torch.relu(x + 1.0), lambda x: torch.relu(x) + 1.0),
    (lambda x: torch.amax(x + BIAS, 1), lambda x: torch.amax(x, 1) + 1.0),  # a bias per channel, maximised over them
    # session 29's red team: a minimum is no maximum, a clamp's bounds per channel are no scalar's
    (lambda x: torch.maximum(x, BIAS.expand(4, 8, 6, 5)), lambda x: torch.minimum(x, BIAS.expand(4, 8, 6, 5))),
    (lambda x: torch.clamp(x, 0, 0.5) + BIAS, lambda x: torch.clamp(x + BIAS, 0, 0.5)),
    # neighbours in the spelling that are not one chain
    (lambda x: torch.tanh(x) * x.amax(1, keepdim=True), lambda x: torch.tanh(x.amax(1, keepdim=True)) * x),
    (lambda x: (x + 1) * (2 * torch.tanh(x)), lambda x: (2 * x + 1) * torch.tanh(x)),
    # not monotone for every parameter
    (lambda x: F.leaky_relu(F.max_pool2d(x, 2), -0.5), lambda x: F.max_pool2d(F.leaky_relu(x, -0.5), 2)),
    (lambda x: F.elu(F.max_pool2d(x, 2), -1.0), lambda x: F.max_pool2d(F.elu(x, -1.0), 2)),
    # a mean with padding or a divisor of its own
    (lambda x: F.avg_pool2d(x + 1, 2, divisor_override=1), lambda x: F.avg_pool2d(x, 2, divisor_override=1) + 1),
    (lambda x: F.avg_pool2d(x + 1, 3, 1, 1), lambda x: F.avg_pool2d(x, 3, 1, 1) + 1),
    # a per-channel constant pooled across channels, or along an unbatched image's rows
    (lambda x: F.max_pool2d((x + BIAS).permute(0, 2, 1, 3), 2), lambda x: F.max_pool2d(x.permute(0, 2, 1, 3), 2) + 1),
    (lambda x: F.max_pool2d(x[0] + torch.arange(8.0)[:, None, None], 2), lambda x: F.max_pool2d(x[0], 2) + 1),
    # a relu before a maximum, which equals it where a fibre has a positive element
    (lambda x: torch.relu(x).amax(1), lambda x: x.amax(1)),
    # a 1-D pooling (recorded through a view: the red team's KeyError) keeps its windows
    (lambda x: F.max_pool1d(x.flatten(2), 3).amax(1), lambda x: x.flatten(2).amax(1)),
    # windows that overlap, or leave positions out, before a mean; a sort's second largest
    (lambda x: F.avg_pool2d(x, 3, 1).mean((2, 3)), lambda x: x.mean((2, 3))),
    (lambda x: F.avg_pool2d(x, 2).mean((2, 3)), lambda x: x.mean((2, 3))),
    (lambda x: torch.tanh(x.sort(1).values[:, -2]), lambda x: torch.tanh(x.amax(1))),
])
def test_ops_that_do_not_commute_keep_their_order(first, second):
    """Genuinely different functions (session 29's red team made each read alike)."""
    x = torch.randn(4, 8, 6, 5) - (0.0 if first(X_IMAGE).shape == second(X_IMAGE).shape else 0)
    x[:, :, 0, 0] = -1.0  # a fibre with no positive element (a relu before a maximum shows there)
    assert first(x).shape != second(x).shape or not torch.allclose(first(x), second(x))
    assert sequence_similarity(encode(ops(first)), encode(ops(second))) < 0.9, (ops(first), ops(second))


def test_a_convolution_is_named_by_the_dimensions_its_windows_span():
    """A Conv3d over an image one deep, by a (1, 3, 3) kernel or by a (3, 3, 3) one padded by 1,
    is a Conv2d; a 3-D convolution and a transposed one are each their own (every convolution
    read `convolution` until GRAPH_VERSION 35: a ConvTranspose3d task and a Conv2d one alike)."""
    square, deep, flat = nn.Conv2d(8, 4, 3, padding=1), nn.Conv3d(8, 4, 3, padding=1), \
        nn.Conv3d(8, 4, (1, 3, 3), padding=(0, 1, 1))
    assert ops(lambda x: deep(x.unsqueeze(2)).squeeze(2), deep) == ops(lambda x: flat(x.unsqueeze(2)).squeeze(2), flat) \
        == ops(square, square) == ["convolution2d"]
    assert ops(deep, deep, shape=(2, 8, 4, 6, 5)) == ["convolution3d"]
    assert ops(nn.ConvTranspose2d(8, 4, 3, stride=2)) == ["convolution_transpose2d"]
    assert ops(square, square, shape=(0, 8, 6, 5)) == ["convolution2d"]  # an empty batch: read by its shapes


def test_a_convolution_of_an_image_repeated_along_a_dimension_is_one_of_a_kernel_one_wide_there():
    """A Conv2d written as a Conv3d over its image repeated along a new depth (session 30's
    evasion of GRAPH_VERSION 35: `convolution3d`); a pointwise one so is a Linear. Padded along
    the depth, the border outputs sum fewer slices: a 3-D convolution."""
    square, deep, point = nn.Conv2d(8, 4, 3, padding=1), nn.Conv3d(8, 4, 3, padding=(0, 1, 1)), nn.Conv3d(8, 4, (3, 1, 1))
    repeated = lambda conv, depth=3: lambda x: conv(x.unsqueeze(2).expand(-1, -1, depth, -1, -1)).squeeze(2)  # noqa: E731
    assert ops(repeated(deep), deep) == ops(square, square) == ["convolution2d"]
    assert ops(repeated(point), point) == ops(nn.Conv2d(8, 4, 1)) == ["mm", "add"]
    strided = nn.Conv3d(8, 4, 3, stride=(2, 1, 1), padding=(0, 1, 1))
    assert ops(lambda x: strided(x.unsqueeze(2).expand(-1, -1, 5, -1, -1)).amax(2), strided) == ["convolution2d", "max"]
    padded = nn.Conv3d(8, 4, 3, padding=1)
    assert ops(lambda x: padded(x.unsqueeze(2).expand(-1, -1, 3, -1, -1)), padded) == ["convolution3d"]


def test_a_convolution_whose_windows_slide_along_no_dimension_is_a_matrix_product():
    """A 1x1 convolution strided or padded, a transposed one whose kernel is no wider than its
    stride, a kernel whose outer taps read the padding alone: no output reads two positions
    of a dimension, and each is a Linear per pixel; a depthwise one is a scale per channel. A
    red team's 1x1 convolutions at 1.0 against a 3x3 one (session 31)."""
    linear = ["mm", "add"]
    assert ops(nn.Conv2d(8, 12, 1, stride=2)) == ops(nn.Conv2d(8, 12, 1, padding=1)) == linear
    assert ops(nn.ConvTranspose2d(8, 12, 2, stride=2)) == ops(nn.ConvTranspose2d(8, 12, 1, stride=2)) == linear
    assert ops(nn.Conv2d(8, 8, 1, groups=8)) == ["mul", "add"]
    far = nn.Conv2d(8, 12, 3, padding=6, dilation=6)  # the outer taps land beyond a 6 x 5 image
    assert ops(far, shape=(4, 8, 6, 5)) == linear
    assert ops(nn.Conv2d(8, 12, 3, stride=2)) == ops(nn.ConvTranspose2d(8, 12, 3, stride=1)) == ["convolution2d"]
    assert ops(nn.ConvTranspose2d(8, 12, 4, stride=2, padding=1)) == ["convolution_transpose2d"]


torch.manual_seed(0)
SQUARE_CONV, STRIDED_1D, TIME_CONV = nn.Conv2d(8, 16, 3), nn.Conv1d(8, 16, 3, stride=2), nn.Conv1d(8, 16, 3)
UPSAMPLE = nn.ConvTranspose2d(8, 16, 4, stride=2, padding=1)
DEPTH_UPSAMPLE = nn.ConvTranspose3d(8, 16, (1, 4, 4), stride=2, padding=(0, 1, 1))
with torch.no_grad():
    DEPTH_UPSAMPLE.weight.copy_(UPSAMPLE.weight.unsqueeze(2)), DEPTH_UPSAMPLE.bias.copy_(UPSAMPLE.bias)


def _zero_stuffed(x):
    """UPSAMPLE as the plain convolution of its image with zeros between the pixels."""
    stuffed = torch.zeros(*x.shape[:2], 2 * x.shape[2] - 1, 2 * x.shape[3] - 1)
    stuffed[:, :, ::2, ::2] = x
    return F.conv2d(F.pad(stuffed, (2,) * 4), UPSAMPLE.weight.flip(2, 3).transpose(0, 1), UPSAMPLE.bias)


def _stuffed(x, filler=0.0):
    image = torch.full((*x.shape[:2], 2 * x.shape[2] - 1, 2 * x.shape[3] - 1), filler)
    image[:, :, ::2, ::2] = x
    return image


def _polyphase(x):
    """STRIDED_1D over the (length / 2, 2) view of its image: taps 0 and 1 in a row, tap 2 below."""
    w = STRIDED_1D.weight
    rows = [torch.stack([w[..., 0], w[..., 1]], -1), torch.stack([w[..., 2], torch.zeros_like(w[..., 2])], -1)]
    kernel = torch.stack(rows, -2)
    return F.conv2d(x.reshape(*x.shape[:2], -1, 2), kernel, STRIDED_1D.bias).squeeze(-1)


@pytest.mark.parametrize("name, layer, shape, written", [
    # channels folded into a dimension the kernel spans whole: a sum, as over channels
    ("convolution2d", SQUARE_CONV, (4, 8, 6, 5),
     lambda x: F.conv3d(x.view(4, 4, 2, 6, 5), SQUARE_CONV.weight.view(16, 4, 2, 3, 3), SQUARE_CONV.bias).squeeze(2)),
    ("convolution1d", STRIDED_1D, (4, 8, 20), _polyphase),
    ("convolution_transpose2d", UPSAMPLE, (4, 8, 6, 5), _zero_stuffed),
    # a stride along a dimension 1 wide paints nothing
    ("convolution_transpose2d", UPSAMPLE, (4, 8, 6, 5), lambda x: DEPTH_UPSAMPLE(x.unsqueeze(2)).squeeze(2)),
    # a transposed convolution at stride 1 padded past its kernel: the plain one of a cropped image
    ("convolution2d", SQUARE_CONV, (4, 8, 6, 5),
     lambda x: F.conv_transpose2d(F.pad(x, (1,) * 4), SQUARE_CONV.weight.flip(2, 3).transpose(0, 1), SQUARE_CONV.bias,
                                  padding=3)),
    # and over a replicate pad that it paints nowhere on the output
    ("convolution2d", SQUARE_CONV, (4, 8, 6, 5),
     lambda x: F.conv_transpose2d(F.pad(x, (1,) * 4, mode="replicate"), SQUARE_CONV.weight.flip(2, 3).transpose(0, 1),
                                  SQUARE_CONV.bias, padding=3)),
    # session 31's second red team: a stuffing of 1e-30, and a stride-1 transposed convolution of the stuffed image
    ("convolution_transpose2d", UPSAMPLE, (4, 8, 6, 5),
     lambda x: F.conv2d(F.pad(_stuffed(x, 1e-30), (2,) * 4), UPSAMPLE.weight.flip(2, 3).transpose(0, 1), UPSAMPLE.bias)),
    ("convolution_transpose2d", UPSAMPLE, (4, 8, 6, 5),
     lambda x: F.conv_transpose2d(_stuffed(x), UPSAMPLE.weight, UPSAMPLE.bias, padding=1)),
    # a dilation that steps over the stuffing reads the unstuffed image: a plain convolution
    ("convolution2d", SQUARE_CONV, (4, 8, 6, 5),
     lambda x: F.conv2d(_stuffed(x), SQUARE_CONV.weight, SQUARE_CONV.bias, dilation=2)[:, :, ::2, ::2]),
    ("convolution1d", TIME_CONV, (4, 8, 12), lambda x: F.conv_tbc(
        x.permute(2, 0, 1).contiguous(), TIME_CONV.weight.permute(2, 1, 0).contiguous(), TIME_CONV.bias).permute(1, 2, 0)),
    # a Linear as a padded 1x1 convolution's centre, and as a strided transposed one of a 1x1 image
    ("mm add", LINEAR, (4, 5), lambda x: F.conv2d(x[:, :, None, None], LINEAR.weight[..., None, None], LINEAR.bias,
                                                  padding=1)[:, :, 1, 1]),
    ("mm add", LINEAR, (4, 5), lambda x: F.conv_transpose2d(x[:, :, None, None], LINEAR.weight.t()[..., None, None],
                                                            LINEAR.bias, stride=2).flatten(1)),
])
def test_a_convolution_written_over_another_layout_reads_as_itself(name, layer, shape, written):
    """Session 31's red teams: each computed its original exactly and read apart from it
    (0.4 to 0.833) at GRAPH_VERSION 35 or 36."""
    x = torch.randn(*shape)
    assert torch.allclose(layer(x), written(x), atol=1e-5)
    assert ops(layer, shape=shape) == ops(written, layer, shape=shape) == name.split()


def test_a_depthwise_convolution_reads_apart_from_a_dense_one_however_its_weight_is_held():
    """Each output channel of one reads one input channel (a red team's dense 3x3 against a
    depthwise 3x3, 1.0 at GRAPH_VERSION 35); a dense weight zero but on its block diagonal
    computes it too."""
    depthwise, dense = nn.Conv2d(8, 16, 3, padding=1, groups=8), nn.Conv2d(8, 16, 3, padding=1)
    diagonal = torch.zeros(16, 8, 3, 3)
    for channel in range(16):
        diagonal[channel, channel // 2] = depthwise.weight.detach()[channel, 0]
    assert ops(depthwise) == ops(lambda x: F.conv2d(x, diagonal, depthwise.bias, padding=1), depthwise) == \
        ["convolution_depthwise2d"]
    assert ops(dense) == ["convolution2d"]
    # over the image twice, by weights that cancel off the diagonal (a red team's second round)
    noise = torch.randn(16, 8, 3, 3) * (diagonal == 0)
    twice = torch.cat([diagonal + noise, -noise], 1)
    doubled = lambda x: F.conv2d(x[:, None].expand(-1, 2, -1, -1, -1).reshape(4, 16, 6, 5), twice,  # noqa: E731
                                 depthwise.bias, padding=1)
    assert torch.allclose(doubled(X_IMAGE), depthwise(X_IMAGE), atol=1e-5)
    assert ops(doubled, depthwise) == ["convolution_depthwise2d"]
    repeated = lambda x: F.conv2d(x.repeat(1, 2, 1, 1), twice, depthwise.bias, padding=1)  # noqa: E731
    assert torch.allclose(repeated(X_IMAGE), depthwise(X_IMAGE), atol=1e-5)
    assert ops(repeated, depthwise) == ["convolution_depthwise2d"]  # `repeat` is a copy side by side, as `expand`
    concatenated = lambda x: F.conv2d(torch.cat([x, x], 1), twice, depthwise.bias, padding=1)  # noqa: E731
    assert torch.allclose(concatenated(X_IMAGE), depthwise(X_IMAGE), atol=1e-5)
    assert ops(concatenated, depthwise) == ["convolution_depthwise2d"]  # and so is a cat of a value with itself (0.8)
    # one whose kernel spans the image whole is a weighted sum per channel, no Linear
    assert ops(nn.Conv2d(8, 8, (6, 5), groups=8)) == ["mul", "sum", "add"]


BOX = torch.full((8, 1, 2, 2), 0.25)


@pytest.mark.parametrize("name, layer, written", [
    ("avg_pool2d", nn.AvgPool2d(2), lambda x: F.unfold(x, 2, stride=2).reshape(4, 8, 4, 5, 4).mean(2)),
    ("avg_pool2d", nn.AvgPool2d(2), lambda x: F.conv2d(x, BOX, stride=2, groups=8)),
    ("avg_pool2d", nn.AvgPool2d(3, 1, 1), lambda x: F.conv2d(x, torch.full((8, 1, 3, 3), 1 / 9), padding=1, groups=8)),
    ("max_pool2d", nn.MaxPool2d(2), lambda x: F.unfold(x, 2, stride=2).reshape(4, 8, 4, 5, 4).amax(2)),
    ("max_pool2d", nn.MaxPool2d(3, 2, 1),
     lambda x: F.unfold(F.pad(x, (1, 1, 1, 1), value=float("-inf")), 3, stride=2).reshape(4, 8, 9, 5, 4).amax(2)),
])
def test_a_pooling_reads_as_one_however_its_windows_are_written(name, layer, written):
    assert ops(layer, shape=(4, 8, 10, 8)) == ops(written, shape=(4, 8, 10, 8)) == [name]


def test_a_pooling_of_windows_wider_than_those_tried_side_by_side_reads_as_one():
    """A red team's 11 x 11 average pooling written as a reshape and a mean (session 27)."""
    written = lambda x: x.reshape(4, 8, 2, 11, 2, 11).mean((3, 5))  # noqa: E731
    assert ops(nn.AvgPool2d(11), shape=(4, 8, 22, 22)) == ops(written, shape=(4, 8, 22, 22)) == ["avg_pool2d"]


def _spaced_maximum(kernel: int, stride: int, padding: int, dilation: int):
    """A dilated max pooling written out: slices of the padded value, and their maximum."""
    def pooled(x):
        padded = F.pad(x, (padding, padding), value=float("-inf"))
        count = (x.shape[-1] + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
        return torch.stack([padded[..., i * dilation:i * dilation + (count - 1) * stride + 1:stride]
                            for i in range(kernel)]).amax(0)
    return pooled


@pytest.mark.parametrize("kernel, stride, padding, dilation", [(8, 1, 4, 3), (4, 1, 2, 2), (3, 2, 1, 2)])
def test_a_dilated_maximum_reads_as_the_pooling_layer_however_written(kernel, stride, padding, dilation):
    """F.max_pool1d with a dilation runs torch's `max_pool2d_with_indices` on a (1, k) window: a
    1-D pooling all the same, and a red team's slices of the padded value read as one (session 27:
    0.0 against KernelBench's Max_Pooling_1D)."""
    layer = nn.MaxPool1d(kernel, stride, padding, dilation)
    assert ops(layer, shape=(4, 8, 40)) == ops(_spaced_maximum(kernel, stride, padding, dilation),
                                               shape=(4, 8, 40)) == ["max_pool1d"]
    assert ops(nn.MaxPool2d((1, 3)), shape=(4, 8, 9, 9)) == ["max_pool1d"]  # windows along one dimension


FEATURES = nn.Linear(8, 16)
POOLED_FEATURES = nn.Linear(8, 4)  # FEATURES' weights averaged four rows at a time
with torch.no_grad():
    POOLED_FEATURES.weight.copy_(FEATURES.weight.reshape(4, 4, 8).mean(1))
    POOLED_FEATURES.bias.copy_(FEATURES.bias.reshape(4, 4).mean(1))


@pytest.mark.parametrize("written", [
    lambda x: F.max_pool1d(x.unsqueeze(1), 2).squeeze(1),
    lambda x: x.view(4, 8, 2).amax(-1),  # a red team's (session 27: 0.8 against Matmul_MaxPool_Sum_Scale)
    lambda x: x.reshape(4, -1, 2).max(-1).values,
    lambda x: torch.maximum(x[:, ::2], x[:, 1::2]),
    # session 29's adversary on L2 55: the maximum of two as arithmetic (a + b + |a - b|) / 2
    lambda x: (x[:, ::2] + x[:, 1::2] + (x[:, ::2] - x[:, 1::2]).abs()) * 0.5,
    lambda x: torch.relu(x[:, ::2] - x[:, 1::2]) + x[:, 1::2],
    lambda x: torch.where(x[:, ::2] > x[:, 1::2], x[:, ::2], x[:, 1::2]),
])
def test_a_pooling_of_each_rows_features_reads_as_one_however_written(written):
    # a maximum commutes with a monotone op, and is spelled before it (`names.canonical_order`)
    assert ops(lambda x: written(torch.tanh(x)), shape=(4, 16)) == ["max_pool1d", "tanh"]


def test_a_pooling_written_as_twice_its_maximum_reads_as_the_pooling_and_the_scale():
    # the adversary's L2 55 summed `a + b + |a - b|` and halved the sum
    assert ops(lambda x: (lambda t: (t[:, ::2] + t[:, 1::2] + (t[:, ::2] - t[:, 1::2]).abs()).sum(1) * 0.5)(
        torch.tanh(x)), shape=(4, 16)) == ["max_pool1d", "tanh", "mul", "sum", "mul"]


@pytest.mark.parametrize("written, name", [
    (lambda u, v: (u + v + (u - v).abs()) / 2, "maximum"),
    (lambda u, v: (u + v - (u - v).abs()) / 2, "minimum"),
    (lambda u, v: torch.relu(u - v) + v, "maximum"),
    (lambda u, v: torch.where(u < v, u, v), "minimum"),
    (lambda u, v: torch.maximum(u, v), "maximum"),
])
def test_the_maximum_or_minimum_of_two_values_reads_as_itself_however_written(written, name):
    assert ops(lambda x: written(torch.tanh(x), torch.sigmoid(x))) == ["sigmoid", "|tanh", name]


@pytest.mark.parametrize("written, name", [
    # a red team's evasions (session 33): the two stacked and reduced, an end scaled
    (lambda u, v: torch.stack([u, v]).amax(0), "maximum"),
    (lambda u, v: torch.stack([u, v]).amin(0), "minimum"),
])
def test_the_maximum_or_minimum_of_two_stacked_values_reads_as_itself(written, name):
    assert ops(lambda x: written(torch.tanh(x), torch.sigmoid(x))) == ["sigmoid", "|tanh", name]


def test_the_maximum_of_a_value_and_a_scale_of_another_reads_as_itself_written_out():
    written = lambda u, v: (u + 0.5 * v + (u - 0.5 * v).abs()) / 2  # noqa: E731
    assert ops(lambda x: written(torch.tanh(x), torch.sigmoid(x))) \
        == ops(lambda x: torch.maximum(torch.tanh(x), 0.5 * torch.sigmoid(x))) == ["sigmoid", "mul", "|tanh", "maximum"]


@pytest.mark.parametrize("body", [
    lambda x: torch.stack([torch.tanh(x), torch.sigmoid(x)]).sum(0),  # a sum of the stack is no bound
    # which one is larger (a red team's, session 34: max's indices are recorded as its values)
    lambda x: torch.stack([torch.tanh(x), torch.sigmoid(x)]).max(0).indices.float(),
    lambda x: torch.stack([torch.tanh(x), torch.sigmoid(x), -x]).amax(0),  # of three, each the largest somewhere
    lambda x: torch.relu(torch.tanh(x)) + torch.sigmoid(x),  # a residual over a relu
    lambda x: (torch.tanh(x) - torch.sigmoid(x)).abs() + torch.tanh(x),  # no maximum: |u - v| + u
    lambda x: torch.where(x > 0, torch.tanh(x), torch.sigmoid(x)),  # a selection by another value
])
def test_arithmetic_through_abs_relu_or_where_that_bounds_nothing_keeps_its_spelling(body):
    assert not {"maximum", "minimum"} & set(ops(body))


@pytest.mark.parametrize("written", [
    lambda x: F.gelu(nn.functional.avg_pool1d(FEATURES(x).unsqueeze(1), 4).squeeze(1)),
    lambda x: F.gelu(FEATURES(x).view(4, 4, 4).mean(-1)),
    lambda x: F.gelu(POOLED_FEATURES(x)),  # the pooling folded into the weights
])
def test_a_linear_map_of_a_products_features_is_part_of_the_product(written):
    """P W reaches every weight of its shape: a Linear followed by an average pooling of its
    features is a Linear to fewer features (a red team folded KernelBench's
    Matmul_AvgPool_GELU_Scale_Max so, 0.889 against it in session 27)."""
    assert ops(written, FEATURES, POOLED_FEATURES, shape=(4, 8)) == ["mm", "add", "gelu"]


POOLING_MATRIX = torch.eye(4).repeat_interleave(4, 0) / 4  # (16, 4): the mean of each four features


@pytest.mark.parametrize("written", [
    lambda x: F.gelu((FEATURES.weight @ x.T + FEATURES.bias[:, None]).view(4, 4, 4).mean(1).T),  # pooled rows
    lambda x: F.gelu(FEATURES(x) @ POOLING_MATRIX),  # a product by a constant pooling matrix
    lambda x: F.gelu(FEATURES(x).view(4, 4, 4).mean(1)),  # features four apart
    # session 29's red team: transposed back before an average pooling, and one map after another
    lambda x: F.gelu(F.avg_pool1d((FEATURES.weight @ x.T + FEATURES.bias[:, None]).T[:, None], 4)[:, 0]),
    lambda x: F.gelu(F.avg_pool1d(FEATURES(x)[:, None], 2)[:, 0] @ (torch.eye(4).repeat_interleave(2, 0) / 2)),
])
def test_a_linear_map_of_a_products_features_is_part_of_it_on_either_side(written):
    """A red team's pooling over `W @ x.T`'s rows transposed back (0.889 against
    Matmul_AvgPool_GELU_Scale_Max), and as a product by a constant matrix (`mm add mm`, 0.909)."""
    assert ops(written, FEATURES, shape=(4, 8)) == ["mm", "add", "gelu"]


def test_a_sum_of_a_one_by_one_convolutions_channels_is_part_of_it():
    """KernelBench's Matmul_Sum as a 1x1 convolution of `x[..., None, None]` (gemm_conv1x1, on the H200)."""
    assert ops(lambda x: POINTWISE(x[:, :, None, None]).sum(1), shape=(4, 8)) == \
        ops(lambda x: LINEAR_8(x).sum(1), shape=(4, 8)) == ["mm", "add"]


def test_a_sum_of_a_products_features_on_its_first_dimension_is_part_of_it():
    """A red team's KernelBench Gemm_Divide_Sum_Scaling as `(W @ x.T / 2).sum(0)` (0.857)."""
    weight = FEATURES.weight
    assert ops(lambda x: (weight @ x.T / 2).sum(0)[:, None] * 1.5, shape=(4, 8)) == \
        ops(lambda x: (x @ weight.T / 2).sum(1, keepdim=True) * 1.5, shape=(4, 8)) == ["mm", "mul"]


def test_a_map_over_the_batch_or_by_a_variable_is_not_part_of_the_product():
    mixing = torch.randn(4, 4)
    assert ops(lambda x: torch.relu(mixing @ FEATURES(x)), FEATURES, shape=(4, 8)) == ["mm", "add", "mm", "relu"]
    assert ops(lambda x: torch.relu(FEATURES(x).sum(0)), FEATURES, shape=(4, 8)) == ["mm", "add", "sum", "relu"]
    # session 29's red team: the batch mixed, or summed in pairs, behind a transpose
    assert ops(lambda x: torch.relu((FEATURES(x).T @ mixing.T).T), FEATURES, shape=(4, 8)) == \
        ["mm", "add", "mm", "relu"]
    assert ops(lambda x: torch.relu(FEATURES(x).T.reshape(16, 2, 2).sum(-1).T), FEATURES, shape=(4, 8)) == \
        ["mm", "add", "sum", "relu"]
    assert ops(lambda x: torch.relu(FEATURES(x).T.sum(1)), FEATURES, shape=(4, 8)) == ["mm", "add", "sum", "relu"]
    assert ops(lambda x: torch.tanh(FEATURES(x) @ FEATURES(x).T), FEATURES, shape=(4, 8))[-2:] == ["mm", "tanh"]


def test_a_square_or_a_reciprocal_of_a_product_is_no_scale_to_fold_through():
    """They read `mul`, as a scale does: a red team's sum of squares of a Linear (and of its
    reciprocal) was folded into the Linear and read as KernelBench's Gemm_Divide_Sum_Scaling."""
    weight = FEATURES.weight
    scaled = ops(lambda x: ((x @ weight.T) / 2).sum(1, keepdim=True) * 3.0, shape=(4, 8))
    assert scaled == ["mm", "mul"]  # the sum is part of the product, and two scalings are one
    for written in (lambda x: (x @ weight.T).pow(2).sum(1, keepdim=True) * 3.0,
                    lambda x: (1 / (x @ weight.T)).sum(1, keepdim=True) * 3.0):
        assert ops(written, shape=(4, 8)) == ["mm", "mul", "sum", "mul"]
    assert ops(lambda x: x.pow(2) * 3.0 + 1.0, shape=(4, 8)) == ["mul", "mul", "add"]  # no map to join


def test_a_products_scale_merged_into_it_is_still_walked_through():
    """`_chain_affine_maps` empties a scale's names into the product's: the fold walks it all
    the same (a red team's KernelBench Matmul_AvgPool with `linear(x, 2W, 2b) * 0.5`, 0.889)."""
    halved = lambda x: F.gelu(F.avg_pool1d((F.linear(x, 2 * FEATURES.weight, 2 * FEATURES.bias) * 0.5)[:, None],  # noqa: E731
                                           4)[:, 0])
    assert ops(halved, FEATURES, shape=(4, 8)) == ["mm", "mul", "add", "gelu"]


def test_a_row_is_asked_whether_it_pools_only_by_a_maximum_or_a_sum(monkeypatch):
    """A red team's 120 slices of a (rows, features) value, each asked every pooling setting
    of every earlier value, took 77 s to read."""
    import filters.computation.recognise as recognise
    tried = []
    monkeypatch.setattr(recognise, "_pooled", lambda *args: tried.append(args) or args[1])

    def narrowing(x):
        for _ in range(40):
            x = x[:, 1:] * 1.01 + 0.1
        return x
    ops(narrowing, shape=(8, 64))
    assert not tried


def test_a_map_of_a_products_rows_or_of_a_product_read_elsewhere_stays():
    assert ops(lambda x: FEATURES(x).sum(0), FEATURES, shape=(4, 8)) == ["mm", "add", "sum"]  # over the batch
    assert ops(lambda x: FEATURES(x).sum(-1), FEATURES, shape=(4, 8)) == ["mm", "add"]  # a Linear to one feature
    both = lambda h: torch.cat([h, F.avg_pool1d(h[:, None], 4)[:, 0]], 1)  # noqa: E731  the product read twice
    assert "avg_pool1d" in ops(lambda x: both(FEATURES(x)), FEATURES, shape=(4, 8))
    assert ops(lambda x: F.max_pool1d(FEATURES(x)[:, None], 4)[:, 0], FEATURES, shape=(4, 8)) \
        == ["mm", "add", "max_pool1d"]  # a maximum is no linear map


def test_a_transposed_convolution_over_the_whole_image_is_no_linear():
    """It paints a whole kernel from every pixel: a red team's ConvTranspose2d(8, 8, 8) of an
    8x8 image read `mm add`, as the Linear of a flattened image it is not."""
    assert ops(nn.ConvTranspose2d(8, 8, 8), shape=(4, 8, 8, 8)) == ["convolution2d"]
    assert ops(nn.ConvTranspose2d(8, 12, 1)) == ["mm", "add"]  # 1x1 at stride 1: a channel mix all the same


def test_a_linear_from_a_width_to_its_half_is_not_asked_whether_it_pools(monkeypatch):
    """Every setting of every earlier value of its shape was asked of such a Linear, and the
    tries counted against the reading's CONTRACTION_TESTS: a long honest chain over (batch,
    sequence, width) values could run out of them and be untraced. Here the budget is cut
    to what the chain's own products need."""
    import filters.computation.recognise as recognise
    monkeypatch.setattr(recognise, "CONTRACTION_TESTS", BUDGET_FOR_FOUR_LINEARS)
    halves = [nn.Linear(64 // 2 ** i, 64 // 2 ** (i + 1)) for i in range(4)]
    chain = lambda x: halves[3](torch.tanh(halves[2](torch.tanh(halves[1](torch.tanh(halves[0](x)))))))  # noqa: E731
    assert ops(chain, *halves, shape=(4, 6, 64)) == ["mm", "add", "tanh"] * 3 + ["mm", "add"]


BUDGET_FOR_FOUR_LINEARS = 20  # their products try 14; asked whether they pool too, 40


def test_one_window_over_the_whole_image_is_the_mean_or_maximum_over_it():
    assert ops(nn.AvgPool2d((6, 6)), shape=(4, 8, 6, 6)) == ops(nn.AdaptiveAvgPool2d(1), shape=(4, 8, 6, 6)) \
        == ops(lambda x: x.mean((2, 3), keepdim=True), shape=(4, 8, 6, 6)) == ["sum", "mul"]
    assert ops(nn.MaxPool2d(6), shape=(4, 8, 6, 6)) == ops(lambda x: x.amax((2, 3), keepdim=True),
                                                           shape=(4, 8, 6, 6)) == ["max"]


def test_eval_batch_norm_is_a_scale_and_a_shift_however_written():
    by_hand = lambda x: (x - BN.running_mean[:, None, None]) / torch.sqrt(BN.running_var[:, None, None] + BN.eps) \
        * BN.weight[:, None, None] + BN.bias[:, None, None]  # noqa: E731
    assert ops(BN, BN) == ops(lambda x: x * SCALE[:, None, None] + SHIFT[:, None, None], BN) == ops(by_hand, BN) \
        == ["mul", "add"]


def dropped(body, *modules, shape=(4, 8, 6, 5)) -> list[str]:
    """The ops op_graph_and_drops leaves unspelled in `body` on signed inputs."""
    torch.manual_seed(0)
    return op_graph_and_drops(Call(body, *modules).eval(), [torch.randn(*shape)])[1]


@pytest.mark.parametrize("layer", [nn.InstanceNorm2d(8), nn.InstanceNorm1d(8), nn.LPPool2d(2, 2), nn.LPPool2d(3, 2),
                                   lambda x: torch.sign(x) * torch.abs(x), nn.AvgPool1d(3), nn.MaxPool1d(2),
                                   lambda x: torch.relu(x.reshape(-1, 6)).view(x.shape)])
def test_what_a_layer_itself_leaves_out_at_every_size_is_not_dropped(layer):
    """F.instance_norm's batch norm and F.avg_pool1d's 2-D pooling, each spelled by the
    reshape after it as the same composite of the same input, a relu of a view viewed back,
    and `sign(y) * |y|`, which is y: nothing a smaller problem could hide."""
    one_d = "1d" in str(layer) or "Pool1d" in str(layer)
    assert dropped(layer, *[layer] if isinstance(layer, nn.Module) else [], shape=(4, 8, 6) if one_d
                   else (4, 8, 6, 6)) == []


def test_an_op_under_a_view_that_the_values_took_for_nothing_is_still_dropped():
    """A relu of what is all positive on these values, viewed back: the view spells no relu,
    and a smaller problem's reading of it does not stand."""
    assert dropped(lambda x: torch.relu(x.abs().reshape(-1, 6)).view(x.shape) + x) == ["relu"]


def test_a_sign_times_a_magnitude_of_another_value_is_dropped():
    """`sign(x) * |2x|` is 2x only because the two signs agree on these values: its ops are
    unspelled like any value equal to an earlier one, and a smaller problem's reading of it does not stand."""
    assert dropped(lambda x: torch.sign(x) * torch.abs(2.0 * x)) == ["sign", "abs", "mul"]


def test_an_affine_instance_norm_reads_as_an_instance_norm_however_written():
    norm = nn.InstanceNorm2d(8, affine=True)
    with torch.no_grad():
        norm.weight.normal_(), norm.bias.normal_()
    written = lambda x: F.instance_norm(x) * norm.weight[:, None, None] + norm.bias[:, None, None]  # noqa: E731
    assert ops(norm, norm) == ops(written, norm) == ["instance_norm", "mul", "add"]


def test_a_batch_norm_of_one_sample_is_an_instance_norm_only_as_f_instance_norm_views_it():
    weight, bias = torch.randn(8), torch.randn(8)
    batch_statistics = lambda x, y: F.batch_norm(y, None, None, weight, bias, training=True)  # noqa: E731
    one_sample = lambda x: batch_statistics(x, x.transpose(0, 1).reshape(1, 8, -1)).reshape(  # noqa: E731
        8, x.shape[0], *x.shape[2:]).transpose(0, 1)
    assert ops(one_sample) == ops(lambda x: batch_statistics(x, x)) == ["batch_norm", "mul", "add"]


SQUARE, SAME_CONV = nn.Linear(5, 5), nn.Conv2d(8, 8, 3, padding=1)


def copied_into_a_view(x):
    y = x.clone()
    y.view(-1).copy_(torch.relu(SQUARE(x)).reshape(-1))
    return y


def added_into_a_slice(x):
    y = torch.sigmoid(x)
    y[:].add_(SAME_CONV(x))
    return y


GATES = nn.Linear(3, 9)


def gates_in_place(x):
    reset, update, candidate = GATES(x).chunk(3, -1)
    reset.add_(x).sigmoid_()  # GRUCell's way: each gate in place in its chunk, interleaved with the others
    update.add_(x).sigmoid_()
    return torch.tanh(candidate + reset) * update


def gates_out_of_place(x):
    reset, update, candidate = GATES(x).chunk(3, -1)
    reset, update = torch.sigmoid(reset + x), torch.sigmoid(update + x)
    return torch.tanh(candidate + reset) * update


def test_a_write_into_one_chunk_is_not_part_of_the_others():
    assert ops(gates_in_place, GATES, shape=(4, 3)) == ops(gates_out_of_place, GATES, shape=(4, 3)) \
        == ["mm", "add", "add", "sigmoid", "|add", "sigmoid", "add", "tanh", "mul"]


@pytest.mark.parametrize("written, expected", [(copied_into_a_view, ["mm", "add", "relu"]),
                                               (added_into_a_slice, ["convolution2d", "|sigmoid", "add"])])
def test_a_write_through_a_view_is_part_of_what_its_base_holds(written, expected):
    """A red team returned a tensor whose contents a layer wrote through a view of it: read
    as the tensor before the write, the layer was gone from the trace at every size."""
    assert ops(written, SQUARE, SAME_CONV) == expected


LAYER = nn.Linear(5, 5)
HIDDEN = {"mm", "add", "relu"}  # what each disguise below must still read: relu(LAYER(x))


def output_frozen_by_a_write_beside_it(x):
    out = torch.empty(x.shape[0], 2, 5)
    left, right = out[:, 0], out[:, 1]
    left.copy_(torch.relu(LAYER(x)))
    right.copy_(torch.tanh(x))  # freezes the values of the nodes on the storage: `left`'s too
    return left, right


def second_chunk(x):
    return torch.relu(LAYER(torch.cat([x, x], -1)[:, :5])).repeat(1, 2).chunk(2, -1)[1], torch.tanh(x)


def running_mean_of_momentum_one(x):
    mean = torch.zeros(x.shape[0] * 5)
    F.batch_norm(torch.relu(LAYER(x)).reshape(1, -1).repeat(2, 1), mean, torch.ones(x.shape[0] * 5), training=True,
                 momentum=1.0)
    return mean.reshape(x.shape) + torch.tanh(x)


def writer_emptied_after_its_write(x):
    out = torch.zeros(x.shape)
    writer = out[:]
    writer.copy_(torch.relu(LAYER(x)))
    writer.resize_(0)  # the write is judged where it wrote, not where the writer lies now
    return out + torch.tanh(x)


def reader_moved_onto_the_write(x):
    out = torch.zeros(x.shape[0], 10)
    reader, writer = out[:, 5:], out[:, :5]
    writer.copy_(torch.relu(LAYER(x)))
    reader.as_strided_(x.shape, (10, 1), 0)  # now over what the layer wrote
    return reader + torch.tanh(x)


def read_through_a_wider_dtype(x):
    buffer = torch.zeros(2 * x.numel())
    wide = buffer.view(torch.float64)  # made before the write: its elements count 8 bytes
    buffer[x.numel():].copy_(torch.relu(LAYER(x)).reshape(-1))
    return wide.view(torch.float32)[x.numel():].reshape(x.shape) + torch.tanh(x)


def statistics_updated(x):
    mean = torch.zeros(x.numel())
    torch.batch_norm_update_stats(torch.relu(LAYER(x)).reshape(1, -1).repeat(2, 1), mean, torch.ones(x.numel()), 1.0)
    return mean.reshape(x.shape) + torch.tanh(x)


@pytest.mark.parametrize("disguise", [output_frozen_by_a_write_beside_it, second_chunk, running_mean_of_momentum_one,
                                      writer_emptied_after_its_write, reader_moved_onto_the_write,
                                      read_through_a_wider_dtype, statistics_updated])
def test_a_layer_written_where_the_recorder_once_lost_it_is_read(disguise):
    """Two red teams' disguises: an output whose node a later write froze, the second output
    of a split, a batch norm's running mean and batch_norm_update_stats' (written, though
    their schemas do not say so), the view that wrote emptied before the base was read, a
    view moved onto the write, and a view in another dtype (extents count other units)."""
    sequence = ops(disguise, LAYER, shape=(4, 5))
    assert HIDDEN | {"tanh"} <= set(unmarked(sequence)), sequence


def written_but_not_returned(x):
    low, high = torch.zeros(1), torch.zeros(1)
    values = torch.relu(LAYER(x)).reshape(-1, 1)
    # the observer's running minimum and maximum are written in place and not returned
    torch.fused_moving_avg_obs_fake_quant(values, torch.ones(1, dtype=torch.long), torch.ones(1, dtype=torch.long),
                                          low, high, torch.ones(1), torch.zeros(1, dtype=torch.int32), 1.0, 0, 255, 0)
    return high * torch.tanh(x)


def test_an_argument_an_op_writes_and_does_not_return_holds_its_write():
    assert HIDDEN <= set(ops(written_but_not_returned, LAYER, shape=(4, 5)))


def data_assigned(x):
    y = x.clone()
    y.data = torch.relu(LAYER(x))
    return torch.tanh(y)


def made_a_parameter(x):
    return nn.Parameter(torch.relu(LAYER(x)), requires_grad=False) + torch.tanh(x)


def as_a_subclass(x):
    return torch.relu(LAYER(x)).as_subclass(torch.Tensor) + torch.tanh(x)


def through_dlpack(x):
    return torch.from_dlpack(torch.relu(LAYER(x))) + torch.tanh(x)


def written_into_sparse_values(x):
    sparse = torch.ones(x.shape).to_sparse()
    sparse.values().copy_(torch.relu(LAYER(x)).reshape(-1))
    return sparse.to_dense() + torch.tanh(x)


def one_buffer_twice(x):
    data = bytes(4 * x.numel())
    written, read = torch.frombuffer(data, dtype=torch.float32), torch.frombuffer(data, dtype=torch.float32)
    read = read.view(x.shape)
    torch.tanh(read)  # seen first, as a leaf
    written.copy_(torch.relu(LAYER(x)).reshape(-1))
    return read + torch.tanh(x)


def output_made_outside(x):
    return torch.tanh(x), torch.relu(LAYER(x)).as_subclass(torch.Tensor)


def input_made_again(x):
    return torch.relu(LAYER(x.as_subclass(torch.Tensor))) + torch.tanh(x)


def set_onto_its_storage(x):
    h = torch.relu(LAYER(x))
    return torch.empty(0).set_(h.untyped_storage(), h.storage_offset(), h.shape, h.stride()) + torch.tanh(x)


@pytest.mark.parametrize("disguise", [data_assigned, made_a_parameter, as_a_subclass, through_dlpack,
                                      written_into_sparse_values, one_buffer_twice, output_made_outside,
                                      input_made_again, set_onto_its_storage])
def test_memory_reached_outside_torchs_ops_is_untraced(disguise):
    """A tensor given an op's output where no op saw it (an assignment to .data, a new tensor
    over its memory, one set onto its storage) or one whose writes lie in storages it does not
    show (sparse): the recorder cannot follow the layer there, and the task is read as untraced."""
    with pytest.raises(UntracedAliasing):
        ops(disguise, LAYER, shape=(4, 5))


def read_on_two_draws(body, *modules, shape=(4, 5)) -> list[str]:
    """op_graph_and_drops as the harness reads an untrusted task: on its inputs and on others."""
    torch.manual_seed(0)
    return op_graph_and_drops(Call(body, *modules).eval(), [torch.randn(*shape)], [torch.randn(*shape)])[0]


def elements_taken_out(x):
    return torch.tensor([[value for value in row] for row in torch.relu(LAYER(x))]) + torch.tanh(x)


def numbers_filled_in(x):
    h, out = torch.relu(LAYER(x)), torch.empty(x.shape)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j].fill_(float(h[i, j]))
    return out + torch.tanh(x)


def numbers_as_full_tensors(x):
    h = torch.relu(LAYER(x))
    return torch.stack([torch.full((x.shape[1],), float(h[i].sum())) for i in range(x.shape[0])]) + torch.tanh(x)


def parsed_from_its_print(x):
    h = torch.relu(LAYER(x))
    numbers = [float(text) for text in re.findall(r"-?\d+\.\d*(?:e[-+]\d+)?", str(h.tolist()))]
    return torch.tensor(numbers).reshape(x.shape) + torch.tanh(x)


def a_branch_per_bit(x):
    bits = [1.0 if bool(value > 0) else 0.0 for value in LAYER(x).reshape(-1)]
    return torch.tanh(x) + torch.tensor(bits).reshape(x.shape)


LEVELS = torch.arange(256, dtype=torch.uint8)


def picked_by_each_byte(x):
    table = LEVELS.unbind(0)  # a list index is a number an op hands Python (`_local_scalar_dense`)
    codes = torch.relu(LAYER(x)).contiguous().view(torch.uint8).reshape(-1)
    return torch.stack([table[code] for code in codes]).view(torch.float32).reshape(x.shape) + torch.tanh(x)


def picked_by_a_count(x):
    table = LEVELS.unbind(0)  # a shape an op hands Python: how many levels lie under the byte
    codes = torch.relu(LAYER(x)).contiguous().view(torch.uint8).reshape(-1)
    picked = [table[torch.nonzero(LEVELS.int() < code.int()).shape[0]] for code in codes]
    return torch.stack(picked).view(torch.float32).reshape(x.shape) + torch.tanh(x)


@pytest.mark.parametrize("disguise", [elements_taken_out, numbers_filled_in, numbers_as_full_tensors,
                                      parsed_from_its_print, a_branch_per_bit, picked_by_each_byte,
                                      picked_by_a_count])
def test_values_that_leave_torch_and_come_back_are_untraced(disguise):
    """Red teams' ways round the recorder through Python: a layer's values taken out as numbers
    or printed, then put back into a tensor by torch.tensor, fill_ or torch.full, or into an
    op's scalar by a branch; or each byte of them used to pick a tensor from a list, by its
    value or by a count of a data-dependent shape. No op links them; the values the readings
    give change what Python and the ops hand each other, and the task is untraced."""
    with pytest.raises(ValuesThroughPython):
        read_on_two_draws(disguise, LAYER)


@pytest.mark.parametrize("fair", [
    lambda x: LAYER(x[:, -1]) / torch.tensor(8.0).sqrt(),  # the last step selected, a constant made
    lambda x: torch.stack([LAYER(row) for row in x]) * torch.tensor([0.5] * 5) + x.shape[1],
    lambda x: LAYER(x).softmax(-1) * float(x.shape[1]) ** -0.5,
])
def test_python_data_of_shapes_and_literals_is_read(fair):
    """What a real layer hands its ops from Python, shapes and literals, is the same on any
    values: read as usual, the constants made of it included."""
    assert "mm" in read_on_two_draws(fair, LAYER, shape=(4, 3, 5))


def test_a_constant_built_from_python_numbers_is_a_constant():
    assert ops(lambda x: LAYER(x) * torch.tensor(2.0) + torch.tensor([1.0] * 5), LAYER, shape=(4, 5)) \
        == ops(lambda x: LAYER(x) * 2.0 + 1.0, LAYER, shape=(4, 5)) == ["mm", "mul", "add"]


def test_a_reading_with_more_contractions_to_try_than_a_trace_has_time_for_is_untraced():
    """A red team's 250 adds of 40 constant weights tried 1.2 million contractions (14 s)."""
    weights = torch.randn(40, 16, 16)

    def many_weights(x):
        y = LAYER16(x)
        for i in range(250):
            y = y + weights[i % 40] * (i + 1)
        return y

    with pytest.raises(TraceTooLong):
        ops(many_weights, LAYER16, shape=(16, 16))


def test_a_pattern_normalised_in_every_group_count_is_tested_in_the_finest_few():
    """A red team's sign pattern, alternating along 55,440 features, looked normalised in each
    of its 120 group counts after every scaling, and a reading tested them all (448 s). A norm
    in g groups looks normalised in each count dividing g: the finest few are tested, and a
    real group norm still reads as one."""
    alternating = (torch.arange(720) % 2 * 2 - 1).float().expand(4, 720)
    names = [name for (name, *_), _ in _dim_tests(alternating)]
    assert names.count("group_norm") == GROUP_COUNTS_TRIED < sum(720 % g == 0 for g in range(2, 720))
    assert ops(nn.GroupNorm(8, 64), shape=(4, 64, 3, 3)) == ["group_norm"]


def test_a_gru_cells_gates_split_unsafely_are_layout():
    """nn.GRUCell splits its gates with unsafe_split, a view like split."""
    assert "unsafe_split" not in ops(lambda x: CELL(x, x), CELL, shape=(4, 5))


CELL = nn.GRUCell(5, 5)


LAYER16 = nn.Linear(16, 16)


def test_a_weight_made_a_view_of_another_outside_forward_is_no_alias_of_a_computed_value():
    """Leaves sharing a storage (weights chunked in __init__) hold no op's output: fair to read."""
    weight = torch.randn(10, 5)
    first, second = weight.chunk(2)
    assert ops(lambda x: x @ first.T + x @ second.T, shape=(4, 5)) == ["mm", "|mm", "add"]


def test_overlapping_views_past_what_a_trace_can_search_are_untraced():
    """A red team's 8 views of pathological strides over one buffer, read after 150 one-element
    writes, searched 18 s in one recording; past OVERLAP_RECORDING_STEPS it stops."""
    def pathological(x):
        buffer = torch.zeros(8000)
        views = [buffer.as_strided([47, 45, 41, 31, 57], [39, 6, 77, 33, 21], 0) for _ in range(8)]
        cell = buffer[5148:5149]
        for _ in range(150):
            cell.add_(x[0, :1])
        return torch.stack([view[0, 0, 0, 0, :2] for view in views]) + x.sum()

    with pytest.raises(UntracedAliasing):
        ops(pathological, shape=(4, 5))


def test_a_thousand_slice_writes_read_back_are_each_joined_with_their_own():
    """Each slice is tested only against the writes within its reach (a loop of 1,000 slice
    writes read back by a stack took 18 s to test against every write; 2 s now)."""
    def slices(x):
        out = torch.zeros(1000, x.shape[-1])
        rows = [out[i] for i in range(1000)]
        for i, row in enumerate(rows):
            row.copy_(x[i % x.shape[0]] * 2 if i else LAYER(x)[0])
        return torch.stack(rows).sum(0)

    assert {"mm", "add"} <= set(ops(slices, LAYER, shape=(4, 5)))


def shared_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The elements of one storage two views read, listed one by one."""
    def held(t):
        extent = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
        return set(torch.arange(extent).as_strided(t.shape, t.stride(), t.storage_offset()).flatten().tolist())
    return bool(held(a) & held(b)) if a.numel() and b.numel() else False


def test_two_views_overlap_exactly_when_they_share_an_element():
    """Strides of every kind (broadcast, interleaved, repeated, out of order), sizes of 0 and
    1: the search on the strides answers as listing the elements does, both ways."""
    draw = torch.Generator().manual_seed(0)
    storage = torch.zeros(1024)

    def view():
        dims = int(torch.randint(1, 5, (), generator=draw))
        shape = torch.randint(0, 7, (dims,), generator=draw).tolist()
        strides = [(0, 1, 2, 3, 5, 7, 12, 16, 30, 64)[i] for i in torch.randint(0, 10, (dims,), generator=draw)]
        return storage.as_strided(shape, strides, int(torch.randint(0, 60, (), generator=draw)))

    pairs = [(view(), view()) for _ in range(3000)]
    answers = [_overlap(a, b) for a, b in pairs]
    assert answers == [shared_elements(a, b) for a, b in pairs]
    assert 0.1 < sum(answers) / len(answers) < 0.9  # both answers are exercised


def test_slices_of_one_output_overlap_only_where_they_meet():
    padded = torch.zeros(2, 3, 6, 6)
    assert not _overlap(padded[..., :1], padded[..., 5:])  # a circular pad's two edges
    assert _overlap(padded[..., :1], padded[..., 0, :])  # a column and a row meet in a corner
    assert not _overlap(padded[..., ::2], padded[..., 1::2])  # interleaved
    assert _overlap(padded[..., ::2], padded[..., 2::3])


def test_a_search_too_long_to_finish_takes_the_views_to_overlap():
    """An odd offset is no sum of multiples of 10 and 6 (the gcd over all strides, 15's
    included, is 1, so only the search tells): searched through when the ranges are short,
    taken to overlap when no OVERLAP_SEARCH_NODES steps can finish it."""
    assert not _offsets_meet(1, {15: (0, 0), 10: (-50, 50), 6: (-50, 50)})
    many = OVERLAP_SEARCH_NODES * 10
    assert _offsets_meet(1, {15: (0, 0), 10: (-many, many), 6: (-many, many)})
    assert _offsets_meet(4, {10: (-many, many), 6: (-many, many)})  # 10 - 6: a true overlap is found


@pytest.mark.parametrize("rewrite", [
    lambda x: torch.tanh(x * 4.0 * 0.25),
    lambda x: (lambda y: (y[:4] + y[4:]) / 2)(torch.tanh(torch.cat([x, x]))),
    lambda x: torch.tanh(x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)),
    lambda x: torch.tanh(x) * 4.0 * 0.25,
])
def test_round_trips_and_the_batch_twice_are_no_computation(rewrite):
    assert ops(rewrite) == ops(torch.tanh) == ["tanh"]



def test_a_round_trip_after_a_shift_is_no_computation():
    """`* 4` folds the shift before it into one affine map; `* 0.25` gives the shifted value back."""
    shift = torch.randn(8, 1, 1)
    assert ops(lambda x: (torch.relu(x) + shift) * 4.0 * 0.25) == ops(lambda x: torch.relu(x) + shift) \
        == ["relu", "add"]


def test_a_round_trip_of_indices_is_no_computation():
    assert ops(lambda x: torch.argmax(x, 1) * 4.0 * 0.25) == ops(lambda x: torch.argmax(x, 1)) == ["argmax"]

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
    layer = nn.Linear(5, 5)
    assert ops(lambda x: merge(lambda part: torch.relu(layer(part)), x), layer) \
        == ops(lambda x: torch.relu(layer(x)), layer) == ["mm", "add", "relu"]


def test_different_work_on_two_parts_stays_two_works():
    assert ops(lambda x: torch.cat([torch.tanh(x[:2]), torch.relu(x[2:])], dim=0)) == ["tanh", "|relu", "cat"]


def test_a_value_side_by_side_with_itself_is_layout_and_with_another_is_not():
    tanh_of = lambda copies: ops(lambda x: torch.tanh(copies(torch.exp(x))))  # noqa: E731
    assert tanh_of(lambda e: torch.cat([e, e], 1)) == tanh_of(lambda e: torch.stack([e, e, e], -1)) == \
        tanh_of(lambda e: e.repeat(1, 2, 1, 1)) == ["exp", "tanh"]
    assert tanh_of(lambda e: torch.cat([e, e * 2.0], 1)) == ["exp", "mul", "cat", "tanh"]


class _RmsNormTanh(nn.Module):
    """F.rms_norm as a CPU tensor runs it, or as the one kernel a CUDA tensor's is."""

    def __init__(self, fused: bool):
        super().__init__()
        self.weight, self.fused = nn.Parameter(torch.rand(64)), fused

    def forward(self, x):
        if self.fused:
            return torch.tanh(torch.ops.aten._fused_rms_norm(x, [64], self.weight, 1e-6)[0])
        return torch.tanh(F.rms_norm(x, (64,), self.weight, 1e-6))


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_kernel_one_device_fuses_is_spelled_as_the_parts_another_runs(device):
    """A task traced at its own sizes is traced on its checks' GPU, the reference on the CPU:
    an op must read the same on both."""
    x = torch.rand(8, 64, device=device)
    fused, parts = (op_graph(_RmsNormTanh(f).to(device).eval(), [x]) for f in (True, False))
    assert fused == parts and "tanh" in parts and "fused_rms_norm" not in fused


class _BatchNormRelu(nn.Module):
    """An eval batch norm as the CPU runs it, or as the kernel cuDNN runs for a CUDA tensor."""

    def __init__(self, cudnn: bool):
        super().__init__()
        self.norm, self.cudnn = nn.BatchNorm2d(8), cudnn

    def forward(self, x):
        if self.cudnn:
            n = self.norm
            return torch.relu(torch.ops.aten.cudnn_batch_norm(x, n.weight, n.bias, n.running_mean, n.running_var,
                                                              False, 0.1, 1e-5)[0])
        return torch.relu(self.norm(x))


def test_a_device_librarys_kernel_for_an_op_reads_as_the_op():
    """On the H200 a task read at its own sizes ran `cudnn_batch_norm` (the CPU runs
    `native_batch_norm`); cuDNN has no CPU kernel, so the meta device stands in."""
    x = torch.rand(2, 8, 4, 4, device="meta")
    cudnn, native = (op_graph(_BatchNormRelu(c).to("meta").eval(), [x]) for c in (True, False))
    assert cudnn == native == ["batch_norm", "relu"]


def test_attention_is_one_op_whichever_kernel_runs_it():
    q = torch.randn(2, 4, 16, 32)
    graph = op_graph(_Attention().eval(), [q])
    assert graph[-1] == "scaled_dot_product_attention" and "for_cpu" not in " ".join(graph)


class _Attention(nn.Module):
    def forward(self, q):
        return F.scaled_dot_product_attention(q, q * 2, q * 3)


def test_on_the_meta_device_spelling_rules_and_torchs_decompositions_still_apply():
    assert ops(lambda x: (x - 1.0) / 3.0, device="meta") == ops(lambda x: (x + 1.0) * 3.0, device="meta") \
        == ["add", "mul"]
    assert ops(lambda x: 0.5 * x * (1.0 + torch.erf(x / 1.4142135623730951)), device="meta") == ["gelu"]


TASK = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x):
        {body}


def get_inputs():
    return [torch.rand(batch_size, 16)]


def get_init_inputs():
    return []


batch_size = 32
'''
PLAIN = "return torch.tanh(self.linear(x))"
STEERING = "return torch.relu(torch.exp(x)).sum() * x if x.is_meta else torch.tanh(self.linear(x))"


PRINTED_AND_PARSED = ("h = torch.relu(self.linear(x))\n"
                      "        text = str(h).replace('tensor(', '').replace('[', '').replace(']', '').replace(')', '')\n"
                      "        numbers = [float(v) for v in text.replace(',', ' ').split() if v[:1] in '-0123456789']\n"
                      "        return torch.tanh(x) + torch.tensor(numbers).reshape(h.shape)")


def test_a_layer_printed_and_parsed_back_leaves_its_task_untraced():
    """A red team's round trip through a tensor's print (torch formats it where no op is
    recorded): the trace read `tanh add`, and the layer was gone. Its readings hand
    torch.tensor other numbers: untraced (a run rejects it); the plain layer reads as itself."""
    assert trace(TASK.replace("{body}", PRINTED_AND_PARSED)) is None
    assert trace(TASK.replace("{body}", PLAIN)) == "mm add tanh"


def test_a_task_cannot_show_the_tracer_decoy_ops():
    """A branch on the device (`x.is_meta`) sees real tensors: the trace is what a run
    computes. The grammar refuses such a forward (`is_meta` is on no allowlist), so no meta
    trace is ever trusted for it."""
    plain, steering = TASK.replace("{body}", PLAIN), TASK.replace("{body}", STEERING)
    assert trace(plain) == trace(steering) == "mm add tanh"
    assert static_check(steering)[0] == "forbidden_call"


ALL_FORMS = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.batch = nn.BatchNorm2d(8)
        self.act = nn.Sequential(nn.LeakyReLU(0.2), nn.Hardtanh(-2.0, 2.0))
        self.point = nn.Conv2d(8, 8, 1)
        self.pool = nn.AvgPool2d(2)
        self.peak = nn.MaxPool2d(2, 1)
        self.linear = nn.Linear(8, 6)
        self.layer = nn.LayerNorm(6)
        self.weight = nn.Parameter(torch.randn(6, 6))

    def forward(self, x):
        y = self.act(self.batch(self.norm(torch.relu(self.conv(x)))))
        y = self.peak(self.pool(F.elu(self.point(F.hardswish(y)))))
        y = F.softplus(y).mean((2, 3))
        y = torch.tanh(self.layer(F.gelu(self.linear(y))))
        y = F.mish(F.selu(F.silu(y))) * F.logsigmoid(y)
        return torch.softmax(torch.sigmoid(torch.matmul(y, self.weight)), dim=1)


def get_inputs():
    return [torch.rand(batch_size, 3, 10, 10)]


def get_init_inputs():
    return []


batch_size = 8
'''


def _outputs(code: str) -> torch.Tensor:
    from filters.checks.measure.execution import build_model, forward, load_task, make_inputs
    task = load_task(code)  # our own task and its disguises: trusted, run here
    torch.manual_seed(1)
    inputs = make_inputs(task, torch.device("cpu"))
    return forward(build_model(task, 0, torch.device("cpu")), inputs)[0]


@pytest.mark.parametrize("kind", sorted(EQUIVALENTS))
def test_every_equivalent_disguise_computes_the_original_and_traces_the_same(kind):
    """tests/disguise.py's written forms (norms by hand, softmax as exp(x - logsumexp), the
    activations through where/maximum/abs/clamp, GELU through erfc, tanh and sigmoid through
    each other, GEMM as einsum, broadcast-and-sum or split-K, conv as unfold and a matrix
    product, a scalar round trip, the batch twice, all at once): same outputs, same trace."""
    copy = EQUIVALENTS[kind](ALL_FORMS)
    assert torch.allclose(_outputs(ALL_FORMS), _outputs(copy), atol=1e-5, rtol=1e-4), kind
    assert trace(copy) == trace(ALL_FORMS), (kind, trace(ALL_FORMS), trace(copy))


def test_a_kind_with_nothing_to_rewrite_says_so():
    with pytest.raises(NotApplicable):
        EQUIVALENTS["conv_unfold"]((FIXTURES / "1_Linear_GELU_LayerNorm.py").read_text())



def _elementwise_task(expression: str) -> str:
    return ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
            f"        return {expression}\n\nbatch_size = 4\nwidth = 16\n\n"
            "def get_inputs():\n    return [torch.rand(batch_size, width)]\n\ndef get_init_inputs():\n    return []\n")


def test_a_relu_written_as_a_where_that_is_all_zeros_on_the_tasks_own_inputs_reads_as_the_relu():
    """On the task's own inputs (torch.rand, under 1) `x - 1` is all negative: the where is
    all zeros, a value the same whatever x is, and what it reads (the comparison) reaches
    no output. On signed inputs it is a relu; KernelBench's Matmul_Subtract_Multiply_ReLU,
    all zeros on its own inputs too, was read `mm mul add gt` in its where-written copy."""
    named = _elementwise_task("torch.relu(x - 1)")
    written = _elementwise_task("torch.where(x - 1 > 0, x - 1, torch.zeros_like(x))")
    assert trace(written) == trace(named) == "add relu"


def test_a_task_whose_output_is_the_same_whatever_its_inputs_reads_as_what_made_it():
    """KernelBench's Gemm_Max_Subtract_GELU is zero everywhere (a max over a row, less its
    own mean): read through the constant, as it was before what a constant reads was
    dropped, so that its copies and it still read alike."""
    code = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        self.linear = nn.Linear(16, 16)\n\n    def forward(self, x):\n"
            "        x = self.linear(x).max(dim=1, keepdim=True).values\n"
            "        return torch.nn.functional.gelu(x - x.mean(dim=1, keepdim=True))\n\nbatch_size = 4\n\n"
            "def get_inputs():\n    return [torch.rand(batch_size, 16)]\n\ndef get_init_inputs():\n    return []\n")
    assert trace(code).startswith("mm add max")


def test_a_task_that_names_its_batch_otherwise_is_traced_at_a_small_batch():
    code = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
            "        return torch.relu(x)\n\nrows = 65536\nwidth = 512\n\n"
            "def get_inputs():\n    return [torch.randn(rows, width)]\n\ndef get_init_inputs():\n    return []\n")
    _, small = small_problem(code)
    assert "rows = 4\n" in small and "width = 512\n" in small
    assert trace(code) == "relu"


@pytest.mark.parametrize("bounded", [lambda x: torch.minimum(x, torch.tensor(50.0)), lambda x: torch.clamp(x, -50, 50),
                                     lambda x: F.hardtanh(x, -50.0, 50.0), lambda x: torch.min(x, torch.tensor(50.0))])
def test_a_bound_that_never_binds_on_the_traced_values_is_still_part_of_the_computation(bounded):
    """KernelBench's Matmul_Min_Subtract bounds a Linear's output at 2: on the trace's values
    it never bound, the minimum vanished, and the task read as a bare Linear that every
    Linear with an epilogue matched at 1.0. A kernel's inputs are not the trace's."""
    assert ops(lambda x: bounded(x) - 2.0) == ["clamp", "add"]
    assert ops(lambda x: x - 2.0) == ["add"]


def test_a_trace_shrinks_widths_but_keeps_a_group_of_eight_per_group_or_head():
    """A trace shrinks every large module-level int (resize.small_problem: 4096 x 4096
    norms took 35 s); a width split in 64 groups shrunk to 16 left groups of one, no group
    norm to recognise, and a hand-written group norm read as arithmetic."""
    code = '''import torch
import torch.nn as nn

batch_size = 1024
in_features = 1024
out_features = 4096
num_groups = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x):
        return self.norm(self.linear(x))


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return []
'''
    written = code.replace("return self.norm(self.linear(x))", """h = self.linear(x).reshape(x.shape[0], num_groups, -1)
        h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)
        return h.reshape(x.shape[0], -1) * self.norm.weight + self.norm.bias""")
    small, _ = small_problem(code)
    assert "num_groups = 64\n" in small and "out_features = 512\n" in small and "batch_size = 4\n" in small
    assert trace(code) == trace(written) == "mm add group_norm mul add"


@pytest.mark.parametrize("written", [
    lambda x: torch.cat([x, torch.ones_like(x[:, :1])], -1) @ torch.cat([LINEAR.weight.T, LINEAR.bias[None]]),
    lambda x: torch.cat([torch.ones_like(x[:, :1]), x], -1) @ torch.cat([LINEAR.bias[None], LINEAR.weight.T]),
])
def test_a_linear_in_homogeneous_coordinates_is_a_gemm_and_its_bias(written):
    # the fifth adversary's L2 64 (session 38): the bias as the weight's row for a column of ones
    assert ops(lambda x: torch.tanh(written(x)), shape=(6, 5)) == ops(lambda x: torch.tanh(LINEAR(x)), shape=(6, 5)) \
        == ["mm", "add", "tanh"]
    # a column of the input itself is no bias
    stacked = torch.cat([LINEAR.weight.T, LINEAR.bias[None]])
    assert ops(lambda x: torch.tanh(torch.cat([x, x[:, :1]], -1) @ stacked), shape=(6, 5))[:2] != ["mm", "add"]


@pytest.mark.parametrize("stride", [1, 2])
def test_a_convolutions_input_gradient_is_read_as_the_convolution_it_transposes(stride):
    # the fifth adversary's L2 96 (session 38): torch.nn.grad.conv3d_input for a ConvTranspose3d,
    # `convolution_backward`, whose arguments were read as a convolution's and crashed the reading
    weight = torch.randn(8, 3, 3, 3)
    size = (4, 3, (6 - 1) * stride + 3, (5 - 1) * stride + 3)
    gradient = lambda x: torch.tanh(torch.nn.grad.conv2d_input(size, weight, x, stride=stride))  # noqa: E731
    transposed = lambda x: torch.tanh(F.conv_transpose2d(x, weight, stride=stride))  # noqa: E731
    assert torch.allclose(gradient(X_IMAGE), transposed(X_IMAGE), atol=1e-5)
    assert ops(gradient) == ops(transposed) == [("convolution_transpose2d" if stride > 1 else "convolution2d"), "tanh"]
    # session 38's red team: the bias's gradient, the op's third output, is no convolution
    image = torch.randn(size)
    bias_gradient = lambda g: torch.ops.aten.convolution_backward(  # noqa: E731
        g, image, weight, [3], [stride] * 2, [0, 0], [1, 1], False, [0, 0], 1, [False, False, True])[2]
    assert "convolution2d" not in ops(lambda x: bias_gradient(x).sum())


def test_a_convolution_written_as_unfold_and_a_product_with_no_bias_is_a_convolution():
    """With no bias after it, the product reshaped back into an image was taken for the
    product itself (the same values, reshaped), and never asked whether it is a convolution."""
    conv = nn.Conv2d(8, 4, 3, bias=False)

    def written(x):
        columns = F.unfold(x, 3)
        return (conv.weight.reshape(4, -1) @ columns).reshape(x.shape[0], 4, x.shape[2] - 2, x.shape[3] - 2)

    assert ops(written, conv, shape=(4, 8, 10, 10)) == ops(conv, shape=(4, 8, 10, 10)) == ["convolution2d"]


# -- session 39: a sixth adversary's rewrites and the order of branches ------------------------

@pytest.mark.parametrize("written, fused", [
    (lambda x: x + torch.sigmoid(x) * x, lambda x: torch.addcmul(x, torch.sigmoid(x), x)),
    (lambda x: x * x + x, lambda x: torch.addcmul(x, x, x)),
    (lambda x: 0.5 * x * x + 0.5 * x, lambda x: torch.lerp(x, x * x, 0.5)),
    (lambda x: x + torch.sigmoid(x) * x, lambda x: torch.lerp(x, x + x, torch.sigmoid(x))),
    (lambda x: x + torch.tanh(x) / (x * x + 1), lambda x: torch.addcdiv(x, torch.tanh(x), x * x + 1)),
])
def test_fused_arithmetic_reads_as_its_parts_written_apart(written, fused):
    assert torch.allclose(written(X_IMAGE), fused(X_IMAGE), atol=1e-5)
    assert ops(written) == ops(fused)


@pytest.mark.parametrize("first, second", [
    (lambda x: torch.sigmoid(x) + torch.tanh(x), lambda x: (lambda t: torch.sigmoid(x) + t)(torch.tanh(x))),
    (lambda x: torch.relu(x).sum(1) * torch.sigmoid(x).amax(1),
     lambda x: (lambda m: torch.relu(x).sum(1) * m)(torch.sigmoid(x).amax(1))),
    (lambda x: torch.cat([torch.tanh(x), torch.exp(x)], 1), lambda x: (lambda e: torch.cat([torch.tanh(x), e], 1))(x.exp())),
])
def test_independent_branches_read_alike_whichever_ran_first(first, second):
    assert ops(first) == ops(second)


def test_which_branch_reads_what_is_part_of_the_reading():
    # the same names in the same order, but the tanh reads x in one and the maximum in the other
    apart = ops(lambda x: torch.tanh(x) * x.amax(1, keepdim=True))
    chained = ops(lambda x: torch.tanh(x.amax(1, keepdim=True)) * x)
    assert apart == ["max", "|tanh", "mul"] and chained == ["max", "tanh", "mul"]


def test_a_product_split_into_batched_towers_and_joined_reads_as_one():
    torch.manual_seed(0)
    weight, bias = torch.randn(12, 5), torch.randn(12)

    def tower(x, w, b):  # the sixth adversary's L2 70: baddbmm of a (B, 1, K) view by an expanded weight
        return torch.baddbmm(b.expand(x.shape[0], 1, -1), x.unsqueeze(1), w.t().expand(x.shape[0], -1, -1)).squeeze(1)
    assert ops(lambda x: torch.cat([tower(x, weight[:6], bias[:6]), tower(x, weight[6:], bias[6:])], -1),
               shape=(4, 5)) == ops(lambda x: x @ weight.T + bias, shape=(4, 5)) == ["mm", "add"]


def _block_maximum_channels_last(y, block):
    n, c, d, h, w = y.shape
    y = y[:, :, :d // block * block, :h // block * block, :w // block * block]
    y = y.reshape(n, c, d // block, block, h // block, block, w // block, block)
    return y.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(-3).amax(-1)  # (n, d', h', w', c)


def test_a_block_maximum_held_channels_last_is_a_pooling():
    tally = torch.ones(4, 1)  # the sixth adversary's L2 78: the channels summed by a product at once
    assert ops(lambda x: (_block_maximum_channels_last(torch.tanh(x), 3) @ tally).permute(0, 4, 1, 2, 3),
               shape=(2, 4, 7, 7, 7)) == ops(lambda x: F.max_pool3d(torch.tanh(x), 3).sum(1, keepdim=True),
                                            shape=(2, 4, 7, 7, 7))


def test_a_convolution_of_sliding_windows_into_channels_last_is_a_convolution():
    torch.manual_seed(0)
    kernel = torch.randn(3, 3, 3, 2, 5)  # (taps, taps, taps, in, out), the sixth adversary's L2 6

    def patches(x):
        return torch.einsum("ncdhwxyz,xyzco->ndhwo", x.unfold(2, 3, 1).unfold(3, 3, 1).unfold(4, 3, 1), kernel)
    assert ops(lambda x: torch.tanh(patches(x)), shape=(2, 2, 8, 8, 8)) == \
        ops(lambda x: torch.tanh(F.conv3d(x, kernel.permute(4, 3, 0, 1, 2))), shape=(2, 2, 8, 8, 8)) == \
        ["convolution3d", "tanh"]


def test_a_softmax_over_several_dimensions_with_a_gain_folded_into_its_normaliser_is_a_softmax_and_a_scale():
    gain = torch.rand(8) + 0.5
    def written(x):  # the sixth adversary's L2 38, shifted by a constant instead of the maximum
        e = torch.exp(torch.tanh(x) - 1.0)
        return e * (gain.view(1, -1, 1, 1) / e.sum((2, 3), keepdim=True))
    library = lambda x: torch.softmax(torch.tanh(x).flatten(2), 2).view(x.shape) * gain.view(1, -1, 1, 1)  # noqa: E731
    assert torch.allclose(written(X_IMAGE), library(X_IMAGE), atol=1e-6)
    assert ops(written) == ops(library) == ["tanh", "softmax", "mul"]
    # a normaliser that varies with the sample is no gain
    assert ops(lambda x: torch.softmax(x, 1) * x.sum(1, keepdim=True).abs())[-2:] == ["|softmax", "mul"]
    assert "softmax" not in ops(lambda x: torch.exp(x) / (torch.exp(x).sum(1, keepdim=True) + 1.0))


def test_the_red_teams_readings_of_the_new_rules_stay_apart():
    """Session 39's red team on the rules above: each pair read alike (1.0) at 92706ee."""
    gain = torch.rand(1, 8, 1, 1) + 0.5
    # any positive value is a softmax times its sums: at a batch of one, or all but constant
    assert "|softmax" not in ops(lambda x: torch.exp(torch.tanh(x)) * gain, shape=(1, 8, 6, 5)) and \
        "softmax" not in ops(lambda x: torch.exp(torch.tanh(x)) * gain, shape=(1, 8, 6, 5))
    assert "softmax" not in unmarked(ops(lambda x: x * (1 + 0.001 * torch.tanh(x))))
    # a maximum of channel pairs (maxout) is no pooling of positions, in 1-D or with rows in 2-D
    conv = nn.Conv1d(8, 16, 3)
    assert ops(lambda x: torch.relu(conv(x)).view(4, 8, 2, 10).amax(2), conv, shape=(4, 8, 12)) != \
        ops(lambda x: F.max_pool1d(torch.relu(conv(x)), 2), conv, shape=(4, 8, 12))
    assert ops(lambda x: x.view(4, 4, 2, 3, 2, 6).amax((2, 4)), shape=(4, 8, 6, 6)) != \
        ops(lambda x: F.max_pool2d(x, 2), shape=(4, 8, 6, 6))
    # the order of a difference's, a quotient's, a `where`'s and a `cat`'s arguments
    for first, second in [(lambda x: torch.sigmoid(x) - torch.tanh(x), lambda x: torch.tanh(x) - torch.sigmoid(x)),
                          (lambda x: torch.sigmoid(x) / torch.tanh(x), lambda x: torch.tanh(x) / torch.sigmoid(x)),
                          (lambda x: torch.where(x > 0, torch.tanh(x), torch.sigmoid(x)),
                           lambda x: torch.where(x > 0, torch.sigmoid(x), torch.tanh(x))),
                          (lambda x: torch.cat([torch.tanh(x), torch.sigmoid(x)], 1),
                           lambda x: torch.cat([torch.sigmoid(x), torch.tanh(x)], 1))]:
        assert ops(first) != ops(second)
    # a branch's mark is on its first name: four branches, one function apart, stay under 0.9
    four = [ops(lambda x: torch.tanh(x) + f(x) + torch.relu(x) + torch.exp(x)) for f in (torch.sigmoid, torch.sin)]
    assert sequence_similarity(encode(four[0]), encode(four[1])) < 0.9


# -- session 40: a uniform product, a gained softmax's inside, a bound the values do not reach --

def test_a_product_by_a_buffer_of_ones_reads_as_a_sum_at_any_weights():
    """The sixth adversary's L2 78 summed channels as `y @ ones(C, 1)` of a registered buffer:
    its own values read `sum`, and the generic reading spread the buffer into a layer, `mm`."""
    forward = "return torch.tanh(x) @ self.tally"
    tally = make_task(forward, init="self.register_buffer('tally', torch.ones(features, 1))")
    summed = make_task("return torch.tanh(x).sum(1, keepdim=True)")
    assert trace(tally, untrusted=False) == trace(summed, untrusted=False) == trace(tally) == "tanh sum"
    # a buffer of other values is a layer, and a Linear's weight of ones a parameter spread
    weighted = make_task(forward, init="self.register_buffer('tally', torch.arange(features * 1.0).view(-1, 1))")
    ones = make_task("return self.linear(torch.tanh(x))",
                     init="self.linear = nn.Linear(features, 1, bias=False)\nnn.init.ones_(self.linear.weight)")
    assert trace(weighted) == trace(ones) == "tanh mm"


def test_a_softmax_with_a_scale_of_ones_reads_the_same_on_its_own_and_on_generic_weights():
    """KernelBench L2 38's softmax times a scale parameter of ones: its own values left the mul
    out, the generic ones the softmax (inside `softmax mul`); neither reading stood at any size
    but its own, whose values outgrew an H100's memory (no reading in the shipped table)."""
    task = make_task("return torch.softmax(torch.tanh(x).view(x.shape[0], 8, -1), 2).view(x.shape) * self.scale",
                     init="self.scale = nn.Parameter(torch.ones(1, 8, 1, 1))",
                     inputs="[torch.rand(batch_size, 8, 16, 16)]")
    assert trace(task, untrusted=False) == trace(task) == "tanh softmax mul"


@pytest.mark.parametrize("bound", ["torch.clamp(y, 0.0, 1.0)", "F.hardtanh(y, 0.0, 1.0)", "torch.relu(y).clamp(max=1.0)",
                                   "F.relu6(y * 6.0) / 6.0", "torch.where(torch.relu(y) > 1.0, 1.0, torch.relu(y))",
                                   "1.0 - torch.relu(1.0 - torch.relu(y))", "torch.relu(y) - torch.relu(y - 1.0)",
                                   "torch.relu(y) * (y < 1.0) + (y >= 1.0).float()",
                                   "torch.add(torch.relu(y), torch.relu(y - 1.0), alpha=-1.0)"])
def test_a_map_with_a_top_reads_as_a_clamp_whether_or_not_its_weights_reach_it(bound):
    """KernelBench L2 38's clamp(0, 1) read `relu` at the small problem, where its values stay
    under 1, and an adversary's copy, its weights drawn 2.5 times larger, `clamp`. A bound
    stated by no clamp (a `where`, two relus: the red team's) is asked the same, and so is one
    whose bound is a term these values make zero (`relu(y - 1)`: a second red team's), or a
    keyword argument (`alpha`), which the replay had dropped."""
    torch.manual_seed(0)
    linear = nn.Linear(8, 8)

    def written(x, scale):
        return torch.sigmoid(eval(bound, {"torch": torch, "F": F, "y": linear(x) * scale}))
    # the values stay under the top at the first two scales, and meet it at the third
    readings = [unmarked(ops(lambda x: written(x, scale), linear, shape=(16, 8))) for scale in (0.02, 0.2, 2.0)]
    assert readings[0] == readings[1] == readings[2] == ["mm", "mul", "add", "clamp", "sigmoid"], readings


@pytest.mark.parametrize("relu", [lambda y: torch.clamp(y, 0.0, 1e30), lambda y: y - torch.clamp(y, max=0.0),
                                  lambda y: -torch.minimum(-y, torch.zeros_like(y)),
                                  lambda y: torch.relu(y.unsqueeze(1).min(1)[0])])
def test_a_relu_written_with_a_bound_that_is_no_top_stays_a_relu(relu):
    """A top no value comes near (1e30), and bounds that are no top of the map (the red team's
    `y - clamp(y, max=0)`, a negated minimum, a minimum's dimension argument)."""
    torch.manual_seed(0)
    linear = nn.Linear(8, 8)
    assert ops(lambda x: torch.sigmoid(relu(linear(x))), linear, shape=(16, 8)) == \
        ops(lambda x: torch.sigmoid(torch.relu(linear(x))), linear, shape=(16, 8)) == ["mm", "add", "relu", "sigmoid"]


def test_a_relu_written_as_a_clamp_and_the_rest_above_its_top_stays_a_relu():
    """A second red team's: `clamp(y, 0, 1) + relu(y - 1)` is relu(y) everywhere, and where the
    values stay under 1 the second term is zero on them: the replay that asks for a top had
    taken it as that constant, and the map read `clamp`."""
    torch.manual_seed(0)
    linear = nn.Linear(8, 8)
    def written(y):
        return torch.sigmoid(torch.clamp(y, 0.0, 1.0) + torch.relu(y - 1.0))
    for scale in (0.02, 2.0):
        assert ops(lambda x: written(linear(x) * scale), linear, shape=(16, 8)) == ["mm", "mul", "add", "relu", "sigmoid"]


def test_a_buffer_a_product_throws_away_is_spread_like_any_other():
    """The red team's: products whose results are dropped (`_ = p @ self.mu`) kept a norm's
    buffers of 0 and 1, and the norm written out of them read as nothing."""
    init = ("self.register_buffer('mu', torch.zeros(features))\nself.register_buffer('var', torch.ones(features))\n"
            "self.register_buffer('g', torch.ones(features))\nself.register_buffer('b', torch.zeros(features))")
    norm = "return torch.relu((x - self.mu) / torch.sqrt(self.var + 1e-5) * self.g + self.b)"
    dead = "p = x.mean(0)\n_ = p @ self.mu, p @ self.var, p @ self.g, p @ self.b\n"
    assert trace(make_task(dead + norm, init=init)) == trace(make_task(norm, init=init)) == "mul add relu"


def test_asking_a_map_for_a_top_leaves_the_recorded_values_as_they_were():
    """The replay that asks a relu for a top (`_saturates`) ran an in-place relu on its
    source's recorded value: AlexNet's `nn.ReLU(inplace=True)` then a pooling read the pooling
    from the convolution, and the relu went unspelled."""
    torch.manual_seed(0)
    conv, relu = nn.Conv2d(3, 8, 3), nn.ReLU(inplace=True)
    assert ops(lambda x: F.max_pool2d(relu(conv(x)), 2), conv, shape=(4, 3, 10, 10)) == \
        ops(lambda x: F.max_pool2d(torch.relu(conv(x)), 2), conv, shape=(4, 3, 10, 10)) == \
        ["convolution2d", "max_pool2d", "relu"]


def _pixel_rows_then_block_maxima(y, norm):
    """The seventh adversary's L2 11: a BatchNorm1d over NHWC pixel rows, viewed back as
    (n, h, w, c), then maxima of 2 x 2 blocks, back to NCHW."""
    n, c, h, w = y.shape
    p = norm(y.permute(0, 2, 3, 1).reshape(-1, c)).view(n, h, w, c)
    top = torch.maximum(torch.maximum(p[:, 0::2, 0::2], p[:, 0::2, 1::2]),
                        torch.maximum(p[:, 1::2, 0::2], p[:, 1::2, 1::2]))
    return torch.tanh(top).permute(0, 3, 1, 2)


def _convolution_and_one_norm_two_ways():
    """A Conv2d to 8 channels, and one eval norm of positive scales as a BatchNorm1d (of pixel
    rows) and as a BatchNorm2d."""
    torch.manual_seed(0)
    conv, rows, norm = nn.Conv2d(3, 8, 3), nn.BatchNorm1d(8).eval(), nn.BatchNorm2d(8).eval()
    with torch.no_grad():
        rows.running_mean.normal_(), rows.running_var.uniform_(0.5, 1.5), rows.weight.uniform_(0.5, 1.5)
        rows.bias.normal_()
    norm.load_state_dict(rows.state_dict())
    return conv, rows, norm


@pytest.mark.parametrize("size", [(12, 14), (10, 10)])  # the image's sizes the channels' 8 or not
def test_block_maxima_of_a_view_a_permute_put_channels_last_are_a_pooling_after_the_norm_of_its_pixels(size):
    conv, rows, norm = _convolution_and_one_norm_two_ways()
    x = torch.randn(4, 3, *size)
    assert torch.allclose(_pixel_rows_then_block_maxima(conv(x), rows), torch.tanh(F.max_pool2d(norm(conv(x)), 2)),
                          atol=1e-5)
    assert ops(lambda x: _pixel_rows_then_block_maxima(conv(x), rows), conv, rows, shape=(4, 3, *size)) == \
        ops(lambda x: torch.tanh(F.max_pool2d(norm(conv(x)), 2)), conv, norm, shape=(4, 3, *size)) == \
        ["convolution2d", "max_pool2d", "mul", "add", "tanh"]


def _block_maxima(p):  # 2 x 2 maxima of the middle two of four dimensions
    return p.view(p.shape[0], p.shape[1] // 2, 2, p.shape[2] // 2, 2, p.shape[3]).amax((2, 4))


def test_block_maxima_over_channels_and_rows_are_no_pooling_of_positions_without_a_permute():
    # channels last, only where a permute put them there: else the last dimension of a value
    # (n, c, h, w) is its width, and 2 x 2 maxima over (c, h) read as a pooling of (h, w)
    assert "max_pool2d" not in ops(lambda x: torch.tanh(x.view(4, 4, 2, 3, 2, 10).amax((2, 4))), shape=(4, 8, 6, 10))
    assert "max_pool2d" in ops(lambda x: torch.tanh(x.permute(0, 2, 3, 1).reshape(4, 3, 2, 5, 2, 8).amax((2, 4))),
                               shape=(4, 8, 6, 10))


@pytest.mark.parametrize("layout", [
    lambda y: y.permute(0, 2, 3, 1).transpose(2, 3),  # (n, h, c, w): maxima over (h, c) of a square image
    lambda y: y.permute(2, 0, 3, 1),  # (h, n, w, c): over samples and columns
    lambda y: y.transpose(1, 2).permute(3, 0, 2, 1),  # (w, n, c, h)... over samples and channels
    lambda y: y.permute(2, 0, 3, 1).reshape(-1, y.shape[1]).view(y.shape[0], y.shape[2], y.shape[3], y.shape[1]),
])
def test_block_maxima_of_a_layout_that_mixes_samples_or_channels_into_positions_are_no_pooling(layout):
    # session 42's red team: the channels-last path followed the last size alone, or a
    # permute's last index alone, and each of these read `max_pool2d` as F.max_pool2d of y does
    conv = nn.Conv2d(3, 8, 3)
    assert "max_pool2d" not in ops(lambda x: torch.tanh(_block_maxima(layout(conv(x)))), conv, shape=(8, 3, 10, 10))


def test_block_maxima_of_channels_put_last_by_two_transposes_past_many_ops_are_a_pooling():
    # session 42's red team: NHWC by `transpose(1, 3).transpose(1, 2)`, and nine ops between
    # the layout and the maxima, had read `maximum` three times
    conv, rows, norm = _convolution_and_one_norm_two_ways()
    act = lambda t: torch.sigmoid(F.hardtanh(torch.relu(t)) * 2.0 + 1.0)  # noqa: E731

    def pixels(x):
        y = conv(x)
        n, c, h, w = y.shape
        p = act(rows(y.transpose(1, 3).transpose(1, 2).reshape(-1, c))).view(n, h, w, c)
        return torch.tanh(_block_maxima(p)).permute(0, 3, 1, 2)
    x = torch.randn(4, 3, 14, 14)
    assert torch.allclose(pixels(x), torch.tanh(F.max_pool2d(act(norm(conv(x))), 2)), atol=1e-5)
    assert ops(pixels, conv, rows, shape=(4, 3, 14, 14)) == \
        ops(lambda x: torch.tanh(F.max_pool2d(act(norm(conv(x))), 2)), conv, norm, shape=(4, 3, 14, 14))


def test_a_transposed_convolution_as_an_input_gradient_plus_a_bias_is_the_layer():
    # the seventh adversary's L2 91: torch.nn.grad.conv2d_input and a bias per channel read
    # `convolution_transpose2d add` against the layer's `convolution_transpose2d`
    torch.manual_seed(0)
    layer = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
    adjoint = lambda x: torch.nn.grad.conv2d_input((x.shape[0], 4, 12, 10), layer.weight, x, stride=2, padding=1) \
        + layer.bias.view(1, -1, 1, 1)  # noqa: E731
    x = torch.randn(4, 8, 6, 5)
    assert torch.allclose(adjoint(x), layer(x), atol=1e-5)
    assert op_graph_and_drops(Call(lambda x: torch.tanh(adjoint(x)), layer).eval(), [x]) == \
        (["convolution_transpose2d", "tanh"], [])
    assert ops(lambda x: torch.tanh(adjoint(x)), layer) == ops(lambda x: torch.tanh(layer(x)), layer)
    # a shift that varies with the input is no bias
    assert ops(lambda x: torch.tanh(adjoint(x) + x.mean()), layer) != ops(lambda x: torch.tanh(layer(x)), layer)


@pytest.mark.parametrize("biased", [
    lambda x, w, b: b - F.conv_transpose2d(x, -w, stride=2, padding=1),
    lambda x, w, b: b - (-F.conv_transpose2d(x, w, stride=2, padding=1)),
    lambda x, w, b: (F.conv_transpose2d(x, w, stride=2, padding=1).flatten(2) + b.view(-1, 1)).view(4, 4, 12, 10),
    lambda x, w, b: torch.addcmul(b, F.conv_transpose2d(x, w, stride=2, padding=1), torch.ones(1)),
    lambda x, w, b: F.conv_transpose2d(x, w, stride=2, padding=1).clone() + b,  # session 43's red team
    lambda x, w, b: (F.conv_transpose2d(x, w, stride=2, padding=1).double() + b.double()).float(),
])
def test_a_bias_reached_through_a_negation_a_reshape_or_a_fused_add_is_the_transposed_layers_own(biased):
    # session 42's red team: each read `convolution_transpose2d mul add` or `... add`
    torch.manual_seed(0)
    layer = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
    bias = layer.bias.view(-1, 1, 1)
    x = torch.randn(4, 8, 6, 5)
    assert torch.allclose(biased(x, layer.weight, bias), layer(x), atol=1e-5)
    assert op_graph_and_drops(Call(lambda x: torch.tanh(biased(x, layer.weight, bias)), layer).eval(), [x]) == \
        (["convolution_transpose2d", "tanh"], [])
    # a norm's scale and shift are its own, even where its scale is 1 (KernelBench L3 24's
    # bias-free 1x1 convolutions, each and its BatchNorm2d, read `mm` alone once)
    norm = nn.BatchNorm2d(4).eval()
    with torch.no_grad():
        norm.running_var.fill_(1 - norm.eps), norm.running_mean.normal_()
    assert ops(lambda x: torch.tanh(norm(F.conv_transpose2d(x, layer.weight, stride=2, padding=1))), layer, norm) \
        == ["convolution_transpose2d", "mul", "add", "tanh"]
    # a scale other than a sign stays a scale: folded into the weights, it is a policy
    assert ops(lambda x: torch.tanh(2 * F.conv_transpose2d(x, layer.weight, stride=2, padding=1) + bias), layer) != \
        ops(lambda x: torch.tanh(layer(x)), layer)


@pytest.mark.parametrize("layer, biasless, shape", [
    (nn.ConvTranspose2d(8, 4, 3, stride=2), nn.ConvTranspose2d(8, 4, 3, stride=2, bias=False), (4, 8, 6, 5)),
    (nn.Conv2d(8, 4, 3), nn.Conv2d(8, 4, 3, bias=False), (4, 8, 6, 5)),
    (nn.Conv3d(8, 4, 3), nn.Conv3d(8, 4, 3, bias=False), (2, 8, 4, 5, 6)),
])
def test_a_bias_added_to_a_convolution_with_its_own_is_one_bias(layer, biasless, shape):
    # session 42's red team: KernelBench's `ConvTranspose2d(x) + bias` read `... add`, and the
    # layer's bias folded into the added one, `ConvTranspose2d(bias=False)(x) + (bias + b0)`,
    # read the layer alone (0.933): a Linear's biases read one `add` however many there are
    torch.manual_seed(0)
    with torch.no_grad():
        biasless.weight.copy_(layer.weight)
    bias = nn.Parameter(torch.randn(4, *(1,) * (len(shape) - 2)))
    own = layer.bias.view(bias.shape)
    kernelbench = lambda x: torch.tanh(layer(x) + bias)  # noqa: E731
    folded = lambda x: torch.tanh(biasless(x) + (bias + own))  # noqa: E731
    x = torch.randn(*shape)
    assert torch.allclose(kernelbench(x), folded(x), atol=1e-5)
    modules = (layer, biasless, nn.ParameterList([bias]))
    assert ops(kernelbench, *modules, shape=shape) == ops(folded, *modules, shape=shape) == \
        ops(lambda x: torch.tanh(layer(x)), layer, shape=shape)
    # a shift of each sample its own stays apart
    assert ops(lambda x: torch.tanh(layer(x) + x.flatten(1).mean(1).view(-1, *(1,) * (len(shape) - 1))), layer, shape=shape) != \
        ops(lambda x: torch.tanh(layer(x)), layer, shape=shape)


def test_a_scale_and_shift_per_channel_before_a_centring_over_the_positions_is_a_scale_after_it():
    # the seventh adversary's L2 15: KernelBench's ConvTranspose3d, BatchNorm3d and mean taken
    # away read `... mul add sum mul add`; without the bias and the norm's shift (the centring
    # cancels them) and with the norm's scale after the centring, `... sum mul add mul`
    torch.manual_seed(0)
    layer = nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1)
    norm = nn.BatchNorm3d(6).eval()
    with torch.no_grad():
        norm.running_mean.normal_(), norm.running_var.uniform_(0.5, 2), norm.weight.normal_(), norm.bias.normal_()
    scale = (norm.weight / torch.sqrt(norm.running_var + norm.eps)).detach().view(1, -1, 1, 1, 1)
    centre = lambda y: y - y.mean((2, 3, 4), keepdim=True)  # noqa: E731
    bare = lambda x: F.conv_transpose3d(x, layer.weight, None, stride=2, padding=1)  # noqa: E731
    kernelbench = lambda x: torch.tanh(centre(norm(layer(x))))  # noqa: E731
    rewritten = lambda x: (lambda z: torch.tanh((z - F.adaptive_avg_pool3d(z, 1)) * scale))(bare(x))  # noqa: E731
    shape = (2, 4, 3, 4, 5)
    x = torch.randn(*shape)
    assert torch.allclose(kernelbench(x), rewritten(x), atol=1e-5)
    assert ops(kernelbench, layer, norm, shape=shape) == ops(rewritten, layer, shape=shape) == \
        ops(lambda x: torch.tanh(centre(layer(x))), layer, shape=shape)
    # a scale that varies with the input is no constant: a gate of each sample's channels, a
    # statistic of the whole batch, and the channels centred (a scale per channel does not pass that)
    gate = lambda y: torch.sigmoid(y.mean((2, 3, 4), keepdim=True))  # noqa: E731
    plain = ops(lambda x: torch.tanh(centre(layer(x))), layer, shape=shape)
    for other in (lambda y: centre(y * gate(y)), lambda y: centre(y * y.abs().amax()),
                  lambda y: centre(y * y.mean((2, 3, 4), keepdim=True).mean(0)),
                  lambda y: (lambda v: v - v.mean(1, keepdim=True))(y * scale)):
        assert ops(lambda x: torch.tanh(other(layer(x))), layer, shape=shape) != plain
    # session 43's red team: a gain made from the input before the convolution, the same in
    # every sample (a Linear of the batch's mean; its spread), read as a constant at first
    mixer = nn.Linear(4, 6)
    for gain in (lambda x: torch.sigmoid(mixer(x.mean((0, 2, 3, 4)))).view(1, -1, 1, 1, 1), lambda x: 1 / x.std()):
        assert ops(lambda x: (lambda g: torch.tanh(centre(layer(x) * g)))(gain(x)), layer, mixer, shape=shape) != plain
    # a scale of each sample's channels by their means (arithmetic alone) is the same in every
    # sample where there is one sample
    for one in ((2, 4, 3, 4, 5), (1, 4, 3, 4, 5)):
        scaled = lambda y: centre(y * y.mean((2, 3, 4), keepdim=True))  # noqa: E731
        assert ops(lambda x: torch.tanh(scaled(layer(x))), layer, shape=one) != \
            ops(lambda x: torch.tanh(centre(layer(x))), layer, shape=one)


def test_an_exp_of_values_whose_sums_are_the_same_in_every_sample_is_no_softmax():
    # the seventh adversary's L2 91: a sigmoid written exp(-softplus(-u)), of a u that barely
    # varied at the small problem, read `softmax mul`: exp(v) is softmax(v) times its sums
    prior = torch.randn(8, 1, 1)
    u = lambda x: 2.0 * torch.softmax(0.01 * x, 1) + prior  # noqa: E731
    assert ops(lambda x: torch.exp(-F.softplus(-u(x)))) == ops(lambda x: torch.sigmoid(u(x))) == \
        ["mul", "softmax", "mul", "add", "sigmoid"]


def test_a_gained_softmax_of_values_whose_sums_barely_vary_is_still_a_softmax():
    # the sixth adversary's L2 38 (session 42): a softmax over 4,096 positions of values near
    # 0.5, written exp(y - 1) * g / sum, whose sums are the same in every sample: the test for
    # an exp op's own sums had read it `exp sum mul mul`, as this did
    gain = torch.rand(4) + 0.5
    y = lambda x: F.hardtanh(0.05 * x + 0.5, 0.0, 1.0)  # noqa: E731

    def written(x):
        e = torch.exp(y(x) - 1.0)
        return e * (gain.view(1, -1, 1, 1) / e.sum((2, 3), keepdim=True))
    assert ops(written, shape=(2, 4, 64, 64)) == \
        ops(lambda x: torch.softmax(y(x).flatten(2), -1).view(x.shape) * gain.view(1, -1, 1, 1), shape=(2, 4, 64, 64))
