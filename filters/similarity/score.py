"""The similarity used for decontamination and dedupe (docs/decontamination.md).

score(a, b) = max(textual, computed): the larger of a textual score that reads the source
and, where both tasks were traced, a score of what they compute (`graph`: the canonical
ATen op sequence of one forward call, filters/computation/, traced in the sandbox). A task
that cannot be traced keeps the textual score.

computed(a, b) is the normalized Indel similarity of the two op sequences.

The textual score reads a task as a *fingerprint*, after aliases of torch modules and
from-imported torch functions are written out (`fn.gelu`, `gelu` -> `F.gelu`) and identity
arithmetic (`x * 1.0`, `x + 0`) is dropped:
- `tokens`: a pre-order walk of its AST with docstrings dropped, every local name and
  user-defined attribute replaced by its role (NAME, ATTR, DEF), numbers and strings
  abstracted (NUM, STR), and API, builtin and tensor-method names kept (nn.Conv2d,
  torch.relu, .sum, len). Roles rather than numbered names: numbering by first use lets
  one reordered definition shift every later name and sink the score of a plain copy;
- `ops`: the multiset of operators the task's classes and functions call, but for
  get_inputs / get_init_inputs (module-level size arithmetic is not an op):
  torch, nn and F API calls and torch.Tensor methods, each named by its lower-cased leaf
  (nn.ReLU, F.relu, torch.relu and x.relu() are all `relu`), and arithmetic operators.
  Calls of the task's own helpers and of Python builtins are structure, not ops.

score(a, b) = min(structure, ops), with structure the normalized Indel similarity of the
token sequences (1 - insertions and deletions / total length, as difflib's ratio) and ops
the multiset Jaccard of the op multisets. Boilerplate (imports, get_inputs, __init__
plumbing) makes most tasks structurally alike; capping by op overlap keeps two tasks with
different op chains apart, however alike their boilerplate. The score is symmetric and 1.0
for a task against itself.
"""
from __future__ import annotations

import ast
import builtins
import hashlib
import zlib
from collections import Counter
from dataclasses import dataclass, replace

import torch
from rapidfuzz import process
from rapidfuzz.distance import Indel

from operators.records import drop_docstrings

API_ROOTS = {"torch", "nn", "F", "math"}
BUILTIN_NAMES = set(dir(builtins))
TENSOR_METHODS = {name for name in dir(torch.Tensor) if not name.startswith("_")}
INPUT_BUILDERS = {"get_inputs", "get_init_inputs"}
NOT_OPS = {"Module", "size", "dim", "numel", "contiguous", "float", "to", "Parameter", "ModuleList", "ModuleDict",
           "Sequential", "register_buffer", "item", "tolist"}


@dataclass(frozen=True)
class Fingerprint:
    name: str
    tokens: str  # one character per token, for rapidfuzz's fast string kernels
    ops: tuple[tuple[str, int], ...]
    digest: str  # hash of the canonical tokens: equal digests are exact duplicates
    graph: str = ""  # the traced op sequence, one character per op; "" when not traced


def encode(tokens: list[str]) -> str:
    """One character per token, the same in every process (a Beam worker fingerprints
    candidates against reference fingerprints made in another): a CRC over ~1M code points."""
    return "".join(chr(0x10000 + zlib.crc32(token.encode()) % 0xF0000) for token in tokens)


def fingerprint(code: str, name: str = "", graph: str | None = None) -> Fingerprint:
    """`graph`: the task's traced op sequence (space-separated op names), if it was traced."""
    tree = _canonical_tree(ast.parse(code))
    drop_docstrings(tree)
    tokens = _Canonicalizer(_user_attributes(tree)).walk(tree)
    ops = tuple(sorted(model_ops(tree).items()))
    return Fingerprint(name, encode(tokens), ops, hashlib.sha256("\x00".join(tokens).encode()).hexdigest()[:16],
                       encode(graph.split()) if graph else "")


def with_graph(fp: Fingerprint, graph: str | None) -> Fingerprint:
    """`fp` with its traced op sequence (space-separated op names), if it was traced."""
    return replace(fp, graph=encode(graph.split())) if graph else fp


def score(a: Fingerprint, b: Fingerprint) -> float:
    return max(textual_similarity(a, b), computed_similarity(a, b))


