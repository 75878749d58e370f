"""A sandbox worker: a long-lived process that runs untrusted candidates one at a time.

Started by `filters.sandbox` as `python -m filters.worker JOB_FD RESULT_FD CONFIG_JSON`.
Before it imports torch it confines itself, each step as far as the OS allows:
- a new PID namespace: the worker forks into it and is its PID 1, so no other process of
  the host (the run that started it, other workers) has a PID it can signal; the process
  left outside only waits and mirrors how the worker ended;
- a new network namespace (no network at all);
- a private mount namespace in which every file system is read-only except the worker's
  scratch folder and the compiler caches;
- an address-space limit when asked (CPU only: it breaks CUDA);
- no stdin, and stdout sent to /dev/null, so a task that prints cannot reach the result
  channel.
Each candidate runs in a fresh throw-away directory inside the scratch folder. Where a step
is refused (no privileges for namespaces), the worker says so in its ready message and the
static check remains the guard.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import shutil
import signal
import sys
import tempfile

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PSEUDO_FILE_SYSTEMS = ("/proc", "/sys", "/dev")


def isolate_processes(scratch: str, channels: tuple[int, ...] = ()) -> tuple[str, int]:
    """Fork into a new PID namespace, with a /proc of its own. Returns (how, this worker's
    PID as the host sees it). The parent stays outside as a shim that lets go of `channels`,
    removes `scratch` once the worker is gone and exits the way the worker did."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWPID) != 0:
        return f"none (unshare failed: {os.strerror(ctypes.get_errno())}); the static check still forbids os", os.getpid()
    host_pid_r, host_pid_w = os.pipe()
    child = os.fork()
    if child:
        _mirror(child, host_pid_w, channels, scratch)
    os.close(host_pid_w)
    host_pid = int.from_bytes(os.read(host_pid_r, 8), "little")
    os.close(host_pid_r)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the shim killed (by the pool): the worker goes too
    return "pidns" + _own_proc(libc), host_pid


def _own_proc(libc) -> str:
    """Mount a /proc that shows this namespace (CUDA looks itself up in /proc by its PID)."""
    if libc.unshare(CLONE_NEWNS) != 0:
        return f" (host /proc: {os.strerror(ctypes.get_errno())})"
    private = libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0
    if not private or libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        return f" (host /proc: {os.strerror(ctypes.get_errno())})"
    return ""


def _mirror(child: int, host_pid_w: int, channels: tuple[int, ...], scratch: str) -> None:
    """The shim: hand the worker its host PID, let go of the channels, clean up after the
    worker, and end as it ends. The shim outlives a worker that dies mid-warm-up because
    the run that started it was killed: then nobody else would remove its scratch."""
    os.write(host_pid_w, child.to_bytes(8, "little"))
    os.close(host_pid_w)
    for fd in channels:
        os.close(fd)  # the worker's death must close the result pipe, not wait for the shim
    _, status = os.waitpid(child, 0)
    shutil.rmtree(scratch, ignore_errors=True)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


def isolate_network() -> str:
    """Enter an empty network namespace; returns how (or why not), for the run report."""
    libc = ctypes.CDLL(None, use_errno=True)
    for flags, how in ((CLONE_NEWNET, "netns"), (CLONE_NEWUSER | CLONE_NEWNET, "userns+netns")):
        if libc.unshare(flags) == 0:
            return how
    return f"none (unshare failed: {os.strerror(ctypes.get_errno())}); the static check still forbids sockets"


def confine_filesystem(writable: list[str]) -> str:
    """Make every mount read-only but `writable` (bind-mounted onto themselves first), in a
    mount namespace of this process's own; returns how it went, for the run report."""
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source, target, flags):
        if libc.mount(source and source.encode(), target.encode(), None, flags, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount {target}: {os.strerror(ctypes.get_errno())}")

    try:
        if libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
        mount(None, "/", MS_REC | MS_PRIVATE)
        for path in writable:
            mount(path, path, MS_BIND | MS_REC)
        for target, options in _mounts():
            if target in writable or target.startswith(PSEUDO_FILE_SYSTEMS) or "ro" in options:
                continue
            kept = sum(flag for name, flag in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC))
                       if name in options)
            mount(None, target, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
    except OSError as error:
        return f"not read-only ({error.strerror or error}); the static check still forbids file access"
    return f"read-only but {', '.join(writable)}"


def _mounts() -> list[tuple[str, set[str]]]:
    with open("/proc/self/mountinfo") as info:
        rows = [line.split() for line in info]
    return [(row[4], set(row[5].split(","))) for row in rows]


def limit_memory(max_memory_gb: float | None) -> None:
    if max_memory_gb:
        limit = int(max_memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _writable_folders(scratch: str) -> list[str]:
    """The scratch folder (also TMPDIR: the C++ compiler writes there), the compiler caches
    and the timing gate's folder, which must exist before the rest turns read-only."""
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(scratch, "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "triton"))
    os.environ.setdefault("CUDA_CACHE_PATH", os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "cuda"))
    folders = [scratch, os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TRITON_CACHE_DIR"],
               os.environ["CUDA_CACHE_PATH"]]
    if os.environ.get("OPSYNTH_TIMING_LOCK"):  # the GPU timing gate's lock files
        folders.append(os.path.dirname(os.environ["OPSYNTH_TIMING_LOCK"]))
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
    return list(dict.fromkeys(os.path.realpath(f) for f in folders if not f.startswith(scratch + os.sep)))


def _share_precompiled_headers() -> None:
    """Inductor precompiles its C++ headers (about 150 MB a build) into a folder under the
    temporary directory it saw at import: here, each worker's scratch. In the compiler
    cache, one build (under Inductor's own file lock) serves every worker and every run."""
    from torch._inductor import codecache
    if hasattr(codecache, "_HEADER_DIR"):
        codecache._HEADER_DIR = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "precompiled_headers")
        codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")


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
    scratch = options["scratch"]  # made by the pool; removed by the pool or the shim when the worker ends
    processes, host_pid = (isolate_processes(scratch, (job_fd, result_fd)) if options.get("isolate_pids", True)
                           else ("not requested", os.getpid()))
    writable = _writable_folders(scratch)
    network = isolate_network() if options.get("isolate_network", True) else "not requested"
    files = confine_filesystem(writable) if options.get("read_only_fs", True) else "not requested"
    limit_memory(options.get("rlimit_gb"))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.chdir(scratch)

    import torch
    torch.set_num_threads(options.get("threads") or torch.get_num_threads())
    _share_precompiled_headers()
    if options.get("gpu_memory_gb") and torch.cuda.is_available():
        # Workers share the GPU: none may take more than its task cap (plus headroom).
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, options["gpu_memory_gb"] * 2**30 / total))
    from filters.harness import evaluate, warm_up

    warmed = "not requested"
    if options.get("warm_up", True):
        # a failure is the host's (its compiler, say), not a candidate's: every candidate will say so too
        try:
            result = warm_up(options.get("device", "cpu"), os.path.join(scratch, "warm-up-compiler-cache"))
            warmed = "passed" if result["passed"] else f"failed: {result['reason']}: {result['detail']}"
        except Exception as error:
            warmed = f"failed: {type(error).__name__}: {error}"
    print(f"sandbox worker {host_pid}: processes {processes}; network {network}; file system {files}; "
          f"warm-up {warmed}", file=sys.stderr, flush=True)
    send(result_fd, {"ready": True, "processes": processes, "network": network, "files": files, "pid": host_pid,
                     "warm_up": warmed})
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
    # The pool closed the channel, or died. Without a PID namespace there is no shim to clean up.
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
