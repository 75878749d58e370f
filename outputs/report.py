"""`opsynth report DIR --against REFERENCE`: a dataset folder beside a reference benchmark
(a KernelBench checkout, a folder of .py tasks, a Parquet file, a Hub id, or another dataset
folder), side by side: the op-count mix, the top ops and op families, the input sizes, eager
time, output magnitude and the similarity to the reference. A Markdown page with plots
(report.md, plots/), the numbers beside it (report.json); the card shows the same comparison
when its run had a reference (docs/publishing.md).

A row's ops are its `ops` column where it has one (what the composer fused). A task with none
(a reference task, or one re-audited by `opsynth validate` from a .py file) is read from its
text, as the similarity score reads it (filters/similarity/score.py): the ops its classes and
helpers call, with `__init__` counting only the modules it builds (its `nn.Parameter(torch.randn
(...) * 0.02)` is initialisation, not an op of the task). Nothing is run.
"""
from __future__ import annotations

import ast
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from filters.similarity.decontaminate import SimilarityIndex
from filters.similarity.reference import ReferenceSet, load_reference
from filters.similarity.score import (INPUT_BUILDERS, NOT_OPS, TENSOR_METHODS, _api_name, _canonical_tree,
                                      _is_user_call, fingerprint)
from outputs.stats import HISTOGRAM_EDGES_MS, SIMILARITY_EDGES, histogram

TOP_OPS = 12  # the most used ops of each side; the table shows the union
OP_COUNT_BUCKETS = ("1", "2", "3", "4", "5", "6+")
SIZE_EDGES = (*(2 ** n for n in range(18)), 2 ** 62)  # log2 bins: 1-2, 2-4, ... 131072 and up
MAGNITUDE_EDGES = (0, 0.01, 0.1, 1, 10, 100, 1000, 10000, 65504, float("inf"))
# Below the similarity histogram's first edge, the exact score does not change a task's bin:
# the index scores exactly every pair that could reach it and skips the rest.
SIMILARITY_FLOOR = SIMILARITY_EDGES[1] - 1e-9
# Tensor methods that only reshape or copy (`x.view(...)`, `x.detach().clone()`): plumbing that
# a fused kernel makes free, not an op the task fuses (the KernelBench names do not count them).
PLUMBING = {"view", "view_as", "reshape", "squeeze", "unsqueeze", "detach", "clone", "expand", "expand_as",
            "type_as"}
ARITHMETIC = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.MatMult: "matmul",
              ast.Pow: "pow", ast.Mod: "remainder", ast.FloorDiv: "floor_divide"}
FAMILIES = (("torch.nn.functional.", "torch.nn.functional"), ("torch.nn.", "torch.nn"),
            ("torch.linalg.", "torch.linalg"), ("torch.fft.", "torch.fft"), ("torch.special.", "torch.special"),
            ("torch.masked.", "torch.masked"), ("torch.Tensor.", "tensor methods"), ("operator.", "arithmetic"),
            ("transformers.", "transformers"), ("torch.", "torch"))


class ReportError(ValueError):
    """DIR is not a dataset folder, or the reference cannot be read."""


@dataclass
class Profile:
    """One side of the comparison, task by task."""

    name: str
    codes: list[str]
    ops: list[list[str]]  # fully qualified op names of each task
    ops_from_text: int = 0  # how many tasks' ops were read from their text
    eager_ms: list[float] = field(default_factory=list)
    output_max_abs: list[float] = field(default_factory=list)


