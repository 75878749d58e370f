import itertools
from pathlib import Path

import pytest

from filters.similarity.score import encode, fingerprint, op_similarity, score, sequence_similarity
from tests.disguise import disguise

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"
TASKS = {p.name: p.read_text() for p in sorted(REFERENCE.rglob("*.py"))}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_disguised_copy_scores_above_the_threshold(name):
    original, copy = TASKS[name], disguise(TASKS[name])
    assert copy != original and "renamed_" in copy
    assert score(fingerprint(original), fingerprint(copy)) > 0.9


def test_different_op_chains_are_not_duplicates_however_alike_the_boilerplate():
    gelu_norm, mish_mish, gelu_softmax = (fingerprint(TASKS[n]) for n in (
        "1_Linear_GELU_LayerNorm.py", "2_Linear_Mish_Mish.py", "3_Linear_GELU_Softmax.py"))
    assert score(mish_mish, gelu_softmax) < 0.5
    assert score(gelu_norm, gelu_softmax) < 0.9


def test_every_pair_above_the_threshold_shares_its_op_multiset():
    fingerprints = [fingerprint(code, name) for name, code in TASKS.items()]
    above = [(a, b) for a, b in itertools.combinations(fingerprints, 2) if score(a, b) > 0.9]
    assert above, "the fixtures hold one near-duplicate pair on purpose"
    assert all(a.ops == b.ops for a, b in above)


def test_score_is_symmetric_and_one_against_itself():
    fingerprints = [fingerprint(code) for code in TASKS.values()]
    for a, b in itertools.product(fingerprints, repeat=2):
        assert score(a, b) == score(b, a)
    assert all(score(a, a) == 1.0 for a in fingerprints)


def test_module_functional_and_method_forms_are_one_op():
    forms = ["nn.ReLU()(x)", "F.relu(x)", "torch.relu(x)", "x.relu()"]
    fps = [fingerprint(f"import torch\nclass Model:\n    def forward(self, x):\n        return {form}\n") for form in forms]
    assert all(op_similarity(fps[0], other) == 1.0 for other in fps)


HEADS = (["mm", "add"], ["convolution"], ["convolution", "add"], ["mm"])
TAILS = (["relu"], ["tanh"], ["gelu"], ["softmax"], ["sigmoid", "mul"], ["layer_norm", "mul", "add"], ["max_pool2d"],
         ["group_norm", "mul", "add", "relu"], ["leaky_relu", "sum"], ["clamp", "add"])
CHAINS = [head + tail for head in HEADS for tail in TAILS]  # 40 chains, each different in a named op


def test_forty_different_chains_are_all_told_apart():
    assert len(CHAINS) == 40
    graphs = [encode(chain) for chain in CHAINS]
    above = [(a, b) for a, b in itertools.combinations(range(40), 2)
             if sequence_similarity(graphs[a], graphs[b]) > 0.9
             and {*CHAINS[a]} - {"add", "mul"} != {*CHAINS[b]} - {"add", "mul"}]
    assert not above, [(CHAINS[a], CHAINS[b]) for a, b in above]


@pytest.mark.parametrize("extra", [["mul", "add"], ["add", "add"], ["mul"]])
def test_two_leftover_generic_ops_keep_a_short_sequence_above_the_threshold(extra):
    for chain in CHAINS:
        if len(chain) >= 3:
            assert sequence_similarity(encode(chain), encode(chain + extra)) > 0.9, (chain, extra)
            assert sequence_similarity(encode(chain + extra), encode(chain)) > 0.9


def test_a_different_named_op_or_a_substituted_generic_op_is_not_forgiven():
    assert sequence_similarity(encode(["mm", "add", "relu"]), encode(["mm", "add", "tanh"])) < 0.9
    assert sequence_similarity(encode(["mm", "add", "relu", "tanh", "add"]),
                               encode(["mm", "add", "relu", "tanh", "mul"])) < 0.9
    assert sequence_similarity(encode(["mm", "add", "relu"]), encode(["mm", "add", "relu", "tanh", "exp"])) < 0.9
