"""The recorded ops read from their values (`_Equivalences`): a value equal to an earlier one is
that value, and a run that computes a known function of an earlier value is named as that
function (the recognisers, filters/computation/recognise.py); what the outputs depend on that
the sequence does not spell as itself is `unspelled` (`_Unspelled`).
"""
from __future__ import annotations

import math

import torch
import torch.utils._pytree

from filters.computation.names import (LAYOUT_ONLY, BOUNDING, RESHAPES, named_by_values, _merged_branches, _name, canonical,
                                      convolution_names,
                                      canonical_order, bound_reach, padded_by_convolutions, plain_average, spelled,
                                      CHANNEL, COUNT, ELEMENT_BOUNDS, GENERIC, NORMS, SCALAR, norm_affine_reach,
                                      norm_name, NORM_NAMES)
from filters.computation.linear import LinearRun, names_a_linear_map
from filters.computation.recognise import WINDOW, _Recognisers, _normalised, affine_reach
from filters.computation.record import _Op, _Recorder, _constant_leaves, argument_values
from filters.computation.values import HEAD, SAMPLE, _apart_values, _is_float, _is_numeric, _uniform, close


class _Unspelled:
    """What the sequence of `_Equivalences` leaves unspelled (a part of that class: it reads
    its recorded ops, what it named and what it took for an earlier value)."""

    def unspelled(self, outputs: list) -> list:
        """The named ops the outputs depend on that the sequence does not spell as themselves
        (see op_graph_and_drops), in the order they ran. What the sequence spells is what
        reaches the outputs and varies: read through a value made constant (outputs the same
        whatever the inputs: a relu that zeroes a layer at the small problem), the op that made
        it is left out (KernelBench L2 9 read `mm mul add` so once the subtraction inside its
        affine map counted as spelled)."""
        spelled = {node for node in self._live(outputs) if node.variable}
        reaching, frontier = set(), list(self._makers(outputs))
        while frontier:
            node = frontier.pop()
            if node not in reaching and node.target is not None:
                reaching.add(node)
                frontier.extend(self.inputs[node])
        hidden = [op for op in self.ops if op in reaching and op not in spelled
                  and (op.variable or op in self.made_constant) and canonical(op)]
        structural = self._identities() | self._renamed_composites(hidden, spelled) | \
            self._inside_named_maps(hidden, spelled) if hidden else set()
        left_out = set(hidden) - structural
        # a kernel's zero taps and an image's zero or repeated slices are facts about values, and
        # these sizes' may not be the task's (a red team's 3x3 kernel, zero but for its centre at
        # the small problem alone, read as a Linear there): the convolution is spelled otherwise
        return [op for op in self.ops if op in left_out or (op in spelled and op.variable and named_by_values(op)
                                                              and self.names(op) == canonical(op))]

    def _renamed_composites(self, hidden: list, spelled: set) -> set:
        """Ops left out because the sequence spells them under a reshape: F.instance_norm is a
        batch norm of a reshaped view, reshaped back, F.avg_pool1d a 2-D pooling of an
        unsqueezed view, squeezed back, and a transformer layer's relu of a (rows, width) product
        viewed as (batch, sequence, width) is viewed back; the view back reads as the instance
        norm (the 1-D pooling, the relu) of the input, and spells it. An op of one variable
        input counts so only where it reads as itself (a composite it was recognised as, or
        its own spelling) and a spelled node reached from it through layout ops alone is named
        as the same, read from the same input up to layout ops: nothing it computes is left
        out, at any size. (One in nine of a thousand template tasks were read again at their
        own sizes for an op so left out, and read the same there.)"""
        renamed = set()
        for op in hidden:
            name = tuple(canonical(op))
            # as itself alone: an affine norm whose scale and shift the values took for nothing
            # at the small problem (a weight of 1 + 1e-4 r) may not be so at its own sizes. A
            # product by a uniform constant is a sum at any size (`y @ ones(C, 1)`)
            if _sum_by_a_uniform_product(op, self.named.get(op)):
                name = self.named[op]
            if not op.variable or not name or self.named.get(op, name) != name or len(self.reads[op]) != 1:
                continue
            source = self._layout_root(self.reads[op][0])
            reshaped, frontier = set(), [op]
            while frontier:
                for user in self.users.get(frontier.pop(), ()):
                    if _name(user) in LAYOUT_ONLY and user not in reshaped:
                        reshaped.add(user)
                        frontier.append(user)
            if any(node in spelled and node.variable and _renamed(self.named.get(node), name)
                   and self._layout_root(self.reads[node][0]) is source for node in reshaped):
                renamed.add(op)
        return renamed

    def _inside_named_maps(self, hidden: list, spelled: set) -> set:
        """Ops inside a map the sequence names that spells them, by three rules. Arithmetic inside
        a map named by arithmetic (an affine map, a polynomial): `x * a + b` is `mul add` at its add, its
        mul inside. Where a is 1 the same map is the add alone, and the mul is nothing: two
        readings of one task (its own weights, generic ones) had each left out an op the other
        spelled (an adversary's GroupNorm affine of 2 and 0). And an op of the map's source
        whose names the map's begin with: `softmax(y) * g` is `softmax mul` at its mul where g
        is a constant times the softmax's sums, its softmax inside (KernelBench L2 38's scale
        of ones read `softmax` alone, spread `softmax mul`, and neither reading stood). And the
        steps between a convolution and the bias named its own (`_bias_of_a_convolution`)."""
        inside = set()
        for node in spelled:
            names = tuple(self.named.get(node, ()))
            if not names or len(self.reads[node]) != 1:
                continue
            source = self.reads[node][0]
            if set(names) <= set(AFFINE):
                inside |= {op for op in self._between(node, source) if set(canonical(op)) <= set(names)}
                continue
            # one value varies among what it reads (a convolution's weight may be made by ops)
            inside |= {op for op in self._between(node, source)
                       if (name := tuple(canonical(op))) and names[:len(name)] == name
                       and len(varying := [read for read in self.reads[op] if read.variable]) == 1
                       and self._layout_root(varying[0]) is self._layout_root(source)}
        return (inside | self.bias_steps) & set(hidden)

    def _layout_root(self, node):
        """The node `node` is a reshape of (itself if it is none)."""
        while node.target is not None and _name(node) in LAYOUT_ONLY and len(self.inputs[node]) == 1:
            node = self.inputs[node][0]
        return node

    def _identities(self) -> set:
        """The ops of `sign(y) * |y|` (or `sign(y) * relu(|y|)`, F.lp_pool's), which is y
        whatever y is: left out at every size. The sign and the magnitude count only where
        the product is all that reads them."""
        found = set()
        for product in self.ops:
            if _name(product) != "mul" or len(product.args) < 2 or not all(
                    isinstance(arg, _Op) for arg in product.args[:2]):
                continue
            sign, magnitude = sorted(product.args[:2], key=lambda node: _name(node) != "sign")
            steps = [magnitude]
            if canonical(magnitude) == ["relu"] and isinstance(magnitude.args[0], _Op):
                magnitude = magnitude.args[0]
                steps.append(magnitude)
            if (_name(sign) != "sign" or _name(magnitude) != "abs" or not isinstance(sign.args[0], _Op)
                    or sign.args[0] is not magnitude.args[0]):
                continue
            pattern = {product, sign, *steps}
            found |= {product} | {node for node in pattern - {product} if self.users.get(node, set()) <= pattern}
        return found


