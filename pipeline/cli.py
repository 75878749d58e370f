"""The `opsynth` command line (docs/architecture.md). Usage errors exit with 2 and one clear line."""
from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from filters.sandbox.pool import HostProblem
from pipeline.defaults import ConfigError


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, beam_args = _split_beam_args(argv)
    args = _parser().parse_args(own)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    for client in ("httpx", "httpx2"):  # a line per LLM request otherwise (openai's client is built on one of them)
        logging.getLogger(client).setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_drop_beam_noise)
    signal.signal(signal.SIGINT, _on_interrupt)
    from operators.libraries import UnknownLibrary
    try:
        return args.handler(args, beam_args)
    except KeyboardInterrupt:  # finished work is on disk (a crawl writes its catalog only when done)
        return _interrupted()
    except (ConfigError, UnknownLibrary) as error:  # a --library any command crawls
        print(f"opsynth: error: {error}", file=sys.stderr)
        return 2
    except HostProblem as error:  # the host, not a candidate: nothing can be validated
        return _host_problem(str(error).split(" [while running")[0])
    except (OSError, RuntimeError) as error:  # Beam re-raises a transform's errors as a RuntimeError
        if str(error).startswith("KeyboardInterrupt"):  # Ctrl-C while a stage ran
            return _interrupted()
        full = _no_space_left(error)
        if full:
            return _host_problem(f"no space left on the disk of --out or --cache-dir ({full}): free some space there")
        unwritable = _os_error(error)
        if not unwritable or os.environ.get("OPSYNTH_DEBUG"):
            raise
        print(f"opsynth: error: {unwritable}; choose a folder you can write to, or fix its permissions "
              "(OPSYNTH_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2


def _interrupted() -> int:
    from filters.sandbox.pool import close_shared_pools
    close_shared_pools()  # else the exit waits for the sandbox jobs under way
    print("opsynth: interrupted; finished work is kept, and the same command continues from it", file=sys.stderr)
    return 130


def _os_error(error: BaseException | None) -> str:
    """`PATH: reason` of the OSError `error` is or was raised from (a read-only folder, a file
    where a folder should be), or ''."""
    while error is not None:
        if isinstance(error, OSError) and error.strerror:
            where = error.filename or ""
            return f"{where}: {error.strerror}" if where else error.strerror
        error = error.__cause__ or error.__context__
    return ""


def _no_space_left(error: BaseException | None) -> str:
    """The OSError's text if `error` is, or was raised from, a full disk; else ''."""
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return str(error)
        error = error.__cause__ or error.__context__
    return ""


def _host_problem(message: str) -> int:
    # the run's log file keeps it; the terminal gets the one line below, not the same twice
    record = logging.getLogger("opsynth").makeRecord("opsynth", logging.ERROR, __file__, 0, "%s", (message,), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
    print(f"opsynth: error: {message}. Finished work is kept; fix that and run the same command again.",
          file=sys.stderr)
    return 3


_INTERRUPTED = threading.Event()


def _on_interrupt(signum, frame):
    """Ctrl-C: Beam logs the KeyboardInterrupt of every stage it stops, with its traceback,
    before `main` says in one line what happened; those records are dropped from then on."""
    _INTERRUPTED.set()
    raise KeyboardInterrupt


def _drop_beam_noise(record: logging.LogRecord) -> bool:
    """Beam's import warns on the root logger about optional GCP clients we never use; and a
    stage it stops for an interrupt or a full disk logs a traceback that `main` replaces
    with one line naming the cause and the fix."""
    if record.getMessage().startswith("apitools not found"):
        return False
    if record.name.startswith("apache_beam") and record.levelno >= logging.ERROR:
        error = record.exc_info[1] if record.exc_info else None
        return not (_INTERRUPTED.is_set() or isinstance(error, KeyboardInterrupt) or _no_space_left(error)
                    or record.getMessage().startswith("KeyboardInterrupt"))
    return True


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("opsynth")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def _split_beam_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after the first `--` goes to Beam unchanged."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opsynth", description="Build kernel-writing training tasks.")
    parser.add_argument("--version", action="version", version=f"opsynth {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="compose, validate and write a dataset",
                              epilog="Options after `--` go to Apache Beam unchanged, e.g. "
                                     "`opsynth run -- --direct_running_mode=multi_processing --direct_num_workers=2`.")
    run.add_argument("--config", help="a YAML file (every flag has a key of the same name) or a shipped recipe name")
    run.add_argument("--out", help="output folder (default: out)")
    run.add_argument("--num-samples", type=int, help="accepted samples to reach (default: 8)")
    run.add_argument("--max-candidates", type=int, help="stop composing after this many candidates (default: 64)")
    run.add_argument("--composer", choices=["template", "llm"], help="how candidates are composed")
    run.add_argument("--sampling",  # its values are checked with the configuration's (config.SAMPLINGS)
                     help="template chains: layers (shaped like fused layers, the default) or uniform")
    run.add_argument("--device", help="auto, cpu or cuda[:N] (default: auto)")
    run.add_argument("--seed", type=int, help="run seed: the same seed composes the same candidates")
    run.add_argument("--reference", help="KernelBench checkout, folder, Parquet file or Hub id to decontaminate against")
    run.add_argument("--ops", type=lambda text: [p.strip() for p in text.split(",") if p.strip()],
                     help="restrict the run to these op names or glob patterns, comma-separated")
    run.add_argument("--llm-model", help="model name for --composer llm (sets llm.model)")
    run.add_argument("--similarity-threshold", type=float, help="reject above this similarity to the reference (0.9)")
    run.add_argument("--library", dest="libraries", action="append", help="op library to draw from (repeatable)")
    run.add_argument("--library-mix", dest="library_shares", action="append", type=_library_share,
                     metavar="LIBRARY=SHARE", help="the share of candidates a library leads, e.g. kornia=0.3 "
                                                   "(repeatable; an added library gets 0.25 split between them)")
    _add_sandbox_flags(run)
    run.set_defaults(handler=_run)

    validate = commands.add_parser("validate", help="re-audit existing tasks against the acceptance rules")
    validate.add_argument("tasks", help="a folder of .py tasks or a Parquet file with a code column")
    validate.add_argument("--out", required=True, help="output folder, in the dataset layout")
    validate.add_argument("--config", help="a YAML file or recipe name (the run's keys apply)")
    validate.add_argument("--device", help="auto, cpu or cuda[:N] (default: auto)")
    _add_sandbox_flags(validate)
    validate.set_defaults(handler=_validate)

    dedupe = commands.add_parser("dedupe", help="score tasks against a reference set and each other")
    dedupe.add_argument("tasks", help="a folder of .py tasks or a Parquet file with a code column")
    dedupe.add_argument("--against", required=True, help="KernelBench checkout, folder, Parquet file or Hub id")
    dedupe.add_argument("--out", default="dedupe.parquet", help="result Parquet file (default: dedupe.parquet)")
    dedupe.add_argument("--threshold", type=float, default=0.9, help="similarity to the reference that removes a task")
    dedupe.add_argument("--dedupe-threshold", type=float, default=0.95, help="similarity between tasks that removes the later one")
    dedupe.add_argument("--levels", default="1,2,3", help="KernelBench levels to use (default: 1,2,3)")
    dedupe.add_argument("--workers", type=int, default=0, help="sandbox workers that trace the tasks (0 = auto)")
    dedupe.add_argument("--cache-dir", help="where traced op sequences are cached (default: ~/.cache/opsynth)")
    dedupe.add_argument("--keep-untraced", action="store_true",
                        help="keep tasks whose computation could not be read, judged by their text alone "
                             "(default: removed, as a run rejects them)")
    dedupe.set_defaults(handler=_dedupe)

    publish = commands.add_parser("publish", help="publish a finished output folder as a named version")
    publish.add_argument("dir", help="a finished output folder")
    publish.add_argument("--to", required=True, help="a local path (a git repository) or hf://datasets/ORG/NAME")
    publish.add_argument("--version", required=True, help="the version name, used as the tag (e.g. v1.0.0)")
    publish.add_argument("--private", action="store_true", help="create a missing Hub repository as private")
    publish.add_argument("--allow-undecontaminated", action="store_true",
                         help="publish a dataset that was not checked against a reference benchmark")
    publish.add_argument("--dry-run", action="store_true", help="show what would change and publish nothing")
    publish.add_argument("--message", help="commit message (default: opsynth dataset VERSION)")
    publish.set_defaults(handler=_publish)

    report = commands.add_parser("report", help="a dataset folder beside a reference benchmark, with plots")
    report.add_argument("dir", help="a dataset folder (the --out of `opsynth run` or `opsynth validate`)")
    report.add_argument("--against", required=True,
                        help="KernelBench checkout, folder, Parquet file, Hub id or another dataset folder")
    report.add_argument("--out", help="where report.md, report.json and plots/ go (default: DIR/report)")
    report.add_argument("--levels", default="1,2,3", help="KernelBench levels to use (default: 1,2,3)")
    report.set_defaults(handler=_report)

    rejects = commands.add_parser("rejects", help="why a run's candidates were rejected, by reason, with examples")
    rejects.add_argument("dir", help="the --out of `opsynth run` or `opsynth validate`")
    rejects.add_argument("--examples", type=int, default=1, help="examples to show of each reason (default: 1)")
    rejects.set_defaults(handler=_rejects)

    crawl = commands.add_parser("crawl", help="build the operator catalog")
    crawl.add_argument("--library", dest="libraries", action="append",
                       help="torch, or any importable module such as torchvision.ops (repeatable; default: torch)")
    crawl.add_argument("--out", default="catalog.parquet", help="catalog Parquet file (default: catalog.parquet)")
    crawl.add_argument("--cache-dir", help="where catalogs are cached by library versions (default: ~/.cache/opsynth)")
    crawl.set_defaults(handler=_crawl)
    return parser


def _add_sandbox_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of every command that runs candidates in the sandbox."""
    parser.add_argument("--workers", type=int, help="sandbox worker processes (0 = auto)")
    parser.add_argument("--timeout-s", type=float, help="wall-clock limit per candidate (default: 300)")
    parser.add_argument("--max-memory-gb", type=float, help="memory limit per sandbox worker (default: 8)")
    parser.add_argument("--max-task-memory-gb", type=float, help="peak device memory a task may use (default: 16)")
    parser.add_argument("--cache-dir", help="catalog, compiler, verdict and LLM caches (default: ~/.cache/opsynth)")


def _run(args, beam_args) -> int:
    from pipeline.config import build_config
    from pipeline.run import run

    overrides = {key: value for key, value in vars(args).items() if key not in ("command", "handler", "config")}
    cfg = build_config(args.config, {**overrides, "beam_args": beam_args or None})
    stats = run(cfg)
    if stats.get("endpoint_down"):
        print(f"opsynth: error: {stats['stop_reason']}", file=sys.stderr)
        return 3
    return 0 if stats["accepted"] >= cfg.num_samples else 1


def _validate(args, beam_args) -> int:
    from pipeline.config import build_config
    from pipeline.run import validate_tasks

    overrides = {key: value for key, value in vars(args).items() if key not in ("command", "handler", "config", "tasks")}
    cfg = build_config(args.config, {**overrides, "beam_args": beam_args or None})
    validate_tasks(cfg, args.tasks)
    return 0


def _crawl(args, beam_args) -> int:
    import shutil

    from operators.catalog import coverage_summary, load_or_crawl
    from operators.libraries import DEFAULT_LIBRARIES, UnknownLibrary
    from pipeline.defaults import default_cache_dir

    began = time.perf_counter()
    try:
        cached, specs = load_or_crawl(args.libraries or list(DEFAULT_LIBRARIES),
                                      Path(args.cache_dir or default_cache_dir()))
    except UnknownLibrary as error:
        raise ConfigError(str(error)) from None
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached, args.out)
    print(coverage_summary(args.out))
    print(f"{args.out} in {time.perf_counter() - began:.1f} s")
    return 0


def _publish(args, beam_args) -> int:
    from outputs.publish import PublishError, publish

    try:
        change, commit = publish(Path(args.dir), args.to, args.version, private=args.private,
                                 allow_undecontaminated=args.allow_undecontaminated, dry_run=args.dry_run,
                                 message=args.message)
    except PublishError as error:
        raise ConfigError(str(error)) from None
    print(change.describe())
    print(f"dry run: nothing published to {args.to}" if commit is None
          else f"published {args.version} to {args.to} (commit {commit[:12]})")
    return 0


def _report(args, beam_args) -> int:
    from outputs.report import ReportError, write_report

    try:
        page = write_report(args.dir, args.against, args.out, _levels(args.levels))
    except ReportError as error:
        raise ConfigError(str(error)) from None
    print(page)
    return 0


def _rejects(args, beam_args) -> int:
    from outputs.rejects import RejectsError, summarize_rejects

    try:
        print(summarize_rejects(args.dir, args.examples))
    except RejectsError as error:
        raise ConfigError(str(error)) from None
    return 0


def _dedupe(args, beam_args) -> int:
    import os

    from filters.similarity.reference import ReferenceSetError
    from filters.sandbox.pool import SandboxOptions, WorkerPool
    from pipeline.dedupe import dedupe_report
    from pipeline.defaults import default_cache_dir

    levels = _levels(args.levels)
    workers = args.workers or min(os.cpu_count() or 1, 8)
    # tracing runs the tasks' code (on the meta device): in the sandbox, like every task
    with WorkerPool(workers, SandboxOptions(timeout_s=120, threads=1, warm_up=False)) as pool:
        try:
            rows = dedupe_report(args.tasks, args.against, levels, args.threshold, args.dedupe_threshold,
                                 Path(args.out), pool, args.cache_dir or default_cache_dir(),
                                 keep_untraced=args.keep_untraced)
        except ReferenceSetError as error:
            raise ConfigError(str(error)) from None
    removed = sum(not row["kept"] for row in rows)
    similar = sum((row["max_similarity"] or 0) > args.threshold for row in rows)
    untraced = sum(not row["traced"] for row in rows)
    print(f"{args.out}: {len(rows)} tasks, {removed} removed ({similar} similar to the reference; {untraced} "
          f"untraced, {'kept where not similar' if args.keep_untraced else 'removed: --keep-untraced keeps them'})")
    return 0


def _library_share(text: str) -> tuple[str, float]:
    library, _, share = text.partition("=")
    try:
        return library.strip(), float(share)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LIBRARY=SHARE, e.g. kornia=0.3") from None


def _levels(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(level) for level in text.split(","))
    except ValueError:
        raise ConfigError(f"--levels must be comma-separated numbers such as 1,2,3, not {text!r}") from None


if __name__ == "__main__":
    sys.exit(main())
