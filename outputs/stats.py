"""stats.json: the funnel stage by stage, the mixes, the runtime histogram, the versions."""
from __future__ import annotations

from collections import Counter

from filters.checks.registry import CHECK_STAGES
from operators.libraries import is_added
from operators.records import Candidate, Verdict
from operators.roles import compute_heavy

# The order candidates meet the stages in; the funnel reports them in this order.
STAGES = ("compose", "static", "sandbox", *CHECK_STAGES, "decontaminate", "dedupe")
HISTOGRAM_EDGES_MS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
TOP_OPS = 20
SIMILARITY_EDGES = (0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0001)


def compute_stats(records: list[tuple[Candidate, Verdict]], run_info: dict, held: int = 0) -> dict:
    """`records`: the rows and the rejects; `held`: how many more were accepted and held back
    (written apart, in held/). composed = accepted + held_back + rejected."""
    accepted = [(c, v) for c, v in records if v.passed]
    rejected = [(c, v) for c, v in records if not v.passed]
    return {
        "composed": len(records) + held,
        "accepted": len(accepted),
        "held_back": held,
        "rejected": len(rejected),
        "funnel": funnel(records, held),
        "rejected_by_reason": dict(Counter(v.reason for _, v in rejected).most_common()),
        "op_count_mix": _sorted_counts(len(c.ops) for c, _ in accepted),
        "library_mix": _sorted_counts(c.data_source.split("#")[0] for c, _ in accepted),
        "op_frequency": dict(Counter(op for c, _ in accepted for op in c.ops).most_common(TOP_OPS)),
        # what a user passes to outputs.load.load_task for rows that use an added library's ops
        "library_ops": sorted({op for c, _ in accepted for op in c.ops if is_added(op)}),
        "compute_heavy_share": share(compute_heavy(c.ops) for c, _ in accepted),
        "eval_mode_only": sum(_above_one(v.metrics.get("train_mode_share")) for _, v in accepted),
        "eager_ms_histogram": histogram([v.metrics.get("eager_ms") for _, v in accepted]),
        "time_by_check_s": time_by_check(records),
        "gpu_gate_s": gpu_gate(records),
        "llm": llm_usage(records, len(accepted)),
        "kernelbench_similarity_histogram": histogram(
            [v.metrics.get("kernelbench_max_similarity") for _, v in accepted], SIMILARITY_EDGES),
        **run_info,
    }


def _above_one(share) -> bool:
    return isinstance(share, (int, float)) and share > 1.0


def funnel(records: list[tuple[Candidate, Verdict]], held: int = 0) -> list[dict]:
    """Each stage, the candidates that entered it and those it rejected (accepted candidates
    held back are rejected by none)."""
    rejected_at = Counter(v.stage for _, v in records if not v.passed)
    entered = len(records) + held
    rows = []
    for stage in STAGES + tuple(sorted(set(rejected_at) - set(STAGES))):
        rows.append({"stage": stage, "entered": entered, "rejected": rejected_at.get(stage, 0)})
        entered -= rejected_at.get(stage, 0)
    return rows


def llm_usage(records: list[tuple[Candidate, Verdict]], accepted: int) -> dict | None:
    """Token cost of an LLM-composed run: totals, per accepted sample, and what repair won."""
    answered = [c for c, _ in records if "prompt_tokens" in c.provenance]
    if not answered:
        return None
    prompt = sum(c.provenance["prompt_tokens"] for c in answered)
    completion = sum(c.provenance["completion_tokens"] for c in answered)
    return {
        "answers": len(answered),
        "answers_from_cache": sum(bool(c.provenance.get("cached")) for c in answered),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "tokens_per_accepted": round((prompt + completion) / accepted, 1) if accepted else None,
        "accepted_first_try": sum(v.passed and not c.provenance.get("repair_round") for c, v in records),
        "accepted_after_repair": sum(v.passed and bool(c.provenance.get("repair_round")) for c, v in records),
    }


def time_by_check(records: list[tuple[Candidate, Verdict]]) -> dict:
    """Sandbox wall time per check, summed over every candidate (accepted or not)."""
    totals: Counter = Counter()
    for _, verdict in records:
        for key, value in verdict.metrics.items():
            if key.startswith("t_") and key.endswith("_ms") and isinstance(value, (int, float)):
                totals[key[2:-3]] += value / 1e3
    return {check: round(seconds, 2) for check, seconds in totals.most_common()}


def gpu_gate(records: list[tuple[Candidate, Verdict]]) -> dict:
    """On a GPU: time the workers spent waiting at the timing gate, and holding the GPU
    alone to time, summed over every candidate (both are inside time_by_check_s)."""
    waiting = sum(v.metrics.get("gate_wait_ms", 0.0) for _, v in records) / 1e3
    alone = sum(v.metrics.get("gpu_alone_ms", 0.0) for _, v in records) / 1e3
    return {"waiting": round(waiting, 2), "alone": round(alone, 2)} if waiting or alone else {}


def histogram(values: list[float | None], edges: tuple = HISTOGRAM_EDGES_MS) -> dict:
    counts = [0] * (len(edges) - 1)
    for value in (v for v in values if v is not None):
        index = next((i for i in range(len(edges) - 1) if value < edges[i + 1]), len(counts) - 1)
        counts[index] += 1
    return {"edges": list(edges), "counts": counts}


def share(flags) -> float | None:
    """The share of true flags, or None when there are none to count."""
    flags = list(flags)
    return round(sum(flags) / len(flags), 3) if flags else None


def ranked(counts: dict) -> list[tuple]:
    """(key, count) pairs, the largest count first (stats.json keeps its keys sorted by name)."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _sorted_counts(values) -> dict:
    return {str(key): count for key, count in sorted(Counter(values).items())}