class _Equivalences(_Unspelled, _Recognisers):
    """The recorded ops with every run that computes a known function of an earlier value
    named as that function, found by comparing values (the trace ran on real tensors):
    - a value equal to an earlier one (`x * 4 * 0.25`, the batch duplicated and averaged, a
      layout round trip) is that value: the ops between are gone;
    - a value that is a composite of an earlier one (`where(x > 0, x, 0)` is relu,
      `exp(x - logsumexp(x))` softmax, `2 sigmoid(2x) - 1` tanh, a norm in any of its
      written forms) is named as the composite, read from that value;
    - a value that is an affine function of an earlier one, per element or per channel, is
      one multiplication and one addition (eval batch norm as scale and shift, a chain of
      scalar arithmetic);
    - a value that is a matrix product or convolution of an earlier value and a weight
      (`(x[:, None] * w).sum(-1)`, split-K halves added, unfold and a matrix product) is `mm`
      or `convolution`.
    Ops that read no model input (weights and what is made of them) are constants: folded.
    The recognisers are `_Recognisers` (filters/computation/recognise.py) and what the
    sequence leaves unspelled is `_Unspelled`: parts of this class, kept apart by concern."""

    def __init__(self, recorder: _Recorder):
        self.ops, self.made_by = recorder.ops, recorder.made_by
        self.contraction_tests = 0
        self.alias: dict = {}  # op -> the earlier node whose value it is
        self.named: dict = {}  # op -> the names it stands for
        self.inputs: dict = {op: list(op.inputs) + [leaf for leaf in op.leaves if leaf.variable] for op in self.ops}
        self.reads: dict = dict(self.inputs)  # what each op reads once named: the value it is a function of
        self.users: dict = {}
        for op in self.ops:
            for node in self.inputs[op]:
                self.users.setdefault(node, set()).add(op)
        self.absorbed: set = set()  # the inside of a recognised composite: no later value is read from there
        # the inside of an affine map: generic arithmetic folded, so a later value equal to one
        # of these is that value (`(x + b) * 4 * 0.25`: `* 4` folds `x + b` in, `* 0.25` is it)
        self.folded: set = set()
        self.samples: dict = {}
        self.heads: dict = {}
        self.images: dict = {}
        self.compositions: dict = {}  # node -> its samples' ELEMENTWISE images, and their images again
        self.triples: dict = {}  # node -> every TRIPLE_STRIDE-th sample's images by three ELEMENTWISE functions
        self.linear_runs: dict = {}  # op -> the run of linear ops it ends (recognise._linear_run)
        self.linear_maps: dict = {}  # op -> the convolution a run of linear ops was solved at it as
        self.linear_solves = 0
        self.shared_runs: set = set()  # linear maps solved whose inside something else reads too: not absorbed
        self.made_constant: set = set()
        self.leaf_readers: dict | None = None  # a weight (its storage) -> the varying ops that read it, once asked
        self.named_reach: dict = {}  # a composite read with its maps (a squash, a mean) -> how far their constants reach
        self.unpadded_pools: set = set()  # poolings recognised from values whose windows read no padding
        self.channels_last_pools: set = set()  # and those that read their source's channels last
        self.bias_steps: set = set()  # the scales and shifts between a convolution and the bias named its own
        self.quadratics: set = set()  # polynomials named in Horner's form: no affine map, for all their names
        self.through_constants = False
        for op in self.ops:
            if op.variable and _is_float(op.value) and op.value.numel() > 1 and _uniform(op.value):
                op.variable = False  # `zeros_like(x)`, `x * 0`: the same value whatever x is, a constant
                self.made_constant.add(op)
            if op.variable and _is_float(op.value):
                self._recognise(op)

    def sequence(self, outputs: list) -> list[str]:
        live = self._live(outputs)
        nodes = [op for op in self.ops if op in live and op.variable]
        reads = {node: [r for r in (self._resolve(i) for i in self.reads[node]) if r.variable] for node in nodes}
        unspelled = _merged_branches(nodes, lambda n: reads[n], self.names, self._resolve) | \
            padded_by_convolutions(nodes, lambda n: reads[n])
        names = {node: self.names(node) for node in nodes if node not in unspelled}
        self._name_norms_in_their_layout(names)
        _join_split_convolutions([node for node in nodes if node in names], reads, names)
        _join_grouped_halves([node for node in nodes if node in names], reads, names)
        _join_split_products([node for node in nodes if node in names], reads, names)
        ordered_sums: set = set()  # sums made by factoring a difference: their terms keep their order
        _factor_shared_products([node for node in nodes if node in names], reads, names, set(self._makers(outputs)),
                                ordered_sums)
        affine = {node for node in nodes if node in names and self._affine_in_one(node, reads[node])}
        chained = _chain_affine_maps([node for node in nodes if node in names], reads, names, affine)
        _fold_into_products([node for node in nodes if node in names], reads, names, affine)
        ordered = [node for node in _in_canonical_order(nodes, reads, names,
                                                        [self._resolve(node) for node in self._makers(outputs)],
                                                        ordered_sums) if node in names]
        return canonical_order(spelled(ordered, names.get, reads.get,
                                       lambda node, name: self._chained_arithmetic(node, name, affine, reads, chained),
                                       self._pooled_source, self._free_weights, _branch_starts(ordered, reads, names)))

    def _free_weights(self, node) -> bool:
        """Whether the product or convolution `node` (an op, or a run of linear ops read as one)
        is by constants made of weights that no varying op outside it reads: a sign after it
        is then its weights' (`names.canonical_order`). `x @ x.T` has none, and a weight tied
        to another layer is not free (a red team's false positives)."""
        if len(self.reads[node]) != 1:
            return False
        inside = self._between(node, self.reads[node][0]) | {node}
        leaves = set().union(*(_constant_leaves(arg) for op in inside for arg in op.inputs + op.leaves
                               if not arg.variable))
        if not leaves:
            return False
        readers = self._leaf_readers()
        return all(readers.get(leaf, set()) <= inside for leaf in leaves)

    def _leaf_readers(self) -> dict:
        """Each weight's storage -> the varying ops that read it (through constants made of it),
        found once per reading, where a sign first reaches a layer."""
        if self.leaf_readers is None:
            self.leaf_readers = {}
            for op in (op for op in self.ops if op.variable):
                for arg in (arg for arg in op.inputs + op.leaves if not arg.variable):
                    for leaf in _constant_leaves(arg):
                        self.leaf_readers.setdefault(leaf, set()).add(op)
        return self.leaf_readers

    def _pooled_source(self, node) -> tuple:
        """(the value `node` reads as it reads it, whether it is an average with no padding or
        divisor of its own, whether it reads its channels last): a pooling recognised from
        values reads its source in the source's layout; an op reads its first variable argument."""
        if node in self.named:
            source = self.reads[node][0] if len(self.reads[node]) == 1 else None
            return source, node in self.unpadded_pools, node in self.channels_last_pools
        source = next((arg for arg in node.args if isinstance(arg, _Op) and arg.variable), None)
        return source, plain_average(node), False

    def _chained_arithmetic(self, node, name: str, affine: set, reads: dict, chained: dict) -> tuple | None:
        """`_arithmetic` of the map `node` spells, where `_chain_affine_maps` joined later maps
        to it: each scale and shift as far as the widest reach among them, the scales' signs
        multiplied (a shift chained to a mean, `x.mean(1) + b`, had no reach, and stayed
        between two means it passes: a red team's shift between a mean of means)."""
        own = self.names(node)
        if node not in chained or name in own[:len(own) - len(_affine_tail(own))]:
            return self._arithmetic(node, name, affine, reads)  # (a name before the tail too: one reach for both)
        whole: dict = {}
        for part in [node, *chained[node]]:
            for step in _affine_tail(self.names(part)):
                by = self._arithmetic(part, step, affine, reads)
                if step == "mul" and "add" in whole:  # a scale after a shift scales it too
                    whole["add"] = _widest(whole["add"], by and (by[0], True, True))
                whole[step] = _widest(whole[step], by) if step in whole else by
        return whole.get(name)

    def _arithmetic(self, node, name: str, affine: set, reads: dict) -> tuple | None:
        """(how far the constant reaches, whether it is positive) of arithmetic by a constant
        the same at every position (`names.canonical_order`), or None."""
        if name not in GENERIC:
            return None
        if node in self.named_reach:
            return self.named_reach[node].get(name)
        if node not in self.named and _name(node) in ELEMENT_BOUNDS:
            return bound_reach(node)
        if node not in self.named and _name(node) in NORMS and (reach := norm_affine_reach(node, name)):
            return reach
        if node in affine and len(reads[node]) == 1:
            return affine_reach(reads[node][0].value, node.value)
        if node not in self.named and canonical(node) == ["sum", "mul"] and name == "mul":
            return COUNT  # a mean, or an average pooling whose one window is the whole value
        return None

    def constant(self, outputs: list) -> bool:
        """Whether the outputs are the same whatever the inputs, on these values."""
        return not any(node.variable for node in self._live(outputs))

    def _live(self, outputs: list) -> set:
        """The nodes the outputs read, through values that vary: what a value the same
        whatever the inputs are (`made_constant`) reads reaches no output (a `where` that
        is all zeros on the task's own inputs left its comparison spelled as `gt`), unless
        `through_constants` (outputs that are constant: what made them is all there is)."""
        live, frontier = set(), [self._resolve(node) for node in self._makers(outputs)]
        while frontier:
            node = frontier.pop()
            if node not in live and node.target is not None:
                live.add(node)
                if node not in self.made_constant or self.through_constants:
                    frontier.extend(self._resolve(n) for n in self.reads[node])
        return live

    def _affine_in_one(self, node, variables: list) -> bool:
        """Whether `node` is an affine map of the one variable value it reads (`variables`, what
        it reads that varies with the inputs): recognised as one
        from its values, or arithmetic by constants (an eval batch norm's scale and shift too).
        A square, a power and a reciprocal read `mul` too, and a red team's sum of squares of a
        Linear was folded into the Linear as if they were scales."""
        if node in self.named:
            return node not in self.quadratics and set(self.named[node]) <= set(AFFINE)
        name = _name(node)
        if not set(canonical(node)) <= set(AFFINE) or name in POWERS or len(variables) != 1:
            return False
        # a division by the variable is its reciprocal
        return name not in ("div", "true_divide") or not getattr(node.args[1] if len(node.args) > 1 else None,
                                                                 "variable", False)

    def _name_norms_in_their_layout(self, names: dict) -> None:
        """A norm over the trailing dimensions of a (batch, groups, ...) value, read on only
        through a reshape into (batch, channels, ...), is named as the norm of those channels
        it computes: a group norm where each group holds several channels, an instance norm
        where each channel is one (`names.norm_name`). The same blocks of each sample are
        normalised either way; only the layout they are written in differs (an adversary
        wrote KernelBench L2 37's Linear and GroupNorm as an einsum into (batch, groups,
        size) and a norm over its last dimension, flattened at the end: `layer_norm` against
        `group_norm`). A view before the norm is read in its source's layout already (the
        reshape back is found a norm of that source: `_composite`)."""
        for node, named in names.items():
            if named[:1] != ["layer_norm"] or node.value is None or node.value.dim() < 3:
                continue
            layout = None if self._reordered(node) else self._reshaped_reader(node)  # the graph first, then the values
            groups = _normalised_groups(node) if layout is not None else None
            if groups and groups > 1:
                names[node] = [_norm_in_layout(layout.value, groups) or "layer_norm", *named[1:]]

    def _reshaped_reader(self, node):
        """The one reshape of `node`'s value, or of values of its shape made from it (a scale
        and a shift per element, an activation written out), into another layout of its
        batch's samples that everything made from it reaches first; None where something else
        is read, reduced or returned before it. Up to LAYOUT_STEPS ops are followed."""
        shape, reshapes = tuple(node.value.shape), set()
        seen, frontier = {node}, [node]
        while frontier:
            readers = self.users.get(frontier.pop(), set())
            if not readers:
                return None  # returned (or dead) in the norm's own layout
            for reader in readers - seen:
                value = reader.value
                if not isinstance(value, torch.Tensor) or len(seen) > LAYOUT_STEPS:
                    return None
                if _name(reader) in RESHAPES and tuple(value.shape) != shape:
                    reshapes.add(reader)
                elif tuple(value.shape) == shape and _name(reader) not in LAYOUT_ONLY:  # no transpose of a square
                    seen.add(reader)
                    frontier.append(reader)
                else:
                    return None
        layout = next(iter(reshapes)) if len(reshapes) == 1 else None
        same_samples = layout is not None and layout.value.numel() == node.value.numel() and \
            layout.value.dim() >= 2 and layout.value.shape[0] == shape[0]
        return layout if same_samples else None

    def _reordered(self, norm) -> bool:
        """Whether the value `norm` normalises was laid out by a permute or transpose since the
        op that made it: its blocks are then no channels' groups, whatever the reshape after
        (a red team's norm over the channels at each position, NHWC flattened: a group norm
        by the reshape alone)."""
        node = self.reads[norm][0] if norm in self.named and self.reads[norm] else \
            (norm.args[0] if norm.args and isinstance(norm.args[0], _Op) else None)
        while isinstance(node, _Op) and node.target is not None and _name(node) in LAYOUT_ONLY:
            if _name(node) not in RESHAPES and _name(node) not in ("clone", "contiguous", "detach", "alias"):
                return True
            node = node.args[0] if node.args and isinstance(node.args[0], _Op) else None
        return False

    def names(self, node) -> list[str]:
        return list(self.named[node]) if node in self.named else canonical(node)

    def _makers(self, outputs):
        """The nodes the outputs are, as the recorder last joined them: not found by their
        values, which a node holds only for its first output, and a clone of once frozen (a
        red team's second chunk of a layer, and a slice written before a write beside it,
        went unread)."""
        return [self.made_by[id(t)] for t in outputs if id(t) in self.made_by]

    def _resolve(self, node):
        while node in self.alias:
            node = self.alias[node]
        return node

    def _recognise(self, op) -> None:
        """An op equal to an earlier value is that value; else one that computes a known
        function of an earlier value is named as it. A layout op is asked the second first:
        F.instance_norm is a batch norm of a reshaped view, reshaped back (equal to the batch
        norm's value, and an instance norm of the input)."""
        window = self._window(op)
        layout = not canonical(op)
        found = self._composite(op, window) if layout else None
        if found and self._same(op, found[1][0]):  # a relu of what is all positive: nothing at all
            found = None
        bounding = not BOUNDING.isdisjoint(canonical(op))
        same = None if found or bounding else next((node for node in window if self._same(op, node)), None)
        if same is None and not found and not bounding and self.folded:
            same = next((node for node in self._window(op, inside=True) if node in self.folded
                         and self._same(op, node)), None)
        if same is not None and layout and 3 <= op.value.dim() <= 5 and same.value.dim() != op.value.dim():
            # a matrix product reshaped into an image is a convolution when it is one (unfold,
            # a product, reshaped back, with no bias after it to be recognised at)
            found = self._convolution(op, window, self._depends_on(op, 2))
            same = None if found else same
        if not found:  # a run of linear ops of one value that one convolution is (its reshape too)
            found = self._linear_map(op)
            same = None if found else same
        if same is not None and not layout and (top := self._top_of_a_relu(op, same)):
            found, same = top, None
        if same is not None:
            self.alias[op] = same
            return
        found = found or self._composite(op, window) or self._composite_of_inside(op, window) or \
            self._bias_of_a_convolution(op) or self._centred(op, window)
        affine = None if found else self._affine(op, window)
        found = found or affine or self._quadratic(op, window) or self._contraction(op, window)
        if found and found[0] == ("relu",) and self._saturates(op, found[1][0]):
            # a bound is part of what the map computes where these values do not reach it:
            # KernelBench L2 38's clamp(0, 1) read `relu` at the small problem, and an
            # adversary's copy, its weights drawn 2.5 times larger, `clamp`
            found = ("clamp",), found[1]
        if found:
            self.named[op], self.reads[op] = found
            if not names_a_linear_map(found[0]):
                self.linear_runs[op] = LinearRun.of(op, None)  # a function of what it reads: no linear step
            inside = self._between(op, min(found[1], key=lambda n: n.index))
            if op not in self.shared_runs:
                self.absorbed |= inside
            if affine:
                self.folded |= inside

    def _top_of_a_relu(self, op, same):
        """What `op` is where it equals a relu or a clamp of u on these values (`same`), asked
        by `_saturates`: (("clamp",), [u]) where the map from u to `op` has a top (`where(y > 1, 1,
        relu(y))` and `1 - relu(1 - relu(y))` are clamp(y, 0, 1) wherever y passes 1), (("relu",),
        [u]) where the clamp it equals has none any longer (`clamp(y, 0, 1) + relu(y - 1)`, the
        second term zero on these values: a red team's); else None (an alias of `same`)."""
        same = self._resolve(same)
        named = self.named.get(same)
        if named not in (("relu",), ("clamp",)) or len(self.reads.get(same, ())) != 1:
            return None
        source = self.reads[same][0]
        top = self._saturates(op, source)
        if top is None or (named == ("clamp",)) == top:
            return None
        return (("clamp",) if top else ("relu",)), [source]

    @torch.no_grad()
    def _saturates(self, op, source) -> bool | None:
        """Whether the map from `source` to `op`, read as a relu on these values, has a top
        within TOP_REACH of them: its ops run again on the source's values widened TOP_REACH
        times (after a replay of the values as they are gives `op`'s own). A clamp, a hardtanh,
        a relu6, `where(y > 1, 1, relu(y))` or `relu(y) - relu(y - 1)` is a clamp whether or not a
        weight's scale at initialisation takes its values to the top; `y - clamp(y, max=0)` has
        none, nor has `clamp(y, 0, 50) + relu(y - 50)`, whose second term these values make
        constant (a red team's: the replay runs such ops again too), nor a top of 1e30. None
        where the replay cannot tell: it does not give `op`'s value, or reads neither."""
        # the ops from `source` to `op` in the order they ran, those these inputs made constant too
        steps = sorted(self._between(op, source, made_constant=True) | {op}, key=lambda node: node.index)
        if not steps or len(steps) > REPLAYED_STEPS or not _is_float(source.value):
            return None
        try:
            if not close(self._replayed(steps, source, source.value), op.value):
                return None
            widened = source.value.float() * TOP_REACH
            top = self._replayed(steps, source, widened)
        except Exception:  # an op a replay cannot call as recorded (a view written through)
            return None
        if top.shape != widened.shape:
            return None
        if close(top, widened.relu()):
            return False
        return True if close(top, widened.clamp(0, top.max())) else None

    def _replayed(self, steps: list, source, value: torch.Tensor) -> torch.Tensor:
        """The last of `steps` computed again with `source`'s value replaced by `value`: each
        step's target called on its recorded arguments, those made by an earlier step replaced
        by what it made again. Every tensor it hands a step is a copy: an in-place step
        (`relu_`) had written the recorded value of its source."""
        made = {source: value.clone()}

        def again(arg):
            if not isinstance(arg, _Op):
                return arg
            if arg in made:
                return made[arg]
            if arg.variable or arg in self.made_constant or not isinstance(arg.value, torch.Tensor):
                raise ValueError("a step reads a value of the inputs no step made again")
            return arg.value.clone()  # a constant: weights, or what is made of them
        for step in steps:
            if not callable(step.target):
                raise ValueError("a step no op made")
            result = step.target(*torch.utils._pytree.tree_map(again, list(step.args)),
                                 **torch.utils._pytree.tree_map(again, step.kwargs))
            made[step] = result[0] if isinstance(result, (tuple, list)) else result
        return made[steps[-1]]

    def _composite_of_inside(self, op, window):
        """A composite of a value inside an earlier recognised run, when nothing outside is
        one: `tanh(x - s)` written `2 sigmoid(2 (x - s)) - 1` reads `x - s`, which the affine
        map `2 (x - s)` of x took in first; a clamp can take in the value a later tanh reads
        the same way. What the earlier run named is then read by nothing, and the ops up to
        the value read are spelled as they are."""
        inside = self._window(op, inside=True)
        found = self._composite(op, inside) if len(inside) > len(window) else None
        # 2 sigmoid(x) is the 1 + tanh(x / 2) a written sigmoid passes through: equal to a
        # value inside is no composite of it (a relu of what is all positive)
        return None if found is None or self._same(op, found[1][0]) else found

    def _window(self, op, inside: bool = False) -> list:
        """The variable nodes `op` depends on, no more than WINDOW ops back, earliest first;
        a node that is an earlier value's is a candidate too (the batch twice is still twice
        the batch: a matrix product of it has twice the rows). The inside of a recognised
        run is left out unless `inside`."""
        seen, frontier = set(), list(self.inputs[op])
        while frontier:
            node = frontier.pop()
            if node in seen or (node.target is not None and node.index < op.index - WINDOW):
                continue
            seen.add(node)
            if node.target is not None:
                frontier.extend(self.inputs[node])
        return sorted((n for n in seen if n.variable and _is_numeric(n.value) and (inside or n not in self.absorbed)),
                      key=lambda n: n.index)

    def _sample(self, node) -> torch.Tensor:
        if node not in self.samples:
            flat = node.value.detach().reshape(-1).float()
            count = min(flat.numel(), SAMPLE)
            index = torch.arange(count, device=flat.device) * (flat.numel() - 1) // max(count - 1, 1)  # exact: no float rounding
            self.samples[node] = flat[index]
        return self.samples[node]

    def _head(self, node) -> list[float]:
        if node not in self.heads:
            self.heads[node] = self._sample(node)[:HEAD].tolist()
        return self.heads[node]

    def _same(self, op, node) -> bool:
        """`op`'s value is `node`'s: reshaped, or repeated along the batch, or its first block."""
        a, b = op.value, node.value
        if a.numel() == b.numel():
            return not _apart_values(self._head(op), self._head(node)) and close(self._sample(op), self._sample(node)) \
                and close(a.reshape(-1), b.reshape(-1))
        if a.dim() == b.dim() and a.dim() > 0 and a.shape[1:] == b.shape[1:] and a.numel() and b.numel():
            big, small = (a, b) if a.shape[0] > b.shape[0] else (b, a)
            return big.shape[0] % small.shape[0] == 0 and all(close(part, small)
                                                              for part in big.split(small.shape[0]))
        return False