def write_report(dataset_dir: str | Path, against: str, out: str | Path | None = None,
                 levels: tuple[int, ...] = (1, 2, 3)) -> Path:
    """Write report.md, report.json and plots/ into `out` (default DIR/report); returns report.md."""
    from outputs.plots import make_comparison_plots

    dataset = profile_folder(Path(dataset_dir))
    reference = profile_source(against, levels)
    comparison = compare(dataset, reference, similarity=True)
    out = Path(out) if out else Path(dataset_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    plots = make_comparison_plots(comparison, out / "plots")
    (out / "report.json").write_text(json.dumps(comparison, indent=2) + "\n")
    (out / "report.md").write_text("\n".join(render_report(comparison, plots)) + "\n")
    return out / "report.md"


# -- the two sides -------------------------------------------------------------------------

def is_dataset_folder(path: Path) -> bool:
    return path.is_dir() and any((path / "data").glob("*.parquet"))


def profile_folder(folder: Path, name: str | None = None) -> Profile:
    """A dataset folder written by `opsynth run` or `opsynth validate`: its accepted rows."""
    if not is_dataset_folder(folder):
        raise ReportError(f"{folder} is not a dataset folder (no data/*.parquet): pass the --out of "
                          "`opsynth run` or `opsynth validate`")
    rows = pq.read_table(folder / "data").to_pylist()
    return profile_rows(name or folder.resolve().name, rows)


def profile_rows(name: str, rows: list[dict]) -> Profile:
    """Rows of the sample schema (older folders may lack a column: it is then not measured)."""
    ops = [list(row.get("ops") or ()) or text_ops(row["code"]) for row in rows]
    return Profile(name, [row["code"] for row in rows], ops,
                   ops_from_text=sum(not row.get("ops") for row in rows),
                   eager_ms=_present(row.get("eager_ms") for row in rows),
                   output_max_abs=_present(row.get("output_max_abs") for row in rows))


def profile_reference(reference: ReferenceSet) -> Profile:
    codes = list(reference.codes)
    return Profile(reference.name, codes, [text_ops(code) for code in codes], ops_from_text=len(codes))


def profile_source(source: str, levels: tuple[int, ...]) -> Profile:
    """Another dataset folder (with its own eager times), or anything `--reference` accepts."""
    from filters.similarity.reference import ReferenceSetError
    if is_dataset_folder(Path(source)):
        return profile_folder(Path(source))
    try:
        return profile_reference(load_reference(source, levels))
    except ReferenceSetError as error:
        raise ReportError(str(error).replace("--reference ", "")) from None


def _present(values) -> list[float]:
    return [float(v) for v in values if v is not None]


# -- reading a task's text ------------------------------------------------------------------

def text_ops(code: str) -> list[str]:
    """The ops a task calls, fully qualified (`torch.nn.Conv2d`, `torch.Tensor.view`,
    `operator.add`); [] when the code does not parse."""
    try:
        tree = _canonical_tree(ast.parse(code))
    except SyntaxError:
        return []
    ops = []
    for definition in tree.body:
        if isinstance(definition, ast.ClassDef):
            for method in definition.body:
                if isinstance(method, ast.FunctionDef):
                    ops += _calls(method, modules_only=method.name == "__init__")
        elif isinstance(definition, ast.FunctionDef) and definition.name not in INPUT_BUILDERS:
            ops += _calls(definition, modules_only=False)
    return ops


def _calls(definition: ast.FunctionDef, modules_only: bool) -> list[str]:
    found = []
    for node in ast.walk(definition):
        name = _call_name(node.func) if isinstance(node, ast.Call) else None
        if name is None and isinstance(node, ast.BinOp) and not modules_only:
            name = "operator." + ARITHMETIC.get(type(node.op), type(node.op).__name__.lower())
        if name and (not modules_only or _is_module(name)):
            found.append(name)
    return found


def _call_name(func: ast.AST) -> str | None:
    if not isinstance(func, ast.Attribute) or func.attr in NOT_OPS or _is_user_call(func):
        return None
    api = _api_name(func)
    if api:
        return None if api.startswith("math.") else "torch.nn.functional." + api[2:] if api.startswith("F.") \
            else "torch." + api if api.startswith("nn.") else api
    return "torch.Tensor." + func.attr if func.attr in TENSOR_METHODS and func.attr not in PLUMBING else None


def _is_module(name: str) -> bool:
    return name.startswith("torch.nn.") and name.rsplit(".", 1)[-1][:1].isupper()


def op_key(name: str) -> str:
    """One name for an op however it is spelt: nn.ReLU, F.relu, torch.relu and x.relu() are
    all `relu` (as the similarity score counts them), nn.GroupNorm and F.group_norm both
    `groupnorm`; a layer of another library keeps its class name."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf.lower().rstrip("_").replace("_", "") if name.startswith(("torch.", "operator.")) else leaf


def op_family(name: str) -> str:
    return next((family for prefix, family in FAMILIES if name.startswith(prefix)), name.split(".", 1)[0])


def input_sizes(code: str) -> list[int]:
    """The integers that shape a task's inputs: module-level int constants that get_inputs
    reads, and int literals in its calls (`torch.rand(batch_size, 64)` -> [batch_size's value, 64])."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_int(node.value):
            constants.update({target.id: node.value.value for target in node.targets if isinstance(target, ast.Name)})
    builder = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "get_inputs"), None)
    if builder is None:
        return []
    sizes = []
    for node in ast.walk(builder):
        if isinstance(node, ast.Name) and node.id in constants:
            sizes.append(constants[node.id])
        elif isinstance(node, ast.Call):
            sizes += [arg.value for arg in node.args if _is_int(arg)]
    return [size for size in sizes if size > 0]


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool)


