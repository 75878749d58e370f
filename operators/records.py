"""The records the parts pass each other (docs/architecture.md): OpSpec, Candidate, Verdict,
and a task's identity (`task_id`, the hash of its normalized code). This is the floor every
package may import."""
from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import asdict, dataclass, field

MODULE = "module"
FUNCTION = "function"


@dataclass(frozen=True)
class OpSpec:
    """An operator known to run.

    `init_args` and `call_args` are recipes: each value is a literal, or a reference to the
    input's shape (`"$C"` the channel size, `"$L"` the last dimension) resolved when the op
    is placed in a chain, or `"$=<expression of x>"` for an input computed from the chain's
    tensor (rotary tables, position ids). `layouts` lists the input layouts the op was
    probed on and ran; `keeps_rank` those where its output has the input's rank (so it can
    sit mid-chain). `definitions` is self-contained source defining the op (an inlined
    library class) when the op is not importable from torch; `output_item` picks the
    tensor out of an op that returns a tuple. `library` is the package the op belongs to
    (the first part of its name), `source` the --library value that crawled it.
    """

    name: str
    library: str
    kind: str
    layouts: tuple[str, ...]
    keeps_rank: tuple[str, ...]
    init_args: dict = field(default_factory=dict)
    call_args: dict = field(default_factory=dict)
    output_shape: tuple[int, ...] = ()
    output_dtype: str = ""
    seed_code: str = ""
    definitions: str = ""
    output_item: int | None = None
    source: str = ""  # the --library value it was crawled from (`torch.special`, `kornia.filters`)

    def to_row(self) -> dict:
        row = asdict(self)
        row["layouts"] = list(self.layouts)
        row["keeps_rank"] = list(self.keeps_rank)
        row["output_shape"] = list(self.output_shape)
        row["init_args"] = json.dumps(self.init_args)
        row["call_args"] = json.dumps(self.call_args)
        return row

    @classmethod
    def from_row(cls, row: dict) -> "OpSpec":
        return cls(
            name=row["name"],
            library=row["library"],
            kind=row["kind"],
            layouts=tuple(row["layouts"]),
            keeps_rank=tuple(row["keeps_rank"]),
            init_args=_json_dict(row["init_args"]),
            call_args=_json_dict(row["call_args"]),
            output_shape=tuple(row["output_shape"]),
            output_dtype=row["output_dtype"],
            seed_code=row["seed_code"],
            definitions=row.get("definitions") or "",
            output_item=row.get("output_item"),
            source=row.get("source") or "",
        )


@dataclass(frozen=True)
class SkippedOp:
    """An operator the crawl saw but could not make runnable, and why (a stable code)."""

    name: str
    library: str
    kind: str
    reason: str
    detail: str = ""
    source: str = ""


@dataclass(frozen=True)
class InlinedOp:
    """A library class made self-contained by a source, ready to probe: `definitions`
    defines `class_name` with torch alone; the args are recipes as in OpSpec."""

    name: str
    library: str
    class_name: str
    definitions: str
    init_args: dict
    call_args: dict
    layouts: tuple[str, ...]


def _json_dict(value) -> dict:
    """Parse a JSON-encoded recipe; JSON has no tuples, so lists come back as tuples."""
    parsed = json.loads(value) if isinstance(value, str) else dict(value)
    return {key: tuple(v) if isinstance(v, list) else v for key, v in parsed.items()}


@dataclass(frozen=True)
class Candidate:
    """A composed task on its way through the filters (docs/architecture.md)."""

    id: str
    ops: tuple[str, ...]
    data_source: str
    code: str
    composer: str
    seed: int
    provenance: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """Where a candidate ended: the stage that decided, pass or a stable reason code, and
    every measurement taken on the way (kept even for rejects). `code` is set when the
    validator re-sized the task, and is then the code to store."""

    id: str
    stage: str
    passed: bool
    reason: str = ""
    detail: str = ""
    metrics: dict = field(default_factory=dict)
    code: str | None = None


def record_to_json(candidate: Candidate, verdict: Verdict | None) -> str:
    """One record as a JSON line; an undecided one (a composed candidate) has the verdict null."""
    return json.dumps({"candidate": asdict(candidate), "verdict": asdict(verdict) if verdict else None}, default=str)


def record_from_json(line: str) -> tuple[Candidate, Verdict | None]:
    data = json.loads(line)
    candidate = data["candidate"]
    verdict = Verdict(**data["verdict"]) if data["verdict"] is not None else None
    return Candidate(**{**candidate, "ops": tuple(candidate["ops"])}), verdict


# -- a task's identity ------------------------------------------------------------------

def normalized_code(code: str) -> str:
    """The code with comments, docstrings and formatting taken out: what a task *is*."""
    tree = ast.parse(code)
    drop_docstrings(tree)
    return ast.unparse(tree)


def drop_docstrings(tree: ast.AST) -> None:
    """Remove every module, class and function docstring from `tree`, in place."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]


def task_id(code: str) -> str:
    return hashlib.sha256(normalized_code(code).encode()).hexdigest()[:16]


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