AFFINE = ("mul", "add")
POWERS = frozenset({"pow", "square", "reciprocal"})  # named `mul`, and no scale


TOP_REACH = 1e3  # how far above its values a map read as a relu is asked whether it has a top


REPLAYED_STEPS = 64  # the most recorded ops `_saturates` runs again


def _sum_by_a_uniform_product(op, named: tuple | None) -> bool:
    """Whether `op` is a matrix product one of whose operands is a constant of one value in
    every element, read as the sum it is."""
    return named == ("sum",) and _name(op) in ("mm", "bmm") and any(
        isinstance(arg, _Op) and not arg.variable and _is_float(arg.value) and _uniform(arg.value)
        for arg in op.args[:2])


def _renamed(named: tuple | None, name: tuple) -> bool:
    """Whether a view back that reads as `named` spells an op named `name`: the same name, or a
    norm named again by the layout it is viewed back into (a norm of (batch, groups, size)
    rows, flattened, is a group norm of the whole)."""
    return named == name or bool(named) and len(named) == len(name) == 1 and \
        named[0] in NORM_NAMES and name[0] in NORM_NAMES

def _in_canonical_order(nodes: list, reads: dict, names: dict, outputs: list, ordered_sums: set) -> list:
    """`nodes` (in the order they ran) in an order that what they compute decides alone: each
    after what it reads, each branch whole before the next, and the branches a node reads
    ordered by what they compute, nearest first (`_branch_keys`). Independent branches run in
    either order read alike (`sigmoid(x) + tanh(x)` with the tanh computed first read `tanh
    sigmoid add`)."""
    keys = _branch_keys(nodes, reads, names)
    order, seen = [], set()
    for root in [*outputs, *nodes]:
        stack = [(root, False)]
        while stack:
            node, done = stack.pop()
            if done:
                order.append(node)
            elif node in keys and node not in seen:
                seen.add(node)
                stack.append((node, True))
                commutes = _commutes(node, names) and node not in ordered_sums
                ordered = sorted(reads[node], key=lambda r: keys.get(r, ())) if commutes else reads[node]
                stack.extend((read, False) for read in reversed(ordered))
    return order