# -- the comparison -------------------------------------------------------------------------

def compare(dataset: Profile, reference: Profile, similarity: bool) -> dict:
    """The numbers of the report, JSON-ready; `similarity`: score every dataset task against
    the reference (textual score; the card has the run's own scores instead)."""
    return {
        "dataset": _about(dataset), "reference": _about(reference),
        "op_count_mix": _paired(_op_count_shares(dataset), _op_count_shares(reference), OP_COUNT_BUCKETS),
        "top_ops": _top_ops(dataset, reference),
        "op_families": _families(dataset, reference),
        "sizes": {"dataset": size_summary(dataset.codes), "reference": size_summary(reference.codes)},
        "eager_ms": {"dataset": _spread(dataset.eager_ms, HISTOGRAM_EDGES_MS),
                     "reference": _spread(reference.eager_ms, HISTOGRAM_EDGES_MS)},
        "output_max_abs": {"dataset": _spread(dataset.output_max_abs, MAGNITUDE_EDGES),
                           "reference": _spread(reference.output_max_abs, MAGNITUDE_EDGES)},
        "similarity": _similarity(dataset, reference) if similarity else None,
    }


def _about(profile: Profile) -> dict:
    counts = [len(ops) for ops in profile.ops]
    return {"name": profile.name, "tasks": len(profile.codes), "ops_from_text": profile.ops_from_text,
            "mean_ops": round(float(np.mean(counts)), 2) if counts else None}


def _op_count_shares(profile: Profile) -> dict:
    buckets = Counter(str(n) if n < 6 else "6+" for n in (len(ops) for ops in profile.ops) if n)
    total = sum(buckets.values()) or 1
    return {bucket: round(count / total, 4) for bucket, count in buckets.items()}


def _paired(mine: dict, theirs: dict, keys) -> list[dict]:
    return [{"key": key, "dataset": mine.get(key, 0.0), "reference": theirs.get(key, 0.0)} for key in keys]


def _task_shares(profile: Profile) -> Counter:
    """Share of tasks that use each op (by op_key) at least once."""
    used = Counter(key for ops in profile.ops for key in {op_key(op) for op in ops})
    return Counter({key: round(count / (len(profile.ops) or 1), 4) for key, count in used.items()})


def _top_ops(dataset: Profile, reference: Profile) -> list[dict]:
    mine, theirs = _task_shares(dataset), _task_shares(reference)
    keys = {key for key, _ in _most(mine)} | {key for key, _ in _most(theirs)}
    rows = _paired(mine, theirs, keys)
    return sorted(rows, key=lambda row: (-row["dataset"], -row["reference"], row["key"]))


def _most(shares: Counter) -> list[tuple[str, float]]:
    return sorted(shares.items(), key=lambda item: (-item[1], item[0]))[:TOP_OPS]


def _families(dataset: Profile, reference: Profile) -> list[dict]:
    """Share of op uses by family (torch.nn, functional, linalg, fft, transformers, ...)."""
    def shares(profile: Profile) -> dict:
        uses = Counter(op_family(op) for ops in profile.ops for op in ops)
        total = sum(uses.values()) or 1
        return {family: round(count / total, 4) for family, count in uses.items()}
    mine, theirs = shares(dataset), shares(reference)
    rows = _paired(mine, theirs, set(mine) | set(theirs))
    return sorted(rows, key=lambda row: (-row["dataset"], -row["reference"], row["key"]))


