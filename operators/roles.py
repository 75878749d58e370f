"""What part an op plays in a fused layer, from its name.

Real fused layers (KernelBench level 2, CUDA-Agent-Ops-6K) are a compute-heavy anchor
(a matmul, convolution, attention, recurrent cell) followed by an epilogue: normalisation,
activations and elementwise math, then perhaps a reduction or pooling. Layout ops (padding,
shuffles, flips) sit before an anchor, as padding before a convolution does. The template
composer shapes its chains from these roles.
"""
from __future__ import annotations

ANCHOR = "anchor"
NORMALISATION = "normalisation"
EPILOGUE = "epilogue"
REDUCTION = "reduction"
LAYOUT = "layout"
ROLES = (ANCHOR, NORMALISATION, EPILOGUE, REDUCTION, LAYOUT)
COMPUTE_HEAVY = (ANCHOR, NORMALISATION)

# Matched against the lower-cased last part of the op's name, in the order of role_of.
NORM_WORDS = ("norm", "lrn")
NOT_NORMALISATION = {"norm", "matrix_norm", "vector_norm", "nanmedian"}  # these compute a norm's value
ANCHOR_WORDS = (
    "linear", "conv", "matmul", "bmm", "einsum", "cell", "rnn", "lstm", "gru", "attention",
    "transformer", "mlp", "intermediate", "output", "embedding", "ffn", "feedforward", "pooler", "router",
    "expert", "dense", "inverse", "pinv", "matrix_exp", "blur", "filter", "sobel", "laplacian", "gaussian",
    "gate",
)
ANCHOR_NAMES = {"mm", "inner", "bilinear", "kron", "inv", "hfft", "hfft2", "hfftn", "irfft", "irfft2", "irfftn", "fft",
                "ifft", "rfft", "fft2", "rfft2", "fftn", "rfftn"}
REDUCTION_WORDS = ("pool", "reduce")
REDUCTION_NAMES = {
    "sum", "mean", "amax", "amin", "max", "min", "prod", "std", "var", "logsumexp", "nansum", "nanmean",
    "norm", "matrix_norm", "vector_norm", "median", "nanmedian", "det", "logdet", "cond", "svdvals", "eigvalsh",
    "pdist", "cdist", "trapz", "trapezoid", "corrcoef", "cov", "count_nonzero",
}
RESAMPLING_WORDS = ("upsample", "interpolate")  # layout, though `upsample_bilinear` says "linear"
LAYOUT_WORDS = ("pad", "shuffle", "unfold", "flip", "roll", "rot90", "tile", "repeat", "diag", "tril", "triu",
                "_copy", "interpolate", "upsample", "fftshift", "msort", "unique", "vander", "narrow", "permute",
                "transpose", "rearrange", "crop", "resize")


def compute_heavy(ops) -> bool:
    """Whether a chain of these ops holds a compute-heavy one (an anchor or a normalisation)."""
    return any(role_of(op) in COMPUTE_HEAVY for op in ops)


def role_of(name: str) -> str:
    """The role of an op named `name` (`torch.nn.Conv2d`, `transformers.models...LlamaRMSNorm`,
    `kornia.filters.box_blur`). A name no rule knows is an epilogue: an op that maps a
    tensor to a tensor, which is what most crawled ops are."""
    leaf = name.rsplit(".", 1)[-1].lower()
    if any(word in leaf for word in NORM_WORDS) and leaf not in NOT_NORMALISATION:
        return NORMALISATION
    if any(word in leaf for word in REDUCTION_WORDS) and "pooler" not in leaf:
        return REDUCTION
    if any(word in leaf for word in RESAMPLING_WORDS):
        return LAYOUT
    if leaf in ANCHOR_NAMES or any(word in leaf for word in ANCHOR_WORDS):
        return ANCHOR
    if leaf in REDUCTION_NAMES:
        return REDUCTION
    if any(word in leaf for word in LAYOUT_WORDS):
        return LAYOUT
    return EPILOGUE
