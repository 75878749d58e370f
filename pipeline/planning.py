"""What each round composes: fresh jobs, and for the LLM composer, repair jobs for
candidates rejected for a reason a model can fix. A pure function of the records so far,
so a rerun plans the same jobs."""
from __future__ import annotations

from operators.records import Candidate, OpSpec, Verdict
from pipeline.composers.llm import REPAIRABLE
from pipeline.sampling import sample_tuples


def plan_jobs(cfg, catalog: list[OpSpec], records: list[tuple[Candidate, Verdict]], next_index: int,
              size: int, usage: dict[str, int] | None = None) -> list[dict]:
    """`usage`: calls of each op in model code (operators/usage.py), the LLM tuples' weights."""
    if cfg.composer == "template":
        return [{"index": index} for index in range(next_index, next_index + size)]
    repairs = repair_jobs(records, cfg.llm["repair_rounds"])[:size]
    drawn = frozenset(tuple(c.provenance.get("requested_ops") or c.ops) for c, _ in records)
    tuples = sample_tuples(catalog, size - len(repairs), cfg.op_count_mix, cfg.library_mix, cfg.seed,
                           start=next_index, drawn=drawn, usage=usage)
    jobs = repairs + [{"ops": ops} for ops in tuples]
    return [{**job, "index": next_index + offset} for offset, job in enumerate(jobs)]


def repair_jobs(records: list[tuple[Candidate, Verdict]], max_rounds: int) -> list[dict]:
    repaired = {c.provenance["repair_of"] for c, _ in records if "repair_of" in c.provenance}
    jobs = []
    for candidate, verdict in sorted(records, key=lambda r: r[0].provenance.get("index", 0)):
        round_ = candidate.provenance.get("repair_round", 0)
        if (verdict.passed or not candidate.composer.startswith("llm:") or verdict.reason not in REPAIRABLE
                or round_ >= max_rounds or candidate.id in repaired):
            continue
        jobs.append({"ops": candidate.provenance.get("requested_ops") or list(candidate.ops),
                     "repair_of": {"id": candidate.id, "round": round_ + 1, "stage": verdict.stage,
                                   "reason": verdict.reason, "detail": verdict.detail,
                                   "code": verdict.code or candidate.code}})
    return jobs
