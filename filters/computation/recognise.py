"""What a value computes of earlier ones, found by comparing values: a composite of one
earlier value (an activation, softmax, log-sum-exp, a norm in any written form), an affine
map of one (one multiplication and one addition), a matrix product or a convolution of an
earlier value and a weight. `_Recognisers` is the part of `_Equivalences`
(filters/computation/equivalences.py) that asks these; the tests on tensors it asks them with
follow it.
"""
from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from filters.computation.linear import JOINS, SUMS, LinearRun, joins_a_layer, linear_step, solve_convolution
from filters.computation.names import (CHANNEL, COPIES, COUNT, LAYOUT_ONLY, RESHAPES, SCALAR, _name, _scalar, canonical,
                                      convolution_names, ends_in_a_layer, is_convolution, norm_name)
from filters.computation.record import _Op, argument_values
from filters.computation.values import _apart, close

WINDOW = 48  # how many ops back a rewritten composite may reach (softmax written out: ~8)
ELEMENTWISE = (
    ("relu", torch.relu), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh), ("gelu", F.gelu),
    ("gelu", lambda t: F.gelu(t, approximate="tanh")), ("silu", F.silu), ("mish", F.mish),
    ("softplus", F.softplus), ("elu", F.elu), ("selu", F.selu), ("hardswish", F.hardswish),
    ("hardsigmoid", F.hardsigmoid), ("log_sigmoid", F.logsigmoid), ("softsign", F.softsign),
)
CONTRACTION_ENDS = frozenset({"add", "sum", "mul", "cat"})  # what a GEMM written out ends in


def _meets_every_tap(conv) -> bool:
    """Whether every tap of a recorded convolution meets every position of its input: a
    transposed one with no padding, or one of stride 1 padded by its whole (dilated) kernel."""
    weight, stride, padding, dilation, transposed = conv.args[1], *conv.args[3:7]
    kernel = getattr(weight, "value", None)
    if not isinstance(kernel, torch.Tensor):
        return False
    if transposed:
        return not any(padding)
    return all(s == 1 for s in stride) and all(p == d * (k - 1) for p, d, k in zip(padding, dilation, kernel.shape[2:]))


def _scale_and_shifts(source: torch.Tensor, target: torch.Tensor) -> float | None:
    """The scale a, where `target` (rows, channels) is a * `source` plus a shift per channel,
    or None where it is not (or the rows do not vary enough to tell)."""
    centred, aimed = source - source.mean(0), target - target.mean(0)
    spread = float(centred.square().sum())
    if spread < 1e-20:
        return None
    scale = float((centred * aimed).sum()) / spread
    return scale if close(scale * centred, aimed) and close(scale * source + (target - scale * source).mean(0),
                                                            target) else None


class TraceTooLong(ValueError):
    """A reading with more to compare than a trace has time for (the task is untraced)."""


# Contractions one reading may try (`_Equivalences._tested`); the most any of 512 benchmark
# candidates tried is in docs/decontamination.md.
CONTRACTION_TESTS = 20_000
EPS_SHARE = 0.1  # the largest eps a mean of a norm is read with, against the least variance it divides
MEANED_CHANNELS = 4096  # the most channels `_mean_of_a_norm` reads a mean of
LINEAR_SOLVES = 64  # settings of a run of linear ops solved for a convolution's weights in one reading