COMMUTATIVE = frozenset({"add", "mul", "maximum", "minimum", "fmax", "fmin"})


def _commutes(node, names: dict) -> bool:
    """Whether the values `node` reads may be taken in any order: a sum, a product, a maximum
    of two. Not a difference, a quotient, a product of matrices, a `where` or a `cat`: their
    order of arguments is what they compute (a red team's `sigmoid(x) - tanh(x)` and `tanh(x)
    - sigmoid(x)` read alike). A maximum or minimum of two recognised in its written forms
    commutes as the op does."""
    own = set(names.get(node) or ())
    return own <= COMMUTATIVE and (_name(node) in COMMUTATIVE or bool(own) and own <= {"maximum", "minimum"})


def _branch_starts(ordered: list, reads: dict, names: dict) -> frozenset:
    """The nodes of `ordered` that spell a name and read no value of the node spelled before
    them, through nodes that spell none: where a branch begins (names.BRANCH)."""
    starts, previous = set(), None
    for node in (node for node in ordered if names.get(node)):
        if previous is not None and previous not in _spelled_reads(node, reads, names):
            starts.add(node)
        previous = node
    return frozenset(starts)


def _spelled_reads(node, reads: dict, names: dict) -> set:
    """The nodes spelling a name that `node` reads, through nodes that spell none."""
    found, seen, frontier = set(), set(), list(reads.get(node, ()))
    while frontier:
        read = frontier.pop()
        if read in seen:
            continue
        seen.add(read)
        if names.get(read):
            found.add(read)
        else:
            frontier.extend(reads.get(read, ()))
    return found


