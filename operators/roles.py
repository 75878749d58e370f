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

# What an op of each role does in a fused layer, in the words the LLM composer's prompt gives
# each op it asks for (pipeline/prompts/compose_v4.txt).
ROLE_DUTIES = {
    ANCHOR: "anchor: the compute-heavy op the layer is built around; it comes first",
    NORMALISATION: "normalisation: normalises the anchor's output (or leads the layer, as LayerNorm -> GELU does)",
    EPILOGUE: "epilogue: elementwise math or an activation applied to the output of the op before it",
    REDUCTION: "reduction: sums, pools or reduces the result; it comes last",
    LAYOUT: "layout: pads or rearranges the input before the anchor",
}


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


# -- input domains and output ranges ----------------------------------------------------
# An op fed values outside its domain puts out NaN or Inf (log of a negative, acosh below 1),
# and the sandbox rejects the task: the template composer places such an op only after an op
# whose range lies inside its domain (Linear -> sigmoid -> log, never Linear -> log). Ranges
# and domains are intervals (low, high), open at both ends; the chain's own input,
# torch.rand, counts as (0, 1) (an exact 0 has probability 2**-24 per element).
REAL = (-float("inf"), float("inf"))
POSITIVE = (0.0, float("inf"))
UNIT = (0.0, 1.0)
SYMMETRIC_UNIT = (-1.0, 1.0)
AT_LEAST_ONE = (1.0, float("inf"))
INPUT_RANGE = UNIT

# The domain an op needs, by the last part of its name (`torch.special.log1p` -> log1p).
DOMAINS = {
    **dict.fromkeys(("log", "log2", "log10", "reciprocal", "rsqrt", "sqrt", "lgamma", "digamma", "polygamma",
                     "gammaln", "psi", "mvlgamma", "multigammaln", "entr", "igamma", "igammac", "gammainc", "gammaincc",
                     "float_power", "pow"), POSITIVE),
    **dict.fromkeys(("log1p", "asin", "acos", "arcsin", "arccos", "atanh", "arctanh", "erfinv"), SYMMETRIC_UNIT),
    **dict.fromkeys(("logit", "ndtri"), UNIT),
    **dict.fromkeys(("acosh", "arccosh"), AT_LEAST_ONE),
}
# The range of an op whose output is bounded or one-signed, whatever its input.
RANGES = {
    **dict.fromkeys(("sigmoid", "expit", "softmax", "softmin", "hardsigmoid", "ndtr"), UNIT),
    **dict.fromkeys(("tanh", "softsign", "erf", "sin", "cos", "hardtanh"), SYMMETRIC_UNIT),
    **dict.fromkeys(("exp", "exp2", "softplus", "erfc"), POSITIVE),
    "cosh": AT_LEAST_ONE,
}


# Ops whose output jumps where their input crosses a point (an integer, zero, a multiple of
# the divisor, the negative axis of atan2). Fed a computed value, an ulp of rounding (eager
# against compiled, float32 against float64) moves some element across a jump on a large
# tensor; fed the chain's own input they are exact. So they are placed first or alone.
DISCONTINUOUS = {"floor", "ceil", "round", "trunc", "fix", "frac", "sign", "sgn", "remainder", "fmod", "floor_divide",
                 "heaviside", "atan2", "arctan2", "hardshrink", "threshold", "bucketize"}


def domain_of(name: str) -> tuple[float, float]:
    """The open interval an op's input must lie in; REAL for most ops."""
    return DOMAINS.get(name.rsplit(".", 1)[-1].lower(), REAL)


def range_of(name: str | None) -> tuple[float, float]:
    """The open interval an op's output lies in; `None` (the chain's input) is torch.rand's."""
    if name is None:
        return INPUT_RANGE
    return RANGES.get(name.rsplit(".", 1)[-1].lower(), REAL)


def discontinuous(name: str) -> bool:
    return name.rsplit(".", 1)[-1].lower() in DISCONTINUOUS


def feeds(previous: str | None, name: str) -> bool:
    """Whether `name` may take the output of `previous` (None: the chain's input): it lies in
    the domain of `name`, and it is the chain's input if `name` jumps."""
    if previous is not None and discontinuous(name):
        return False
    (low, high), (domain_low, domain_high) = range_of(previous), domain_of(name)
    return domain_low <= low and high <= domain_high


# Linear-algebra ops that invert, factor or exponentiate the square matrices of their input's
# last two dimensions: on torch.rand's matrices (one eigenvalue near n/2, others near zero)
# they put out Inf or values far past float32's precision. A chain that starts with one gets
# I + rand / n instead (operators/task.py): eigenvalues near 1 to 1.5, symmetric enough in
# its lower triangle for cholesky.
CONDITIONED_MATRIX_OPS = {
    "inv", "inv_ex", "inverse", "pinv", "pinverse", "solve", "solve_ex", "cholesky", "cholesky_ex", "cholesky_inverse",
    "matrix_exp", "matrix_power", "det", "logdet", "slogdet", "cond", "lu", "lu_factor", "eig", "eigvals", "eigh",
    "eigvalsh", "svd", "svdvals", "qr", "lstsq", "tensorinv",
}


def needs_conditioned_matrix(name: str) -> bool:
    return name.rsplit(".", 1)[-1].lower() in CONDITIONED_MATRIX_OPS


# Ops whose output grows fast, has poles or loses precision on ordinary inputs, beside those
# above; and the namespaces of special functions, transforms and linear algebra. A chain with
# none of them is not run through the composer's numeric screen: of 300 default candidates,
# the chains without one (130) held one screen fault (pinverse, since added above) against
# 70 in the 170 with one.
GROWING = {"exp", "exp2", "expm1", "tan", "cosh", "sinh", "pow", "float_power", "reciprocal", "divide", "div",
           "true_divide", "xlogy", "ldexp", "kron", "cumprod", "prod", "polar"}
SENSITIVE_NAMESPACES = ("torch.special.", "torch.fft.", "torch.linalg.")


def numerically_sensitive(name: str) -> bool:
    """Whether an op can put out NaN, Inf, huge or imprecise values on finite inputs."""
    return (name.rsplit(".", 1)[-1].lower() in GROWING or name.startswith(SENSITIVE_NAMESPACES)
            or domain_of(name) != REAL or discontinuous(name) or needs_conditioned_matrix(name))
