"""The dataset card's plots, as PNG files under plots/ that the card shows."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

PLOTS = {
    "op_count_mix": "Accepted samples by number of fused ops",
    "library_mix": "Accepted samples by library",
    "eager_ms": "Median eager time of accepted samples",
    "funnel": "Rejected candidates by reason",
}


def make_plots(stats: dict, folder: Path) -> dict[str, str]:
    """Write every plot; returns {name: path relative to the dataset folder}."""
    folder.mkdir(parents=True, exist_ok=True)
    histogram = stats["eager_ms_histogram"]
    edges = histogram["edges"]
    series = {
        "op_count_mix": (list(stats["op_count_mix"]), list(stats["op_count_mix"].values()), "ops fused"),
        "library_mix": (list(stats["library_mix"]), list(stats["library_mix"].values()), "library"),
        "eager_ms": ([f"{edges[i]}-{edges[i + 1]}" for i in range(len(edges) - 1)], histogram["counts"], "ms"),
        "funnel": (list(stats["rejected_by_reason"]), list(stats["rejected_by_reason"].values()), "reason"),
    }
    paths = {}
    for name, (labels, values, xlabel) in series.items():
        figure, axes = plt.subplots(figsize=(6, 3.2), dpi=100)
        axes.bar(range(len(values)), values, color="#4c72b0")
        axes.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 4 else 0, ha="right" if len(labels) > 4 else "center")
        axes.set_title(PLOTS[name])
        axes.set_xlabel(xlabel)
        axes.set_ylabel("count")
        axes.yaxis.get_major_locator().set_params(integer=True)
        figure.tight_layout()
        figure.savefig(folder / f"{name}.png")
        plt.close(figure)
        paths[name] = f"{folder.name}/{name}.png"
    return paths
