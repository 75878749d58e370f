"""A sandbox worker: a long-lived process that runs untrusted candidates one at a time.

Started by `filters.sandbox` as `python -m filters.worker JOB_FD RESULT_FD CONFIG_JSON`.
Before it imports torch it confines itself: a new network namespace where the OS allows
it, an address-space limit when asked (CPU only: it breaks CUDA), no stdin, and stdout
sent to /dev/null so a task that prints cannot reach the result channel. Each candidate
runs in a fresh throw-away directory.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import shutil
import sys
import tempfile

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000


def isolate_network() -> str:
    """Enter an empty network namespace; returns how (or why not), for the run report."""
    libc = ctypes.CDLL(None, use_errno=True)
    for flags, how in ((CLONE_NEWNET, "netns"), (CLONE_NEWUSER | CLONE_NEWNET, "userns+netns")):
        if libc.unshare(flags) == 0:
            return how
    return f"none (unshare failed: {os.strerror(ctypes.get_errno())}); the static check still forbids sockets"


def limit_memory(max_memory_gb: float | None) -> None:
    if max_memory_gb:
        limit = int(max_memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def send(fd: int, message: dict) -> None:
    data = json.dumps(message, default=str).encode()
    os.write(fd, len(data).to_bytes(8, "little") + data)


def receive(fd: int) -> dict | None:
    header = _read_exact(fd, 8)
    if header is None:
        return None
    return json.loads(_read_exact(fd, int.from_bytes(header, "little")))


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main() -> None:
    job_fd, result_fd, options = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    network = isolate_network() if options.get("isolate_network", True) else "not requested"
    limit_memory(options.get("rlimit_gb"))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    scratch = tempfile.mkdtemp(prefix="opsynth-worker-")
    os.chdir(scratch)

    import torch
    torch.set_num_threads(options.get("threads") or torch.get_num_threads())
    if options.get("gpu_memory_gb") and torch.cuda.is_available():
        # Workers share the GPU: none may take more than its task cap (plus headroom).
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, options["gpu_memory_gb"] * 2**30 / total))
    from filters.harness import evaluate

    send(result_fd, {"ready": True, "network": network, "pid": os.getpid()})
    while (job := receive(job_fd)) is not None:
        workdir = tempfile.mkdtemp(dir=scratch)
        os.chdir(workdir)
        try:
            result = evaluate(job["code"], job["config"])
        except BaseException as error:  # SystemExit, KeyboardInterrupt from the task: a crash, not ours
            result = {"passed": False, "stage": "sandbox", "reason": "crashed",
                      "detail": f"{type(error).__name__}: {error}"[:500], "metrics": {}, "code": job["code"]}
        os.chdir(scratch)
        shutil.rmtree(workdir, ignore_errors=True)
        gc.collect()
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        send(result_fd, result)


if __name__ == "__main__":
    main()
