"""`opsynth run`: compose and validate in rounds until N samples are accepted, then write
the dataset folder.

Each round is one Beam pipeline over a range of candidate indexes; its records land in
`OUT/.staging/round-*.jsonl`. Composition is a pure function of (seed, index), so a run
started again with the same configuration reads the finished rounds back and goes on
from there instead of redoing them.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, replace
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions

from filters.checks import CHECKS
from filters.decontaminate import dedupe
from filters.reference import (GRAPH_VERSION, ReferenceSet, ReferenceSetError, load_reference, read_parquet,
                               read_tasks, traced)
from filters.sandbox import SandboxOptions, shared_pool
from filters.similarity import fingerprint
from operators.catalog import cache_key, load_or_crawl
from operators.records import Candidate, record_from_json, record_to_json
from operators.task import imported_packages, task_id
from operators.usage import op_usage
from outputs.dataset import write_dataset
from outputs.remote import RemoteOutputError, check_writable, is_remote, local_mirror, upload
from pipeline.composers.llm import LLMSettings
from pipeline.config import ConfigError, RunConfig
from pipeline.planning import plan_jobs
from pipeline.progress import Progress
from pipeline.sampling import NoOpsSelected, select_ops
from pipeline.transforms import ComposeCandidates, Decontaminate, DropDuplicates, ValidateCandidates, WriteRecords

log = logging.getLogger("opsynth")
MIN_YIELD = 0.1


def run(cfg: RunConfig) -> dict:
    started = time.monotonic()
    device, gpus = resolve_device(cfg.device)
    out_dir = output_dir(cfg)
    _log_to(out_dir / "run.log")
    cache_dir = Path(cfg.cache_dir)
    llm = llm_settings(cfg)  # configuration problems surface before the (first-time, minutes-long) crawl
    reference = _load_reference(cfg)
    _, catalog = load_or_crawl(cfg.libraries, cache_dir)
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
        pool = shared_pool(workers, _sandbox_options(cfg, device, gpus, workers, out_dir), gpus or None)
        reference = traced(reference, pool, cfg.cache_dir)
        log.info("reference traced: %d of %d tasks compared by what they compute", reference.traced,
                 len(reference.fingerprints))
    staging = _staging_dir(out_dir, _fingerprint(cfg, device))
    records = drop_near_duplicates(_read_rounds(staging), cfg.dedupe_threshold)
    next_index = max((c.provenance.get("index", -1) for c, _ in records), default=-1) + 1
    resumed = len(records), sum(v.passed for _, v in records)  # (decided, accepted) by earlier invocations
    if records:
        log.info("resuming: %d candidates already decided in %s", len(records), staging)

    down = None
    status = Progress(cfg.num_samples, sum(v.passed for _, v in records))
    with status:
        stop_reason, records, down = _rounds(cfg, catalog, reference, llm, records, next_index, staging, device, gpus,
                                             workers, cache_dir, out_dir, status)

    (log.info if "num-samples" in stop_reason else log.warning)("stopped: %s", stop_reason)
    run_info = _run_info(cfg, device, reference, stop_reason, time.monotonic() - started, resumed,
                         sum(v.passed for _, v in records), sorted({spec.library for spec in catalog}))
    stats = write_dataset(out_dir, records, run_info)
    log.info("wrote %s: %d accepted, %d rejected", out_dir, stats["accepted"], stats["rejected"])
    _copy_to_remote(out_dir, cfg.out)
    return {**stats, "endpoint_down": down is not None}


def _rounds(cfg, catalog, reference, llm, records, next_index, staging, device, gpus, workers, cache_dir, out_dir,
            status):
    """Compose and validate round after round; returns (why it stopped, records, endpoint down?)."""
    down = None
    while True:
        accepted = sum(v.passed for _, v in records)
        if accepted >= cfg.num_samples:
            stop_reason = f"reached --num-samples ({accepted} accepted, {cfg.num_samples} asked)"
            break
        if next_index >= cfg.max_candidates:
            stop_reason = (f"reached --max-candidates ({cfg.max_candidates}) with {accepted} of "
                           f"{cfg.num_samples} samples accepted")
            break
        size = round_size(cfg.num_samples - accepted, accepted, len(records), workers, cfg.max_candidates - next_index)
        jobs = plan_jobs(cfg, catalog, records, next_index, size)
        if not jobs:
            stop_reason = f"drew every op tuple the selected {len(catalog)} ops allow, with {accepted} accepted"
            break
        path = staging / f"round-{next_index:07d}-{next_index + len(jobs):07d}.jsonl"
        _run_round(cfg, catalog, reference, llm, jobs, {c.id for c, _ in records},
                   device, gpus, workers, cache_dir, out_dir, path)
        round_records, down = _keep_before_endpoint_down(path)
        records = drop_near_duplicates(records + round_records, cfg.dedupe_threshold)
        next_index += len(jobs)
        status.sync(sum(v.passed for _, v in records), Counter(v.reason for _, v in records if not v.passed))
        log.info("round of %d done: %s", len(round_records), status.line())
        if down:
            stop_reason = (f"the LLM endpoint stayed down ({down}); the {len(records)} candidates decided so far "
                           "are kept; fix the endpoint and run the same command again to continue")
            break
    return stop_reason, records, down


def llm_settings(cfg: RunConfig) -> LLMSettings | None:
    if cfg.composer != "llm":
        return None
    if not cfg.llm.get("model"):
        raise ConfigError("--composer llm needs a model: pass --llm-model NAME or set llm.model in the config")
    if not (cfg.llm.get("base_url") or os.environ.get("OPENAI_BASE_URL") or os.environ.get(cfg.llm["api_key_env"])):
        raise ConfigError(f"--composer llm needs an endpoint: set OPENAI_BASE_URL (or llm.base_url) for your own "
                          f"server, or {cfg.llm['api_key_env']} for OpenAI")
    return LLMSettings(**{**cfg.llm, "target_ms": cfg.target_ms})


def _keep_before_endpoint_down(path: Path) -> tuple[list, str | None]:
    """A round in which the endpoint went down keeps what came before the first job it
    failed; the rest is rewritten away so that a rerun composes it again."""
    records = _read_jsonl(path)
    down = [(c, v) for c, v in records if v.reason == "endpoint_down"]
    if not down:
        return records, None
    first = min(c.provenance["index"] for c, _ in down)
    kept = [(c, v) for c, v in records if c.provenance["index"] < first]
    start = int(path.stem.split("-")[1])
    path.unlink()
    if kept:
        path.with_name(f"round-{start:07d}-{first:07d}.jsonl").write_text(
            "".join(record_to_json(c, v) + "\n" for c, v in kept))
    return kept, down[0][1].detail


def validate_tasks(cfg: RunConfig, tasks: str) -> dict:
    """`opsynth validate`: re-audit existing tasks with the engine `opsynth run` uses."""
    started = time.monotonic()
    device, gpus = resolve_device(cfg.device)
    out_dir = output_dir(cfg)
    candidates = external_candidates(tasks)
    workers = cfg.workers or default_workers(device, gpus, cfg.beam_args)
    path = out_dir / ".staging" / "validate.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    sandbox = _sandbox_options(cfg, device, gpus, workers, out_dir)
    check_config = _check_config(cfg, device, sandbox)
    with beam.Pipeline(options=PipelineOptions(_beam_args(cfg.beam_args))) as pipeline:
        accepted, failed = (pipeline | "Tasks" >> beam.Create(candidates)
                            | "Validate" >> ValidateCandidates(sandbox, check_config, workers, gpus or None,
                                                               verdicts_dir(cfg.cache_dir), imported_libraries(cfg)))
        (accepted, failed) | "AllRecords" >> beam.Flatten() | "Write" >> WriteRecords(str(path))
    records = _read_jsonl(path)
    stop = f"validated all {len(candidates)} tasks of {tasks}"
    run_info = _run_info(cfg, device, None, stop, time.monotonic() - started, (0, 0),
                         sum(v.passed for _, v in records))
    stats = write_dataset(out_dir, records, run_info)
    log.info("wrote %s: %d of %d tasks pass", out_dir, stats["accepted"], stats["composed"])
    _copy_to_remote(out_dir, cfg.out)
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


def resolve_device(requested: str) -> tuple[str, list[int]]:
    import torch
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cpu":
        return "cpu", []
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {requested}: torch sees no CUDA device (torch.cuda.is_available() is False, "
                          f"torch {torch.__version__}); use --device cpu or --device auto")
    if ":" in requested:
        index = int(requested.split(":")[1])
        if index >= torch.cuda.device_count():
            raise ConfigError(f"--device {requested}: only {torch.cuda.device_count()} CUDA device(s) are visible")
        return "cuda", [index]
    return "cuda", list(range(torch.cuda.device_count()))


def default_workers(device: str, gpus: list[int], beam_args: list[str] = ()) -> int:
    """One sandbox worker a core, at most 8 (on a GPU host: 8 per GPU). Compilation and the
    correctness checks run on the cores in parallel; timing takes turns on each GPU. Under
    the multi-process DirectRunner every Beam process has its own pool: they share the cores."""
    cores = os.cpu_count() or 1
    processes = _beam_processes(beam_args)
    per_host = min(cores, 8 * len(gpus)) if device == "cuda" else min(cores, 8)
    return max(1, per_host // processes)


def _beam_processes(beam_args) -> int:
    args = " ".join(beam_args)
    if "multi_processing" not in args:
        return 1
    found = re.search(r"--direct_num_workers[= ](\d+)", args)
    return max(1, int(found.group(1))) if found else 1


def round_size(needed: int, accepted: int, decided: int, workers: int, remaining: int) -> int:
    """Enough candidates to reach the target at the yield seen so far (a guess of 50% at
    first), at least one batch for every worker, never past --max-candidates."""
    observed = accepted / decided if decided else 0.5
    size = math.ceil(needed / max(observed, MIN_YIELD) * 1.2)
    return max(1, min(max(size, 2 * workers), remaining))


def output_dir(cfg: RunConfig) -> Path:
    """The folder the run writes: --out itself, or for a Beam file system URL (gs://...) a
    local mirror in the cache, copied there at the end (outputs/remote.py)."""
    if not is_remote(cfg.out):
        return prepare_out_dir(cfg.out)
    try:
        check_writable(cfg.out)
    except RemoteOutputError as error:
        raise ConfigError(str(error)) from None
    return prepare_out_dir(str(local_mirror(cfg.out, Path(cfg.cache_dir))))


def _copy_to_remote(out_dir: Path, out: str) -> None:
    if is_remote(out):
        written = upload(out_dir, out)
        log.info("copied %d files to %s", len(written), out)


def prepare_out_dir(out: str) -> Path:
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".opsynth-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise ConfigError(f"--out {out} is not writable ({error.strerror or error}); choose a folder you can write to") from None
    return path


def gpu_share_gb(gpus: list[int], workers: int) -> float:
    """GPU memory each worker may take: 90% of the smallest GPU, split among its workers."""
    import torch
    per_gpu = math.ceil(workers / len(gpus))
    return 0.9 * min(torch.cuda.get_device_properties(g).total_memory for g in gpus) / 2**30 / per_gpu


def _sandbox_options(cfg: RunConfig, device: str, gpus: list[int], workers: int, out_dir: Path) -> SandboxOptions:
    on_host = workers * _beam_processes(cfg.beam_args)  # every Beam process of the host has a pool this size
    return SandboxOptions(
        device=device, timeout_s=cfg.timeout_s, max_memory_gb=cfg.max_memory_gb,
        threads=max(1, (os.cpu_count() or 1) // on_host), log_path=str(out_dir / "workers.log"),
        timing_lock_dir=gpu_lock_dir() if device == "cuda" else None,
        gpu_memory_gb=gpu_share_gb(gpus, on_host) if device == "cuda" else None)


def gpu_lock_dir() -> str:
    """Host-local, not in the cache: on a distributed runner the cache is a shared mount,
    and a lock there would make every host's GPU 0 take turns with every other's."""
    return os.path.join(tempfile.gettempdir(), f"opsynth-gpu-locks-{os.getuid()}")


def _check_config(cfg: RunConfig, device: str, sandbox: SandboxOptions) -> dict:
    return {**cfg.checks, "device": device, "seed": cfg.seed, "atol": cfg.atol, "rtol": cfg.rtol,
            "determinism_tol": cfg.determinism_tol, "window_ms": list(cfg.window_ms), "target_ms": cfg.target_ms,
            "max_task_memory_gb": cfg.max_task_memory_gb,
            "memory_budget_gb": sandbox.gpu_memory_gb / 3 if sandbox.gpu_memory_gb else None,
            "op_graph": GRAPH_VERSION,  # verdicts stored before tracing carry no op sequence
            "checks": [check.stage for check in CHECKS]}  # verdicts stored before a check was added do not count


def _run_round(cfg, catalog, reference, llm, jobs, prior_ids, device, gpus, workers, cache_dir, out_dir, path):
    sandbox = _sandbox_options(cfg, device, gpus, workers, out_dir)
    check_config = _check_config(cfg, device, sandbox)
    layered = cfg.composer == "template" and cfg.sampling == "layers"
    usage = op_usage([spec.name for spec in catalog], cfg.libraries) if layered else None  # cached after round one
    options = PipelineOptions(_beam_args(cfg.beam_args))
    with beam.Pipeline(options=options) as pipeline:
        batch = 2 * llm.concurrency if llm else 16
        candidates, compose_rejects = (pipeline | "Jobs" >> beam.Create(jobs) | "Compose" >> ComposeCandidates(
            cfg.composer, catalog, cfg.seed, batch, op_count_mix=cfg.op_count_mix, library_mix=cfg.library_mix,
            sampling=cfg.sampling, usage=usage, llm_settings=llm, cache_dir=str(cache_dir)))
        unique, duplicates = candidates | "Dedupe" >> DropDuplicates(frozenset(prior_ids))
        accepted, failed = unique | "Validate" >> ValidateCandidates(sandbox, check_config, workers, gpus or None,
                                                                      verdicts_dir(cache_dir), imported_packages(catalog))
        similar = pipeline | "NoReference" >> beam.Create([])
        if reference:
            accepted, similar = accepted | "Decontaminate" >> Decontaminate(reference.fingerprints,
                                                                            cfg.similarity_threshold)
        ((accepted, failed, compose_rejects, duplicates, similar) | "AllRecords" >> beam.Flatten()
         | "Write" >> WriteRecords(str(path)))


def imported_libraries(cfg: RunConfig) -> frozenset[str]:
    """The root modules of the run's added op libraries, which tasks handed to `validate`
    may import (the static check's allowlist grows by them; a run's own tasks import what
    its catalog's ops need, operators.task.imported_packages). torch is always allowed;
    transformers layers are inlined, so their tasks import nothing of it."""
    roots = {library.split(":")[0].split(".")[0] for library in cfg.libraries}
    return frozenset(roots - {"torch", "transformers"})


def _load_reference(cfg: RunConfig) -> ReferenceSet | None:
    if not cfg.reference:
        return None
    try:
        reference = load_reference(cfg.reference, tuple(cfg.reference_levels))
    except ReferenceSetError as error:
        raise ConfigError(str(error)) from None
    log.info("reference %s (%s): %d tasks", cfg.reference, reference.revision, len(reference.fingerprints))
    return reference


def drop_near_duplicates(records: list, threshold: float) -> list:
    """Accepted samples that duplicate an earlier accepted one (by index) become rejects
    naming what they duplicate. Stable: a sample's fate depends only on earlier ones."""
    ordered = sorted(records, key=lambda r: r[0].provenance.get("index", 0))
    accepted = [(c, v) for c, v in ordered if v.passed]
    results = dedupe([fingerprint(v.code or c.code, c.id) for c, v in accepted], threshold)
    verdicts = {c.id: (v if result.kept else replace(
        v, stage="dedupe", passed=False, reason="near_duplicate",
        detail=f"AST similarity {result.similarity:.3f} to accepted sample {result.duplicate_of}"))
        for (c, v), result in zip(accepted, results)}
    return [(c, verdicts.get(c.id, v) if v.passed else v) for c, v in ordered]


def _beam_args(args: list[str]) -> list[str]:
    """The user's Beam options, with the embedded DirectRunner unless they chose a runner."""
    return list(args) if any(a.startswith("--runner") for a in args) else ["--runner=DirectRunner", *args]


def verdicts_dir(cache_dir: str | Path) -> str:
    """The verdict store: a killed `opsynth run` or `opsynth validate` redoes no finished validation."""
    return str(Path(cache_dir) / "verdicts")


def _staging_dir(out_dir: Path, fingerprint: str) -> Path:
    staging = out_dir / ".staging"
    marker = staging / "fingerprint.txt"
    if staging.exists() and (not marker.exists() or marker.read_text() != fingerprint):
        log.info("configuration changed since the last run in %s: starting over", out_dir)
        shutil.rmtree(staging)
    staging.mkdir(parents=True, exist_ok=True)
    marker.write_text(fingerprint)
    return staging


def _fingerprint(cfg: RunConfig, device: str) -> str:
    """What decides the records of a round: change any of it and old rounds no longer apply."""
    keys = ("composer", "sampling", "seed", "libraries", "op_count_mix", "window_ms", "atol", "rtol", "determinism_tol",
            "max_task_memory_gb", "reference", "reference_levels", "similarity_threshold", "ops", "library_mix",
            "target_ms", "checks")
    llm_keys = ("model", "temperature", "max_tokens", "repair_rounds")
    blob = {key: asdict(cfg)[key] for key in keys} | {"device": device, "catalog": cache_key(cfg.libraries),
                                                       "stages": [check.stage for check in CHECKS]}
    if cfg.composer == "llm":
        blob["llm"] = {key: cfg.llm.get(key) for key in llm_keys}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _read_rounds(staging: Path) -> list:
    return [record for path in sorted(staging.glob("round-*.jsonl")) for record in _read_jsonl(path)]


def _read_jsonl(path: Path) -> list:
    return [record_from_json(line) for line in path.read_text().splitlines() if line.strip()]


def _log_to(path: Path) -> None:
    """Everything the run logs also goes to a file in the output folder."""
    root = logging.getLogger()
    if not any(getattr(h, "baseFilename", None) == str(path.resolve()) for h in root.handlers):
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        root.addHandler(handler)
        root.setLevel(min(root.level or logging.INFO, logging.INFO))


def _run_info(cfg: RunConfig, device: str, reference, stop_reason: str, wall_time_s: float,
              resumed: tuple[int, int], accepted: int, op_libraries: list[str] = ()) -> dict:
    """`wall_time_s` and `accepted_per_hour` are this invocation's: a resumed run's counts
    include what earlier invocations decided (`resumed_candidates`), its clock does not."""
    return {
        "device": device, "composer": cfg.composer, "sampling": cfg.sampling, "seed": cfg.seed,
        "window_ms": list(cfg.window_ms), "op_count_target": _shares(cfg.op_count_mix),
        "atol": cfg.atol, "rtol": cfg.rtol, "determinism_tol": cfg.determinism_tol,
        "reference": cfg.reference, "reference_revision": reference.revision if reference else None,
        "decontaminated": reference is not None, "similarity_threshold": cfg.similarity_threshold,
        "dedupe_threshold": cfg.dedupe_threshold,
        "target_samples": cfg.num_samples, "stop_reason": stop_reason, "wall_time_s": round(wall_time_s, 1),
        "resumed_candidates": resumed[0], "accepted_per_hour": round((accepted - resumed[1]) / wall_time_s * 3600),
        "libraries": list(cfg.libraries), "versions": versions([*cfg.libraries, *op_libraries]),
    }


def _shares(mix: dict) -> dict:
    total = sum(mix.values())
    return {str(key): round(value / total, 4) for key, value in sorted(mix.items())}


def versions(libraries=()) -> dict:
    """opsynth's own stack, and every op library of the run by its top-level package
    (`kornia.filters` -> kornia's distribution version)."""
    def of(package):
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"
    found = {"opsynth": of("opsynth"), "torch": of("torch"), "transformers": of("transformers"),
             "apache_beam": of("apache-beam"), "python": platform.python_version(), "platform": sys.platform}
    distributions = packages_distributions()
    for library in libraries:
        root = library.partition(":")[0].split(".")[0]
        if root not in found and (root in distributions or of(root) != "not installed"):
            found[root] = of(distributions[root][0]) if root in distributions else of(root)
    return found
