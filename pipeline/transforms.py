"""The Beam graph of one round: one composite PTransform per stage, each step labelled.

The logic lives in plain Python (pipeline/composers, filters/, outputs/); these transforms
only wire it and count every outcome with Beam counters.

The graph is one chain. Every element is a record, (Candidate, Verdict | None), undecided
while its verdict is None. A stage decides the undecided records it can and passes the
decided ones on untouched, so nothing is dropped (every index that enters leaves as exactly
one record) and one sink writes them all. Every step emits from `process` only and gathers
its work with GroupByKey, never with tagged outputs or `finish_bundle`: Beam's DaskRunner
sends all of a ParDo's outputs down one path and loses what `finish_bundle` emits.
"""
from __future__ import annotations

from collections import Counter
from concurrent.futures import as_completed
from dataclasses import replace

import apache_beam as beam
from apache_beam.metrics import Metrics

from filters.similarity.decontaminate import SimilarityIndex
from filters.sandbox.pool import SandboxOptions, close_shared_pools, shared_pool
from filters.similarity.score import fingerprint
from filters.sandbox.validate import start_validation
from filters.store import VerdictStore
from operators.records import Candidate, OpSpec, Verdict, record_to_json
from pipeline import progress
from pipeline.composers import make_composer

NAMESPACE = "opsynth"

Record = tuple[Candidate, Verdict | None]


FROM_STORE = "from_store"  # verdicts a validation found in the verdict store
TURNED_DOWN = "turned_down"  # chains a composer's screens turned down (and drew again), by screen


def count(stage: str, outcome: str, times: int = 1) -> None:
    Metrics.counter(NAMESPACE, f"{stage}.{outcome}").inc(times)


def index_of(candidate: Candidate) -> int:
    return candidate.provenance.get("index", 0)


class ComposeCandidates(beam.PTransform):
    """Jobs ({"index": n, ...}) -> records: (Candidate, None), or (placeholder Candidate, its
    reject) for a job that yields no task. Jobs are composed `batch` consecutive indexes at a
    time, so that an LLM composer keeps several requests in flight."""

    def __init__(self, kind: str, catalog: list[OpSpec], run_seed: int, batch: int = 16, **options):
        """`options` are make_composer's: op_count_mix, library_mix, sampling, usage, llm_settings, cache_dir."""
        super().__init__()
        self.args = (kind, catalog, run_seed, options)
        self.batch = batch

    def expand(self, jobs):
        return (jobs
                | "KeyByBatch" >> beam.Map(_keyed_by_batch, self.batch)
                | "GroupBatch" >> beam.GroupByKey()
                | "ComposeEach" >> beam.ParDo(_ComposeFn(*self.args)))


def _keyed_by_batch(job: dict, batch: int) -> tuple[int, dict]:
    return job["index"] // batch, job


class _ComposeFn(beam.DoFn):
    def __init__(self, kind, catalog, run_seed, options):
        self.kind, self.catalog, self.run_seed, self.options = kind, catalog, run_seed, options

    def setup(self):
        self.composer = make_composer(self.kind, self.catalog, **self.options)

    def process(self, keyed_batch):
        _, jobs = keyed_batch
        for result in self.composer.compose_many(sorted(jobs, key=lambda job: job["index"]), self.run_seed):
            if isinstance(result, tuple):
                count("compose", result[1].reason)
                yield result
            else:
                count("compose", "composed")
                yield result, None
        for screen, turned_down in getattr(self.composer, "turned_down", Counter()).items():
            count(TURNED_DOWN, screen, turned_down)
        self.composer.turned_down = Counter()


class DropDuplicates(beam.PTransform):
    """Of the undecided candidates with one id, keep the first (lowest index); the others are
    rejects that name what they duplicate. `prior_ids` are ids decided in earlier rounds."""

    def __init__(self, prior_ids: frozenset[str] = frozenset()):
        super().__init__()
        self.prior_ids = prior_ids

    def expand(self, records):
        return (records
                | "KeyById" >> beam.Map(lambda record: (record[0].id, record))
                | "GroupById" >> beam.GroupByKey()
                | "KeepFirst" >> beam.ParDo(_KeepFirst(self.prior_ids)))


class _KeepFirst(beam.DoFn):
    def __init__(self, prior_ids):
        self.prior_ids = prior_ids

    def process(self, keyed):
        candidate_id, group = keyed
        undecided = sorted((c for c, verdict in group if verdict is None), key=index_of)
        yield from ((c, verdict) for c, verdict in group if verdict is not None)
        keep = undecided[0] if undecided and candidate_id not in self.prior_ids else None
        if keep:
            count("dedupe", "unique")
            yield keep, None
        for duplicate in undecided[1 if keep else 0:]:
            count("dedupe", "duplicate")
            original = f"candidate {index_of(keep)}" if keep else "a candidate of an earlier round"
            yield duplicate, Verdict(duplicate.id, "dedupe", False, "duplicate", f"same normalized code as {original}")


