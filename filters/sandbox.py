"""The worker pool: untrusted candidates run only here, in long-lived worker processes.

Every job gets a wall-clock limit; a worker that hangs, dies or outgrows its memory is
killed and replaced, and the job comes back as `timeout`, `crashed` or `out_of_memory`.
`run` never raises: every job yields a result dict. Results travel on a pipe of their own,
never on the worker's stdout.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from filters.worker import receive, send

POLL_S = 0.2
WORKER_ENV = {
    "PYTHONUNBUFFERED": "1",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",  # no compile subprocess pool per worker
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
    # How memory is capped: "rlimit" (address-space limit; breaks CUDA), "rss" (the parent
    # watches resident memory and kills the worker), or "auto" (rlimit on CPU, rss on GPU).
    memory_guard: str = "auto"
    threads: int | None = None
    isolate_network: bool = True
    read_only_fs: bool = True  # every file system read-only but the scratch folder and compiler caches
    startup_timeout_s: float = 180.0
    # Each worker starts by running the checks on a built-in task (harness.warm_up): no
    # candidate pays the cold compile, and the garbage collector skips what that imported.
    warm_up: bool = True
    log_path: str | None = None
    # Workers that share a GPU take turns timing through a lock file per GPU in this folder,
    # which must be local to the host: every run there that times on a GPU takes its turn.
    timing_lock_dir: str | None = None
    # GPU memory one worker may take (the task cap plus headroom); None leaves it unbounded.
    gpu_memory_gb: float | None = None
    env: tuple = ()  # extra (name, value) environment pairs; a tuple keeps options hashable
    # Free space the scratch folders and the compiler cache need: Inductor writes every kernel
    # it builds there. Below it no candidate is sent: on a full disk every compile fails.
    min_free_gb: float = 1.0

    def guard(self) -> str:
        if self.memory_guard != "auto":
            return self.memory_guard
        return "rss" if self.device.startswith("cuda") else "rlimit"


class HostProblem(RuntimeError):
    """The host, not a candidate: nothing can be validated until it is fixed."""


class WorkerFailed(HostProblem):
    """A worker could not start at all."""


class DiskFull(HostProblem):
    """Too little free space where the workers write."""


class Worker:
    def __init__(self, options: SandboxOptions, gpu: int | None = None):
        self.options, self.gpu = options, gpu
        self.process: subprocess.Popen | None = None
        self.scratch: str | None = None  # the worker's only writable folder but the compiler caches
        self.info: dict = {}

    def run(self, job: dict) -> dict:
        self._require_free_space()
        if not self.alive():
            self.start()
        try:
            send(self.job_fd, job)
        except OSError:
            return self._died(job)
        result = self._await_result(job)
        # A verdict reached while the disk filled up may be the disk's (a compile that could
        # not write its kernel): it is dropped, never stored, and the run stops.
        self._require_free_space()
        return result

    def _require_free_space(self) -> None:
        folders = {"the workers' scratch folders (set TMPDIR to move them)": tempfile.gettempdir(),
                   "the compiler cache (under --cache-dir)": dict(self.options.env).get("TORCHINDUCTOR_CACHE_DIR")}
        for what, folder in folders.items():
            free_gb = _free_gb(folder) if folder else None
            if free_gb is not None and free_gb < self.options.min_free_gb:
                raise DiskFull(f"only {free_gb:.2f} GiB free on the disk of {folder}, {what}; the sandbox needs "
                               f"{self.options.min_free_gb:g} GiB there to compile candidates: free some space")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.stop()
        job_r, self.job_fd = os.pipe()
        self.result_fd, result_w = os.pipe()
        self.scratch = tempfile.mkdtemp(prefix="opsynth-worker-")
        options = {"scratch": self.scratch, "device": self.options.device, "warm_up": self.options.warm_up,
                   "isolate_network": self.options.isolate_network, "read_only_fs": self.options.read_only_fs,
                   "threads": self.options.threads,
                   "gpu_memory_gb": self.options.gpu_memory_gb,
                   "rlimit_gb": self.options.max_memory_gb if self.options.guard() == "rlimit" else None}
        env = {**os.environ, **dict(self.options.env), **WORKER_ENV}
        gpu = physical_gpu(self.gpu or 0)
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        if self.options.timing_lock_dir:
            env["OPSYNTH_TIMING_LOCK"] = os.path.join(self.options.timing_lock_dir,
                                                      f"gpu{re.sub(r'[^A-Za-z0-9-]', '_', gpu)}.lock")
        log = open(self.options.log_path, "ab") if self.options.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [sys.executable, "-m", "filters.worker", str(job_r), str(result_w), json.dumps(options)],
            pass_fds=(job_r, result_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            env=env, start_new_session=True)
        if log is not subprocess.DEVNULL:
            log.close()
        os.close(job_r)
        os.close(result_w)
        ready = self._read(self.options.startup_timeout_s)
        if not isinstance(ready, dict) or not ready.get("ready"):
            self.stop()
            why = (f"not ready within {self.options.startup_timeout_s:.0f} s" if ready == "timeout"
                   else "it exited before it was ready" if ready is None else f"it answered {ready}")
            raise WorkerFailed(f"a sandbox worker did not start ({why}); see {self.options.log_path or 'its stderr'}")
        self.info = ready

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            for fd in (self.job_fd, self.result_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self.scratch:  # a killed worker cannot clean up after itself
            shutil.rmtree(self.scratch, ignore_errors=True)
        self.process, self.scratch = None, None

    def _await_result(self, job: dict) -> dict:
        outcome = self._read(self.options.timeout_s, watch_memory=self.options.guard() == "rss")
        if isinstance(outcome, dict):
            return outcome
        if outcome == "timeout":
            self.stop()
            return _failure(job, "timeout", f"no result within {self.options.timeout_s:.0f} s; the worker was killed")
        if outcome == "memory":
            self.stop()
            return _failure(job, "out_of_memory",
                            f"resident memory passed {self.options.max_memory_gb} GB; the worker was killed")
        return self._died(job)

    def _died(self, job: dict) -> dict:
        code = self.process.wait() if self.process else None
        self.stop()
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            reason = "out_of_memory" if name == "SIGKILL" else "crashed"
            return _failure(job, reason, f"the worker died from {name}")
        return _failure(job, "crashed", f"the worker exited with code {code} before answering")

    def _read(self, timeout_s: float, watch_memory: bool = False):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.result_fd], [], [], POLL_S)
            if ready:
                return receive(self.result_fd)  # None when the worker closed the pipe by dying
            if watch_memory and _rss_bytes(self.info.get("pid", self.process.pid)) > self.options.max_memory_gb * 2**30:
                return "memory"
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

    def submit(self, job: dict, then: Callable[[dict], Any] = lambda result: result) -> Future:
        """A future of `then(result)`; `then` runs on the pool's thread as soon as the job ends."""
        return self.executor.submit(lambda: then(self._run_one(job)))

    def run_many(self, jobs: list[dict]) -> list[dict]:
        return [future.result() for future in [self.submit(job) for job in jobs]]

    def _run_one(self, job: dict) -> dict:
        worker = self.idle.get()
        try:
            return worker.run(job)
        finally:
            self.idle.put(worker)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        for worker in self.workers:
            worker.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_SHARED: dict = {}


def shared_pool(size: int, options: SandboxOptions, gpus: list[int] | None = None) -> WorkerPool:
    """One warm pool per process and configuration, reused by every Beam bundle and round
    (torch imported and the compiler warm once, not per bundle)."""
    key = (size, options, tuple(gpus or ()))
    if key not in _SHARED:
        _SHARED[key] = WorkerPool(size, options, gpus)
    return _SHARED[key]


@atexit.register
def _close_shared() -> None:
    for pool in _SHARED.values():
        pool.close()
    _SHARED.clear()


def _failure(job: dict, reason: str, detail: str) -> dict:
    return {"passed": False, "stage": "sandbox", "reason": reason, "detail": detail, "metrics": {},
            "code": job["code"]}


def physical_gpu(index: int) -> str:
    """The run's CUDA device `index` as the host names it: a run started with
    CUDA_VISIBLE_DEVICES=2,3 gives its workers GPU 2 and 3, and their timing locks are
    those of GPU 2 and 3, shared with any other run on the host that times there."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[index] if index < len(visible) else str(index)


def _free_gb(folder: str) -> float | None:
    """Free space on the file system of `folder`, or of its nearest existing parent."""
    path = os.path.abspath(folder)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize / 2**30


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
