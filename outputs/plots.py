"""The dataset card's plots, as PNG files under plots/ that the card shows."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from outputs.stats import ranked  # noqa: E402

PLOTS = {
    "op_count_mix": "Accepted samples by number of fused ops, against the target mix",
    "op_frequency": "Most frequent ops",
    "library_mix": "Accepted samples by library",
    "eager_ms": "Median eager time of accepted samples",
    "funnel": "Rejected candidates by reason",
}
BLUE, GREY = "#4c72b0", "#bbbbbb"


def make_plots(stats: dict, folder: Path) -> dict[str, str]:
    """Write every plot; returns {name: path relative to the dataset folder}."""
    folder.mkdir(parents=True, exist_ok=True)
    histogram = stats["eager_ms_histogram"]
    edges = histogram["edges"]
    low, high = stats.get("window_ms") or (0, float("inf"))
    in_window = [BLUE if low <= edges[i] and edges[i + 1] <= high else GREY for i in range(len(edges) - 1)]
    bars = {
        "library_mix": (list(stats["library_mix"]), list(stats["library_mix"].values()), "library", BLUE),
        "eager_ms": ([f"{edges[i]}-{edges[i + 1]}" for i in range(len(edges) - 1)], histogram["counts"],
                     f"ms (blue: inside the {low}-{high} ms timing window)", in_window),
        "funnel": (list(stats["rejected_by_reason"]), list(stats["rejected_by_reason"].values()), "reason", BLUE),
    }
    paths = {}
    for name, (labels, values, xlabel, color) in bars.items():
        figure, axes = _figure(name)
        axes.bar(range(len(values)), values, color=color)
        axes.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 4 else 0,
                        ha="right" if len(labels) > 4 else "center")
        axes.set_xlabel(xlabel)
        axes.set_ylabel("count")
        axes.yaxis.get_major_locator().set_params(integer=True)
        paths[name] = _save(figure, folder, name)
    paths["op_count_mix"] = _op_count_mix(stats, folder)
    paths["op_frequency"] = _op_frequency(stats, folder)
    if stats.get("reference_comparison"):
        beside = make_comparison_plots(stats["reference_comparison"], folder, COMPARISON_PREFIX)
        paths.update({COMPARISON_PREFIX + name: path for name, path in beside.items()})
    return paths


def _op_count_mix(stats: dict, folder: Path) -> str:
    """Share of accepted samples per op count beside the share the run aimed at."""
    counts = stats["op_count_mix"]
    target = stats.get("op_count_target") or {}
    keys = sorted(set(counts) | set(target), key=int)
    total = sum(counts.values()) or 1
    figure, axes = _figure("op_count_mix")
    positions = range(len(keys))
    axes.bar([p - 0.2 for p in positions], [counts.get(k, 0) / total for k in keys], 0.4, color=BLUE, label="accepted")
    axes.bar([p + 0.2 for p in positions], [target.get(k, 0) for k in keys], 0.4, color=GREY, label="target")
    axes.set_xticks(list(positions), keys)
    axes.set_xlabel("ops fused")
    axes.set_ylabel("share of samples")
    axes.legend()
    return _save(figure, folder, "op_count_mix")


def _op_frequency(stats: dict, folder: Path) -> str:
    frequency = dict(ranked(stats.get("op_frequency") or {}))
    names = [_short_name(name) for name in frequency][::-1]
    figure, axes = plt.subplots(figsize=(6, 0.25 * len(names) + 1.2), dpi=100)
    axes.set_title(PLOTS["op_frequency"])
    axes.barh(range(len(names)), list(frequency.values())[::-1], color=BLUE)
    axes.set_yticks(range(len(names)), names, fontsize=7)
    axes.set_xlabel("accepted samples using the op")
    axes.xaxis.get_major_locator().set_params(integer=True)
    return _save(figure, folder, "op_frequency")


def _short_name(name: str) -> str:
    """`torch.nn.functional.gelu` -> `F.gelu`; a transformers layer by its class name."""
    if name.startswith("transformers."):
        return name.rsplit(".", 1)[-1]
    return name.replace("torch.nn.functional.", "F.").replace("torch.nn.", "nn.")


def _figure(name: str):
    figure, axes = plt.subplots(figsize=(6, 3.2), dpi=100)
    axes.set_title(PLOTS[name])
    return figure, axes


def _save(figure, folder: Path, name: str) -> str:
    figure.tight_layout()
    figure.savefig(folder / f"{name}.png")
    plt.close(figure)
    return f"{folder.name}/{name}.png"


# -- a dataset beside a reference (outputs/report.py) ---------------------------------------

COMPARISON_PLOTS = {
    "op_count_mix": "Tasks by number of ops",
    "top_ops": "Tasks using each op",
    "op_families": "Op uses by family",
    "sizes": "Input sizes (log2 bins)",
    "eager_ms": "Median eager time",
    "output_max_abs": "Largest output magnitude",
    "similarity": "Highest textual similarity to the reference",
}
ORANGE = "#dd8452"
COMPARISON_PREFIX = "vs_reference_"  # the card's comparison plots, beside its own


def make_comparison_plots(comparison: dict, folder: Path, prefix: str = "") -> dict[str, str]:
    """The report's plots (file names start with `prefix`; the card's are `vs_reference_*`);
    a measure neither side has gets none. Returns {name: path relative to folder's parent}."""
    folder.mkdir(parents=True, exist_ok=True)
    sides = (comparison["dataset"]["name"], comparison["reference"]["name"])
    paths = {}
    for name, rows in (("op_count_mix", comparison["op_count_mix"]), ("op_families", comparison["op_families"])):
        paths[name] = _paired_bars(folder, prefix, name, sides, rows, "share")
    paths["top_ops"] = _paired_bars(folder, prefix, "top_ops", sides, comparison["top_ops"][::-1],
                                    "share of tasks", horizontal=True)
    paths["sizes"] = _paired_histograms(folder, prefix, "sizes", sides, [comparison["sizes"][side]["histogram"]
                                                                         for side in ("dataset", "reference")])
    for name in ("eager_ms", "output_max_abs"):
        spreads = [comparison[name][side] for side in ("dataset", "reference")]
        if any(spreads):
            paths[name] = _paired_histograms(folder, prefix, name, sides, [s and s["histogram"] for s in spreads])
    if comparison.get("similarity"):
        paths["similarity"] = _paired_histograms(folder, prefix, "similarity", sides,
                                                 [comparison["similarity"]["histogram"], None])
    return paths


def _paired_bars(folder: Path, prefix: str, name: str, sides: tuple, rows: list[dict], unit: str,
                 horizontal: bool = False) -> str:
    """Each key's share on both sides, as two bars."""
    labels = [_short_name(row["key"]) for row in rows]
    if horizontal:
        figure, axes = plt.subplots(figsize=(6, 0.3 * len(rows) + 1.4), dpi=100)
    else:
        figure, axes = plt.subplots(figsize=(6, 3.4), dpi=100)
    axes.set_title(COMPARISON_PLOTS[name])
    positions = range(len(rows))
    bar = axes.barh if horizontal else axes.bar
    for offset, side, key, color in ((-0.2, sides[0], "dataset", BLUE), (0.2, sides[1], "reference", ORANGE)):
        bar([p + offset for p in positions], [row[key] for row in rows], 0.4, color=color, label=side)
    if horizontal:
        axes.set_yticks(list(positions), labels, fontsize=7)
        axes.set_xlabel(unit)
    else:
        crowded = sum(len(label) for label in labels) > 40
        axes.set_xticks(list(positions), labels, rotation=30 if crowded else 0, ha="right" if crowded else "center",
                        fontsize=8)
        axes.set_ylabel(unit)
    axes.legend(fontsize=7)
    return _save(figure, folder, prefix + name)


def _paired_histograms(folder: Path, prefix: str, name: str, sides: tuple, histograms: list) -> str:
    """Share of each side's tasks per bin; a side without the measure has no bars."""
    edges = next(h for h in histograms if h)["edges"]
    labels = [f"{_edge(edges[i])}-{_edge(edges[i + 1])}" for i in range(len(edges) - 1)]
    figure, axes = plt.subplots(figsize=(6.4, 3.4), dpi=100)
    axes.set_title(COMPARISON_PLOTS[name])
    positions = range(len(labels))
    both = all(histograms)
    for offset, side, found, color in ((-0.2, sides[0], histograms[0], BLUE), (0.2, sides[1], histograms[1], ORANGE)):
        if found:
            total = sum(found["counts"]) or 1
            axes.bar([p + (offset if both else 0) for p in positions], [c / total for c in found["counts"]],
                     0.4 if both else 0.8, color=color, label=side)
    axes.set_xticks(list(positions), labels, rotation=45, ha="right", fontsize=7)
    axes.set_ylabel("share of each side's tasks")
    axes.set_xlabel(HISTOGRAM_AXES.get(name, ""))
    if name == "similarity" and SIMILARITY_THRESHOLD in edges:  # where decontamination cuts
        axes.axvline(edges.index(SIMILARITY_THRESHOLD) - 0.5, color="red", linestyle="--", linewidth=1,
                     label=f"threshold {SIMILARITY_THRESHOLD}")
    axes.legend(fontsize=7)
    return _save(figure, folder, prefix + name)


HISTOGRAM_AXES = {"similarity": "highest textual similarity to any reference task (no traced ops)", "eager_ms": "eager time (ms)",
                  "output_max_abs": "largest output magnitude"}
SIMILARITY_THRESHOLD = 0.9  # the default --similarity-threshold


def _edge(value: float) -> str:
    """A bin edge as a person reads it: 1k for 1024, inf for the open end, 1 for 1.0001."""
    if value == float("inf") or value >= 2 ** 62:
        return "inf"
    if value >= 1024 and float(value).is_integer() and int(value) & (int(value) - 1) == 0:
        return f"{int(value) // 1024}k"
    return f"{round(value, 3):g}"