BRANCH_KEY_NAMES = 16  # names a branch is ordered by: a change deep in it moves it no more


def _branch_keys(nodes: list, reads: dict, names: dict) -> dict:
    """Each node's key: its names, then its reads' keys in order, up to BRANCH_KEY_NAMES.
    Names, not a digest: two branches alike but for one op keep their order."""
    keys: dict = {}
    for node in nodes:  # in the order they ran: what a node reads has its key already
        below = sorted(keys.get(read, ()) for read in reads[node])
        keys[node] = (tuple(names.get(node, ())) + tuple(name for key in below for name in key))[:BRANCH_KEY_NAMES]
    return keys


def _chain_affine_maps(nodes: list, reads: dict, names: dict, affine: set) -> dict:
    """An affine map of an affine map is one (`names` edited in place): a norm's own scale
    and shift followed by an eval batch norm's reads `mul add` once, as the same arithmetic
    folded by hand does. A map is a node of `affine` arithmetic on one variable value; it
    joins the map that made that value when nothing else reads it, and that map's tail is
    affine (a square reads `mul`, and is no map to join). Returns each map that others joined
    -> those, in order."""
    users = _users(nodes, reads)
    owner: dict = {}  # a node folded into an earlier map -> that map's node
    for node in nodes:
        mine = names[node]
        if not mine or node not in affine or len(reads[node]) != 1:
            continue
        previous = reads[node][0]
        previous = owner.get(previous, previous)
        tail = _affine_tail(names.get(previous, []))
        whole = len(tail) == len(names.get(previous, []))  # nothing but arithmetic: it must be a map itself
        if not tail or len(users.get(reads[node][0], [])) != 1 or (whole and previous not in affine):
            continue
        names[previous] = names[previous][:len(names[previous]) - len(tail)] + \
            [op for op in AFFINE if op in tail or op in mine]
        names[node] = []
        owner[node] = previous
    chained: dict = {}  # a map -> the maps joined to it, in order
    for node, previous in owner.items():
        chained.setdefault(previous, []).append(node)
    return chained


