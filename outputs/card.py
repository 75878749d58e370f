"""The dataset card (README.md): YAML metadata the Hub reads, then the story for people."""
from __future__ import annotations

import pyarrow as pa
import yaml

from outputs.schema import SAMPLE_SCHEMA

REJECT_GLOSSARY = {
    "compose_failed": "no chain of the drawn length fitted together",
    "duplicate": "same normalized code as an earlier candidate",
    "syntax_error": "does not parse", "bad_interface": "lacks Model / get_inputs / get_init_inputs",
    "forbidden_import": "imports a module outside the allowlist",
    "forbidden_call": "reaches the file system, processes, network or interpreter",
    "stochastic_op": "random op in forward", "eager_error": "raises in eager mode",
    "nan_or_inf": "output holds NaN or Inf", "nondeterministic": "two identical runs differ",
    "fixed_inputs": "get_inputs() does not draw fresh inputs",
    "constant_output": "output does not depend on the input at the verification tolerance",
    "too_fast": "under the timing window even after re-sizing",
    "too_slow": "over the timing window even after re-sizing", "too_large": "over the memory cap",
    "compile_error": "torch.compile fails", "compile_mismatch": "eager and compiled outputs disagree",
    "timeout": "ran past the wall-clock limit", "crashed": "killed its worker",
    "out_of_memory": "ran out of memory", "kernelbench_similar": "too close to a KernelBench task",
    "llm_error": "the LLM request failed for good", "no_code": "the answer held no code block",
    "missing_op": "the code does not use every requested op", "dead_parameter": "a parameter does not affect the output",
    "unused_module": "a submodule is built but never used", "redundant_op": "an op can be dropped without effect",
    "near_duplicate": "too close to an earlier accepted sample",
}


def render_card(stats: dict, plots: dict[str, str] | None = None) -> str:
    body = _body(stats, plots or {})
    return f"---\n{yaml.safe_dump(_metadata(stats), sort_keys=False)}---\n\n" + "\n".join(body) + "\n"


def _metadata(stats: dict) -> dict:
    accepted = stats["accepted"]
    size = "n<1K" if accepted < 1_000 else "1K<n<10K" if accepted < 10_000 else "10K<n<100K"
    return {
        "license": "apache-2.0",
        "tags": ["code", "cuda", "pytorch", "kernels", "reinforcement-learning", "opsynth"],
        "size_categories": [size],
        "task_categories": ["text-generation"],
        "configs": [{"config_name": "default",
                     "data_files": [{"split": "train", "path": "data/train-*.parquet"}]}],
        "dataset_info": {"features": [_feature(field) for field in SAMPLE_SCHEMA],
                         "splits": [{"name": "train", "num_examples": accepted}]},
    }


def _feature(field) -> dict:
    if pa.types.is_list(field.type):
        return {"name": field.name, "sequence": str(field.type.value_type)}
    return {"name": field.name, "dtype": {"double": "float64", "bool": "bool"}.get(str(field.type), str(field.type))}


def _plot(plots: dict[str, str], name: str) -> list[str]:
    return [f"![{name}]({plots[name]})", ""] if name in plots else []


