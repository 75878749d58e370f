"""Stated rules for operators that make no sense as a kernel task.

Each rule is a stable reason code; the crawl lists every excluded op with its code, so
coverage is visible. Rules that need the op to run (tuple or non-float output, views)
live with the prober.
"""
from __future__ import annotations

import re

STOCHASTIC = re.compile(r"dropout|rrelu|gumbel|fractional_max_pool|bernoulli|multinomial|^rand|normal|poisson", re.I)
LOSS_FUNCTIONS = {
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy", "ctc_loss",
    "kl_div", "nll_loss", "poisson_nll_loss", "gaussian_nll_loss", "cosine_embedding_loss",
    "hinge_embedding_loss", "margin_ranking_loss", "multilabel_margin_loss", "multi_margin_loss",
    "triplet_margin_loss", "triplet_margin_with_distance_loss", "mse_loss", "l1_loss",
    "smooth_l1_loss", "huber_loss", "soft_margin_loss", "multilabel_soft_margin_loss",
}
CONTAINERS = {"Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict", "Container"}
CREATION = re.compile(r"^(zeros|ones|empty|full|arange|range|linspace|logspace|eye|tensor|as_tensor|"
                      r"asarray|from_|frombuffer|sparse_|tril_indices|triu_indices|scalar_tensor|"
                      r"hann_window|hamming_window|bartlett_window|blackman_window|kaiser_window)")
NO_COMPUTATION = {
    "Identity", "Flatten", "Unflatten", "clone", "detach", "contiguous", "alias_copy", "detach_copy",
    "view_as_real", "view_as_complex", "numel", "is_nonzero", "result_type",
}
# Ops that need inputs of a special dtype or device (integer indices, complex, quantized, sparse).
SPECIAL_INPUT = re.compile(r"quantiz|sparse|^q_|^int_repr|^bitwise|^logical|^fbgemm|^mkldnn|^cudnn|^miopen|"
                           r"^embedding|^one_hot|^bincount|^histc|^searchsorted|^bucketize|complex|^fft_", re.I)


def exclusion_reason(op_name: str) -> str | None:
    """The reason code an op is excluded by name alone, or None if it should be probed."""
    leaf = op_name.rsplit(".", 1)[-1]
    parts = op_name.split(".")
    rules = (
        # a private name anywhere, or a dispatcher overload (OpInfo's `ops.aten._safe_softmax.default`)
        ("private", any(part.startswith("_") for part in parts[1:]) or "ops" in parts[1:-1]),
        ("in_place", leaf.endswith("_") or leaf.startswith("inplace")),
        ("stochastic", bool(STOCHASTIC.search(leaf))),
        ("loss", leaf.endswith("Loss") or leaf.endswith("_loss") or leaf in LOSS_FUNCTIONS),
        ("container", leaf in CONTAINERS),
        ("lazy_module", leaf.startswith("Lazy")),
        ("creation_op", bool(CREATION.match(leaf))),
        ("no_computation", leaf in NO_COMPUTATION),
        ("special_input", bool(SPECIAL_INPUT.search(leaf))),
    )
    return next((code for code, hit in rules if hit), None)
