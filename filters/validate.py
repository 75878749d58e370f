"""Validate candidates: the static check here, every execution check in the sandbox."""
from __future__ import annotations

from filters.sandbox import WorkerPool
from filters.static_check import static_check
from filters.store import VerdictStore
from operators.records import Candidate, Verdict


def validate(candidates: list[Candidate], pool: WorkerPool, check_config: dict,
             extra_imports: frozenset[str] = frozenset(), store: VerdictStore | None = None) -> list[Verdict]:
    """One Verdict per candidate, in order. Never raises for anything a candidate does.
    With a store, results already there are reused and new ones are added."""
    verdicts: list[Verdict | None] = [None] * len(candidates)
    to_run, known = [], {}
    for position, candidate in enumerate(candidates):
        rejected = static_check(candidate.code, extra_imports)
        if rejected:
            verdicts[position] = Verdict(candidate.id, "static", False, rejected[0], rejected[1])
            continue
        stored = store.get(store.key(candidate.code, check_config)) if store else None
        if stored is not None:
            known[position] = stored
        else:
            to_run.append(position)
    fresh = pool.run_many([{"code": candidates[p].code, "config": check_config} for p in to_run])
    for position, result in zip(to_run, fresh):
        if store and result["stage"] != "sandbox":  # a crash or timeout may be the machine's: try again
            store.put(store.key(candidates[position].code, check_config), result)
    results = {**known, **dict(zip(to_run, fresh))}
    for position, result in sorted(results.items()):
        candidate = candidates[position]
        resized = result.get("code") if result.get("code") not in (None, candidate.code) else None
        verdicts[position] = Verdict(candidate.id, result["stage"], result["passed"], result["reason"],
                                     result["detail"], result.get("metrics", {}), resized)
    return verdicts