def _body(stats: dict, plots: dict[str, str]) -> list[str]:
    low, high = stats["window_ms"]
    lines = [
        "# opsynth kernel tasks",
        "",
        "Self-contained PyTorch programs in the KernelBench format (`Model`, `get_inputs`, "
        "`get_init_inputs`) that fuse one to five operators, for training agents that write CUDA "
        "kernels, in the style of CUDA-Agent-Ops-6K. Every task was proven in a sandbox to run in "
        f"eager mode and under `torch.compile` with agreeing outputs (atol = rtol = {stats['atol']}), "
        f"to be deterministic, to give input-dependent output, and to take {low}-{high} ms in eager "
        f"mode on **{stats['device']}**" + (" (a CPU timing window: re-validate on a GPU before GPU training)."
                                            if stats["device"] == "cpu" else "."),
        "",
        *_decontamination(stats),
        "## Counts",
        "",
        f"{stats['accepted']} accepted of {stats['composed']} composed ({stats['rejected']} rejected); "
        f"the run stopped because it {stats['stop_reason']}.",
        "",
        "How it was made: operators crawled from " + ", ".join(stats.get("libraries", ["torch"]))
        + f" were fused by the `{stats['composer']}` composer; every candidate was validated in a sandboxed "
        "worker process (static check, eager, timing window with re-sizing, determinism, input dependence, "
        "no dead parameter or redundant op, `torch.compile` agreement), then matched against the reference "
        "benchmark and deduplicated.",
        "",
        *_table(["ops", "samples", "share", "target share"], _op_count_rows(stats)),
        "",
        *_plot(plots, "op_count_mix"),
        *_op_frequency(stats),
        *_plot(plots, "op_frequency"),
        *_table(["library", "samples"], stats["library_mix"].items()),
        "",
        *_plot(plots, "library_mix"),
        "## Eager time",
        "",
        *_table(["eager ms", "samples"], _histogram_rows(stats["eager_ms_histogram"])),
        "",
        *_plot(plots, "eager_ms"),
        "## Reject funnel",
        "",
        *_table(["stage", "entered", "rejected"],
                [(row["stage"], row["entered"], row["rejected"]) for row in stats["funnel"]]),
        "",
        *_table(["reason", "rejected", "meaning"],
                [(r, n, REJECT_GLOSSARY.get(r, "")) for r, n in stats["rejected_by_reason"].items()]),
        "",
        *_plot(plots, "funnel"),
        "## Provenance",
        "",
        *_table(["what", "value"], _provenance(stats)),
    ]
    return lines


def _op_count_rows(stats: dict):
    counts, target = stats["op_count_mix"], stats.get("op_count_target") or {}
    total = sum(counts.values()) or 1
    for key in sorted(set(counts) | set(target), key=int):
        yield key, counts.get(key, 0), f"{counts.get(key, 0) / total:.3f}", target.get(key, "")


def _op_frequency(stats: dict) -> list[str]:
    if not stats.get("op_frequency"):
        return []
    heavy = stats.get("compute_heavy_share")
    return [f"The {len(stats['op_frequency'])} most frequent ops; "
            + (f"{heavy:.1%} of samples hold a compute-heavy op (a matmul, convolution, attention, recurrent "
               "cell or normalisation)." if heavy is not None else ""), "",
            *_table(["op", "samples"], stats["op_frequency"].items()), ""]


def _decontamination(stats: dict) -> list[str]:
    if stats.get("decontaminated"):
        return [f"Decontaminated against `{stats['reference']}` (revision `{stats['reference_revision']}`): no "
                f"task has AST similarity above {stats['similarity_threshold']} to any reference task, and no two "
                f"tasks are more than {stats['dedupe_threshold']} similar to each other.", "",
                *_table(["max similarity to the reference", "samples"],
                        _histogram_rows(stats["kernelbench_similarity_histogram"])), ""]
    return ["> **Not decontaminated.** This run had no reference benchmark (`--reference`), so tasks "
            "were not checked against KernelBench. Do not train on it and evaluate on KernelBench.", ""]


def _provenance(stats: dict) -> list[tuple[str, str]]:
    versions = stats["versions"]
    return [
        *((package.replace("_", "-"), value) for package, value in versions.items() if package != "platform"),
        ("device", stats["device"]),
        ("composer", stats["composer"] + (f" ({stats['sampling']} sampling)" if stats.get("sampling") else "")),
        ("seed", str(stats["seed"])),
        ("timing window (ms)", f"{stats['window_ms'][0]}-{stats['window_ms'][1]}"),
        ("determinism tolerance", str(stats["determinism_tol"])),
        ("reference set", f"{stats['reference']} @ {stats['reference_revision']}" if stats.get("reference") else "none"),
        ("similarity thresholds", f"reference {stats['similarity_threshold']}, dedupe {stats['dedupe_threshold']}"),
        ("wall time (s)", f"{stats['wall_time_s']:.0f}"),
        *([("LLM tokens (prompt + completion)", f"{stats['llm']['prompt_tokens']} + {stats['llm']['completion_tokens']}"),
           ("LLM tokens per accepted sample", str(stats["llm"]["tokens_per_accepted"])),
           ("accepted after repair", str(stats["llm"]["accepted_after_repair"]))] if stats.get("llm") else []),
    ]


def _histogram_rows(histogram: dict):
    edges = histogram["edges"]
    return [(f"{edges[i]}-{edges[i + 1]}", count) for i, count in enumerate(histogram["counts"]) if count]


def _table(header: list[str], rows) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines
