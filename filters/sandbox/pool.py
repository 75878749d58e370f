"""The worker pool: untrusted candidates run only here, in jailed, long-lived workers.

Each worker is a warm zygote inside the jail (filters/sandbox/jail.py) that forks a fresh child for
every job (filters/sandbox/worker.py). The zygote bounds each job's time and memory; the pool keeps
a backstop limit a little past it and replaces a worker that misses it. `run` never raises
for anything a candidate does: every job yields a result dict. Results travel on a pipe of
their own, tagged with the job's id, and are taken only in the shape the checks produce: the
code a verdict applies to is always the job's own (re-sized here, never sent back).
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from filters.sandbox import gpu_memory, jail, redaction
from filters.checks.measure.resize import as_stored
from filters.sandbox.worker import MAX_DETAIL, check_result, failure, longest_job_s, receive, send

POLL_S = 0.2
BACKSTOP_S = 30.0  # past the longest job its zygote allows, the pool replaces the worker
MAX_JOB_LOG_BYTES = 256 << 10  # what one job (or a worker's start) may write to workers.log
MAX_LOG_LINE = 2_000  # characters of one workers.log line; the rest is counted, not kept
LOG_CHUNK = 64 << 10  # bytes of a worker's stderr read at a time: no line is ever read whole
LOG_KEPT = 16 << 10  # bytes of a line redacted before its cut: a secret across the cut goes whole
WORKER_ENV = {
    "PYTHONUNBUFFERED": "1",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",  # no compile subprocess pool per worker
    # Asking whether a GPU is there through NVML, not the CUDA runtime: the zygote must never
    # initialise CUDA, or no child forked from it could use the GPU.
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    # Keep freed tensor memory in the heap, as a GPU caching allocator does, so CPU timings
    # measure the ops and not the OS faulting fresh pages in on every call.
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(16 << 30),
}


@dataclass(frozen=True)
class SandboxOptions:
    device: str = "cpu"
    timeout_s: float = 300.0
    max_memory_gb: float = 8.0
    # How memory is capped: "rlimit" (address-space limit; breaks CUDA), "rss" (the zygote
    # watches its child's resident memory and kills it), or "auto" (rlimit on CPU, rss on GPU).
    memory_guard: str = "auto"
    threads: int | None = None
    startup_timeout_s: float = 180.0
    # Each worker starts by running the checks on a built-in task (harness.warm_up): no
    # candidate pays the cold compile, and the garbage collector skips what that imported.
    warm_up: bool = True
    log_path: str | None = None
    # Workers that share a GPU take turns timing through a lock file per GPU in this folder,
    # which must be local to the host: every run there that times on a GPU takes its turn.
    timing_lock_dir: str | None = None
    # GPU memory one job may hold (the task cap plus headroom); None leaves it unbounded.
    gpu_memory_gb: float | None = None
    # GPU memory the jobs of one GPU share, counted (gpu_memory.py): each holds what it needs,
    # up to gpu_memory_gb. None: each worker's job is capped at gpu_memory_gb, counted by no one.
    gpu_pool_gb: float | None = None
    # GPU memory the timing check's resize search gives one task (None: the task cap). Not the
    # worker's share: a verdict must not change with the number of workers.
    task_memory_budget_gb: float | None = None
    # What a GPU worker's zygote readies before forking (warm.warm_for_gpu): "imports",
    # "triton" (Triton's CUDA helpers built once, not by every child) or "dynamo" (and a
    # trusted Dynamo compile on the CPU, torch told there is no GPU meanwhile).
    gpu_warm_up: str = "imports"
    env: tuple = ()  # extra (name, value) environment pairs; a tuple keeps options hashable

    def guard(self) -> str:
        if self.memory_guard != "auto":
            return self.memory_guard
        return "rss" if self.device.startswith("cuda") else "rlimit"


class HostProblem(RuntimeError):
    """The host, not a candidate: nothing can be validated until it is fixed."""


class WorkerFailed(HostProblem):
    """A worker could not start at all."""


class Worker:
    def __init__(self, options: SandboxOptions, gpu: int | None = None):
        self.options, self.gpu = options, gpu
        self.process: subprocess.Popen | None = None
        self.info: dict = {}
        self.jobs = itertools.count()
        self.log_tail: deque[str] = deque(maxlen=5)
        self.host_fault = False  # the last job ended by the worker's failure, not by its task
        self.log_job = 0  # the job whose lines the worker's log now holds, for its per-job budget

    def run(self, job: dict) -> dict:
        self.host_fault = False
        self.log_job += 1
        if not self.alive():
            self.start()
        job_id = f"{os.getpid()}-{id(self)}-{next(self.jobs)}"
        try:
            send(self.job_fd, {"id": job_id, "code": job["code"], "config": job["config"]})
        except OSError:
            return self._died(job)
        return self._await_result(job, job_id)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.stop()
        job_r, self.job_fd = os.pipe()
        self.result_fd, result_w = os.pipe()
        seccomp = jail.seccomp_pipe()
        options = {"device": self.options.device, "warm_up": self.options.warm_up, "threads": self.options.threads,
                   "timeout_s": self.options.timeout_s, "gpu_memory_gb": self.options.gpu_memory_gb,
                   "gpu_pool_gb": self.options.gpu_pool_gb,
                   "gpu_warm_up": self.options.gpu_warm_up,
                   "rlimit_gb": self.options.max_memory_gb if self.options.guard() == "rlimit" else None,
                   "rss_limit_gb": self.options.max_memory_gb if self.options.guard() == "rss" else None}
        extra = {**dict(self.options.env), **WORKER_ENV}
        gpu = physical_gpu(self.gpu or 0)
        if self.gpu is not None:
            extra["CUDA_VISIBLE_DEVICES"] = gpu
        readable: tuple[str, ...] = ()
        if self.options.timing_lock_dir:
            extra["OPSYNTH_TIMING_LOCK"] = lock = _timing_lock(self.options.timing_lock_dir, gpu)
            if self.options.gpu_pool_gb:
                gpu_memory.make_units(lock, gpu_memory.units_in(self.options.gpu_pool_gb))
            readable = (self.options.timing_lock_dir,)
        argv = [sys.executable, "-m", "filters.sandbox.worker", str(job_r), str(result_w), json.dumps(options)]
        command = jail.command(argv, gpu=self.options.device.startswith("cuda"), env=jail.environment(extra),
                              seccomp_fd=seccomp, readable=readable)
        self.process = subprocess.Popen(command, pass_fds=(job_r, result_w, seccomp), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        for fd in (job_r, result_w, seccomp):
            os.close(fd)
        threading.Thread(target=self._copy_log, args=(self.process.stderr,), daemon=True).start()
        ready = self._read(self.options.startup_timeout_s)
        if not isinstance(ready, dict) or not ready.get("ready"):
            self.stop()
            why = (f"not ready within {self.options.startup_timeout_s:.0f} s" if ready == "timeout"
                   else "it exited before it was ready" if ready is None else f"it answered {ready}")
            said = " | ".join(self.log_tail)
            raise WorkerFailed(f"a sandbox worker did not start ({why}){': ' + said if said else ''}; "
                               f"see {self.options.log_path or 'its stderr'}")
        self.info = ready

    def _copy_log(self, stream) -> None:
        """The worker's stderr into the run's workers.log, a line at a time, each line cut to
        MAX_LOG_LINE characters and redacted, each job's lines to MAX_JOB_LOG_BYTES: a job
        that floods its log loses its own lines, never a later job's (`run` counts the jobs)."""
        secrets = redaction.secret_values()
        log = open(self.options.log_path, "a", errors="replace") if self.options.log_path else None
        job, written = -1, 0
        try:
            while (line := _read_line(stream, secrets)) is not None:
                self.log_tail.append(line.strip()[:300])
                if job != self.log_job:
                    job, written = self.log_job, 0
                if log and written < MAX_JOB_LOG_BYTES:
                    written += len(line)
                    log.write(line if written < MAX_JOB_LOG_BYTES else "[workers.log: this job's output cut here]\n")
                    log.flush()
        finally:
            if log:
                log.close()

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            for fd in (self.job_fd, self.result_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.process = None

    def _await_result(self, job: dict, job_id: str) -> dict:
        backstop_s = longest_job_s(self.options.timeout_s) + BACKSTOP_S
        outcome = self._read(backstop_s)
        if outcome == "timeout":  # the zygote kept no limit of its own: the worker is not trusted
            self.stop()
            self.host_fault = True
            return _finish(job, failure("timeout", f"the worker gave no result within {backstop_s:.0f} s; "
                                                   "it was killed"))
        if not isinstance(outcome, dict):
            return self._died(job)
        if outcome.get("job") != job_id:  # a worker that answers out of turn is not trusted again
            self.stop()
            return _finish(job, failure("crashed", "the worker answered for another job; it was replaced"))
        if outcome.get("retire"):  # a job changed what the zygote keeps: no later job may see it
            self.stop()
        from filters.checks.harness import REASONS
        result = check_result({k: v for k, v in outcome.items() if k not in ("job", "retire")}, REASONS)
        if result is None:
            self.stop()
            return _finish(job, failure("crashed", "the worker sent something that is not a verdict; it was replaced"))
        return _finish(job, result)

    def _died(self, job: dict) -> dict:
        code = self.process.wait() if self.process else None
        self.stop()
        self.host_fault = True
        if code is not None and code < 0:
            return _finish(job, failure("crashed", f"the worker died from {signal.Signals(-code).name}"))
        return _finish(job, failure("crashed", f"the worker exited with code {code} before answering"))

    def _read(self, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.result_fd], [], [], POLL_S)
            if ready:
                try:
                    return receive(self.result_fd)  # None when the worker closed the pipe by dying
                except ValueError:
                    return None
            if self.process.poll() is not None:
                return None
        return "timeout"