def _normalised_groups(norm) -> int | None:
    """How many blocks of each sample `norm` normalises: the product of the dimensions before
    the ones F.layer_norm was given, or, for a norm recognised from its value, before the
    fewest trailing dimensions its value is normalised over (a norm in g groups looks
    normalised in every coarser count too)."""
    shape = tuple(norm.value.shape)
    if _name(norm) == "layer_norm" and len(norm.args) > 1 and isinstance(norm.args[1], (list, tuple)):
        return math.prod(shape[1:len(shape) - len(norm.args[1])])
    value = norm.value.float()
    for first in range(len(shape) - 1, 0, -1):
        groups = math.prod(shape[1:first])
        if _normalised(value.reshape(shape[0], groups, -1), (2,), 0, "norm"):
            return groups
    return None


LAYOUT_STEPS = 32  # the most same-shaped ops between a norm and the reshape that gives its value channels


def _norm_in_layout(value: torch.Tensor, groups: int) -> str | None:
    """The norm that normalises `groups` contiguous blocks of each sample of a value of
    this (batch, channels, ...) shape, or None where the blocks split channels."""
    ndim, channels = value.dim(), value.shape[1]
    if channels % groups:
        return None
    if channels == groups:
        return norm_name(ndim, tuple(range(2, ndim)))
    return norm_name(ndim, tuple(range(1, ndim)), groups)


def _join_split_convolutions(nodes: list, reads: dict, names: dict) -> None:
    """A sum of two convolutions of one setting, over the two halves of one value's channels
    (by their weights' halves), is one convolution of the whole value (`names` and `reads`
    edited in place): an adversary split KernelBench L2 26's ConvTranspose3d over its input
    channels, `convolution_transpose3d convolution_transpose3d add` against one."""
    users = _users(nodes, reads)
    for node in nodes:
        if names[node] != ["add"] or len(reads[node]) != 2:
            continue
        first, second = reads[node]
        if first is second or any(_name(c) != "convolution" or len(c.args) < 9 or names.get(c) != names.get(first)
                                  or users.get(c) != [node] for c in (first, second)):
            continue
        if first.args[3:9] != second.args[3:9] or first.args[8] != 1:
            continue  # stride, padding, dilation, transposed, output padding, groups
        if _joined_name(first, second, node) == names[first]:
            names[second], names[node], reads[node] = [], [], [first]


def _join_split_products(nodes: list, reads: dict, names: dict) -> None:
    """A sum of two matrix products of the two halves of one value's last dimension, by two
    weights, is one product of the whole value by the weights stacked (`names` and `reads`
    edited in place): an adversary's L2 63 split its GEMM over K into two parameters of its
    own, `mm mm add` against `mm` (a split of one weight's slices is read from the values)."""
    users = _users(nodes, reads)
    for node in nodes:
        if names[node] != ["add"] or len(reads[node]) != 2:
            continue
        first, second = reads[node]
        if first is second or any(_name(p) != "mm" or names.get(p) != ["mm"] or users.get(p) != [node]
                                  or len(p.args) < 2 for p in (first, second)):
            continue
        source = _sliced_from(first.args[0], second.args[0])
        values = [getattr(n, "value", None) for n in (first.args[0], second.args[0], first.args[1], second.args[1])]
        if source is None or not all(isinstance(v, torch.Tensor) for v in values) or \
                getattr(first.args[1], "variable", False) or getattr(second.args[1], "variable", False):
            continue
        (a, b), (u, v) = values[:2], values[2:]
        order = next((k for k, pair in enumerate(((a, b), (b, a))) if pair[0].dim() == pair[1].dim() == 2
                      and torch.equal(torch.cat(pair, -1), source.value)), None)
        if order is None:
            continue
        weight = torch.cat((u, v) if order == 0 else (v, u), 0)
        if close(source.value.float() @ weight.float(), first.value.float() + second.value.float()):
            names[second], names[node], reads[node] = [], [], [first]