class _Recognisers:
    """The recognisers of `_Equivalences` (a part of that class: they read its recorded ops,
    values and what it named so far, and its `_window`, `_same` and `_sample`)."""

    # -- composites of one earlier value ------------------------------------------------------

    def _composite(self, op, window):
        along = None
        factors = self._factors(op) if canonical(op) == ["mul"] else []
        for node in (n for n in window if n.value.shape == op.value.shape):
            name = self._elementwise(op, node)
            names = (name,) if name else None
            if name is None:
                along = _dim_tests(op.value.float(), canonical(op) == ["exp"]) if along is None else along
                names = next((names for names, test in along if test(node.value.float())), None)
            if names:
                return names, [node]
            if node in factors and (name := self._times_a_function_of_it(op, node, factors)):
                return (name, "mul"), [node]
            if len(factors) > 1 and (name := self._scaled_function_of_it(op, node, factors)):
                return (name, "mul"), [node]
        # a maximum over windows is a pooling before it is a reduction of the windows' view
        # and two values stacked and reduced are their maximum before a reduction of the stack
        return self._sum_of_a_full_convolution(op) or self._reduction(op, window, REDUCTIONS[:1]) or self._pool(op, window) or \
            self._bound_of_two(op, window) or self._reduction(op, window, REDUCTIONS[1:]) or self._squash(op) or \
            self._sum_by_a_constant(op, window) or self._mean_of_a_norm(op, window) or self._composition(op, window)

    def _sum_of_a_full_convolution(self, op):
        """`op` sums (or averages) a convolution over all its positions, where every tap meets
        every position of the input (a transposed convolution with no padding, or one of stride 1
        padded by its whole kernel): that is the input's sum over its positions times the sum of
        each kernel's taps, a matrix product. Read `sum mm`, from the input, however the sum is
        written (views, sums of sums, scalar maps and shifts between: a red team's
        `flatten(2).mean(-1)` of L2 42 read as its original had). An adversary wrote KernelBench
        L2 42's ConvTranspose2d and global average pooling as `x.sum((2, 3)) @ w.sum((2, 3)) /
        area`, `sum mm mul` against `convolution2d sum mul`. Only a convolution of one group
        by constant weights: a depthwise one summed is a scale per channel, and a kernel or a
        bias computed from the input is no matrix of constants."""
        name = canonical(op)
        if name != ["mul"] and (not name or name[0] != "sum" or not set(name[1:]) <= {"mul"}):
            return None  # a sum, a mean, or a scale of one (`einsum('nchw->nc', y) / area`)
        conv, shifted = self._summed_convolution(op)
        if conv is None or not _meets_every_tap(conv) or conv.args[8] != 1 \
                or any(getattr(arg, "variable", False) for arg in conv.args[1:3]):
            return None
        image, positions = conv.args[0], tuple(range(2, conv.value.dim()))
        batch, channels = conv.value.shape[:2]
        if not (isinstance(image, _Op) and image.variable and positions and batch > 1
                and op.value.numel() == batch * channels):
            return None
        summed, target = conv.value.float().sum(positions), op.value.float().reshape(batch, channels)
        fit = _scale_and_shifts(summed, target)
        if fit is None:
            return None  # not its sum (or mean) over every position, up to a scale and a shift per channel
        # the input's whole sum at one position, at either end: the same sums where every tap meets every position
        settings = argument_values(conv.args[1:9])
        for corner in (0, -1):
            moved = torch.zeros_like(image.value)
            moved[(..., *[corner] * len(positions))] = image.value.sum(positions)
            if not close(torch.ops.aten.convolution.default(moved, *settings).float().sum(positions), summed):
                return None
        # a bias (the convolution's, or one added before the sum) is an `add`, a scale a `mul`, in the order maps are
        tail = ({"mul"} if abs(fit - 1) > 1e-4 else set()) | \
            ({"add"} if shifted or isinstance(conv.args[2], _Op) else set())
        return ("sum", "mm", *(step for step in ("mul", "add") if step in tail)), [image]

    def _summed_convolution(self, op) -> tuple:
        """(the convolution `op` reads through views, sums and arithmetic by constants alone,
        each read by the one above it alone; whether an addition is among them), or (None, False)."""
        above, node, shifted, summed = None, op, False, False
        for _ in range(SUM_DEPTH):
            variables = self._variables(node)
            if not variables or len(variables) != 1 or (above is not None and self.users.get(node) != {above}):
                return None, False
            if _name(node) == "convolution" and len(node.args) >= 9:
                return (node, shifted) if summed else (None, False)
            steps = canonical(node)
            summed |= steps[:1] == ["sum"]
            by_a_constant = _name(node) in SUMMED_MAPS and node.args and node.args[0] is variables[0]
            if node is not op and steps and steps[0] != "sum" and not by_a_constant:
                return None, False
            shifted |= by_a_constant and _name(node) in ("add", "sub")
            above, node = node, variables[0]
        return None, False

    def _sum_by_a_constant(self, op, window):
        """`op` is c times the sum of an earlier value along one of its dimensions (not the
        batch), written as a product by a vector of c's: an einsum or a matmul with a ones
        vector, a 1x1 convolution of ones. Read `sum`, and `mul` where c is no 1 (an adversary
        summed KernelBench L2 78's channels with `einsum(..., ones)`: `mm` against `sum`). A
        matrix of equal columns of c's makes the sum once per column (`x @ ones(K, 2)`): the
        same sum, repeated."""
        name = canonical(op)
        if name and name[-1] != "mm":
            return None
        target = op.value.float()
        if target.dim() > 1 and target.shape[-1] > 1 and close(target, target[..., :1].expand_as(target)):
            target = target[..., :1]
        for node in (n for n in window if n.value.dim() in (target.dim(), target.dim() + 1)):
            source = node.value.float()
            for dim, keep in _reduced_to(source, target):
                if dim == 0:
                    continue  # not the batch
                self._tested()
                summed = source.sum(dim, keepdim=keep)
                scale = float((summed * target).sum() / (summed * summed).sum().clamp_min(1e-30))
                if close(scale * summed, target):
                    return ("sum",) + (("mul",) if abs(scale - 1) > 1e-4 else ()), [node]
        return None

    def _mean_of_a_norm(self, op, window):
        """`op` is each channel's mean over the positions of a group or layer normalisation
        of an earlier (batch, channels, *positions) value: (m_c - m_g) / sqrt(v_g + eps), from
        the channel's mean m_c and its group's mean and variance, the normalised value never
        made. Named as the norm and the mean (`group_norm sum mul`), read from the value. An
        adversary fused KernelBench L2 23's and 27's GroupNorm and mean into that closed form
        from moments. Tried only where the target's channels average to zero in each group,
        as such means do."""
        target = op.value
        if target.dim() < 2 or canonical(op)[-1:] not in (["mul"], ["div"], ["add"]) or \
                not 4 <= target[0].numel() <= MEANED_CHANNELS:
            return None  # (batch, channels), its channels in groups, or (batch, channels, 1, 1)
        batch = target.shape[0]
        flat = target.float().reshape(batch, -1)
        channels, largest = flat.shape[1], float(flat.abs().max())
        # groups that each average to zero make rows that do: one pass rules most values out
        # (a 4,096 x 4,096 value had been asked each of its 12 counts, 48 times a reading)
        if float(flat.mean(-1).abs().max()) >= 1e-4 * largest:
            return None
        counts = [g for g in range(1, channels // 2 + 1) if channels % g == 0
                  and float(flat.reshape(batch, g, -1).mean(-1).abs().max()) < 1e-4 * largest]
        if not counts or largest < 1e-6:
            return None
        for node in (n for n in window if n.value.dim() >= 3 and n.value.shape[0] == batch
                     and n.value.shape[1] == channels and n.value.is_floating_point()):
            values = node.value.float().reshape(batch, channels, -1)
            channel_means = values.mean(-1)
            for groups in counts:
                grouped = values.reshape(batch, groups, -1)
                spread = grouped.var(-1, unbiased=False)  # (batch, groups)
                offsets = channel_means.reshape(batch, groups, -1) - grouped.mean(-1, keepdim=True)
                eps = _norm_eps(offsets, flat.reshape(batch, groups, -1), spread)
                if eps is None or eps > MAX_EPS or eps > EPS_SHARE * float(spread.min()):
                    continue  # an eps past the variance would take any scale of centred means for a norm
                self._tested()
                if close((offsets / torch.sqrt(spread[..., None] + eps)).reshape(target.shape), target, 2e-3):
                    name = norm_name(node.value.dim(), tuple(range(1, node.value.dim())), groups if groups > 1 else 0)
                    self.named_reach[op] = {"mul": COUNT}  # a mean over the channels after it is one mean of both
                    return (name, "sum", "mul"), [node]
        return None

    def _squash(self, op):
        """`op` is c * f(a * u + b) + d of an earlier u, f a sigmoid or a tanh, a and b scalars,
        c and d scalars or one per channel, with arithmetic on one side at least: named as the
        one of the two that needs fewer of those maps (tanh(z) = 2 sigmoid(2z) - 1; a tie is a
        sigmoid), each map a `mul` or an `add` where it is no identity. An adversary wrote
        KernelBench L2 70's `s * sigmoid(y)` as `s / 2 * (1 + tanh(y / 2))` (`mul tanh add
        mul` against `sigmoid mul`), and L2 82's `2 tanh(y) + b` as `4 sigmoid(2y) + (b - 2)`.
        Asked at the end of the arithmetic after the function, not inside it."""
        if not self._a_map(op) or self._squash_continues(op):
            return None
        squash = self._variables(op)[0]
        while canonical(squash) not in (["sigmoid"], ["tanh"]):
            if not self._a_map(squash):
                return None
            squash = self._variables(squash)[0]
        argument = self._variables(squash)
        if not argument or len(argument) != 1 or squash.value.shape != op.value.shape:
            return None
        chain = [argument[0]]  # the argument, and the values it is arithmetic of
        while self._a_map(chain[-1]):
            chain.append(self._variables(chain[-1])[0])
        # the earliest value the argument is a map of by scalars (a bias per feature is no scalar)
        # whose maps nothing else reads: folding in a value read elsewhere would hide it
        for source in [*reversed(chain[1:]), chain[0]]:
            inner = (torch.ones(1), torch.zeros(1)) if source is chain[0] else \
                _affine_coefficients(source.value.float(), chain[0].value.float(), None)
            if inner is not None and self._read_only_by(op, source):
                break
        else:
            return None
        outer = next((_along_channels(fit, op.value.dim()) if dim else fit
                      for dim in ((None, 1) if op.value.dim() >= 2 else (None,))
                      if (fit := _affine_coefficients(squash.value.float(), op.value.float(), dim)) is not None), None)
        if outer is None:
            return None
        written = canonical(squash)[0]
        forms = _squash_forms(written, (float(inner[0]), float(inner[1])), outer)
        # a reflection may not bring in a sign a reading cannot show (1 - sigmoid(2u) is no
        # sigmoid(2u), and both would read `mul sigmoid`): only a -1 of a layer's weights, which
        # vanishes into them (`names.canonical_order`), or one it takes away
        negated = [k for k, (_, (_, (a, _), _)) in enumerate(forms) if k >= REFLECTED and abs(a + 1) < 1e-6]
        vanishes = set(negated) if negated and self._takes_a_sign(source) else set()
        kept = [k for k, (_, (_, (a, _), _)) in enumerate(forms) if k < REFLECTED or a > 0 or k in vanishes]
        best = min(kept, key=lambda k: (len(forms[k][0]) - (k >= REFLECTED and forms[k][1][1][0] < 0) - 1,
                                        forms[k][1][0] != "sigmoid"))
        names, (function, (a, b), (c, d)) = forms[best]
        if best == 0 or not close(c * function(a * source.value.float() + b) + d, op.value):
            return None  # as written: its maps are read as the arithmetic they are
        # how far the maps' constants reach, for `names.canonical_order` (the inner ones are
        # scalars), and whether each scale is a sign alone (a negation passes back through a maximum)
        c = torch.as_tensor(c)
        per_channel = c.numel() > 1 or torch.as_tensor(d).numel() > 1
        at = next(k for k, name in enumerate(names) if name in SQUASHES)
        scales = [abs(a)] * ("mul" in names[:at]) + c.abs().flatten().tolist() * ("mul" in names[at + 1:])
        self.named_reach[op] = {"mul": (CHANNEL if per_channel else SCALAR, a > 0 and bool((c > 0).all()),
                                        all(abs(scale - 1) < 1e-4 for scale in scales)),
                                "add": (CHANNEL if per_channel else SCALAR, True)}
        return names, [source]

    def _takes_a_sign(self, source) -> bool:
        """Whether `source` is a product or convolution whose weights nothing else reads: a -1
        after it is its weights' (`names.canonical_order`)."""
        return ends_in_a_layer(self.names(source)) and self._free_weights(source)

    def _read_only_by(self, op, source) -> bool:
        """Whether every value between `source` and `op` is read by `op` or another of them alone."""
        return self._read_alone(self._between(op, source), op)

    def _read_alone(self, between: set, op) -> bool:
        """Whether each value of `between` is read by `op` or another of them alone."""
        return all(self.users.get(node, set()) <= between | {op} for node in between)

    def _a_map(self, node) -> bool:
        """Whether `node` is arithmetic by constants on one variable value of its own shape."""
        reads = self._variables(node)
        return bool(reads) and canonical(node) != [] and self._affine_in_one(node, reads) and \
            reads[0].value.shape == node.value.shape

    def _variables(self, node) -> list | None:
        """What a recorded op reads that varies, or None for a value no op made (an input)."""
        return [n for n in self.inputs[node] if n.variable] if node.target is not None and node in self.inputs else None

    def _squash_continues(self, op) -> bool:
        """Whether arithmetic by constants reads `op` and nothing else does: the map goes on."""
        readers = self.users.get(op, set())
        return len(readers) == 1 and self._a_map(next(iter(readers)))

    def _elementwise(self, op, node) -> str | None:
        target, source = self._sample(op), self._sample(node)
        if node not in self.images:
            self.images[node] = torch.stack([f(source) for _, f in ELEMENTWISE])
        images = self.images[node]
        scale = torch.maximum(images.abs().amax(dim=1), target.abs().max())
        hits = ((images - target).abs().amax(dim=1) <= 2e-4 * scale).nonzero().flatten()
        for hit in hits.tolist():
            name, f = ELEMENTWISE[hit]
            if close(f(node.value.float()), op.value):
                return name
        return self._piecewise_linear(op, node)

    def _composition(self, op, window):
        """`op` is g(h(u)) of an earlier value u, element by element, for two functions of
        ELEMENTWISE, or a clamp of one of them, neither made alone: an adversary wrote
        KernelBench L2 69's `relu(hardswish(y))` as `t (t + 3) / 6 + relu(y - t)` of `t =
        y.clamp(0, 3)`. Read `h g`, in the order they apply. Where two pairs compute the same
        (relu and hardswish commute; softsign(sigmoid(u)) is sigmoid(log_sigmoid(u))), h is the
        earlier of ELEMENTWISE. Tried last, where nothing else names `op`: a single function
        of any earlier value, or a chain whose steps are named one by one, is read as that."""
        target = self._sample(op)
        for node in (n for n in window if n.value.shape == op.value.shape):
            if not self._elementwise_of(op, node):
                continue
            if node not in self.compositions:
                images = torch.stack([f(self._sample(node)) for _, f in ELEMENTWISE])
                self.compositions[node] = images, torch.stack([f(images) for _, f in ELEMENTWISE])
            images, composed = self.compositions[node]
            scale = torch.maximum(composed.abs().amax(dim=2), target.abs().max())
            hits = ((composed - target).abs().amax(dim=2) <= 2e-4 * scale).nonzero().tolist()
            for outer, inner in sorted(hits, key=lambda hit: hit[::-1]):  # the earliest inner function first
                value = ELEMENTWISE[outer][1](ELEMENTWISE[inner][1](node.value.float()))
                if close(value, op.value):
                    return (ELEMENTWISE[inner][0], ELEMENTWISE[outer][0]), [node]
            low, high = target.min(), target.max()
            clamped = images.clamp(low, high)
            for inner in ((clamped - target).abs().amax(dim=1) <= 2e-4 * target.abs().max()).nonzero().flatten().tolist():
                if name := _piecewise(ELEMENTWISE[inner][1](node.value.float()), op.value.float()):
                    return (ELEMENTWISE[inner][0], name), [node]
            if names := self._composition_of_three(op, node, composed):
                return names, [node]
        return None

    def _composition_of_three(self, op, node, composed) -> tuple | None:
        """`op` as f(g(h(u))) of `node`'s u for three functions of ELEMENTWISE (`_composition`'s
        pairs `composed`, on the samples): a red team wrote `sigmoid(tanh(softplus(y)))` in one
        closed form whose intermediates are no function of the catalog (`1 / (1 + exp(-1) exp(2
        / ((1 + e^y)^2 + 1)))`). Tried on every TRIPLE_STRIDE-th sample first (the 2,744 triples
        of 512 samples would cost more than a reading), then in full, the earliest functions first."""
        if node not in self.triples:
            heads = composed[..., ::TRIPLE_STRIDE]
            self.triples[node] = torch.stack([f(heads) for _, f in ELEMENTWISE])  # (outer, middle, inner, samples)
        tripled = self.triples[node]
        target = self._sample(op)[::TRIPLE_STRIDE]
        scale = torch.maximum(tripled.abs().amax(dim=3), target.abs().max())
        hits = ((tripled - target).abs().amax(dim=3) <= 2e-4 * scale).nonzero().tolist()
        for outer, middle, inner in sorted(hits, key=lambda hit: hit[::-1])[:TRIPLES_TRIED]:
            value = node.value.float()
            for k in (inner, middle, outer):
                value = ELEMENTWISE[k][1](value)
            if close(value, op.value, TRIPLE_TOLERANCE):
                return tuple(ELEMENTWISE[k][0] for k in (inner, middle, outer))
        return None

    def _times_a_function_of_it(self, op, node, factors: list) -> str | None:
        """The function f where a product `op` is u * f(u) of `node`'s u, however its factors
        are grouped: an adversary wrote KernelBench L2 26's `y * hardswish(y)` as `y * y *
        hardsigmoid(y)` (`mul hardsigmoid mul` against `hardswish mul`). u is one of the
        product's factors and the others are made of it: `exp(x) sigmoid(x)` equals
        `u softsign(u)` of u = exp(x), and is no function of exp(x) as written."""
        target, source = self._sample(op), self._sample(node)
        if node not in self.images:
            self._elementwise(op, node)
        products = self.images[node] * source
        scale = torch.maximum(products.abs().amax(dim=1), target.abs().max())
        for hit in ((products - target).abs().amax(dim=1) <= 2e-4 * scale).nonzero().flatten().tolist():
            name, f = ELEMENTWISE[hit]
            image = f(node.value.float())
            # a function that is the value itself here is none (a mish of large values, a relu
            # of positive ones): `x * mish(x)` over log-sum-exps is the square it equals
            if not close(image, node.value) and close(image * node.value.float(), op.value) and \
                    all(f is node or self._made_of(f, node) for f in factors):
                return name
        return None

    def _scaled_function_of_it(self, op, node, factors: list) -> str | None:
        """The function f where a product `op` of values all made of `node`'s u element by
        element is c * f(u) for a constant c, f(u) never made alone: an adversary wrote KernelBench L2 59's
        `silu(t) * s` as `s / 2 * t * (1 + tanh(t / 2))` (`sigmoid mul mul` against `silu
        mul`). Read `f mul`, as the function and then its scale."""
        if not all(self._elementwise_of(factor, node) for factor in factors):
            return None
        target = self._sample(op)
        if node not in self.images:
            self._elementwise(op, node)
        images = self.images[node]
        scales = (images * target).sum(1) / (images * images).sum(1).clamp_min(1e-30)
        fitted = scales[:, None] * images
        bound = 2e-4 * torch.maximum(fitted.abs().amax(dim=1), target.abs().max())
        for hit in ((fitted - target).abs().amax(dim=1) <= bound).nonzero().flatten().tolist():
            name, f = ELEMENTWISE[hit]
            image = f(node.value.float())
            scale = float(scales[hit])
            if abs(scale - 1) > 1e-4 and abs(scale) > 1e-6 and not close(image, node.value) \
                    and close(scale * image, op.value):
                # a scalar, as `canonical_order` moves one (past a clamp: the fourth adversary's
                # L2 81, `silu(z) / 2` written `z / (2 + 2 exp(-z))` before its clamp)
                self.named_reach[op] = {"mul": (SCALAR, scale > 0, abs(abs(scale) - 1) < 1e-4)}
                return name
        return None

    def _elementwise_of(self, value, source) -> bool:
        """Whether `value` is made of `source` alone, element by element: every varying value
        between has its shape. A scalar made of the input (a running maximum an op wrote, a
        mean) is no constant, though the product is a multiple of f(u) on one input."""
        frontier, seen = [value], set()
        while frontier:
            node = frontier.pop()
            if node is source or node in seen:
                continue
            if node.target is None or node.index < source.index or node.value.shape != source.value.shape:
                return False
            seen.add(node)
            frontier += [n for n in self.inputs.get(node, []) if n.variable]
        return True

    def _factors(self, op) -> list:
        """The values a product of products multiplies, however grouped, WINDOW ops back at most
        (a chain of 120 products, each asked for its factors, had taken 1.5 times as long to read).
        A square is two of its value, and `op` a product's where it scales one by a number: an
        adversary wrote KernelBench L2 26's `y * hardswish(y)` as `y.square() * relu6(y + 3) / 6`.
        Any other product of one varying value is a factor as it is (`y = x * w` of a weight
        `w`, in `y * hardswish(y)`, is y, not x)."""
        factors, frontier = [], [op]
        while frontier:
            node = frontier.pop()
            reads = self._variables(node)
            square = _squares(node)
            one_of_two = reads and len(reads) == 1 and (square or node is op and _scales_by_a_number(node))
            if canonical(node) == ["mul"] and reads and (len(reads) == 2 or one_of_two) and node not in self.named \
                    and node.index >= op.index - WINDOW:
                frontier += reads * 2 if square else reads
            else:
                factors.append(node)
        return factors

    def _made_of(self, node, source) -> bool:
        """Whether `node` is computed from `source`."""
        seen, frontier = set(), [node]
        while frontier:
            current = frontier.pop()
            if current is source:
                return True
            if current in seen or current.target is None or current.index < source.index:
                continue
            seen.add(current)
            frontier += self.inputs.get(current, [])
        return False

    def _piecewise_linear(self, op, node) -> str | None:
        """relu, leaky relu and the clamps (hardtanh, relu6), however they are written."""
        target, source = self._sample(op), self._sample(node)
        if not (close(source.clamp(target.min(), target.max()), target) or _leaky(source, target)):
            return None
        return _piecewise(node.value.float(), op.value.float())

    def _bound_of_two(self, op, window):
        """`op` is the maximum or minimum of two earlier values, up to a positive scale, written
        through arithmetic: (u + v + |u - v|) / 2, relu(u - v) + v, where(u > v, u, v), or the two
        stacked and reduced (`stack([u, v]).amax(0)`) (an adversary wrote KernelBench L2 55's max pooling of two features, then a sum, as half
        the sum of `a + b + |a - b|`). Read `maximum` or `minimum` of the two, or the pooling
        it is where they are a value's windows; a scale other than 1 is a `mul` after it."""
        ends = self._written_bound_ends(op)
        if ends is None:
            return None
        target = op.value.float()
        for u, v in itertools.combinations(ends, 2):
            if self._same(u, v):
                continue  # a bound of a value and itself is no bound (`sign(y) * |y|`, F.lp_pool's, is y)
            for name, bound in (("maximum", torch.maximum), ("minimum", torch.minimum)):
                scale = _positive_scale(bound(self._sample(u), self._sample(v)), self._sample(op))
                if scale is None or not close(scale * bound(u.value.float(), v.value.float()), target):
                    continue
                scaled = ("mul",) if abs(scale - 1) > 1e-4 else ()
                if scaled and self._scaled_by_its_reader(op):
                    return None  # `(a + b + |a - b|) * 0.5`: read at the scale, which the bound is
                pooled = self._pool(op, window, scale, written=[name]) if name == "maximum" else None
                return ((pooled[0] + scaled), pooled[1]) if pooled else ((name,) + scaled, [u, v])
        # the maximum of a value and 0: what an `abs` or a `where` walked through reads
        spellings = (node for node in self._bound_walk(op)[0] if _name(node) in ("abs", "where"))
        arguments = dict.fromkeys(n for spelling in spellings for n in self._variables(spelling))
        return next(filter(None, (self._relu_of_one(op, u) for u in arguments if u.value.shape == op.value.shape)),
                    None)

    def _relu_of_one(self, op, u):
        """`op` is c relu(u), c > 0, written through arithmetic (an adversary's L2 63, relu and a
        division as `(v + |v|) / (2 d)`: the maximum of v and 0, scaled). Not where v is nowhere
        negative: a relu of it is v (F.lp_pool's `sign(y) relu(|y|)` of a pooled square)."""
        if not bool((u.value < 0).any()):
            return None
        scale = _positive_scale(torch.relu(self._sample(u)), self._sample(op))
        if scale is None or not close(scale * torch.relu(u.value.float()), op.value.float()):
            return None
        scaled = ("mul",) if abs(scale - 1) > 1e-4 else ()
        return None if scaled and self._scaled_by_its_reader(op) else (("relu",) + scaled, [u])

    def _scaled_by_its_reader(self, op) -> bool:
        readers = self.users.get(op, set())
        reader = next(iter(readers)) if len(readers) == 1 else None
        return reader is not None and _name(reader) in ("mul", "div", "true_divide") and self._variables(reader) == [op]

    def _bound_walk(self, op) -> tuple[set, list]:
        """(the ops a bound written at `op` is made of: the arithmetic and its spellings up to
        BOUND_DEPTH back; the values of `op`'s shape they read besides)."""
        walked, frontier, ends = set(), [(op, 0)], []
        while frontier:
            node, depth = frontier.pop()
            if node in walked:
                continue
            walked.add(node)
            for read in self.inputs[node]:
                if read.target is not None and read.variable and depth < BOUND_DEPTH \
                        and _name(read) in BOUND_WALKED:
                    frontier.append((read, depth + 1))
                elif read.variable and read.value.shape == op.value.shape and read.value.is_floating_point():
                    ends.append(read)
        return walked, ends

    def _written_bound_ends(self, op) -> list | None:
        """The values a bound written through `abs`, `relu` or `where` could be of: what the
        few ops before `op` read, where one of them is such an op (every other op is asked
        nothing: two of every earlier value would be too many)."""
        walked, ends = self._bound_walk(op)
        if BOUND_SPELLINGS.isdisjoint(_name(n) for n in walked):
            return None
        # a scale walked through may make an end: max(u, 0.5 w) written out reads 0.5 w, not w
        scaled = [n for n in walked if n is not op and _name(n) in BOUND_SCALES and len(self._variables(n)) == 1
                  and n.value.shape == op.value.shape]
        ends = list(dict.fromkeys(n for n in ends + scaled if (n not in walked or n in scaled) and n not in self.absorbed))
        return ends if 1 <= len(ends) <= BOUND_ENDS else None  # one: its maximum with 0 (`_relu_of_one`)

    def _reduction(self, op, window, reductions):
        """A log-sum-exp, maximum or minimum of an earlier value along one dimension, however
        written (an adversary's minimum as `-amax(-t)` read `mul max mul`)."""
        target = op.value.float()
        for node in (n for n in window if n.value.dim() in (target.dim(), target.dim() + 1)):
            source = node.value.float()
            for dim, keep in _reduced_to(source, target):
                for name, reduce in reductions:
                    if (not _apart(*_end_fibres_reduced(source, target, dim, reduce))
                            and close(reduce(source, dim, keepdim=keep), target)
                            and (name == "logsumexp" or self._only_signs_between(op, node))):
                        return (name,), [node]
        return None

    def _only_signs_between(self, op, source) -> bool:
        """Whether `op` reaches `source` through maxima, minima and scales alone (a minimum
        written -amax(-t)): a relu before a maximum equals it on most values, and is no part
        of it (a red team's relu(x).amax(1) read `max`)."""
        between = self._between(op, source)
        return self._read_alone(between, op) and all(_name(n) in SIGNS_AND_MAXIMA or not canonical(n) for n in between)

    def _pool(self, op, window, scale: float = 1.0, written: list | None = None):
        """`op` is an average or a maximum over windows of an earlier value's spatial
        dimensions, whatever computes it: a pooling layer, unfold and a mean, a convolution by
        a constant kernel one channel at a time, slices of a padded value and their maximum (a
        dilated window). Named as the pooling layer (`avg_pool2d`), or as the mean or maximum
        over those dimensions where one window covers them all (what an adaptive pool to 1
        and `x.mean((2, 3))` read as). A (rows, features) value is pooled along its features,
        as F.max_pool1d of `x.unsqueeze(1)` is (a red team wrote it `x.view(B, F // 2, 2).amax(-1)`)."""
        name = written or canonical(op)
        flat = op.value.dim() == 2
        image = (lambda value: value[:, None]) if flat else (lambda value: value)
        target = image(op.value) / scale if scale != 1 else image(op.value)
        spatial = target.dim() - 2
        # a matrix product writes no pooling (a Linear from a width to its half, over (batch,
        # sequence, width) values, was asked every setting of every earlier value of its shape).
        # A layout op may: F.avg_pool1d is a 2-D pooling of a view, and the view back reads it.
        if spatial not in (1, 2, 3) or not target.is_floating_point() or "mm" in name:
            return None
        # a row's features are pooled by a maximum or a sum of a view alone: asked of every 2-D
        # op that narrows a value, a red team's 120 slices took 77 s to read
        if flat and FLAT_POOL_ENDS.isdisjoint(name):
            return None
        # a pooling that keeps the size (stride 1, padded) is asked only of what can write one:
        # every op of that shape would be asked otherwise
        same_size = not POOL_ENDS.isdisjoint(name) or any(map(is_convolution, name))
        # either may hold its channels last, (batch, *positions, channels): adversaries' block
        # maxima of permuted views, one read by a product before any permute back
        candidates = [(t, node, x, last) for node in window if node.value.dim() == op.value.dim()
                      and node.value.is_floating_point()
                      for x, t, last in ([(image(node.value), target, False)] if flat else
                                         _pooled_layouts(node.value, target, lambda node=node: self._channels_last(node)))
                      if x.shape[:2] == t.shape[:2] and (same_size or x.shape[2:] != t.shape[2:])]
        for target, node, x, channels_last in candidates:
            for kind, kernel, stride, padding, dilation in _pool_settings(x.shape[2:], target.shape[2:]):
                # one channel of one sample rules most settings out, in microseconds: only what
                # passes it counts against the contractions a reading may try
                try:
                    if not close(_pooled(kind, x[:1, :1], kernel, stride, padding, dilation), target[:1, :1], 1e-4):
                        continue
                except RuntimeError:  # a window wider than the padded value (an adversary's 3-D task raised here)
                    continue
                self._tested()
                if close(_pooled(kind, x, kernel, stride, padding, dilation), target, 1e-4):
                    # one window over all of it (a maximum's padding, where its window spans it, reads nothing)
                    if all(n == 1 for n in target.shape[2:]) and (not padding or (kind == "max" and close(
                            x.amax(tuple(range(2, x.dim())), keepdim=True), target))):
                        if kind == "avg":  # a mean over every position
                            self.named_reach[op] = {"mul": COUNT}
                        return (("sum", "mul") if kind == "avg" else ("max",)), [node]
                    if not padding:
                        self.unpadded_pools.add(op)
                    if channels_last:
                        self.channels_last_pools.add(op)
                    return (f"{kind}_pool{spatial}d",), [node]
        return None

    def _channels_last(self, node) -> bool:
        """Whether `node` holds a (batch, channels, *positions) value as (batch, *positions,
        channels): walked back up to CHANNELS_LAST_STEPS ops of one varying input, through
        permutes, transposes and movedims (whose axes are followed), reshapes and slices (a
        run of them keeps the first axis and the last where it keeps their sizes), and ops
        that keep the shape, to a value whose channels are the last axis, whose batch the
        first, and whose positions the rest (the seventh adversary's L2 11 ran a BatchNorm1d
        over NHWC pixel rows, viewed back as (n, h, w, c), and took 2 x 2 maxima; a red
        team's (h, n, w, c) and (n, h, c, w) of a square image are no such value)."""
        top = tuple(node.value.shape)  # the shape `axes` are axes of
        axes = list(range(len(top)))  # `node`'s axis i is axis axes[i] of that (None: lost in a reshape)
        for _ in range(CHANNELS_LAST_STEPS):
            variables = self._variables(node)
            if not variables or len(variables) != 1 or not isinstance(variables[0].value, torch.Tensor):
                return False
            below, shape = variables[0], tuple(node.value.shape)
            order = _axis_order(node, below)
            if order is not None:
                axes = _axes_through_reshapes(axes, top, shape)
                if axes is None:
                    return False
                axes = [order[axis] if axis is not None else None for axis in axes]
                top = tuple(below.value.shape)
                if axes[-1] == 1 and axes[0] == 0 and set(axes[1:-1]) <= set(range(2, len(top))) | {None}:
                    return True
            elif not (_name(node) in RESHAPES | KEEP_AXES or
                      tuple(below.value.shape) == shape and _name(node) not in LAYOUT_ONLY):
                return False
            node = below
        return False

    # -- affine maps of one earlier value ----------------------------------------------------

    def _affine(self, op, window):
        """`op` is a * x + b of an earlier x, with a and b scalars or one per index of one
        dimension, and at least two ops between: eval batch norm as scale and shift, scalar
        arithmetic in several steps."""
        if canonical(op) not in (["add"], ["mul"]):
            return None
        target = op.value.float()
        for node in (n for n in window if n.value.shape == target.shape and n.index < op.index - 1):
            between = self._private_between(op, node)
            if between is None or len(between) < 1:
                continue
            source = node.value.float()
            for dim in (None, *range(target.dim())):
                fit = _fit_affine(source, target, dim)
                if fit is not None:
                    return fit, [node]
        return None

    def _quadratic(self, op, window):
        """`op` is a x^2 + b x + c of an earlier x, with a, b and c scalars or one per channel,
        made by arithmetic alone (at least two ops): named in Horner's form, `(a x + b) x + c`,
        each map a `mul` or an `add` where it is no identity. However a product is distributed
        over a sum, the polynomial is one: KernelBench L2 20's `((y + b) + y) * y + y` and an
        adversary's `y * (2 y + b + 1)` both read `mul add mul`."""
        if canonical(op) not in (["add"], ["mul"]):
            return None
        target = op.value.float()
        for node in (n for n in window if n.value.shape == target.shape and n.index < op.index - 1):
            between = self._arithmetic_between(op, node)
            if not between or not any(self._products_of(n) for n in between | {op}):
                continue
            source = node.value.float()
            for dim in (None, 1) if target.dim() >= 2 else (None,):
                fit = _quadratic_fit(source, target, dim)
                if fit is not None:
                    self.quadratics.add(op)
                    return fit, [node]
        return None

    def _products_of(self, node) -> bool:
        """Whether `node` multiplies two values that vary (x times x, or times x + b), or is a
        polynomial that does."""
        return node in self.quadratics or node not in self.named and canonical(node) == ["mul"] and \
            sum(1 for n in self.inputs[node] if n.variable) + (_name(node) in ("pow", "square")) >= 2

    def _arithmetic_between(self, op, source) -> set | None:
        """The variable ops between `source` and `op`, if each adds or multiplies (an affine
        map named so too) and nothing else reads them; None otherwise."""
        between, frontier = set(), list(self.reads[op] if op in self.named else self.inputs[op])
        while frontier:
            node = self._resolve(frontier.pop())  # a clone of a value is the value
            if node is source or node in between or not node.variable or node.target is None:
                continue
            names = self.named.get(node, canonical(node))
            if node.index < source.index or not names or not set(names) <= {"add", "mul"}:
                return None
            between.add(node)
            frontier.extend(self.reads[node] if node in self.named else self.inputs[node])
        return between if self._read_alone(between, op) else None

    def _between(self, op, source, made_constant: bool = False) -> set:
        """The variable ops `op` reached `source` through (and those whose values these inputs
        made constant, `made_constant`: what a replay of the map runs again)."""
        between, frontier = set(), list(self.inputs[op])
        while frontier:
            node = frontier.pop()
            if node is source or node in between or node.target is None or node.index < source.index \
                    or not (node.variable or made_constant and node in self.made_constant):
                continue
            between.add(node)
            frontier.extend(self.inputs[node])
        return between

    def _private_between(self, op, source) -> set | None:
        """The variable ops between `source` and `op`, if nothing else reads them (folding
        them into one affine map must not swallow a value something else also uses)."""
        between, frontier = set(), list(self.inputs[op])
        while frontier:
            node = frontier.pop()
            if node is source or node in between or not node.variable or node.target is None:
                continue
            if node.index < source.index or node in self.named:
                return None  # `op` reads a variable value from before `source`, or one already named
                # (affine maps of affine maps are chained in the sequence: `_chain_affine_maps`)
            between.add(node)
            frontier.extend(self.inputs[node])
        return between if self._read_alone(between, op) else None

    # -- linear maps of one value, solved for their weights ---------------------------------------

    def _linear_map(self, op):
        """`op` is a convolution of one earlier value, written as a run of linear ops of it that
        joins what one layer computes: partial products of it added or stacked and summed (a
        Conv3d as per-depth Conv2d, nine shifted einsums), or a product of its windows (unfold
        and a matrix product, depth taps stacked into channels). Solved for its weights from the
        values (filters/computation/linear.py) and named as that convolution (`convolution_names`),
        read from the value. Asked once per run, where it ends: at a join, a product, a sum or
        a reshape that no later one continues. What the run made inside is absorbed unless
        something else reads it (a side use of a partial sum then still reads it)."""
        run = self._linear_run(op)
        if not run.composed or len(run.leaves) != 1:
            return None
        source = next(iter(run.leaves))
        if not isinstance(source.value, torch.Tensor) or source.value.dim() < 3:
            return None
        biased = self._biases_a_solved_map(op)
        if not (joins_a_layer(op) or biased):
            return None
        if _name(op) in LAYOUT_ONLY and self._reshapes_a_solved_map(op) or self._run_goes_on(op, source):
            return None  # a reshape of what was solved, or a join the next one takes in
        # its channels where a layer puts them, or last (an adversary's patches contracted into
        # (batch, *positions, channels))
        found = next((fit for image in _layouts(op.value.float())
                      if (fit := solve_convolution(source.value.float(), image, self._solved)) is not None), None)
        if found is None or (biased and found.bias is None):
            return None
        self.linear_maps[op] = found
        inside = self._between(op, source)
        if any(user not in inside and user is not op for node in inside for user in self.users.get(node, ())):
            self.shared_runs.add(op)  # a value inside is read elsewhere too: it stays where that reads it
        setting = found.setting
        name = convolution_names(found.convolved, found.weight, found.image, setting.stride, setting.padding,
                                 setting.dilation, 1, found.bias is not None, transposed=False)
        return tuple(name), [source]

    def _solved(self) -> None:
        """Count one linear map solved (a least-squares fit of up to UNKNOWNS unknowns, tens of
        ms): past LINEAR_SOLVES in one reading the task is untraced, as past CONTRACTION_TESTS,
        so that a task cannot spend them on decoys before the map it hides."""
        self.linear_solves += 1
        if self.linear_solves > LINEAR_SOLVES:
            raise TraceTooLong(f"more than {LINEAR_SOLVES} linear maps to solve")

    def _run_goes_on(self, op, source) -> bool:
        """Whether an op that reads `op` joins the same run further (the next partial sum,
        the next reshape): solved there, once, not at each step."""
        for user in self.users.get(op, ()):
            # a sum of the run goes on only as a join of stacked parts, which a sum over
            # positions is not: it is asked here too
            if joins_a_layer(user) and _name(user) not in SUMS and linear_step(user) and all(
                    self._linear_run(node).leaves == {source} for node in self.inputs[user] if node.variable):
                return True
        return False

    def _reshapes_a_solved_map(self, op) -> bool:
        """Whether `op` reshapes (through layout ops alone) a value solved as a convolution."""
        return self._solved_below(op, LAYOUT_ONLY) is not None

    def _solved_below(self, op, through) -> object:
        """The convolution solved at the value `op` reads through ops named in `through`
        alone, each of one variable input; None where there is none."""
        node = op
        while _name(node) in through and len(variables := self._variables(node) or []) == 1:
            node = self._resolve(variables[0])
            if node in self.linear_maps:
                return self.linear_maps[node]
        return None

    def _biases_a_solved_map(self, op) -> bool:
        """Whether `op` adds a constant to a convolution solved without a bias (reshaped or
        not), which nothing else reads: the map's own bias, as a Conv2d's is (an adversary
        added KernelBench L2 25's bias after unfold and a matrix product). Solved again there."""
        if _name(op) not in JOINS or sum(getattr(arg, "variable", False) for arg in op.args[:2]) != 1:
            return False
        below = self._solved_below(op, LAYOUT_ONLY | JOINS)
        return below is not None and below.bias is None

    def _linear_run(self, op) -> LinearRun:
        """The run of linear ops `op` ends (`LinearRun`), each op's found once: the ops are
        read in the order they ran, so what an op reads is found before it."""
        if op in self.linear_runs:
            return self.linear_runs[op]
        pending = [op]
        while pending:
            node = pending[-1]
            step = linear_step(node)  # a model input is none
            parts = [n for n in self.inputs[node] if n.variable and n not in self.linear_runs] if step else []
            if parts:
                pending.extend(parts)
                continue
            pending.pop()
            self.linear_runs[node] = LinearRun.of(node, [self.linear_runs[n] for n in self.inputs[node] if n.variable]
                                                  if step else None)
        return self.linear_runs[op]

    # -- contractions with a weight -------------------------------------------------------------

    def _contraction(self, op, window):
        name = canonical(op)
        if op.value.dim() < 2 or (name and is_convolution(name[-1])):
            return None
        weights = self._depends_on(op, 2)
        if name and name[-1] == "mm":  # a product is one, unless its weight holds a bias too
            return self._matmul(op, window, weights, homogeneous=True)
        if name and name[-1] in CONTRACTION_ENDS or not name:
            found = self._matmul(op, window, weights)
            if found:
                return found
        return self._convolution(op, window, weights) if 3 <= op.value.dim() <= 5 else None

    def _bias_of_a_convolution(self, op):
        """`op` adds a bias per channel to a convolution, through at most BIAS_STEPS ops of it
        alone (scales and shifts by constants, reshapes, copies), each read by the next alone: the
        convolution's own bias, as a layer's is (convolution names carry none), and a negation
        on the way its weights' sign. Only where what `op` holds is the convolution, or its
        negation, plus a constant per channel (a scale by anything else stays: folded into the
        weights, it is a policy). A convolution that has a bias already takes this one into it,
        as a Linear's biases read one `add` however many are added: KernelBench's
        `ConvTranspose2d(x) + bias` and a red team's `ConvTranspose2d(bias=False)(x) + (bias +
        b0)` are one map. A plain convolution with its bias is found again by `_convolution`
        too; a transposed one, or a convolution's input gradient, is not (the seventh
        adversary's L2 91 wrote a ConvTranspose2d as torch.nn.grad.conv2d_input plus a bias; a
        red team's `b - conv_transpose2d(x, -w)`, an addcmul and a bias added to the flattened
        positions)."""
        node, added, chain = op, False, []
        for _ in range(BIAS_STEPS):
            variables = self._variables(node) or []
            names = canonical(node)
            # arithmetic, or a reshape: a norm's scale and shift are its own (51 took KernelBench
            # L3 24's train-mode BatchNorm2d after a bias-free 1x1 convolution for a bias)
            if len(variables) != 1 or not set(names) <= {"add", "mul"} or \
                    _name(node) not in BIAS_ARITHMETIC | RESHAPES | COPIES:
                return None
            added |= "add" in names
            conv = variables[0]
            if _a_convolution(conv):
                break
            if conv in self.named or self.users.get(conv) != {node}:
                return None
            node = conv
            chain.append(node)
        else:
            return None
        if not added or conv in self.named or self.users.get(conv) != {node} or conv.value.dim() < 3 or \
                op.value.numel() != conv.value.numel():
            return None
        held = op.value.float().reshape(conv.value.shape)
        for sign in (1.0, -1.0):
            shift = held - sign * conv.value.float()
            per_channel = shift[:1, :, *(slice(0, 1),) * (shift.dim() - 2)]
            if close(shift, per_channel.expand_as(shift), 1e-3):
                image = [n for n in self.inputs[conv] if n.variable and n.value.dim() == conv.value.dim()]
                if len(image) != 1:
                    return None
                self.bias_steps |= set(chain)  # spelled by the convolution named at `op`
                return tuple(canonical(conv)), image
        return None

    def _centred(self, op, window):
        """`op` is s * (u - mean(u)) of an earlier (batch, channels, *positions) u, the mean over
        its positions and s a constant per channel: u centred over its positions, scaled. A
        shift per channel before a centring is nothing after it, and a scale per channel passes
        through it, so a convolution's bias and a norm's scale and shift before the centring
        are the scale after it. Read `sum mul add` (the mean taken away) from the earliest such
        u, whatever s is: a scale after the centring joins its affine tail in the sequence
        (`_chain_affine_maps`), as it does where the centring and the scale are written apart.
        The seventh adversary's L2 15 dropped KernelBench's ConvTranspose3d bias and
        BatchNorm3d shift, which the centring cancels, and scaled after it (`... sum mul add
        mul` against `... mul add sum mul add`)."""
        if canonical(op) != ["add"] or op.value.dim() < 3 or op.value[0, 0].numel() < 2:
            return None
        if op.value.shape[0] < 2:
            return None  # one sample: a scale of each sample its own (a gate) would fit as a constant
        target = op.value.float()
        positions = tuple(range(2, target.dim()))
        across = (0, *positions)
        means = target.mean(positions).abs()
        if float(means.max()) > 1e-4 * max(float(target.abs().max()), 1e-30):
            return None  # not centred: asked of every add, this is most of them, at one mean
        for node in (n for n in window if n.value.shape == target.shape and n.index < op.index - 1):
            between = self._between(op, node)
            if not between or not self._read_alone(between, op) or not self._reads_only(op, between | {node}) or \
                    not all(self._centring_step(n, node, between, target) for n in between):
                continue
            source = node.value.float()
            centred = source - source.mean(positions, keepdim=True)
            power = (centred * centred).sum(across)
            if float(power.min()) <= 1e-12 * max(float(power.max()), 1e-30):
                continue  # a channel constant over its positions: any scale of it is zero
            scale = ((target * centred).sum(across) / power).view(1, -1, *(1,) * len(positions))
            if close(scale * centred, target):
                return ("sum", "mul", "add"), [node]
        return None

    def _centring_step(self, node, source, between: set, target) -> bool:
        """Whether `node`, between `source` and the centred value, may be a step of `_centred`:
        reading `source` and the steps alone (and constants), and arithmetic (an eval norm's
        scale and shift too), a reshape or copy, or a sum or mean that keeps each sample's
        channels apart. Anything else is a scale that may vary with the input: a
        statistic of the batch or of a whole sample, a gain computed from the input before
        `source` was (a red team's sigmoid of a Linear of the batch's mean, the same in every
        sample, read as a constant), an input."""
        if not self._reads_only(node, between | {source}):
            return False
        names = self.named.get(node, canonical(node))
        if _name(node) in RESHAPES | COPIES or names and set(names) <= {"add", "mul"}:
            return True
        return names[:1] == ["sum"] and set(names[1:]) <= {"mul"} and node.value.shape[:2] == target.shape[:2]

    def _reads_only(self, node, among: set) -> bool:
        return all(read in among for read in self.inputs[node] if read.variable)

    def _tested(self) -> None:
        """Count one contraction tried (a value against a weight, or a convolution's
        settings): past CONTRACTION_TESTS in one reading, the task is untraced. A red team's
        250 adds of 40 constant weights tried 1.2 million, and took 14 s to read."""
        self.contraction_tests += 1
        if self.contraction_tests > CONTRACTION_TESTS:
            raise TraceTooLong(f"more than {CONTRACTION_TESTS} contractions to try")

    def _depends_on(self, op, ndim: int) -> list:
        """The constants (weights, and what is made of them) and model inputs `op` depends on
        with at least `ndim` dimensions (exactly 1 for `ndim` 1: a bias): a product of two
        inputs is a GEMM too."""
        seen, frontier, found = set(), list(op.inputs) + list(op.leaves), []
        while frontier:
            node = frontier.pop()
            if node in seen:
                continue
            seen.add(node)
            if (node.target is None or not node.variable) and isinstance(node.value, torch.Tensor) \
                    and (node.value.dim() == 1 if ndim == 1 else node.value.dim() >= ndim):
                found.append(node)
            if node.target is not None and node.index >= op.index - WINDOW:
                frontier.extend(node.inputs + node.leaves)
        return found

    def _matmul(self, op, window, weights, homogeneous: bool = False):
        """("mm",) where `op` is a product of an earlier value by a weight, ("mm", "add") where it
        is one plus a bias: a bias the op adds (`acc = b; acc = acc + x_j @ w_j`, a bias first,
        then partial products), or a weight's row that reads a column of ones (`cat([x, 1]) @
        [w; b]`, homogeneous coordinates: `homogeneous`, asked of a product op). A bias the op
        adds is one of the constants it depends on: a value the same in every row that a
        model input makes (`x @ w + x.mean(0)`) is no bias. Asked only of an add of two values
        that vary: a product plus a bias is read as written, `mm` then `add`, and taking it in
        again would leave the product unspelled in one reading and not the other."""
        target = op.value.float()
        # an add of two varying values, or a product added to one (`addmm(acc, x_j, w_j)`: an
        # adversary's split-K GEMM accumulated partial products so)
        sums_two = canonical(op)[-1:] == ["add"] and sum(1 for n in self.inputs[op] if n.variable) >= 2
        biases = [b.value.float() for b in self._depends_on(op, 1) if b.value.shape[-1] == target.shape[-1]] \
            if sums_two and not homogeneous else []
        for node in (n for n in window if n.value.dim() >= 2):
            a = node.value.float()
            for weight in weights:
                if weight is node:
                    continue
                w = weight.value.float()
                # a stack of slabs is one matrix of their rows: partial products of a value's
                # feature blocks summed (an adversary's `bmm(chunks, slabs).sum(0)` of a Linear)
                # (blocks taken in order, or strided: `x[:, i::4]`). Made only where `a` has as
                # many columns (or one fewer: homogeneous): the strided one is a copy, and a 16 x
                # 512 x 8,192 weight's, made for each earlier value, took 135 s of a reading
                rows = math.prod(w.shape[:-1])
                stacked = () if w.dim() < 3 or a.shape[-1] not in (rows, rows - 1) else \
                    (w.reshape(-1, w.shape[-1]), w.transpose(0, 1).reshape(-1, w.shape[-1])) if w.dim() == 3 \
                    else (w.reshape(-1, w.shape[-1]),)
                for b in (w, w.mT, *stacked):
                    for product, bias in _affine_products(a, b, biases, homogeneous):
                        found = self._is_product(a, product, bias, target)
                        if found is not None:
                            return ("mm",) + ("add",) * (not isinstance(found, float)), \
                                [node] + ([weight] if weight.variable else [])
        return None

    def _is_product(self, a: torch.Tensor, b: torch.Tensor, biases: list, target: torch.Tensor):
        """The bias (0.0 for none) where target is a @ b plus one of `biases` or none, up to
        dimensions of 1 in its shape (a broadcast product of blocks and slabs summed over the
        blocks keeps one: `(x.view(n, 4, 1, 4) @ slabs).sum(1)`); else None. One test,
        whatever the biases: each is compared with what a corner of the product leaves."""
        shape = _matmul_shape(a, b) if a.shape[-1] == b.shape[-2] else ()
        if not shape or _without_ones(shape) != _without_ones(target.shape):
            return None
        t = target.reshape(shape)
        self._tested()
        rows, columns = slice(0, 3), slice(0, 16)  # a corner first: a weight can be 8192 x 8192
        corner = a[..., :1, :] @ b[..., columns]
        bias = next((bias for bias in [0.0, *biases] if close(
            corner + (bias if isinstance(bias, float) else bias[..., columns]), t[..., :1, columns], 1e-3)), None)
        # every row: a task can fake the corner alone
        if bias is not None and close(a[..., rows, :] @ b + bias, t[..., rows, :], 1e-3) and close(a @ b + bias, t, 1e-3):
            return bias
        return None

    def _convolution(self, op, window, weights):
        """A convolution of 1 to 3 spatial dimensions of an earlier value by a weight, whatever
        computes it (unfold, sliding windows of `Tensor.unfold` and a product, shifted products)."""
        rank, vectors = op.value.dim(), [n.value.float() for n in self._depends_on(op, 1)]
        for target, weight, node in ((t, w, n) for t in _layouts(op.value.float()) for w in weights
                                     if w.value.dim() == rank and w.value.shape[0] == t.shape[1]
                                     for n in window if n.value.dim() == rank and n.value.shape[0] == t.shape[0]):
            w = weight.value.float()
            biases = [None] + [vector for vector in vectors if vector.shape == (target.shape[1],)]
            x = node.value.float()
            if x.shape[1] % w.shape[1]:
                continue
            groups = x.shape[1] // w.shape[1]
            if w.shape[0] % groups:
                continue  # no grouped convolution of these (a red team's 6 of 8 channels raised here)
            for stride, padding, dilation in _conv_settings(x, w, target):
                self._tested()
                if groups == 1 and not _one_channel_fits(x, w, target, stride, padding, dilation):
                    continue  # one output channel, up to its bias, rules most settings out
                for bias in biases:
                    got = _convolved(x[:1], w, bias, stride, padding, dilation, groups)
                    # then every sample: a task can convolve the first alone
                    if close(got, target[:1], 1e-3) and close(_convolved(x, w, bias, stride, padding, dilation,
                                                                         groups), target, 1e-3):
                        name = convolution_names(x, w, target, stride, padding, dilation, groups, bias is not None,
                                                 transposed=False)
                        return tuple(name), [node]
        return None


TRIPLE_STRIDE = 16  # `_composition_of_three` tries every 16th of a value's samples first
TRIPLES_TRIED = 8  # and at most 8 triples that pass there in full
# a tenth of `close`'s: among 2,744 triples a closed form a little off finds one (a red team's
# log(3.005 + e^u) read as three softplus)
TRIPLE_TOLERANCE = 2e-5
POOL_ENDS = frozenset({"sum", "max", "avg_pool1d", "avg_pool2d", "avg_pool3d"})  # and any convolution
FLAT_POOL_ENDS = frozenset({"sum", "max", "maximum"})  # amax, max, sum and mean of a (rows, windows, width) view,
# and torch.maximum of its slices
# what a maximum or minimum of two is written through: arithmetic, or the two stacked and
# reduced by amax or amin (not max, min or sort: their indices are recorded as their values, and
# a red team's `stack([u, v]).max(0).indices` read `maximum`)
BOUND_SPELLINGS = frozenset({"abs", "relu", "where", "amax", "amin"})
BOUND_WALKED = BOUND_SPELLINGS | {"add", "sub", "mul", "div", "neg", "gt", "lt", "ge", "le", "stack"}
BOUND_SCALES = frozenset({"mul", "div", "neg"})  # an end may be a scale of a value (max(u, 0.5 w))
SUM_DEPTH = 8  # views, sums and maps by constants walked from a sum back to the convolution it sums
SUMMED_MAPS = frozenset({"mul", "div", "add", "sub"})  # the maps by a constant it walks through (the value first)
BOUND_DEPTH = 4  # ops back from a written bound to the values it bounds: (u + v + |u - v|) / 2 is 4 deep
BOUND_ENDS = 6  # values a written bound may be of: two, and what else those few ops read
POOL_KERNELS = range(2, 9)  # the windows a pooling written out is tried with (KernelBench's: 2 to 4)


CHANNELS_LAST_STEPS = 32  # ops back from a pooled value to the permute that put its channels last
BIAS_STEPS = 4  # ops from a bias back to the convolution it is of (`b - (-conv(x))` is two)
BIAS_ARITHMETIC = frozenset({"add", "sub", "rsub", "mul", "div", "true_divide", "neg", "addcmul"})
KEEP_AXES = frozenset({"slice", "clone", "contiguous", "detach", "alias", "to_copy"})  # what they read, cut or copied
POOL_DILATIONS = (2, 3)  # a maximum's spaced windows tried (KernelBench's: 2 and 3)


def _a_convolution(node) -> bool:
    return _name(node) in ("convolution", "convolution_backward")


def _squares(node) -> bool:
    """Whether `node` is `u ** 2` of a value u."""
    return _name(node) == "pow" and _scalar(node.args, 1) == 2


def _scales_by_a_number(node) -> bool:
    """Whether `node` multiplies or divides a value by a Python number."""
    return _name(node) in ("mul", "div") and _scalar(node.args, 1) is not None


def _pool_settings(size, pooled):
    """(kind, kernel, stride, padding, dilation) of a square average or maximum pooling that
    turns a `size` image into a `pooled` one, the common ones first: a window as wide as its
    stride, then a stride of 1 or 2, padded by at most half the window, then a maximum's
    spaced windows; and one window over the whole."""
    if all(n == 1 for n in pooled) and len(set(size)) == 1:
        yield from (("avg", size[0], size[0], 0, 1), ("max", size[0], size[0], 0, 1))
    # windows side by side, of any width the sizes give (a red team's 11 x 11 average, written
    # as a reshape and a mean, was past the widths tried below)
    side = size[0] // pooled[0] if pooled[0] else 0
    if side > POOL_KERNELS[-1] and all(n // side == m for n, m in zip(size, pooled)):
        yield from (("avg", side, side, 0, 1), ("max", side, side, 0, 1))
    for dilation in (1, *POOL_DILATIONS):
        for kernel in POOL_KERNELS:
            for stride in dict.fromkeys((kernel, 1, 2)):
                for padding in range(kernel // 2 + 1):
                    span = dilation * (kernel - 1) + 1
                    if all((n + 2 * padding - span) // stride + 1 == m for n, m in zip(size, pooled)):
                        kinds = ("avg", "max") if dilation == 1 else ("max",)  # an average has no dilation
                        yield from ((kind, kernel, stride, padding, dilation) for kind in kinds)


SQUASHES = {"sigmoid": torch.sigmoid, "tanh": torch.tanh}
REFLECTED = 2  # `_squash_forms`: the written function, the other, then the two reflected


def _squash_forms(written: str, inner: tuple, outer: tuple) -> list:
    """[(names, (function, (a, b), (c, d)))] of c * f(a * u + b) + d as a sigmoid and as a tanh,
    the `written` one's maps first, then each of the two reflected: tanh(z) = 2 sigmoid(2z) - 1,
    sigmoid(z) = (1 + tanh(z / 2)) / 2, sigmoid(z) = 1 - sigmoid(-z), tanh(z) = -tanh(-z)
    (`1 - sigmoid(u)` is `sigmoid(-u)`: a red team's sigmoid of a layer as one minus the
    sigmoid of its weights negated read `sigmoid mul add` against `sigmoid`)."""
    (a, b), (c, d) = inner, outer
    if written == "tanh":
        forms = [("tanh", (a, b), (c, d)), ("sigmoid", (2 * a, 2 * b), (2 * c, d - c))]
    else:
        forms = [("sigmoid", (a, b), (c, d)), ("tanh", (a / 2, b / 2), (c / 2, d + c / 2))]
    reflected = {"sigmoid": lambda a, b, c, d: ((-a, -b), (-c, c + d)), "tanh": lambda a, b, c, d: ((-a, -b), (-c, d))}
    forms += [(name, *reflected[name](*inner, *outer)) for name, inner, outer in forms]
    return [(_affine_names(*inner) + (name,) + _affine_names(*outer), (SQUASHES[name], inner, outer))
            for name, inner, outer in forms]


def _along_channels(fit: tuple, ndim: int) -> tuple:
    """(a, b) fitted one per index of dimension 1, shaped to multiply a value of `ndim` dimensions."""
    return tuple(t.reshape((1, -1) + (1,) * (ndim - 2)) for t in fit)


def _affine_names(scale, shift) -> tuple:
    scale, shift = torch.as_tensor(scale), torch.as_tensor(shift)
    scaled = bool((scale - 1).abs().max() > 1e-4)
    shifted = bool(shift.abs().max() > 1e-4 * (1 + float(scale.abs().max())))
    return ("mul",) * scaled + ("add",) * shifted


def _positive_scale(bound: torch.Tensor, target: torch.Tensor) -> float | None:
    """c > 0 where target = c * bound on these samples, or None."""
    nonzero = bound.abs() > 1e-6 * (1 + float(bound.abs().max()))
    if not bool(nonzero.any()):
        return None
    scale = float((target[nonzero] / bound[nonzero]).median())
    return scale if scale > 0 and math.isfinite(scale) and close(scale * bound, target) else None


def _pooled(kind: str, x: torch.Tensor, kernel: int, stride: int, padding: int, dilation: int = 1) -> torch.Tensor:
    if kind == "avg":
        pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[x.dim() - 2]
        return pool(x.float(), kernel, stride, padding)
    pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[x.dim() - 2]
    return pool(x.float(), kernel, stride, padding, dilation)


def _dim_tests(target: torch.Tensor, an_exp: bool = False) -> list:
    """(name, test of a source) for what `target` could be along its dimensions: softmax,
    log-softmax, the normalisations. Asked of one fibre of the target first (sums to one,
    mean 0 and variance up to 1), so that most ops have no test to run on their sources."""
    tests = _softmax_tests(target, an_exp)
    for dim in range(target.dim()):
        if target.shape[dim] < 2:
            continue
        fibre = _fibre(target, (dim,))
        if abs(float(torch.logsumexp(fibre, 0))) < 1e-4 and _normalised(target, (dim,), 0, "log_softmax"):
            tests.append((("log_softmax",), lambda source, dim=dim: close(torch.log_softmax(source, dim), target)))
    normalised = [(dims, groups) for dims, groups in _norm_dims(target)
                  if _normalised(_group_view(target, groups) if groups else target, (2,) if groups else dims, 0, "norm")]
    # a norm in g groups looks normalised in every count that divides g as well: the finest
    # are tried (a red team's sign pattern looked normalised in all 120 of its counts)
    grouped = sorted((found for found in normalised if found[1]), key=lambda found: -found[1])
    for dims, groups in [found for found in normalised if not found[1]] + grouped[:GROUP_COUNTS_TRIED]:
        tests.append(((norm_name(target.dim(), dims, groups),),
                      lambda source, dims=dims, groups=groups: _is_norm_of(source, target, dims, groups)))
    return tests


def _softmax_tests(target: torch.Tensor, an_exp: bool = False) -> list:
    """Softmax along one dimension or the trailing ones from any (an adversary's spatial
    softmax over (2, 3, 4) unflattened), and softmax times a constant of the other dimensions,
    the same in every sample (its gain per channel folded into the normaliser: `softmax mul`)."""
    if not target.numel() or target.min() < 0:
        return []
    tests, ndim = [], target.dim()
    for dims in [(d,) for d in range(ndim)] + [tuple(range(first, ndim)) for first in range(1, ndim - 1)]:
        total = float(_fibre(target, dims).sum())
        if all(target.shape[d] < 2 for d in dims) or total <= 0:
            continue
        if abs(total - 1) < 1e-4 and _normalised(target, dims, 0, "softmax"):
            tests.append((("softmax",), lambda source, dims=dims: close(_softmax(source, dims), target)))
        elif ndim >= 2 and (gain := _constant_sums(target, dims)) is not None:
            tests.append((("softmax", "mul"), lambda source, dims=dims, gain=gain: close(_softmax(source, dims) * gain,
                                                                                      target)
                          and not (an_exp and _same_normaliser_in_every_sample(source, dims))))
    return tests


SOFTMAX_SPREAD = 1e-2  # how far a gained softmax's values are apart, against its largest, at least


def _softmax(source: torch.Tensor, dims: tuple) -> torch.Tensor:
    shifted = (source - source.amax(dims, keepdim=True)).exp()
    return shifted / shifted.sum(dims, keepdim=True)


def _same_normaliser_in_every_sample(source: torch.Tensor, dims: tuple) -> bool:
    """Whether the sums of exp(source) along `dims` are the same in every sample: a softmax of
    it times them is exp(source) itself, and an exp op of values whose sums barely vary read
    `softmax mul` of its own input (the seventh adversary's L2 91 wrote a sigmoid as
    exp(-softplus(-u)), of a u that barely varied at the small problem). Asked of an exp op
    alone: a softmax written out and scaled ends in its division, and a clamped value's sums
    over 4,096 positions barely vary either (the sixth adversary's L2 38 had read `exp sum
    mul mul`)."""
    normaliser = torch.logsumexp(source.float(), dims, keepdim=True)
    return close(normaliser, normaliser[:1].expand_as(normaliser))


def _constant_sums(target: torch.Tensor, dims: tuple) -> torch.Tensor | None:
    """The sums of `target` along `dims` where they are positive and the same in every one of
    two samples at least (a constant of the other dimensions), and the values vary along
    `dims`, else None. Any positive value is a softmax times its own sums: at a batch of one
    every exp read `softmax mul` (a red team's), and so did a value within `close`'s
    tolerance of a constant (1 + 0.001 tanh(x))."""
    if 0 in dims or target.shape[0] < 2:
        return None
    sums = target.sum(dims, keepdim=True)
    first, fibre = sums[:1], _fibre(target, dims)
    if float(fibre.max() - fibre.min()) < SOFTMAX_SPREAD * float(fibre.max()):
        return None
    return first if float(first.min()) > 0 and close(sums, first.expand_as(sums)) else None


def _piecewise(source: torch.Tensor, target: torch.Tensor) -> str | None:
    """relu, a clamp or a leaky relu that makes `target` of `source`, or None."""
    low, high = target.min(), target.max()
    # values within `close`'s tolerance of one constant are no clamp's: clustered far from
    # zero (a batch's log-sum-exps, 5.01 to 5.02), forty times them is them clamped to its
    # own range (a disguised L2 42's `* 4.0` read `clamp` on the H100). A clamp that passes
    # no value through is still one where values meet both bounds (relu6 of `x * 1e6`).
    spread = float(high - low) > 2e-4 * float(torch.maximum(low.abs(), high.abs()))
    if spread and close(source.clamp(low, high), target):
        return "relu" if abs(float(low)) <= 1e-6 and float(source.max()) <= float(high) else "clamp"
    return "leaky_relu" if _leaky(source, target) else None


def _leaky(source: torch.Tensor, target: torch.Tensor) -> bool:
    negative = source < -1e-3
    if not negative.any() or negative.all():
        return False
    slope = (target[negative] / source[negative]).median()
    return bool(0 < slope < 1) and close(torch.where(source > 0, source, slope * source), target)


def _fibre(target: torch.Tensor, dims) -> torch.Tensor:
    """The values along `dims` at index 0 of every other dimension (a view: no copy)."""
    return target[tuple(slice(None) if d in dims else 0 for d in range(target.dim()))]


def _normalised(view: torch.Tensor, dims, _groups, kind: str) -> bool:
    """What `kind` makes along `dims` holds of the first fibre, then of the whole: sums to
    one (softmax), log-sum-exp zero (log-softmax), mean 0 and variance up to 1, under it by the eps (a norm)."""
    if all(view.shape[d] == 1 for d in dims):
        return False
    for part in (_fibre(view, dims).unsqueeze(0), view):
        along = tuple(range(1, part.dim())) if part is not view else dims
        if kind == "softmax":
            ok = part.min() >= 0 and (part.sum(along) - 1).abs().max() < 1e-4
        elif kind == "log_softmax":
            ok = torch.logsumexp(part, along).abs().max() < 1e-4 if len(along) == 1 else \
                torch.logsumexp(part.flatten(1), 1).abs().max() < 1e-4
        else:
            mean, var = part.mean(along), part.var(along, unbiased=False)  # under 1 by the eps
            ok = mean.abs().max() < 1e-3 and var.min() > 1e-3 and var.max() < 1 + 1e-2
        if not ok:
            return False
    return True


def _norm_dims(target: torch.Tensor):
    """(dimensions, groups) a normalisation of a tensor of this shape could work along."""
    ndim = target.dim()
    for first in range(1, ndim):
        yield tuple(range(first, ndim)), 0
    if ndim >= 3:
        yield (0, *range(2, ndim)), 0
    if ndim >= 2:  # a group norm of features alone (after a Linear) has groups too
        channels = target.shape[1]
        for groups in range(2, channels):
            if channels % groups == 0:
                yield tuple(range(1, ndim)), groups


def _group_view(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x.reshape(x.shape[0], groups, -1)


GROUP_COUNTS_TRIED = 3
MAX_EPS = 1e-2  # the largest eps a normalisation is taken to add to the variance


def _norm_eps(offsets: torch.Tensor, target: torch.Tensor, spread: torch.Tensor) -> float | None:
    """The eps with target = offsets / sqrt(spread + eps) per group, read where the group's
    offsets are largest, or None where no such eps is."""
    weight = offsets.square().sum(-1)  # (batch, groups)
    reached = target.square().sum(-1)
    if float(reached.min()) <= 0:
        return None
    eps = weight / reached - spread
    largest = int(weight.reshape(-1).argmax())
    return max(float(eps.reshape(-1)[largest]), 0.0)


def _is_norm_of(source: torch.Tensor, target: torch.Tensor, dims, groups) -> bool:
    """`target` is `(source - mean) / sqrt(var + eps)` along `dims` (or in `groups`), for
    one eps in [0, MAX_EPS] whatever it is (1e-5, 1e-6, 1e-12: every library and hand has
    its own; on a small variance it decides the value). The eps is read off the fibre of
    least variance, where it weighs most, and the whole is then checked with it."""
    along = (2,) if groups else dims
    view = _group_view(source, groups) if groups else source
    mean, var = view.mean(along, keepdim=True), view.var(along, unbiased=False, keepdim=True)
    reached = (_group_view(target, groups) if groups else target).var(along, unbiased=False, keepdim=True)
    if reached.min() <= 0:
        return False
    least = int(var.reshape(-1).argmin())
    eps = max(float(var.reshape(-1)[least] * (1 / reached.reshape(-1)[least] - 1)), 0.0)
    return eps <= MAX_EPS and close(((view - mean) / torch.sqrt(var + eps)).reshape(source.shape), target, 2e-3)


def _corner(source: torch.Tensor, dim) -> tuple:
    """Every index of `dim` and the first four of each other dimension: a fit tried there first."""
    return tuple(slice(None) if d == dim else slice(0, 4) for d in range(source.dim()))


def _rows_along(source: torch.Tensor, target: torch.Tensor, dim) -> tuple:
    """`source` and `target` as rows to fit one function each: one row (dim None), or one per
    index along `dim`."""
    if dim is None:
        return source.reshape(1, -1), target.reshape(1, -1)
    return (source.movedim(dim, 0).reshape(source.shape[dim], -1),
            target.movedim(dim, 0).reshape(target.shape[dim], -1))


def _quadratic_fit(source: torch.Tensor, target: torch.Tensor, dim) -> tuple[str, ...] | None:
    """Horner's names for target = a source^2 + b source + c, a, b and c scalars (dim None) or
    one per index along `dim`, fitted by least squares (on a corner first); None where no such
    a, b and c fit, or a is zero (an affine map: `_affine`)."""
    corner = _corner(source, dim)
    if _quadratic_coefficients(source[corner], target[corner], dim) is None:
        return None
    fit = _quadratic_coefficients(source, target, dim)
    if fit is None:
        return None
    a, b, c = fit
    scale = float(target.abs().max())
    if float(a.abs().max()) < 1e-4:
        return None
    return ("mul",) * (not close(a, torch.ones_like(a))) + ("add",) * bool(b.abs().max() > 1e-4 * scale) + \
        ("mul",) + ("add",) * bool(c.abs().max() > 1e-4 * scale)


def _quadratic_coefficients(source: torch.Tensor, target: torch.Tensor, dim) -> tuple | None:
    x, y = _rows_along(source, target, dim)
    if x.shape[1] < 8:
        return None
    ordered = x.sort(1).values
    if int((ordered[:, 1:] != ordered[:, :-1]).sum(1).min()) < 3:
        return None  # any function of a value of three levels (in any one channel) is a quadratic of it
    x, y = x.double(), y.double()
    square = x * x
    # the normal equations of each index's least squares, 3 x 3 (a solve over every element costs more)
    moments = torch.stack([square * square, square * x, square, x, torch.ones_like(x)], -1).sum(1)  # x^4 .. x^0
    gram = torch.stack([moments[:, 0:3], moments[:, 1:4], moments[:, 2:5]], 1)
    right = torch.stack([(y * square).sum(1), (y * x).sum(1), y.sum(1)], -1)
    try:
        a, b, c = torch.linalg.solve(gram, right).unbind(-1)
    except RuntimeError:  # singular: a value of two levels, say, is no quadratic to fit
        return None
    fitted = a[:, None] * square + b[:, None] * x + c[:, None]
    return (a.float(), b.float(), c.float()) if close(fitted.float(), y.float()) else None


def _fit_affine(source: torch.Tensor, target: torch.Tensor, dim) -> tuple[str, ...] | None:
    """("mul", "add") when target = a * source + b, with a and b scalars (dim None) or one
    per index along `dim`; the fitted a and b decide which of the two it needs. Fitted on a
    corner of the tensors first (every index of `dim`, a few of each other dimension)."""
    corner = _corner(source, dim)
    if _affine_fit(source[corner], target[corner], dim) is None:
        return None
    return _affine_fit(source, target, dim)


def _affine_fit(source: torch.Tensor, target: torch.Tensor, dim) -> tuple[str, ...] | None:
    fit = _affine_coefficients(source, target, dim)
    if fit is None:
        return None
    a, b = fit
    scaled, shifted = not close(a, torch.ones_like(a)), bool(b.abs().max() > 1e-4 * target.abs().max())
    return ("mul",) * scaled + ("add",) * shifted or None


def _affine_coefficients(source: torch.Tensor, target: torch.Tensor, dim) -> tuple | None:
    """(a, b) with target = a * source + b, scalars (dim None) or one per index along `dim`."""
    x, y = _rows_along(source, target, dim)
    if x.shape[1] < 4:
        return None
    xm, ym = x.mean(1, keepdim=True), y.mean(1, keepdim=True)
    var = ((x - xm) ** 2).mean(1, keepdim=True)
    if (var < 1e-8).any():
        return None
    a = ((x - xm) * (y - ym)).mean(1, keepdim=True) / var
    b = ym - a * xm
    return (a, b) if close(a * x + b, y) else None


def affine_reach(source: torch.Tensor, target: torch.Tensor) -> tuple | None:
    """(SCALAR or CHANNEL, whether the scale is positive, whether it is 1 or -1) where
    `target` is an affine map of `source` by constants the same at every position: scalars,
    or one per channel."""
    if source.numel() != target.numel() or not source.is_floating_point():
        return None
    source = source.reshape(target.shape)  # a view between (`[:, None]`) is the same value
    for reach, dim in ((SCALAR, None), (CHANNEL, 1)):
        if dim is not None and target.dim() < 2:
            continue
        fit = _affine_coefficients(source.float(), target.float(), dim)
        if fit is not None:
            return reach, bool((fit[0] > 0).all()), bool(((fit[0].abs() - 1).abs() < 1e-4).all())
    return None


REDUCTIONS = (("logsumexp", torch.logsumexp), ("max", torch.amax), ("min", torch.amin))
# what may lie between a maximum and the value it is of: signs, maxima, and a sort (the fibre's
# largest is its sorted last: a red team's `sort(1).values[:, -1]` read `sort max`)
SIGNS_AND_MAXIMA = frozenset({"neg", "mul", "amax", "amin", "max", "min", "sort"})


def _reduced_to(source: torch.Tensor, target: torch.Tensor):
    """(dim, keepdim) for each dimension of `source`, 2 long at least, whose reduction has
    `target`'s shape."""
    keep = source.dim() == target.dim()
    for dim in range(source.dim()):
        reduced = list(source.shape)
        reduced[dim:dim + 1] = [1] if keep else []
        if tuple(reduced) == tuple(target.shape) and source.shape[dim] >= 2:
            yield dim, keep


def _end_fibres_reduced(source: torch.Tensor, target: torch.Tensor, dim: int,
                        reduce=torch.logsumexp) -> tuple[torch.Tensor, torch.Tensor]:
    """`reduce` along `dim` of the first and the last fibre of `source`, and the two elements
    of `target` they would be (`_reduction` rules most candidates out on these)."""
    ends = [tuple(slice(None) if d == dim else end for d in range(source.dim())) for end in (0, -1)]
    reduced = torch.stack([reduce(source[index], 0) for index in ends])
    kept = [tuple(i for d, i in enumerate(index) if d != dim or source.dim() == target.dim()) for index in ends]
    return reduced, torch.stack([target[tuple(0 if isinstance(i, slice) else i for i in index)] for index in kept])


def _affine_products(a: torch.Tensor, b: torch.Tensor, biases: list, homogeneous: bool):
    """(weight, biases) a @ weight + one of the biases or none might be, b read as a product's
    weight: b with `biases` (unless `homogeneous`); b's rows less its first or last, where it
    has one more row than a has columns, with that row as the bias."""
    if not homogeneous:
        yield b, biases
    if b.dim() == 2 and b.shape[0] == a.shape[-1] + 1:
        yield b[:-1], [b[-1]]
        yield b[1:], [b[0]]


def _matmul_shape(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """The shape of a @ b, or () when the batch dimensions do not broadcast (in Python:
    torch.broadcast_shapes cost a third of a matrix product's recognition)."""
    batch = []
    for x, y in itertools.zip_longest(reversed(a.shape[:-2]), reversed(b.shape[:-2]), fillvalue=1):
        if x != y and 1 not in (x, y):
            return ()
        batch.insert(0, y if x == 1 else x)
    return (*batch, a.shape[-2], b.shape[-1])


def _without_ones(shape) -> tuple:
    return tuple(n for n in shape if n != 1)


def _layouts(value: torch.Tensor) -> list[torch.Tensor]:
    """What a layer of a (batch, channels, *positions) value made: as it is, and, where it has
    two or three positions, held (batch, *positions, channels) (its channels moved back to the
    second dimension). One position is not: a (batch, channels, length) value's channels are
    not told from its length, and a maximum of channel pairs (maxout) read as a pooling."""
    return [value] + ([value.movedim(-1, 1)] if value.dim() >= 4 and value.shape[-1] != value.shape[1] else [])


def _axes_through_reshapes(axes: list, top: tuple, shape: tuple) -> list | None:
    """`axes` (of a value of shape `top`) as axes of what a run of reshapes and slices made it
    from, of `shape`: the same where the shapes are; else its first and last axes alone, where
    their sizes are kept (a row-major reshape keeps them), and None where they are not."""
    if shape == top:
        return axes
    if len(shape) < 2 or shape[0] != top[0] or shape[-1] != top[-1]:
        return None
    ends = {0: 0, len(top) - 1: len(shape) - 1}
    return [ends.get(axis) if axis is not None else None for axis in axes]


def _axis_order(node, below) -> list | None:
    """For a recorded permute, transpose or movedim of `below`: the axis of `below` each of
    its axes is; None for any other op."""
    ndim, name = node.value.dim(), _name(node)
    if below.value.dim() != ndim or len(node.args) < 2:
        return None
    order = list(range(ndim))
    if name == "permute" and isinstance(node.args[1], (list, tuple)) and len(node.args[1]) == ndim:
        return [int(axis) % ndim for axis in node.args[1]]
    if name == "transpose" and len(node.args) >= 3 and all(isinstance(a, int) for a in node.args[1:3]):
        first, second = node.args[1] % ndim, node.args[2] % ndim
        order[first], order[second] = order[second], order[first]
        return order
    if name == "movedim" and len(node.args) >= 3:
        sources, destinations = ([int(a) % ndim for a in arg] if isinstance(arg, (list, tuple)) else [int(arg) % ndim]
                                 for arg in node.args[1:3])
        rest = [axis for axis in order if axis not in sources]
        order = [None] * ndim
        for source, destination in zip(sources, destinations):
            order[destination] = source
        kept = iter(rest)
        return [axis if axis is not None else next(kept) for axis in order]
    return None


def _pooled_layouts(source: torch.Tensor, target: torch.Tensor, channels_last) -> list[tuple]:
    """(source, target, whether the source is read channels last) for each layout a pooling
    of `source` into `target` is tried in: both as they are; the target held channels last,
    its channels the source's; and both held so, for
    three positions (a block maximum of an adversary's channels-last volume), or for two
    where `channels_last()` (a walk, asked only then) says a permute put them last: two of four
    dimensions held so are any two otherwise (a maximum over channels and rows read as one
    over rows and columns)."""
    pairs = [(source, target, False)]
    if target.dim() >= 4 and target.shape[-1] == source.shape[1] != target.shape[1]:
        pairs.append((source, target.movedim(-1, 1), False))
    if source.shape[-1] == target.shape[-1] and (target.dim() == 5 and source.shape[-1] != source.shape[1] or
                                                 channels_last()):
        pairs.append((source.movedim(-1, 1), target.movedim(-1, 1), True))
    return pairs


def _one_channel_fits(x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, stride: int, padding: int,
                      dilation: int) -> bool:
    """Whether the first output channel of the first sample is x convolved by w's first kernel,
    up to a bias."""
    first = _convolved(x[:1], w[:1], None, stride, padding, dilation, 1)
    return close(first, target[:1, :1] - (target[:1, :1] - first).mean(), 1e-3)


def _convolved(x: torch.Tensor, w: torch.Tensor, bias, stride: int, padding: int, dilation: int,
               groups: int) -> torch.Tensor:
    """x convolved by w over its 1 to 3 spatial dimensions."""
    spatial = x.dim() - 2
    return torch.ops.aten.convolution.default(x, w, bias, [stride] * spatial, [padding] * spatial,
                                              [dilation] * spatial, False, [0] * spatial, groups)


def _conv_settings(x: torch.Tensor, w: torch.Tensor, target: torch.Tensor):
    """(stride, padding, dilation) that give a convolution of x by w the target's size."""
    for stride in (1, 2, 3, 4):
        for padding in (0, 1, 2, 3):
            for dilation in (1, 2, 3):
                size = [(n + 2 * padding - dilation * (k - 1) - 1) // stride + 1
                        for n, k in zip(x.shape[2:], w.shape[2:])]
                if tuple(size) == tuple(target.shape[2:]):
                    yield stride, padding, dilation
