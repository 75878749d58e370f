"""Validate candidates: the static check here, every execution check in the sandbox."""
from __future__ import annotations

from concurrent.futures import Future

from filters.sandbox.pool import WorkerPool
from filters.grammar import static_check
from filters.store import VerdictStore
from operators.records import Candidate, Verdict


def start_validation(candidate: Candidate, pool: WorkerPool, check_config: dict,
                     library_ops: frozenset[str] = frozenset(), store: VerdictStore | None = None) -> Future:
    """A future Verdict for one candidate. The static check and the store decide at once;
    anything else goes to the next idle sandbox worker. Never fails for anything a candidate
    does. With a store, a result already there is reused and a new one is added."""
    rejected = static_check(candidate.code, library_ops)
    if rejected:
        return _decided(Verdict(candidate.id, "static", False, rejected[0], rejected[1]))
    key = store.key(candidate.code, check_config) if store else ""
    stored = store.get(key) if store else None
    if stored is not None:
        reused = _decided(_verdict(candidate, stored))
        reused.from_store = True  # a resumed run says how much it found done
        return reused

    def finish(result: dict) -> Verdict:
        if store and result["stage"] != "sandbox":  # a crash or timeout may be the machine's: try again
            store.put(key, result)
        return _verdict(candidate, result)
    return pool.submit({"code": candidate.code, "config": check_config}, then=finish)


def validate(candidates: list[Candidate], pool: WorkerPool, check_config: dict,
             library_ops: frozenset[str] = frozenset(), store: VerdictStore | None = None) -> list[Verdict]:
    """One Verdict per candidate, in order."""
    futures = [start_validation(c, pool, check_config, library_ops, store) for c in candidates]
    return [future.result() for future in futures]


def _verdict(candidate: Candidate, result: dict) -> Verdict:
    resized = result.get("code") if result.get("code") not in (None, candidate.code) else None
    return Verdict(candidate.id, result["stage"], result["passed"], result["reason"], result["detail"],
                   result.get("metrics", {}), resized)


def _decided(verdict: Verdict) -> Future:
    future: Future = Future()
    future.set_result(verdict)
    return future