def _join_grouped_halves(nodes: list, reads: dict, names: dict) -> None:
    """The two halves of a convolution of two groups' outputs, added, are one convolution of
    the whole value, by each group's weights side by side (`names` and `reads` edited in
    place): a red team's evasion (session 33) of a Conv2d, `convolution2d add` against one."""
    users = _users(nodes, reads)
    for node in nodes:
        if names[node] != ["add"] or len(reads[node]) != 2:
            continue
        halves = reads[node]
        conv = _sliced_from(*halves)
        if conv is None or _name(conv) != "convolution" or len(conv.args) < 9 or conv.args[8] != 2 or conv.args[6] \
                or sorted(users.get(conv, []), key=id) != sorted(halves, key=id) or conv not in names:
            continue
        weight, out = conv.args[1].value if isinstance(conv.args[1], _Op) else None, conv.value
        if not isinstance(weight, torch.Tensor) or out.shape[1] % 2 or \
                not any(torch.equal(torch.cat([a.value, b.value], 1), out) for a, b in (halves, halves[::-1])):
            continue
        joined = torch.cat(weight.chunk(2, 0), 1)  # each group's outputs, now reading every input channel
        stride, padding, dilation = conv.args[3:6]
        image = conv.args[0].value if isinstance(conv.args[0], _Op) else None
        if not isinstance(image, torch.Tensor) or not close(torch.ops.aten.convolution.default(
                image, joined, None, stride, padding, dilation, False, conv.args[7], 1).float(),
                node.value.float() - _halves_bias(conv)):
            continue
        names[conv] = convolution_names(image, joined, node.value, stride, padding, dilation, 1, True, False)
        names[node], reads[node] = [], [conv]
        for half in halves:
            names[half] = []


def _halves_bias(conv) -> torch.Tensor | float:
    """The bias a grouped convolution's two output halves, added, carry: its halves' sum."""
    bias = conv.args[2].value if isinstance(conv.args[2], _Op) else None
    if not isinstance(bias, torch.Tensor):
        return 0.0
    summed = sum(bias.float().chunk(2))
    return summed.reshape(1, -1, *[1] * (conv.value.dim() - 2))


def _joined_name(first, second, total) -> list | None:
    """The name of the one convolution that two recorded ones over slices of one value are,
    read from its joined weights (each half of a red team's pair read depthwise, and their sum
    is not), or None where they are not the two halves of one value's channels."""
    source = _sliced_from(first.args[0], second.args[0])
    values = [getattr(n, "value", None) for n in (first.args[0], second.args[0], first.args[1], second.args[1])]
    if source is None or not all(isinstance(v, torch.Tensor) for v in values):
        return None
    images, weights = (_parts_read(first, second) if first.args[0] is second.args[0] else values[:2]), values[2:]
    if images is None:
        return None
    order = next((k for k, pair in enumerate((images, images[::-1])) if torch.equal(torch.cat(pair, 1), source.value)),
                 None)
    if order is None:
        return None
    transposed = bool(first.args[6])
    try:  # a transposed convolution's weight holds its input channels first
        weight = torch.cat(weights if order == 0 else weights[::-1], 0 if transposed else 1)
    except RuntimeError:  # kernels of two shapes: a red team's (2, 1) and (1, 2) at stride 2
        return None
    stride, padding, dilation = first.args[3:6]
    return convolution_names(source.value, weight, total.value, stride, padding, dilation, 1, True, transposed)


def _parts_read(first, second) -> list | None:
    """The two parts of one op of several outputs (`x.chunk(2, 1)`, `x.split(4, 1)`: recorded
    once, its first output its value) that two convolutions read, found by computing each
    convolution again from each part; None where it has not two or they do not fit."""
    split = first.args[0]
    parts = split.target(*argument_values(split.args))
    if not isinstance(parts, (list, tuple)) or len(parts) != 2:
        return None
    for order in (parts, parts[::-1]):
        try:
            if all(close(torch.ops.aten.convolution.default(
                    part, *argument_values(conv.args[1:9])), conv.value)
                   for part, conv in zip(order, (first, second))):
                return list(order)
        except RuntimeError:  # a part of other channels than the weight's
            continue
    return None


def _sliced_from(a, b):
    """The value two recorded slices were taken from, where it is one."""
    sources = [next((arg for arg in getattr(n, "args", ()) if isinstance(arg, _Op)), None) for n in (a, b)]
    if any(_name(n) not in ("slice", "narrow", "split", "split_with_sizes", "getitem") for n in (a, b)):
        return None
    return sources[0] if sources[0] is not None and sources[0] is sources[1] and \
        isinstance(sources[0].value, torch.Tensor) else None


def _factor_shared_products(nodes: list, reads: dict, names: dict, outputs: set, ordered_sums: set) -> None:
    """A sum of two products that share a factor is the factor times the sum (`names` edited
    in place): `x * y - y * y` reads `add mul`, as `(x - y) * y` does (an adversary distributed
    KernelBench L2 28's product over its residual sum: `mul mul add` against `add mul`). Only
    products of two varying values (or a square) that nothing else reads, and a factor that is
    the same value in both; a product by a constant is arithmetic the affine reading folds."""
    users = _users(nodes, reads)
    for node in nodes:
        if names[node] != ["add"] or len(reads[node]) != 2 or reads[node][0] is reads[node][1]:
            continue
        products = reads[node]
        factors = [_factors(product, reads, names) for product in products]
        if any(f is None or len(users.get(p, [])) != 1 or p in outputs for f, p in zip(factors, products)):
            continue
        shared = next((a for a in factors[0] for b in factors[1] if a is b), None)
        if shared is not None:
            # the sum at the first product, the product at `node`, as `(x - y) * y` is spelled
            others = [second if first is shared else first for first, second in factors]
            names[products[0]], reads[products[0]] = ["add"], others
            if not _commutes(node, names):  # x y - y y is (x - y) y: its terms in their order
                ordered_sums.add(products[0])
            names[products[1]] = []
            names[node], reads[node] = ["mul"], [products[0], shared]