class WorkerPool:
    """N workers. `submit` hands a job to the next idle worker and returns a future of its
    result; `run_many` runs a list and returns the results in job order."""

    def __init__(self, size: int, options: SandboxOptions, gpus: list[int] | None = None):
        self.options = options
        self.workers = [Worker(options, gpus[i % len(gpus)] if gpus else None) for i in range(max(1, size))]
        self.idle: queue.Queue[Worker] = queue.Queue()
        for worker in self.workers:
            self.idle.put(worker)
        self.executor = ThreadPoolExecutor(len(self.workers), thread_name_prefix="sandbox")
        self.closed = False

    def submit(self, job: dict, then: Callable[[dict], Any] = lambda result: result) -> Future:
        """A future of `then(result)`; `then` runs on the pool's thread as soon as the job ends."""
        return self.executor.submit(lambda: then(self._run_one(job)))

    def run_many(self, jobs: list[dict]) -> list[dict]:
        return [future.result() for future in [self.submit(job) for job in jobs]]

    def _run_one(self, job: dict) -> dict:
        """The job's result. A worker that dies under a job, or keeps no limit of its own, is
        the host's fault, not the task's (a task's own hang, crash or memory is its zygote's
        verdict): the job runs once more on a fresh worker, and only a second such end stands."""
        for _ in range(2):
            worker = self.idle.get()
            if self.closed:  # the run is stopping: no worker is started again
                self.idle.put(worker)
                return _finish(job, failure("crashed", "the run stopped before this job ended"))
            try:
                result = worker.run(job)
                host_fault = worker.host_fault
            finally:
                self.idle.put(worker)
            if not host_fault or self.closed:
                return result
        return {**result, "detail": f"{result['detail']} (twice, on fresh workers)"[:MAX_DETAIL]}

    def close(self) -> None:
        self.closed = True
        self.executor.shutdown(wait=False, cancel_futures=True)
        for worker in self.workers:
            worker.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_SHARED: dict = {}