def size_summary(codes: list[str]) -> dict:
    """How round the input sizes are: the share of sizes (and of tasks, all of their sizes)
    that are multiples of 8 and powers of two, their median and a log2 histogram."""
    per_task = [input_sizes(code) for code in codes]
    sizes = [size for task in per_task for size in task]
    sized = [task for task in per_task if task]
    return {
        "sizes": len(sizes),
        "multiple_of_8": _share(size % 8 == 0 for size in sizes),
        "power_of_two": _share(size & (size - 1) == 0 for size in sizes),
        "tasks_all_multiple_of_8": _share(all(size % 8 == 0 for size in task) for task in sized),
        "median": float(np.median(sizes)) if sizes else None,
        "histogram": histogram(sizes, SIZE_EDGES),
    }


def _share(flags) -> float | None:
    flags = list(flags)
    return round(sum(flags) / len(flags), 4) if flags else None


def _spread(values: list[float], edges: tuple) -> dict | None:
    """Count, p10 / p50 / p90 and a histogram; None when the side has no such measure."""
    if not values:
        return None
    p10, p50, p90 = (round(float(v), 4) for v in np.percentile(values, [10, 50, 90]))
    return {"tasks": len(values), "p10": p10, "p50": p50, "p90": p90, "histogram": histogram(values, edges)}


def _similarity(dataset: Profile, reference: Profile) -> dict:
    """Each dataset task's highest textual similarity to any reference task (exact from the
    histogram's first edge up)."""
    index = SimilarityIndex(_fingerprints(reference.codes, "reference"))
    scores = [index.match(fp, SIMILARITY_FLOOR).similarity for fp in _fingerprints(dataset.codes, "dataset")]
    if not scores:
        return None
    return {"tasks": len(scores), "p50": round(float(np.median(scores)), 4), "max": round(max(scores), 4),
            "above_0.9": sum(score > 0.9 for score in scores), "histogram": histogram(scores, SIMILARITY_EDGES)}


def _fingerprints(codes: list[str], side: str):
    found = []
    for number, code in enumerate(codes):
        try:
            found.append(fingerprint(code, f"{side}#{number}"))
        except SyntaxError:
            continue
    return found


# -- the page -------------------------------------------------------------------------------

def render_report(comparison: dict, plots: dict[str, str]) -> list[str]:
    mine, theirs = comparison["dataset"], comparison["reference"]
    return [f"# {mine['name']} beside {theirs['name']}", "",
            f"{mine['tasks']} accepted tasks of `{mine['name']}` beside the {theirs['tasks']} tasks of "
            f"`{theirs['name']}`. Generated by `opsynth report`; the numbers are in report.json.", "",
            *comparison_lines(comparison, plots, level="##")]


def comparison_lines(comparison: dict, plots: dict[str, str], level: str) -> list[str]:
    """The comparison's sections under `level` headings: the report's body, and the card's section."""
    mine, theirs = comparison["dataset"], comparison["reference"]
    head = ["", mine["name"], theirs["name"]]
    return [
        *_table(head, _summary_rows(comparison)), "",
        _ops_source(comparison), "",
        f"{level} Op-count mix", "",
        "Share of tasks by the number of ops they fuse.", "",
        *_table(["ops", *head[1:]], [(r["key"], _pct(r["dataset"]), _pct(r["reference"]))
                                     for r in comparison["op_count_mix"]]), "",
        *_plot(plots, "op_count_mix"),
        f"{level} Top ops", "",
        "Share of tasks that use the op at least once (nn.ReLU, F.relu, torch.relu and x.relu() are one op).", "",
        *_table(["op", *head[1:]], [(f"`{r['key']}`", _pct(r["dataset"]), _pct(r["reference"]))
                                    for r in comparison["top_ops"]]), "",
        *_plot(plots, "top_ops"),
        f"{level} Op families", "",
        "Share of all op uses by where the op lives.", "",
        *_table(["family", *head[1:]], [(r["key"], _pct(r["dataset"]), _pct(r["reference"]))
                                        for r in comparison["op_families"]]), "",
        *_plot(plots, "op_families"),
        f"{level} Input sizes", "",
        "The integers that shape each task's inputs (batch, channels, features, spatial, sequence).", "",
        *_table(["", *head[1:]], _size_rows(comparison["sizes"])), "",
        *_plot(plots, "sizes"),
        f"{level} Eager time", "",
        *_spread_section(comparison["eager_ms"], head, "ms", "Median eager time of one forward call, "
                         "where the side was timed (a dataset folder; a reference of bare code was not)."),
        *_plot(plots, "eager_ms"),
        f"{level} Output magnitude", "",
        *_spread_section(comparison["output_max_abs"], head, "max abs",
                         "The largest magnitude of any output element, where the side measured it."),
        *_plot(plots, "output_max_abs"),
        *_similarity_section(comparison["similarity"], theirs["name"], level),
        *_plot(plots, "similarity"),
    ]


