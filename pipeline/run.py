"""`opsynth run`: compose and validate in rounds until N samples are accepted, then write
the dataset folder; `opsynth validate`: re-audit existing tasks the same way.

Each round is one Beam pipeline over a range of candidate indexes; its records land in the
staging folder (pipeline/staging.py). Composition is a pure function of (seed, index), so a
run started again with the same configuration reads the finished rounds back and goes on
from there instead of redoing them.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from filters.checks.registry import CHECK_STAGES, DEFAULTS as CHECK_DEFAULTS
from filters.sandbox.pool import SandboxOptions, shared_pool
from filters.similarity.reference import (GRAPH_VERSION, ReferenceSet, ReferenceSetError, load_reference, read_parquet,
                                          read_tasks)
from operators.catalog import load_or_crawl
from operators.records import Candidate, OpSpec, task_id
from operators.libraries import is_added
from operators.task import library_ops
from operators.usage import op_usage
from outputs.dataset import write_dataset
from pipeline.composers.llm import LLMSettings
from pipeline.config import ConfigError, RunConfig
from pipeline.dedupe import traced_in_batches
from pipeline.devices import beam_processes, default_workers, resolve_device, sandbox_options
from pipeline.out_dir import copy_to_remote, log_to, output_dir
from pipeline.planning import plan_jobs
from pipeline import progress
from pipeline.progress import Progress
from pipeline.run_info import run_info
from pipeline.sampling import (NoOpsSelected, held_back, mix_gaps, rows_complete, select_ops, steer_config,
                               top_up_candidates, written_rows)
from pipeline.staging import (drop_near_duplicates, keep_before_endpoint_down, read_invocations, read_jsonl,
                              read_rounds, record_invocation, run_fingerprint, staging_dir)
from pipeline.transforms import (FROM_STORE, TURNED_DOWN, ComposeCandidates, Decontaminate, DropDuplicates,
                                 ValidateCandidates, WriteRecords)

log = logging.getLogger("opsynth")
MIN_YIELD = 0.1
ROUND_PER_WORKER = 64
FIRST_ROUND_PER_WORKER = 4
MAX_TOP_UPS = 3  # rounds composed after --num-samples were accepted, to meet the mix (mix_tolerance)


@dataclass(frozen=True)
class RunSetup:
    """What every round of one run shares."""

    cfg: RunConfig
    catalog: list[OpSpec]
    reference: ReferenceSet | None
    llm: LLMSettings | None
    device: str
    gpus: list[int]
    workers: int
    out_dir: Path
    staging: Path
    usage: dict | None  # calls of each op in real model code, for the template composer's layer sampling


def run(cfg: RunConfig) -> dict:
    started = time.monotonic()
    device, gpus = resolve_device(cfg.device)
    out_dir = output_dir(cfg)
    log_to(out_dir / "run.log")
    llm = llm_settings(cfg)  # configuration problems surface before the (first-time, minutes-long) crawl
    reference = _load_reference(cfg)
    _, catalog = load_or_crawl(cfg.libraries, Path(cfg.cache_dir), cfg.ops)
    try:
        catalog = select_ops(catalog, cfg.ops)
    except NoOpsSelected as error:
        raise ConfigError(str(error)) from None
    log.info("catalog: %d runnable ops from %s", len(catalog), ", ".join(cfg.libraries))
    if not reference:
        log.warning("NO REFERENCE BENCHMARK (--reference): tasks are NOT decontaminated against KernelBench; "
                    "the dataset card will say so")
    workers = cfg.workers or default_workers(device, gpus, cfg.beam_args)
    if reference:  # traced by the pool the run's validation then uses (the same options: the same pool)
        pool = shared_pool(workers, sandbox_options(cfg, device, gpus, workers, out_dir), gpus or None)
        reference = traced_in_batches(reference, pool, cfg.cache_dir, {"device": device, "seed": cfg.seed})
        log.info("reference traced: %d of %d tasks compared by what they compute", reference.traced,
                 len(reference.fingerprints))
    layered = cfg.sampling == "layers"  # the template composer's chains and the LLM composer's op tuples
    setup = RunSetup(cfg, catalog, reference, llm, device, gpus, workers, out_dir,
                     staging_dir(out_dir, run_fingerprint(cfg, device)),
                     op_usage([spec.name for spec in catalog], cfg.libraries) if layered else None)
    records = drop_near_duplicates(read_rounds(setup.staging), cfg.dedupe_threshold)
    next_index = max((c.provenance.get("index", -1) for c, _ in records), default=-1) + 1
    resumed = len(records), sum(v.passed for _, v in records)  # (decided, accepted) by earlier invocations
    if records:
        log.info("resuming: %d candidates already decided in %s", len(records), setup.staging)

    invocation = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    decided_so_far = [resumed[0]]

    def ledger(decided: int) -> None:
        decided_so_far[0] = decided
        record_invocation(setup.staging, invocation, time.monotonic() - started, decided - resumed[0])

    with Progress(cfg.num_samples, sum(v.passed for _, v in records), started=started) as status:
        status.stop_when(lambda accepted: rows_complete(accepted, cfg), [r for r in records if r[1].passed])
        try:
            stop_reason, records, down = _rounds(setup, records, next_index, status, ledger)
        except BaseException:  # interrupted: its time counts in the run's stats, with the rounds it finished
            ledger(decided_so_far[0])
            raise

    (log.info if "num-samples" in stop_reason else log.warning)("stopped: %s", stop_reason)
    ledger(len(records))
    accepted = sum(v.passed for _, v in records)
    records, held = held_back(written_rows(records, cfg))
    info = run_info(cfg, device, reference, stop_reason, read_invocations(setup.staging), resumed,
                    accepted, sorted({spec.library for spec in catalog}))
    stats = write_dataset(out_dir, records, info, reference, held=held)
    log.info("wrote %s: %s; %d accepted/h over the run's %.0f s", out_dir, written_summary(stats),
             stats["accepted_per_hour"], stats["wall_time_s"])
    copy_to_remote(out_dir, cfg.out)
    return {**stats, "endpoint_down": down is not None}


def written_summary(stats: dict) -> str:
    """What a finished command wrote, in the words the card uses."""
    held = stats.get("held_back", 0)
    return (f"{stats['accepted']} rows" + (f" ({held} more accepted, held back in held/: their op count or library "
                                           "had filled its share)" if held else "")
            + f", {stats['rejected']} rejected (rejects/)")


def _rounds(setup: RunSetup, records: list, next_index: int, status: Progress, ledger):
    """Compose and validate round after round, noting each in the run's `ledger`; returns
    (why it stopped, records, endpoint down?)."""
    cfg, catalog = setup.cfg, setup.catalog
    down, top_ups = None, 0
    while True:
        stop_reason, size, top_up = plan_round(cfg, records, setup.workers, next_index, top_ups)
        if stop_reason:
            break
        top_ups += top_up
        steered = replace(setup, cfg=steer_config(cfg, records, size))  # the mix corrected by what was accepted
        jobs = plan_jobs(steered.cfg, catalog, records, next_index, size, setup.usage)
        if not jobs:
            stop_reason = (f"drew every op tuple the selected {len(catalog)} ops allow, with "
                           f"{sum(v.passed for _, v in records)} accepted")
            break
        path = setup.staging / f"round-{next_index:07d}-{next_index + len(jobs):07d}.jsonl"
        log.info("round of %d candidates (%d-%d): composing, then validating on %d workers", len(jobs), next_index,
                 next_index + len(jobs) - 1, setup.workers)
        reused = _run_round(steered, jobs, [c for c, _ in records], path)
        round_records, down = keep_before_endpoint_down(path)
        records = drop_near_duplicates(records + round_records, cfg.dedupe_threshold)
        next_index += len(jobs)
        status.sync(sum(v.passed for _, v in records), Counter(v.reason for _, v in records if not v.passed),
                    [record for record in records if record[1].passed])
        ledger(len(records))
        undecided = len(jobs) - len(round_records)  # cancelled in flight once the target was reached
        log.info("round of %d done: %s%s%s", len(round_records), status.line(),
                 f" ({reused} verdicts found in the verdict store, decided before: not run again)" if reused else "",
                 f"; {undecided} of its {len(jobs)} candidates left undecided, not needed once the target was reached"
                 if undecided and status.done.is_set() else "")
        if down:
            stop_reason = (f"the LLM endpoint stayed down ({down}); the {len(records)} candidates decided so far "
                           "are kept; fix the endpoint and run the same command again to continue")
            break
    return stop_reason, records, down


def plan_round(cfg: RunConfig, records: list, workers: int, next_index: int, top_ups: int) -> tuple[str, int, bool]:
    """(why to stop, or "" to go on; the next round's size; whether it is a top-up round):
    rounds go on until --num-samples are accepted and, with `mix_tolerance` set, until the
    rows written can meet the mix (at most MAX_TOP_UPS rounds more), or --max-candidates."""
    accepted = sum(v.passed for _, v in records)
    top_up = top_up_candidates(records, cfg) if accepted >= cfg.num_samples else 0
    gaps = mix_gaps(written_rows(records, cfg), cfg) if top_up else {}
    if accepted >= cfg.num_samples and (not top_up or top_ups == MAX_TOP_UPS):
        stop_reason = f"reached --num-samples ({accepted} accepted, {cfg.num_samples} asked)"
        if top_up:
            stop_reason += (f"; after {top_ups} top-up rounds the mix is still off by "
                            + ", ".join(f"{-gap:+.0f} {key}" for key, gap in gaps.items() if abs(gap) >= 1))
        return stop_reason, 0, False
    if next_index >= cfg.max_candidates:
        return (f"reached --max-candidates ({cfg.max_candidates}) with {accepted} of "
                f"{cfg.num_samples} samples accepted"), 0, False
    if top_up:
        log.info("%d accepted; top-up round %d of at most %d for the mix: %s", accepted, top_ups + 1, MAX_TOP_UPS,
                 ", ".join(f"{key} {-gap:+.1f}" for key, gap in gaps.items()))
    # A cluster's runner spreads a round over workers opsynth does not count: its first round is full size
    local = _runner(cfg.beam_args).endswith("DirectRunner")
    size = round_size(max(cfg.num_samples - accepted, 0), accepted, len(records), workers,
                      cfg.max_candidates - next_index, top_up, FIRST_ROUND_PER_WORKER if local else ROUND_PER_WORKER)
    return "", size, bool(top_up)


def llm_settings(cfg: RunConfig) -> LLMSettings | None:
    if cfg.composer != "llm":
        return None
    if not cfg.llm.get("model"):
        raise ConfigError("--composer llm needs a model: pass --llm-model NAME or set llm.model in the config")
    if not (cfg.llm.get("base_url") or os.environ.get("OPENAI_BASE_URL") or os.environ.get(cfg.llm["api_key_env"])):
        raise ConfigError(f"--composer llm needs an endpoint: set OPENAI_BASE_URL (or llm.base_url) for your own "
                          f"server, or {cfg.llm['api_key_env']} for OpenAI")
    return LLMSettings(**{**cfg.llm, "target_ms": cfg.target_ms})


def validate_tasks(cfg: RunConfig, tasks: str) -> dict:
    """`opsynth validate`: re-audit existing tasks with the engine `opsynth run` uses."""
    started = time.monotonic()
    device, gpus = resolve_device(cfg.device)
    out_dir = output_dir(cfg)
    candidates = external_candidates(tasks)
    workers = cfg.workers or default_workers(device, gpus, cfg.beam_args)
    path = out_dir / ".staging" / "validate.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    sandbox = sandbox_options(cfg, device, gpus, workers, out_dir)
    check_config = _check_config(cfg, device, sandbox)
    groups = validation_groups(cfg.beam_args, len(candidates), workers)
    log.info("validating %d tasks of %s on %d workers", len(candidates), tasks, workers)
    with Progress(len(candidates), started=started), round_pipeline(cfg.beam_args, groups) as pipeline:
        (pipeline | "Tasks" >> beam.Create([(candidate, None) for candidate in candidates])
         | "Validate" >> ValidateCandidates(sandbox, check_config, workers, gpus or None, verdicts_dir(cfg.cache_dir),
                                            added_library_ops(cfg), groups)
         | "Write" >> WriteRecords(str(path)))
    drop_write_leftovers(path)
    records = read_jsonl(path)
    stop = f"validated all {len(candidates)} tasks of {tasks}"
    invocation = {"wall_time_s": time.monotonic() - started, "decided": len(records)}
    info = {**run_info(cfg, device, None, stop, {"validate": invocation}, (0, 0), sum(v.passed for _, v in records)),
            "composer": "validate", "sampling": None, "source": str(tasks), "target_samples": len(candidates)}
    stats = write_dataset(out_dir, records, info)
    log.info("wrote %s: %d of %d tasks pass", out_dir, stats["accepted"], stats["composed"])
    for candidate, verdict in sorted(records, key=lambda record: str(record[0].provenance.get("source"))):
        log.info("  %s: %s", candidate.provenance.get("source"),
                 "passes" if verdict.passed else f"{verdict.stage}/{verdict.reason}: {verdict.detail[:160]}")
    copy_to_remote(out_dir, cfg.out)
    return stats


def external_candidates(tasks: str) -> list[Candidate]:
    """Candidates from a folder of .py files or a Parquet file with a `code` column; each
    keeps its `source` (file name or row number) and, from Parquet, its ops and composer."""
    path = Path(tasks)
    try:
        if path.is_file() and path.suffix == ".parquet":
            rows = read_parquet(path).to_pylist()
            if rows and "code" not in rows[0]:
                raise ConfigError(f"{tasks} has no `code` column")
            named = [(f"row {i}", row) for i, row in enumerate(rows)]
        else:
            named = [(name, {"code": code}) for name, code in read_tasks(tasks)]
    except ReferenceSetError as error:
        raise ConfigError(str(error).replace("--reference ", "")) from None
    if not named:
        raise ConfigError(f"{tasks} holds no tasks")
    candidates = []
    for index, (source, row) in enumerate(named):
        ops = tuple(row.get("ops") or ())
        candidates.append(Candidate(
            id=_external_id(row["code"]), ops=ops, data_source=row.get("data_source") or f"external#{len(ops)}",
            code=row["code"], composer=row.get("composer") or "external", seed=0,
            provenance={"index": index, "source": source}))
    return candidates


def _external_id(code: str) -> str:
    try:
        return task_id(code)
    except SyntaxError:
        return hashlib.sha256(code.encode()).hexdigest()[:16]


def round_size(needed: int, accepted: int, decided: int, workers: int, remaining: int, top_up: int = 0,
               first_per_worker: int = FIRST_ROUND_PER_WORKER) -> int:
    """Enough candidates to reach the target at the yield seen so far (a guess of 50% at
    first), or the `top_up` candidates the mix lacks, at least one batch for every worker,
    never past --max-candidates. At most ROUND_PER_WORKER a worker: a long run then keeps
    its work in staging round by round, and composes a round while its pool waits for a
    few seconds, not for minutes. A run's first round is at most `first_per_worker` a
    worker: its first verdicts and rows come after composing that few (a first round of
    1,024 was composed and screened for 160 s on the H200 before any worker had a task),
    and the next round is sized by the yield it saw."""
    observed = accepted / decided if decided else 0.5
    size = math.ceil(max(needed / max(observed, MIN_YIELD), top_up) * 1.2)
    most = (ROUND_PER_WORKER if decided else first_per_worker) * workers
    return max(1, min(max(size, 2 * workers), most, remaining))


def _check_config(cfg: RunConfig, device: str, sandbox: SandboxOptions) -> dict:
    """Every setting the checks read, their defaults spelt out: a verdict stored under one
    threshold is not taken for another (the store's key is this)."""
    return {**CHECK_DEFAULTS, **cfg.checks, "device": device, "seed": cfg.seed, "atol": cfg.atol, "rtol": cfg.rtol,
            "determinism_tol": cfg.determinism_tol, "window_ms": list(cfg.window_ms), "target_ms": cfg.target_ms,
            "max_task_memory_gb": cfg.max_task_memory_gb,
            "memory_budget_gb": sandbox.task_memory_budget_gb,
            "op_graph": GRAPH_VERSION,  # verdicts stored before tracing carry no op sequence
            "checks": list(CHECK_STAGES)}  # verdicts stored before a check was added do not count


def _run_round(setup: RunSetup, jobs: list[dict], prior: list[Candidate], path: Path) -> int:
    """Compose `jobs` (or read back the round an interrupted invocation composed), then decide
    each in one Beam pipeline, knowing the `prior` candidates of earlier rounds; the records
    land in `path`. Returns how many verdicts it found in the verdict store (decided by an
    earlier, interrupted invocation)."""
    cfg = setup.cfg
    composed = composed_round(setup, jobs, prior, composed_path(path))
    sandbox = sandbox_options(cfg, setup.device, setup.gpus, setup.workers, setup.out_dir)
    check_config = _check_config(cfg, setup.device, sandbox)
    groups = validation_groups(cfg.beam_args, len(jobs), setup.workers)
    validate = ValidateCandidates(sandbox, check_config, setup.workers, setup.gpus or None, verdicts_dir(cfg.cache_dir),
                                  library_ops(setup.catalog), groups)
    with round_pipeline(cfg.beam_args, groups) as pipeline:
        records = (pipeline | "Composed" >> beam.Create(composed)
                   | "Dedupe" >> DropDuplicates(frozenset(c.id for c in prior)) | "Validate" >> validate)
        if setup.reference:
            records = records | "Decontaminate" >> Decontaminate(setup.reference.fingerprints, cfg.similarity_threshold)
        records | "Write" >> WriteRecords(str(path))
    drop_write_leftovers(path)
    composed_path(path).unlink(missing_ok=True)  # the round's records hold its candidates now
    return counted(pipeline, f"validate.{FROM_STORE}")


def composed_path(round_path: Path) -> Path:
    """Where a round's composed candidates wait for their verdicts, beside the round's records."""
    return round_path.with_name("composed-" + round_path.name.removeprefix("round-"))


def composed_round(setup: RunSetup, jobs: list[dict], prior: list[Candidate], path: Path) -> list:
    """The round's composed records, (Candidate, None) or a composition's reject: composed
    by a Beam pipeline of their own and kept in `path` (written whole or not at all) until
    the round is decided, so that an invocation interrupted while validating resumes with
    its first verdict, not by composing and screening the round again (150 s a round of
    1,024 on the H200)."""
    if path.exists():
        composed = read_jsonl(path)
        log.info("round composed by an earlier invocation: %d candidates read back", len(composed))
        return composed
    for stale in path.parent.glob("composed-*.jsonl"):  # a round planned otherwise (its plan's input changed)
        stale.unlink()
    cfg, llm = setup.cfg, setup.llm
    # The template composer takes a round as one batch (every index under the last + 1 shares
    # one key), so that the round's candidates hold back each other's op tuples.
    batch = 2 * llm.concurrency if llm else jobs[-1]["index"] + 1
    reference = setup.reference.fingerprints if setup.reference else ()
    compose = ComposeCandidates(cfg.composer, setup.catalog, cfg.seed, batch,
                                op_count_mix=cfg.op_count_mix, library_mix=cfg.library_mix, sampling=cfg.sampling,
                                usage=setup.usage, llm_settings=llm, cache_dir=cfg.cache_dir,
                                drawn=frozenset(candidate.ops for candidate in prior if candidate.ops),
                                reference=reference, similarity_threshold=cfg.similarity_threshold)
    began = time.monotonic()
    progress.doing(f"composing a round of {len(jobs)}")
    try:
        with round_pipeline(cfg.beam_args, 1) as pipeline:
            pipeline | "Jobs" >> beam.Create(jobs) | "Compose" >> compose | "Write" >> WriteRecords(str(path))
    finally:
        progress.doing("validating")
    drop_write_leftovers(path)
    composed = read_jsonl(path)
    turned_down = counted(pipeline, f"{TURNED_DOWN}.kernelbench_similar")
    log.info("composed %d candidates in %.0f s%s", sum(v is None for _, v in composed), time.monotonic() - began,
             f" ({turned_down} chains too close to the reference drawn again)" if turned_down else "")
    return composed


def drop_write_leftovers(path: Path) -> None:
    """Beam's file sink works in temporary folders beside the file, and removes the one it
    finishes in; on the DaskRunner every task that reads the sink's set-up result makes
    another, which stays behind."""
    for leftover in path.parent.glob(f"beam-temp-{path.name}-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def added_library_ops(cfg: RunConfig) -> frozenset[str]:
    """The ops of the run's added libraries that tasks handed to `validate` may use, by
    dotted name (the static check allows exactly those, and the modules that hold them; a
    run's own tasks use its catalog's, operators.task.library_ops). torch is always allowed;
    transformers layers are inlined, so their tasks use nothing of it."""
    added = [library for library in cfg.libraries if is_added(library)]
    if not added:
        return frozenset()
    _, catalog = load_or_crawl(added, Path(cfg.cache_dir))
    return library_ops(catalog)


def _load_reference(cfg: RunConfig) -> ReferenceSet | None:
    if not cfg.reference:
        return None
    try:
        reference = load_reference(cfg.reference, tuple(cfg.reference_levels))
    except ReferenceSetError as error:
        raise ConfigError(str(error)) from None
    log.info("reference %s (%s): %d tasks", cfg.reference, reference.revision, len(reference.fingerprints))
    return reference


@contextlib.contextmanager
def round_pipeline(beam_args: list[str], groups: int):
    """A Beam pipeline on the user's runner, run to the end when the block closes (its result
    is kept as `pipeline.finished`, for its counters)."""
    pipeline = beam.Pipeline(options=PipelineOptions(_beam_args(beam_args, groups)))
    yield pipeline
    result = pipeline.run()
    try:
        result.wait_until_finish()
        pipeline.finished = result
    finally:
        client = getattr(result, "client", None)  # the DaskRunner leaves its connection to the scheduler open
        if client is not None:
            client.close()


def counted(pipeline, name: str) -> int:
    """A counter of a finished round (0 where the runner reports none)."""
    try:
        found = pipeline.finished.metrics().query(MetricsFilter().with_name(name))["counters"]
    except Exception:  # a runner without metrics
        return 0
    return int(sum(counter.committed or counter.attempted or 0 for counter in found))


def validation_groups(beam_args: list[str], candidates: int, workers: int) -> int:
    """How many groups a round's candidates are validated in (ValidateCandidates): one for
    each Beam process of a DirectRunner, whose pool each keeps full; on any other runner,
    one for every four candidates a pool of `workers` holds, so that the cluster's workers
    share the round and a lost worker costs only the groups it held."""
    if _runner(beam_args).endswith("DirectRunner"):
        return beam_processes(beam_args)
    return max(1, math.ceil(candidates / (4 * workers)))


def _beam_args(args: list[str], groups: int) -> list[str]:
    """The user's Beam options, with the embedded DirectRunner unless they chose a runner.
    On the DaskRunner a round's jobs are split in as many parts as there are validation
    groups, unless the user split them: Beam's Create otherwise keeps up to 128 in one
    part, which one dask worker would then validate alone."""
    args = list(args) if any(a.startswith("--runner") for a in args) else ["--runner=DirectRunner", *args]
    split = any(a.startswith(("--dask_npartitions", "--dask_partition_size")) for a in args)
    if _runner(args).endswith("DaskRunner") and not split:
        args.append(f"--dask_npartitions={groups}")
    return args


def _runner(beam_args: list[str]) -> str:
    return PipelineOptions(list(beam_args)).view_as(StandardOptions).runner or "DirectRunner"


def verdicts_dir(cache_dir: str | Path) -> str:
    """The verdict store: a killed `opsynth run` or `opsynth validate` redoes no finished validation."""
    return str(Path(cache_dir) / "verdicts")