_SHARED_LOCK = threading.Lock()  # a runner's threads (a dask worker's) set up their DoFns at once


def shared_pool(size: int, options: SandboxOptions, gpus: list[int] | None = None) -> WorkerPool:
    """One warm pool per process and configuration, reused by every Beam bundle and round
    (torch imported and the compiler warm once, not per bundle)."""
    key = (size, options, tuple(gpus or ()))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = WorkerPool(size, options, gpus)
        return _SHARED[key]


@atexit.register
def close_shared_pools() -> None:
    """Stop every shared pool's workers. An interrupted run calls it at once: the
    interpreter waits for the pools' threads, and so for the jobs under way, before it runs
    atexit."""
    with _SHARED_LOCK:
        for pool in _SHARED.values():
            pool.close()
        _SHARED.clear()


def _finish(job: dict, result: dict) -> dict:
    """The result as the pipeline takes it: with the code it applies to, which is the job's
    own, re-sized here to the sizes the checks chose (`size.<name>` metrics, each checked to
    name a size constant of the job's code and to be a sane int: filters/checks/measure/resize.py
    `as_stored`), and every string the child sent (its detail, its metrics' names and strings) naming no
    secret of this process."""
    code = as_stored(job["code"], result["metrics"])
    clean = redaction.clean_strings(result)
    return {**clean, "detail": clean["detail"][:MAX_DETAIL], "code": code}


def _read_line(stream, secrets: tuple[str, ...]) -> str | None:
    """The next line of a worker's stderr, redacted and cut to MAX_LOG_LINE characters with a
    note of its length; None at the end. It is read LOG_CHUNK bytes at a time and only its
    first LOG_KEPT bytes are kept: a line of any length costs this process no memory."""
    head, size = b"", 0
    while chunk := stream.readline(LOG_CHUNK):
        head += chunk[:max(0, LOG_KEPT - len(head))]
        size += len(chunk)
        if chunk.endswith(b"\n"):
            break
    if not size:
        return None
    text = redaction.redact(head.decode(errors="replace").rstrip("\n"), secrets)
    if size > len(head) or len(text) > MAX_LOG_LINE:
        text = f"{text[:MAX_LOG_LINE]} [workers.log: a line of {size} bytes, cut to {MAX_LOG_LINE} characters]"
    return text + "\n"


def _timing_lock(folder: str, gpu: str) -> str:
    """The lock file of `gpu` in `folder`, made here: a jailed worker can only read it."""
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, os.stat(folder).st_mode | 0o055)  # the jail's uid must reach the files inside
    path = os.path.join(folder, f"gpu{re.sub(r'[^A-Za-z0-9-]', '_', gpu)}.lock")
    for name in (path, path + ".gate"):
        with open(name, "a"):
            pass
    return path


def physical_gpu(index: int) -> str:
    """The run's CUDA device `index` as the host names it: a run started with
    CUDA_VISIBLE_DEVICES=2,3 gives its workers GPU 2 and 3, and their timing locks are
    those of GPU 2 and 3, shared with any other run on the host that times there."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[index] if index < len(visible) else str(index)