class ValidateCandidates(beam.PTransform):
    """Static check, then every execution check in the sandbox pool, for each undecided record.

    Records are validated in `groups` groups (by index), each group by one call that keeps
    its process's pool full: one group per Beam process on one host; on a cluster, enough
    groups that every worker gets some and a lost worker's groups are all that is redone."""

    def __init__(self, sandbox: SandboxOptions, check_config: dict, workers: int, gpus: list[int] | None,
                 store_dir: str | None = None, library_ops: frozenset[str] = frozenset(), groups: int = 1):
        super().__init__()
        self.validate_fn = _ValidateFn(sandbox, check_config, workers, gpus, store_dir, library_ops)
        self.groups = groups

    def expand(self, records):
        return (records
                | "KeyByGroup" >> beam.Map(_keyed_by_group, self.groups)
                | "GroupForPool" >> beam.GroupByKey()
                | "RunChecks" >> beam.ParDo(self.validate_fn))


def _keyed_by_group(record: Record, groups: int) -> tuple[int, Record]:
    return index_of(record[0]) % max(1, groups), record


class _ValidateFn(beam.DoFn):
    """Every candidate of a group goes to the pool at once, and its verdict leaves as soon as
    it is known: no worker waits for the slowest candidate of a batch."""

    def __init__(self, sandbox, check_config, workers, gpus, store_dir, library_ops=frozenset()):
        self.sandbox, self.check_config, self.workers, self.gpus = sandbox, check_config, workers, gpus
        self.store_dir, self.library_ops = store_dir, library_ops

    def setup(self):
        self.pool = shared_pool(self.workers, self.sandbox, self.gpus)
        self.store = VerdictStore(self.store_dir) if self.store_dir else None

    def process(self, keyed_group):
        _, group = keyed_group
        in_flight = {}
        for candidate, verdict in sorted(group, key=lambda record: index_of(record[0])):
            if verdict is not None:
                yield candidate, verdict
            elif not progress.stop_requested():
                in_flight[start_validation(candidate, self.pool, self.check_config, self.library_ops,
                                           store=self.store)] = candidate
        for future in as_completed(in_flight):
            if progress.stop_requested():
                # the run has its rows: what is under way is not needed, and its candidates stay
                # undecided (a later, larger run composes new ones); what is decided is kept
                yield from self._finished(in_flight)
                close_shared_pools()
                return
            yield self._decided(in_flight, future)

    def _decided(self, in_flight: dict, future) -> Record:
        verdict = future.result()
        count(verdict.stage, "passed" if verdict.passed else verdict.reason)
        if getattr(future, "from_store", False):
            count("validate", FROM_STORE)  # a resumed run says how much it found done, on any runner
        progress.report(verdict.passed, verdict.reason, (in_flight[future], verdict))
        return in_flight.pop(future), verdict

    def _finished(self, in_flight: dict):
        for future in [future for future in in_flight if future.done() and not future.cancelled()]:
            yield self._decided(in_flight, future)


class Decontaminate(beam.PTransform):
    """Accepted records stay accepted when at most `threshold` similar to every reference
    task (the nearest one and its score are kept as metrics); the others become
    `kernelbench_similar` rejects, and those whose computation the sandbox could not trace
    `untraced` ones. Rejected records pass untouched."""

    def __init__(self, reference: tuple, threshold: float):
        super().__init__()
        self.reference, self.threshold = reference, threshold

    def expand(self, records):
        return records | "MatchReference" >> beam.ParDo(_DecontaminateFn(self.reference, self.threshold))


class _DecontaminateFn(beam.DoFn):
    def __init__(self, reference, threshold):
        self.reference, self.threshold = reference, threshold

    def setup(self):
        self.index = SimilarityIndex(self.reference)

    def process(self, record):
        candidate, verdict = record
        if not verdict.passed:
            yield record
            return
        graph = verdict.metrics.get("op_graph")  # what the validated task computes, traced in the sandbox
        if graph is None and self.index.graphs:
            # a trace that failed or ran out of time leaves the text alone to compare, and a
            # determined task can fail its trace (filters/checks/harness.py, trace)
            count("decontaminate", "untraced")
            yield candidate, replace(
                verdict, stage="decontaminate", passed=False, reason="untraced",
                detail="what it computes could not be traced in the sandbox, so it cannot be compared with "
                       "the reference's computations; only its text could")
            return
        match = self.index.match(fingerprint(verdict.code or candidate.code, candidate.id, graph), self.threshold)
        metrics = {**verdict.metrics, "kernelbench_max_similarity": match.similarity,
                   "kernelbench_nearest": match.nearest}
        if match.too_close(self.threshold):
            count("decontaminate", "kernelbench_similar")
            yield candidate, replace(
                verdict, stage="decontaminate", passed=False, reason="kernelbench_similar", metrics=metrics,
                detail=f"AST similarity {match.similarity:.3f} to {match.nearest} (> {self.threshold})")
            return
        count("decontaminate", "passed")
        yield candidate, replace(verdict, metrics=metrics)


class WriteRecords(beam.PTransform):
    """Every decided record of the round as one JSON line, in one file named for the round,
    written whole or not at all (so a rerun can trust a round file that exists)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def expand(self, records):
        return (records
                | "ToJson" >> beam.MapTuple(record_to_json)
                | "WriteJsonLines" >> beam.io.WriteToText(self.path, num_shards=1, shard_name_template=""))
