"""The Beam graph of one round: one composite PTransform per stage, each step labelled.

The logic lives in plain Python (pipeline/composers, filters/, outputs/); these transforms
only wire it, count every outcome with Beam counters, and route rejects to their own
output so that nothing is dropped: every index that enters leaves as exactly one record.
"""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait
from dataclasses import replace

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from filters.similarity.decontaminate import SimilarityIndex
from filters.sandbox.pool import SandboxOptions, shared_pool
from filters.similarity.score import fingerprint
from filters.sandbox.validate import start_validation
from filters.store import VerdictStore
from operators.records import Candidate, OpSpec, Verdict, record_to_json
from pipeline import progress
from pipeline.composers import make_composer

REJECTED = "rejected"
NAMESPACE = "opsynth"


def count(stage: str, outcome: str) -> None:
    Metrics.counter(NAMESPACE, f"{stage}.{outcome}").inc()


class ComposeCandidates(beam.PTransform):
    """Jobs ({"index": n, ...}) -> Candidates; a job that yields no task becomes a reject.
    Jobs are batched so an LLM composer can keep several requests in flight."""

    def __init__(self, kind: str, catalog: list[OpSpec], run_seed: int, batch: int = 16, **options):
        """`options` are make_composer's: op_count_mix, library_mix, sampling, usage, llm_settings, cache_dir."""
        super().__init__()
        self.args = (kind, catalog, run_seed, options)
        self.batch = batch

    def expand(self, jobs):
        outputs = (jobs
                   | "Batch" >> beam.BatchElements(min_batch_size=self.batch, max_batch_size=self.batch)
                   | "ComposeEach" >> beam.ParDo(_ComposeFn(*self.args)).with_outputs(REJECTED, main="candidates"))
        return outputs.candidates, outputs[REJECTED]


class _ComposeFn(beam.DoFn):
    def __init__(self, kind, catalog, run_seed, options):
        self.kind, self.catalog, self.run_seed, self.options = kind, catalog, run_seed, options

    def setup(self):
        self.composer = make_composer(self.kind, self.catalog, **self.options)

    def process(self, jobs: list[dict]):
        for result in self.composer.compose_many(jobs, self.run_seed):
            if isinstance(result, tuple):
                count("compose", result[1].reason)
                yield beam.pvalue.TaggedOutput(REJECTED, result)
            else:
                count("compose", "composed")
                yield result


class DropDuplicates(beam.PTransform):
    """Keep the first candidate (lowest index) of each id; the others are rejects that name
    what they duplicate. `prior_ids` are ids already decided in earlier rounds."""

    def __init__(self, prior_ids: frozenset[str] = frozenset()):
        super().__init__()
        self.prior_ids = prior_ids

    def expand(self, candidates):
        outputs = (candidates
                   | "KeyById" >> beam.Map(lambda c: (c.id, c))
                   | "GroupById" >> beam.GroupByKey()
                   | "KeepFirst" >> beam.ParDo(_KeepFirst(self.prior_ids)).with_outputs(REJECTED, main="unique"))
        return outputs.unique, outputs[REJECTED]


class _KeepFirst(beam.DoFn):
    def __init__(self, prior_ids):
        self.prior_ids = prior_ids

    def process(self, keyed):
        candidate_id, group = keyed
        ordered = sorted(group, key=lambda c: c.provenance.get("index", 0))
        keep = ordered[0] if candidate_id not in self.prior_ids else None
        if keep:
            count("dedupe", "unique")
            yield keep
        for duplicate in ordered[1 if keep else 0:]:
            count("dedupe", "duplicate")
            original = f"candidate {ordered[0].provenance.get('index')}" if keep else "a candidate of an earlier round"
            yield beam.pvalue.TaggedOutput(REJECTED, (duplicate, Verdict(
                duplicate.id, "dedupe", False, "duplicate", f"same normalized code as {original}")))


class ValidateCandidates(beam.PTransform):
    """Static check, then every execution check in the sandbox pool."""

    def __init__(self, sandbox: SandboxOptions, check_config: dict, workers: int, gpus: list[int] | None,
                 store_dir: str | None = None, library_ops: frozenset[str] = frozenset()):
        super().__init__()
        self.sandbox, self.check_config, self.workers, self.gpus = sandbox, check_config, workers, gpus
        self.store_dir, self.library_ops = store_dir, library_ops

    def expand(self, candidates):
        outputs = candidates | "RunChecks" >> beam.ParDo(
            _ValidateFn(self.sandbox, self.check_config, self.workers, self.gpus, self.store_dir, self.library_ops)
        ).with_outputs(REJECTED, main="accepted")
        return outputs.accepted, outputs[REJECTED]