def _factors(node, reads: dict, names: dict) -> tuple | None:
    """The two varying values a product multiplies (a square's twice), or None."""
    if names.get(node) != ["mul"]:
        return None
    if _name(node) == "mul" and len(reads[node]) == 2:
        return tuple(reads[node])
    if _name(node) in ("pow", "square") and len(reads[node]) == 1:  # named `mul`: a square
        return (reads[node][0],) * 2
    return None


def _users(nodes: list, reads: dict) -> dict:
    """Each node -> the nodes of `nodes` that read it."""
    users: dict = {}
    for node in nodes:
        for read in reads[node]:
            users.setdefault(read, []).append(node)
    return users


def _widest(by: tuple | None, other: tuple | None) -> tuple | None:
    """Two maps' constants' reach as one map's: the wider reach, the product of their signs,
    a unit where both are; None where either is unknown."""
    if by is None or other is None:
        return None
    reach = SCALAR if by[0] == other[0] == SCALAR else CHANNEL
    unit = len(by) > 2 and len(other) > 2 and by[2] and other[2]
    return reach, by[1] == other[1], unit


def _affine_tail(names: list) -> list:
    tail = []
    for name in reversed(names):
        if name not in AFFINE or name in tail:
            break
        tail.insert(0, name)
    return tail


FEATURE_MAPS = (("avg_pool1d",), ("sum",), ("sum", "mul"))  # linear maps of a value's features
PRODUCTS = frozenset({"mm", "addmm"})  # a matrix product recorded with its two factors last


def _fold_into_products(nodes: list, reads: dict, names: dict, affine: set) -> None:
    """A linear map of a matrix product's output features, where nothing else reads the
    product, is part of the product (`names` edited in place): P W reaches every weight of its
    shape, so a Linear followed by one computes what a Linear to fewer features does (a red
    team folded KernelBench's Matmul_AvgPool_GELU_Scale_Max into one Linear with pooled
    weights, `mm add` beside `mm add avg_pool1d`). The maps: an average pooling of the
    features, sums or means of groups of them, and a product by a constant matrix on their
    side (a pooling matrix, a second Linear); one map of another folds in too. The product's
    own affine tail (a bias, a scale, whether or not `_chain_affine_maps` merged it into the
    product's names) and transposes are walked through, and nothing else; its rows, the
    batch, are the map's."""
    users = _users(nodes, reads)
    folded: dict = {}  # a map folded into a product -> whether its features are its first dimension
    for node in nodes:
        if len(reads[node]) != 1 or not names[node]:
            continue
        source = reads[node][0]
        first = _features_below(source, reads, users, names, affine, folded)
        if first is None:
            continue
        if tuple(names[node]) in FEATURE_MAPS and _over_features(source.value, node.value, names[node], first):
            names[node] = []
            folded[node] = first and node.value.dim() == 2
        elif names[node][0] == "mm" and _by_a_constant(node, source, first):
            names[node] = names[node][1:]
            folded[node] = first


def _features_below(source, reads: dict, users: dict, names: dict, affine: set, folded: dict) -> bool | None:
    """Whether `source`'s features are its first dimension, where it is a matrix product (or a
    map folded into one) through its affine tail and transposes, each read by the next alone;
    None where it is not."""
    node, flipped = source, False
    while True:
        if len(users.get(node, [])) != 1:
            return None
        if node in folded:
            return folded[node] != flipped
        if node in names and names[node][:1] == ["mm"]:
            return _features_first(node) != flipped
        if len(reads.get(node, [])) != 1:
            return None
        below = reads[node][0]
        if _name(node) in LAYOUT_ONLY:
            if not _transposed(node.value, below.value):
                return None
            flipped = not flipped
        elif node not in affine:
            return None
        node = below


def _transposed(value, below) -> bool:
    return value.dim() == below.dim() == 2 and value.shape == below.shape[::-1] and torch.equal(value, below.t())


def _features_first(product) -> bool:
    """Whether a 2-D matrix product's features are its first dimension: a constant on the
    left of a variable (`W @ x.T`)."""
    if _name(product) not in PRODUCTS or product.value.dim() != 2:
        return False
    left, right = product.args[-2:]
    return not getattr(left, "variable", True) and getattr(right, "variable", False)


def _by_a_constant(node, source, first: bool) -> bool:
    """Whether `node` multiplies `source`, as it is, by a constant matrix on its features'
    side: the product of two linear maps is one."""
    if _name(node) not in PRODUCTS:
        return False
    left, right = node.args[-2:]
    variable, constant = (right, left) if first else (left, right)
    if not getattr(variable, "variable", False) or getattr(constant, "variable", True) or variable.value.dim() != 2:
        return False
    features = variable.value.shape[0] if first else variable.value.shape[-1]
    return (source.value.shape[0 if first else -1] == features and variable.value.numel() == source.value.numel()
            and torch.equal(variable.value.reshape(-1), source.value.reshape(-1)))


def _over_features(source: torch.Tensor, mapped: torch.Tensor, name: list, first: bool = False) -> bool:
    """`mapped` keeps `source`'s rows and maps its features (its last dimension, or its first
    where `first`): a pooling of them, or sums or means of groups of them (checked on the
    values: a sum over the rows of a square value keeps as many)."""
    source, mapped = _without_trailing_ones(source), _without_trailing_ones(mapped)  # a 1x1 convolution's (B, O, 1, 1)
    if source.dim() == 0 or mapped.dim() == 0 or (first and source.dim() != 2):
        return False
    if first:
        source = source.t()
    rows, features = source.numel() // max(source.shape[-1], 1), source.shape[-1]
    if mapped.numel() == rows:
        table = mapped.reshape(rows, 1)
    elif first and mapped.dim() == 2 and mapped.shape[1] == rows:
        table = mapped.t()
    elif not first and math.prod(mapped.shape[:-1]) == rows:
        table = mapped.reshape(rows, -1)
    else:
        return False
    kept = table.shape[1]
    if kept >= features or features % kept:
        return False
    if name[0] != "sum":
        return not first  # a pooling's windows lie along the last dimension
    values, group = source.reshape(rows, -1).float(), features // kept
    sums = (values.reshape(rows, kept, group).sum(-1), values.reshape(rows, group, kept).sum(1))
    return any(close(table.float(), total) or close(table.float(), total / group) for total in sums)


def _without_trailing_ones(value: torch.Tensor) -> torch.Tensor:
    while value.dim() > 2 and value.shape[-1] == 1:
        value = value.squeeze(-1)
    return value