def textual_similarity(a: Fingerprint, b: Fingerprint) -> float:
    return min(structure_similarity(a, b), op_similarity(a, b))


def computed_similarity(a: Fingerprint, b: Fingerprint) -> float:
    return sequence_similarity(a.graph, b.graph) if a.graph and b.graph else 0.0


# Generic arithmetic, what a rewrite leaves behind when it adds anything (a scale, a shift):
# an op one sequence has and the other lacks costs EXTRA of an op when it is one of these.
GENERIC = frozenset(encode(["add", "mul"]))
EXTRA = 1 / 3
# Plain Indel similarity is at most this far under the fair score (every unmatched op costs
# at least EXTRA): below it, no pair can score above a threshold of 0.9.
PLAIN_FLOOR = 1 - (1 - 0.9) / EXTRA


def sequence_similarity(a: str, b: str) -> float:
    """1 - cost / (len a + len b), over the ops the longest common subsequence leaves
    unmatched: an op on one side that the other side has no counterpart of costs 1, or EXTRA
    when it is generic arithmetic (add, mul) and the other side has no generic op left over
    to pair with it (then the two are a substitution: 1 each). A disguise's leftover scale
    and shift cost a third of an op; a different activation, norm or contraction costs 2,
    as does `add` where the other has `mul`. Plain Indel (every unmatched op costs 1) is
    unfair to short sequences: two leftover ops in a 3-op task score 0.75."""
    if not a or not b:
        return 0.0
    deleted = [a[op.src_pos] for op in Indel.editops(a, b) if op.tag == "delete"]
    inserted = [b[op.dest_pos] for op in Indel.editops(a, b) if op.tag == "insert"]
    generic_a, generic_b = sum(c in GENERIC for c in deleted), sum(c in GENERIC for c in inserted)
    named = len(deleted) - generic_a + len(inserted) - generic_b
    cost = named + 2 * min(generic_a, generic_b) + EXTRA * abs(generic_a - generic_b)
    return 1.0 - cost / (len(a) + len(b))


def nearest_computation(fp: Fingerprint, graphs: list[str], names: list[str]) -> tuple[float, str | None]:
    """(computed similarity, name) of the closest of `graphs` to `fp`'s. Plain Indel in C++
    picks the candidates (the fair score is never under it, and never over it by more than
    the gap to PLAIN_FLOOR); the fair score decides among them. Exact above 0.9."""
    if not fp.graph or not graphs:
        return 0.0, None
    _, plain, index = process.extractOne(fp.graph, graphs, scorer=Indel.normalized_similarity)
    best = (sequence_similarity(fp.graph, graphs[index]), names[index])
    for _, _, other in process.extract(fp.graph, graphs, scorer=Indel.normalized_similarity, limit=None,
                                       score_cutoff=min(PLAIN_FLOOR, plain)):
        best = max(best, (sequence_similarity(fp.graph, graphs[other]), names[other]), key=lambda pair: pair[0])
    return best


def structure_similarity(a: Fingerprint, b: Fingerprint) -> float:
    return Indel.normalized_similarity(a.tokens, b.tokens)


def op_similarity(a: Fingerprint, b: Fingerprint) -> float:
    if not a.ops and not b.ops:
        return 1.0
    ca, cb = Counter(dict(a.ops)), Counter(dict(b.ops))
    return sum((ca & cb).values()) / sum((ca | cb).values())


TORCH_MODULE_NAMES = {"torch": "torch", "torch.nn": "nn", "torch.nn.functional": "F"}
IDENTITY_OPERANDS = {ast.Mult: 1, ast.Div: 1, ast.Add: 0, ast.Sub: 0, ast.Pow: 1}


def _canonical_tree(tree: ast.Module) -> ast.Module:
    """Aliases of torch modules written as `torch`, `nn`, `F`; from-imported torch functions
    as their dotted names; identity arithmetic gone."""
    names: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in TORCH_MODULE_NAMES:
                    names[alias.asname] = ast.Name(TORCH_MODULE_NAMES[alias.name], ast.Load())
        elif isinstance(node, ast.ImportFrom) and node.module in TORCH_MODULE_NAMES:
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                local = alias.asname or alias.name
                if dotted in TORCH_MODULE_NAMES:
                    names[local] = ast.Name(TORCH_MODULE_NAMES[dotted], ast.Load())
                else:
                    names[local] = ast.Attribute(ast.Name(TORCH_MODULE_NAMES[node.module], ast.Load()), alias.name,
                                                 ast.Load())
    return _Rewrite({k: v for k, v in names.items() if k not in API_ROOTS or ast.unparse(v) != k}).visit(tree)