class _ValidateFn(beam.DoFn):
    """Each candidate goes to the pool as it arrives and its verdict leaves as soon as it is
    known, so no worker waits for the slowest candidate of a batch. Twice as many
    candidates as workers are in flight; the rest wait in Beam."""

    def __init__(self, sandbox, check_config, workers, gpus, store_dir, library_ops=frozenset()):
        self.sandbox, self.check_config, self.workers, self.gpus = sandbox, check_config, workers, gpus
        self.store_dir, self.library_ops = store_dir, library_ops

    def setup(self):
        self.pool = shared_pool(self.workers, self.sandbox, self.gpus)
        self.store = VerdictStore(self.store_dir) if self.store_dir else None

    def start_bundle(self):
        self.in_flight: dict[Future, tuple[Candidate, WindowedValue]] = {}

    def process(self, candidate: Candidate, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam):
        future = start_validation(candidate, self.pool, self.check_config, self.library_ops, store=self.store)
        self.in_flight[future] = (candidate, WindowedValue(None, timestamp, [window]))
        if len(self.in_flight) >= 2 * self.workers:
            wait(self.in_flight, return_when=FIRST_COMPLETED)
        yield from self._emit(everything=False)

    def finish_bundle(self):
        yield from self._emit(everything=True)

    def _emit(self, everything: bool):
        """The verdicts already known, or (`everything`) all of them, each as it finishes."""
        finished = as_completed(self.in_flight) if everything else [f for f in self.in_flight if f.done()]
        for future in finished:
            candidate, place = self.in_flight.pop(future)
            verdict = future.result()
            count(verdict.stage, "passed" if verdict.passed else verdict.reason)
            progress.report(verdict.passed, verdict.reason)
            value = place.with_value((candidate, verdict))
            yield value if verdict.passed else beam.pvalue.TaggedOutput(REJECTED, value)


class WriteRecords(beam.PTransform):
    """Every (Candidate, Verdict) of the round as one JSON line, in one file named for the
    round, written whole or not at all (so a rerun can trust a round file that exists)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def expand(self, records):
        return (records
                | "ToJson" >> beam.MapTuple(record_to_json)
                | "WriteJsonLines" >> beam.io.WriteToText(self.path, num_shards=1, shard_name_template=""))


class Decontaminate(beam.PTransform):
    """Accepted records -> those at most `threshold` similar to every reference task (with
    the nearest one and its score kept as metrics) | rejects as `kernelbench_similar`."""

    def __init__(self, reference: tuple, threshold: float):
        super().__init__()
        self.reference, self.threshold = reference, threshold

    def expand(self, records):
        outputs = records | "MatchReference" >> beam.ParDo(
            _DecontaminateFn(self.reference, self.threshold)).with_outputs(REJECTED, main="clean")
        return outputs.clean, outputs[REJECTED]


class _DecontaminateFn(beam.DoFn):
    def __init__(self, reference, threshold):
        self.reference, self.threshold = reference, threshold

    def setup(self):
        self.index = SimilarityIndex(self.reference)

    def process(self, record):
        candidate, verdict = record
        graph = verdict.metrics.get("op_graph")  # what the validated task computes, traced in the sandbox
        match = self.index.match(fingerprint(verdict.code or candidate.code, candidate.id, graph), self.threshold)
        metrics = {**verdict.metrics, "kernelbench_max_similarity": match.similarity,
                   "kernelbench_nearest": match.nearest}
        if match.too_close(self.threshold):
            count("decontaminate", "kernelbench_similar")
            yield beam.pvalue.TaggedOutput(REJECTED, (candidate, replace(
                verdict, stage="decontaminate", passed=False, reason="kernelbench_similar", metrics=metrics,
                detail=f"AST similarity {match.similarity:.3f} to {match.nearest} (> {self.threshold})")))
            return
        count("decontaminate", "passed")
        yield candidate, replace(verdict, metrics=metrics)