def _summary_rows(comparison: dict) -> list[tuple]:
    mine, theirs = comparison["dataset"], comparison["reference"]
    sizes, eager = comparison["sizes"], comparison["eager_ms"]
    return [("tasks", mine["tasks"], theirs["tasks"]),
            ("mean ops per task", mine["mean_ops"], theirs["mean_ops"]),
            ("input sizes that are multiples of 8", _pct(sizes["dataset"]["multiple_of_8"]),
             _pct(sizes["reference"]["multiple_of_8"])),
            ("input sizes that are powers of two", _pct(sizes["dataset"]["power_of_two"]),
             _pct(sizes["reference"]["power_of_two"])),
            ("eager ms, median", *(_get(eager[side], "p50") for side in ("dataset", "reference")))]


def _ops_source(comparison: dict) -> str:
    sides = "; ".join(f"`{about['name']}`: {_source(about)}" for about in (comparison["dataset"], comparison["reference"]))
    return (f"Where the ops come from: {sides}. Ops read from text include the arithmetic and tensor methods a "
            "task spells out, which a composed row's `ops` name only where the composer drew them.")


def _source(about: dict) -> str:
    if not about["ops_from_text"]:
        return "its `ops` column"
    if about["ops_from_text"] == about["tasks"]:
        return "the tasks' text"
    return f"its `ops` column, and the text of the {about['ops_from_text']} tasks without one"


def _size_rows(sizes: dict) -> list[tuple]:
    mine, theirs = sizes["dataset"], sizes["reference"]
    return [("input sizes counted", mine["sizes"], theirs["sizes"]),
            ("multiples of 8", _pct(mine["multiple_of_8"]), _pct(theirs["multiple_of_8"])),
            ("powers of two", _pct(mine["power_of_two"]), _pct(theirs["power_of_two"])),
            ("tasks with every size a multiple of 8", _pct(mine["tasks_all_multiple_of_8"]),
             _pct(theirs["tasks_all_multiple_of_8"])),
            ("median", _number(mine["median"]), _number(theirs["median"]))]


def _spread_section(spread: dict, head: list[str], unit: str, what: str) -> list[str]:
    if not spread["dataset"] and not spread["reference"]:
        return [what + " Neither side measured it.", ""]
    rows = [(f"{name} {unit}", *(_get(spread[side], name) for side in ("dataset", "reference")))
            for name in ("p10", "p50", "p90")]
    return [what, "", *_table(["", *head[1:]], [("tasks", *(_get(spread[s], "tasks") for s in ("dataset", "reference"))),
                                               *rows]), ""]


def _similarity_section(similarity: dict | None, reference: str, level: str) -> list[str]:
    if not similarity:
        return []
    return [f"{level} Similarity to {reference}", "",
            f"Each task's highest textual similarity to any task of `{reference}` (the decontamination score "
            f"without traced op sequences): median {similarity['p50']}, highest {similarity['max']}, "
            f"{similarity['above_0.9']} of {similarity['tasks']} above 0.9. A run's own decontamination "
            "compared what each task computes as well: its score, usually higher, is the rows' "
            "`kernelbench_max_similarity` column.", "",
            *_table(["similarity", "tasks"], _bins(similarity["histogram"])), ""]


def _bins(histogram: dict) -> list[tuple]:
    edges = histogram["edges"]
    return [(f"{edges[i]}-{edges[i + 1]:.4g}", count) for i, count in enumerate(histogram["counts"]) if count]


def _get(spread: dict | None, key: str):
    return "not measured" if spread is None or spread.get(key) is None else _number(spread[key])


def _number(value):
    return f"{value:.3g}" if isinstance(value, float) else value


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def _plot(plots: dict[str, str], name: str) -> list[str]:
    return [f"![{name}]({plots[name]})", ""] if name in plots else []


def _table(header: list[str], rows) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