class _Rewrite(ast.NodeTransformer):
    def __init__(self, names: dict[str, ast.AST]):
        self.names = names

    def visit_Name(self, node: ast.Name):
        if isinstance(node.ctx, ast.Load) and node.id in self.names:
            return ast.copy_location(self.names[node.id], node)
        return node

    def visit_BinOp(self, node: ast.BinOp):
        self.generic_visit(node)
        identity = IDENTITY_OPERANDS.get(type(node.op))
        right = node.right.value if isinstance(node.right, ast.Constant) else None
        if identity is not None and isinstance(right, (int, float)) and not isinstance(right, bool) \
                and right == identity:
            return node.left
        return node


def _user_attributes(tree: ast.AST) -> set[str]:
    """Attribute names the task itself assigns (self.conv = ...): these are renamed."""
    return {target.attr for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Attribute)}


class _Canonicalizer:
    def __init__(self, user_attributes: set[str]):
        self.user_attributes = user_attributes

    def walk(self, node: ast.AST) -> list[str]:
        tokens: list[str] = []
        self._visit(node, tokens)
        return tokens

    def _visit(self, node: ast.AST, tokens: list[str]) -> None:
        api = _api_name(node)
        if api:
            tokens.append(api)
            return
        tokens.append(type(node).__name__)
        if isinstance(node, ast.Name):
            tokens.append(_role(node.id, "NAME"))
        elif isinstance(node, ast.arg):
            tokens.append(_role(node.arg, "NAME"))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            tokens.append(node.name if node.name in ("Model", "forward", "__init__", *INPUT_BUILDERS) else "DEF")
        elif isinstance(node, ast.Attribute):
            tokens.append("ATTR" if node.attr in self.user_attributes else "." + node.attr)
        elif isinstance(node, ast.Constant):
            tokens.append("NUM" if isinstance(node.value, (int, float, complex)) and not isinstance(node.value, bool)
                          else "STR" if isinstance(node.value, str) else repr(node.value))
        elif isinstance(node, ast.alias):
            tokens.append(node.name)
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.Load, ast.Store, ast.Del)):
                self._visit(child, tokens)



def _role(name: str, role: str) -> str:
    return name if name in API_ROOTS or name in BUILTIN_NAMES or name == "self" else role


def _api_name(node: ast.AST) -> str | None:
    """`nn.Conv2d`, `torch.nn.functional.gelu`, ... as one token, aliases unified."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not parts or not isinstance(node, ast.Name) or node.id not in API_ROOTS:
        return None
    dotted = ".".join([node.id, *reversed(parts)])
    return dotted.replace("torch.nn.functional.", "F.").replace("nn.functional.", "F.").replace("torch.nn.", "nn.")


def model_ops(tree: ast.Module) -> Counter:
    ops: Counter = Counter()
    for definition in tree.body:
        if not isinstance(definition, (ast.ClassDef, ast.FunctionDef)) or definition.name in INPUT_BUILDERS:
            continue
        for node in ast.walk(definition):
            if isinstance(node, ast.Call) and (leaf := _op_name(node.func)):
                ops[leaf.lower().rstrip("_")] += 1
            elif isinstance(node, ast.BinOp):
                ops[type(node.op).__name__.lower()] += 1
    return ops


def _op_name(func: ast.AST) -> str | None:
    """torch.relu, nn.Conv2d, F.gelu -> their leaf; x.view(...) -> view; anything else
    (self.conv(x), a helper, a builtin) is not an op."""
    if not isinstance(func, ast.Attribute) or func.attr in NOT_OPS or _is_user_call(func):
        return None
    if _api_name(func):
        return func.attr
    return func.attr if func.attr in TENSOR_METHODS else None


def _is_user_call(func: ast.AST) -> bool:
    """self.conv(x) calls a submodule the task built: its op is counted where it was built."""
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
