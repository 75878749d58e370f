"""A sandbox worker: a warm zygote that never runs task code, and a fresh child per job.

Started by `filters.sandbox` inside the jail (`filters.sandbox.jail`) as
`python -m filters.sandbox.worker JOB_FD RESULT_FD OPTIONS_JSON`. The zygote drops to an
unprivileged uid, imports torch and, on a CPU host, runs every check once on a built-in task
(on a GPU host it only imports: compiling makes Dynamo ask the CUDA runtime about the GPU,
and no child forked after that can use it). Then, for each job, it forks a child that:
- leaves its own process group and closes every descriptor but stderr and a pipe made for
  this job alone, so the zygote's channels are out of its reach;
- works in a fresh folder that is also its TMPDIR and its compiler caches (nothing a
  later job reads), under a memory limit and an audit hook that refuses processes, sockets
  and introspection routes the static check already forbids;
- runs the checks and writes one result on its pipe, then exits.
A second child of the same kind traces what an accepted task computes (its op sequence, for
decontamination), under a hard time limit of its own. The zygote bounds each child's time
and memory, kills its process group and every other process left in the jail, wipes
whatever it left in /tmp and /dev/shm, checks the result's shape (`check_result`) and sends
it on, tagged with the job's id. No state a task can change outlives its job: every child starts
from the zygote as it was after its warm-up. What the zygote readies is warm.py, a child's
start on the GPU cuda_start.py, and the removal of what a job left wipe.py.
"""
from __future__ import annotations

import errno
import functools
import gc
import json
import math
import mmap
import os
import resource
import select
import signal
import struct
import sys
import tempfile
import time

from filters.sandbox.cuda_start import _start_cuda
from filters.sandbox.jail import drop_privileges
from filters.sandbox.landlock import restrict_writes_to
from filters.sandbox.warm import _check_vector_instructions, _keep_precompiled_headers, warm_for_gpu
from filters.sandbox.wipe import _clear, _remove_sysv_ipc
from filters.checks.measure.resize import as_stored

MAX_RESULT_BYTES = 1 << 20
# Tracing on the meta device takes well under a second; a task that makes real tensors of its
# own, or a recurrent cell unrolled over a long sequence, can take minutes: it stays untraced.
TRACE_LIMIT_S = 20
MAX_DETAIL = 500
POLL_S = 0.1
# What a job's child writes where its parent reads it while it runs (one mmap of SHARED_BYTES):
# at 0, the seconds it waited at the GPU gate; at 8, the index + 1 of the task of a batch it is
# tracing (0: none), so that a batch that dies names the one task to trace alone.
SHARED_BYTES = 16
GATE_WAIT, UNDER_WAY = "d", "q"
EXIT_GRACE_S = 5  # a child that closed its pipe has this long to exit
ZYGOTE_DIR = "/tmp/zygote"
JAILED = False  # set by main(): whether this zygote runs in a PID namespace of the jail's own
# Programs the compiler may start (Inductor's C++ build, Triton's ptxas and its libcuda lookup).
COMPILER_PROGRAMS = frozenset({"gcc", "g++", "cc", "c++", "clang", "clang++", "ld", "ld.bfd", "ld.gold", "as",
                               "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-g++", "ptxas", "nvcc", "nvlink",
                               "fatbinary", "cicc", "nvdisasm", "cuobjdump", "openssl", "ldconfig", "ldconfig.real",
                               "cc1", "cc1plus", "collect2"})
# Compiler arguments that make a compiler start programs of the caller's choosing (a wrapper,
# a plugin, another tool folder, specs, arguments read from a file): Inductor and Triton use none.
STEERING_ARGUMENTS = ("-wrapper", "-B", "-specs", "--specs", "-fplugin", "-plugin", "--plugin", "-Wl,-plugin",
                      "-Wl,--plugin", "-no-integrated-cpp", "-fuse-ld", "@")
REFUSED_EVENTS = frozenset({"os.system", "os.exec", "os.spawn", "os.fork", "os.forkpty", "ctypes.dlsym/handle",
                            "os.kill", "os.killpg", "pty.spawn", "socket.__new__", "socket.connect", "socket.bind", "socket.sendto",
                            "socket.sendmsg", "gc.get_referrers", "gc.get_referents", "gc.get_objects",
                            "sys._current_frames", "sys.setprofile", "sys.settrace", "sys.addaudithook",
                            "webbrowser.open", "ctypes.dlsym", "ctypes.string_at", "ctypes.addressof"})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


# -- the channel ---------------------------------------------------------------------------

def send(fd: int, message: dict) -> None:
    data = json.dumps(message, default=str).encode()
    os.write(fd, len(data).to_bytes(8, "little") + data)


def receive(fd: int) -> dict | None:
    header = _read_exact(fd, 8)
    if header is None:
        return None
    size = int.from_bytes(header, "little")
    if size > MAX_RESULT_BYTES * 2:
        return None
    body = _read_exact(fd, size)
    return None if body is None else json.loads(body)


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# -- what a result may hold ------------------------------------------------------------------

def check_result(raw: object, reasons: dict[str, frozenset[str]]) -> dict | None:
    """The result a child sent, if it has the shape the checks produce: a known stage and
    reason, a capped detail, flat metrics of numbers, booleans and short strings. Anything
    else (code above all: the pool derives the published code itself) is not a verdict."""
    if not isinstance(raw, dict) or set(raw) != {"passed", "stage", "reason", "detail", "metrics"}:
        return None
    passed, stage, reason, detail, metrics = (raw[k] for k in ("passed", "stage", "reason", "detail", "metrics"))
    if not (isinstance(passed, bool) and isinstance(stage, str) and isinstance(reason, str)
            and isinstance(detail, str) and isinstance(metrics, dict)):
        return None
    if reason not in reasons.get(stage, ()) or passed != (stage == "accepted"):
        return None
    clean = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or len(name) > 64:
            return None
        if isinstance(value, float) and math.isnan(value):
            value = None
        longest = _max_op_graph() if name.startswith("op_graph") else 200
        if not (value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= longest)):
            return None
        clean[name] = value
    return {"passed": passed, "stage": stage, "reason": reason, "detail": detail[:MAX_DETAIL], "metrics": clean}


def longest_job_s(timeout_s: float) -> float:
    """The longest a job may take in a zygote that keeps its limits: its own work, as long
    again waiting at the GPU gate, twice (a job whose GPU memory ran out runs again alone),
    the trace, and the wait for each child's exit status."""
    return 2 * (2 * timeout_s + EXIT_GRACE_S) + TRACE_LIMIT_S + EXIT_GRACE_S


def accepted(metrics: dict) -> dict:
    return {"passed": True, "stage": "accepted", "reason": "", "detail": "", "metrics": metrics}


def _max_op_graph() -> int:
    from filters.computation.graph import MAX_OP_GRAPH  # here, not at the top: graph imports torch
    return MAX_OP_GRAPH


def failure(reason: str, detail: str) -> dict:
    return {"passed": False, "stage": "sandbox", "reason": reason, "detail": detail, "metrics": {}}


# -- the zygote ----------------------------------------------------------------------------

def serve(job_fd: int, result_fd: int, options: dict) -> None:
    """Run jobs until the pool closes the channel. What the zygote keeps on disk (its
    precompiled headers, its warm-up kernels) is in the children's reach as files of the
    same uid: each job ends with a check that none changed (a write, a rename or a chmod
    changes a file's ctime, which no process can set). If one did, the job's result is
    sent and the worker retires: no later job reads what a task left."""
    from filters.checks.harness import REASONS
    kept = _snapshot(ZYGOTE_DIR)
    while (job := receive(job_fd)) is not None:
        outcome = run_job(job, options, REASONS)
        forged = outcome.pop("forged", False)
        tampered = _snapshot(ZYGOTE_DIR) != kept
        if tampered:  # whatever the child said, it said it from a worker it changed
            outcome = failure("crashed", "the task changed the worker's own files: no verdict of it is kept, "
                                         "and the worker is replaced")
        send(result_fd, {"job": job["id"], **outcome, "retire": forged or tampered})
        if forged or tampered:
            why = "sent an answer that is not the checks' own" if forged else "changed the zygote's files"
            print(f"sandbox worker: a job {why}; retiring", file=sys.stderr, flush=True)
            return


def _snapshot(folder: str) -> dict:
    """`folder` and everything under it with what no task can forge: inode, size, times."""
    paths = [folder, *(os.path.join(root, name) for root, folders, files in os.walk(folder) for name in folders + files)]
    return {path: _identity(os.lstat(path)) for path in paths}


def _identity(info: os.stat_result) -> tuple:
    return info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode


def run_job(job: dict, options: dict, reasons) -> dict:
    """The checks' verdict (for a trace-only job, a stand-in that only carries the trace),
    with what the task computes, traced in a second child: a trace that fails or hangs never
    changes a verdict."""
    if job["config"].get("trace_batch"):  # many tasks' traces, none of them checked (filters/sandbox/trace_batch.py)
        from filters.sandbox.trace_batch import batch_limit_s
        return _in_child(job, {**options, "timeout_s": batch_limit_s(_task_limit_s(job))}, reasons, _trace_batch_child)
    if job["config"].get("trace_only"):
        outcome = accepted({})
    else:
        outcome = confirm(_in_child(job, options, reasons, _child), job["config"])
        if gpu_memory_ran_out(outcome, options, job["config"]):
            first = outcome
            outcome = retried_alone(job, options, reasons)
            outcome["metrics"].update(  # what sent it to run alone, for the throughput benchmark
                first_failure=f"{first['stage']}/{first['reason']}",
                first_error_in=first["metrics"].get("error_in"), first_detail=first["detail"][:200],
                first_gpu_memory_held_mb=first["metrics"].get("gpu_memory_held_mb"),
                first_job_wall_ms=first["metrics"].get("job_wall_ms"))
    if outcome["passed"]:  # the code as the pool stores it, at the sizes the checks chose, as they ran it
        # Where memory is counted the trace starts as any job does, and runs alone only if that
        # runs out: waiting for the turn to run alone, a trace's 20 s could run out first.
        alone = bool(outcome["metrics"].get("retried_alone")) and not options.get("gpu_pool_gb")
        stored = {**job, "code": as_stored(job["code"], outcome["metrics"]),
                  "config": {**job["config"], "gpu_alone": alone}}
        began = time.monotonic()
        traced = _in_child(stored, {**options, "timeout_s": TRACE_LIMIT_S, "alone": alone}, reasons, _trace_child)
        outcome["metrics"]["op_graph"] = traced["metrics"].get("op_graph") if traced["passed"] else None
        outcome["metrics"]["trace_wall_ms"] = (time.monotonic() - began) * 1e3  # the zygote's, for the benchmark
        if job["config"].get("trace_only"):  # a reference task's reading at a smaller problem (harness.Reading)
            outcome["metrics"]["partial"] = bool(traced["passed"] and traced["metrics"].get("partial"))
    return outcome


def gpu_memory_ran_out(outcome: dict, options: dict, config: dict) -> bool:
    """Whether a check ended because an allocation on a shared GPU failed: the task ran out
    of the most its job may hold, or the other jobs held what it needed. That is no verdict on the task
    until it has run with the GPU's memory to itself (`retried_alone`)."""
    if outcome["passed"] or outcome["stage"] == "sandbox" or config.get("gpu_alone"):
        return False  # a host memory limit, a crash or a timeout is the task's own; one retry at most
    if not (options.get("device", "cpu").startswith("cuda") and options.get("gpu_memory_gb")):
        return False
    from filters.checks.measure.execution import gpu_allocation_failed
    return outcome["reason"] == "out_of_memory" or (outcome["reason"] == "eager_error"
                                                    and gpu_allocation_failed(outcome["detail"]))


def retried_alone(job: dict, options: dict, reasons) -> dict:
    """The job again, in a fresh child from this zygote, with the GPU's memory not split
    between workers: where the worker counts GPU memory, as the one job of its GPU that may
    grow into all of it (gpu_memory.GpuMemory.run_alone), its steps beside other workers';
    where it does not, with every GPU step alone (no other worker's step allocates meanwhile,
    and what each step frees goes back before the next worker's). Its verdict stands,
    whatever it is: a task that needs more than the GPU holds is the task's own fault."""
    config = {**job["config"], "gpu_alone": True}
    outcome = confirm(_in_child({**job, "config": config}, {**options, "alone": True}, reasons, _child), config)
    outcome["metrics"]["retried_alone"] = True
    return outcome


def confirm(outcome: dict, config: dict) -> dict:
    """The verdict on what the child measured, decided here, in a process that never ran task
    code. A child may reject itself (that costs no one but its own job) but never accept
    itself: its "accepted" only claims that every measure was taken. The zygote checks that
    each measure the enabled checks take is there with its type, applies every check's
    thresholds (filters/checks/registry.py `decide`), and holds the timing to its own clock. An answer that lacks
    a measure or claims more time than passed was not written by the checks: a forgery."""
    if not outcome["passed"]:
        return outcome
    from filters.checks.registry import DEFAULTS, decide, measures
    cfg, metrics = {**DEFAULTS, **config}, outcome["metrics"]
    missing = sorted(name for name, kind in measures(cfg).items() if not _typed(metrics.get(name, _ABSENT), kind))
    impossible = _beyond_clock(metrics, cfg)
    if missing or impossible:
        why = f"reported no valid {', '.join(missing[:3])}" if missing else impossible
        return {**failure("crashed", f"the task's process {why}: not the checks' answer; the worker is replaced"),
                "forged": True}
    rejected = decide(metrics, cfg)
    if rejected:
        stage, reason, detail = rejected
        return {"passed": False, "stage": stage, "reason": reason, "detail": detail[:MAX_DETAIL], "metrics": metrics}
    return outcome


_ABSENT = object()


def _typed(value, kind: type) -> bool:
    """A measure of its declared kind; a float may be None (a decide that needs it fails it)."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _beyond_clock(metrics: dict, cfg: dict) -> str | None:
    """What the child claims took longer than the zygote saw pass: the stages' wall times
    together, or the precise timing, which samples at least `min_repeats` calls."""
    wall = metrics["job_wall_ms"]
    stages = sum(value for name, value in metrics.items() if name.startswith("t_") and name.endswith("_ms")
                 and isinstance(value, (int, float)) and not isinstance(value, bool))
    eager = metrics.get("eager_ms")
    if stages > wall:
        return f"claimed {stages:.0f} ms of checks in {wall:.0f} ms"
    if isinstance(eager, (int, float)) and eager * cfg["min_repeats"] > wall:
        return f"claimed a median eager time of {eager:.1f} ms in {wall:.0f} ms"
    return None


def _in_child(job: dict, options: dict, reasons, body) -> dict:
    workdir = tempfile.mkdtemp(prefix="job-", dir="/tmp")
    read_fd, write_fd = os.pipe()
    shared = mmap.mmap(-1, SHARED_BYTES)
    child = os.fork()
    if child == 0:
        body(job, options, workdir, write_fd, shared)  # never returns
    os.close(write_fd)
    began = time.monotonic()
    try:
        outcome = _await_child(child, read_fd, options, reasons, shared)
        outcome["metrics"]["job_wall_ms"] = (time.monotonic() - began) * 1e3  # the zygote's own clock
    finally:
        os.close(read_fd)
        _end(child)
        _end_strays()
        _wipe()
    under_way = struct.unpack_from(UNDER_WAY, shared, 8)[0] - 1  # read once the child is gone: it moves no more
    if not outcome["passed"] and under_way >= 0:
        outcome["metrics"]["under_way"] = under_way
    return outcome


def _await_child(child: int, read_fd: int, options: dict, reasons, shared: mmap.mmap) -> dict:
    """The child's result. Its time limit counts its own work: the time it reports waiting
    at the GPU gate is added, up to the limit itself (a child that lies gains at most that)."""
    started, limit = time.monotonic(), options["timeout_s"]
    rss_limit = options.get("rss_limit_gb")
    data = bytearray()
    while True:
        reported = struct.unpack_from(GATE_WAIT, shared, 0)[0]
        # a NaN compares false with everything: taken as it is, the deadline was NaN and never came
        waited = min(max(reported, 0.0), limit) if math.isfinite(reported) else limit
        deadline = started + limit + waited
        if time.monotonic() > deadline:
            return failure("timeout", f"no result within {limit:.0f} s of its own work"
                                      f"{f' (and {waited:.0f} s waiting for the GPU)' if waited >= 1 else ''}; "
                                      "the task was killed")
        if rss_limit and _rss_bytes(child) > rss_limit * 2**30:
            return failure("out_of_memory", f"resident memory passed {rss_limit:g} GB; the task was killed")
        ready, _, _ = select.select([read_fd], [], [], POLL_S)
        if not ready:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_RESULT_BYTES:
            return failure("crashed", "the task's process sent more than a verdict can hold")
    status = _exit_status(child, deadline)
    if status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
        return failure("timeout", "one step held the GPU gate past its limit; the task was killed and the gate freed")
    if status is not None and os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return failure("out_of_memory" if name == "SIGKILL" else "crashed", f"the task's process died from {name}")
    try:
        result = check_result(json.loads(bytes(data)), reasons) if data else None
    except ValueError:
        result = None
    if result is None and data:  # bytes that are not the checks' answer: written by the task's code
        return {**failure("crashed", "the task's process sent something that is not the checks' answer; "
                                     "the worker is replaced"), "forged": True}
    if result is None:
        code = os.waitstatus_to_exitcode(status) if status is not None else "unknown"
        return failure("crashed", f"the task's process ended without an answer (exit code {code})")
    return result


def _exit_status(child: int, deadline: float) -> int | None:
    while time.monotonic() < deadline + EXIT_GRACE_S:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            return status
        time.sleep(0.01)
    return None


def _end(child: int) -> None:
    """Kill the child's process group (a compiler it started, anything left) and reap it."""
    try:
        os.killpg(child, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(child, 0)
    except ChildProcessError:
        pass


def _end_strays() -> None:
    """Every process left in the jail but the zygote and the jail's init: a program a child
    started in a session of its own outlives the kill of the child's process group, and could
    reach the next job (same uid). kill(-1) reaches exactly those: the jail has its own PID
    namespace, and the caller and the namespace's init are spared. Outside a jail (a zygote
    run by hand) it would reach every process of the user, so only a jailed zygote does it."""
    if not JAILED:
        return
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:  # nobody left
        pass
    while True:  # reap those that were the zygote's own children
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break


def _own_pid_namespace() -> bool:
    """Whether this process's PID namespace is one the jail made: its init is bwrap, not the
    host's init."""
    try:
        with open("/proc/1/comm") as init:
            return init.read().strip() == "bwrap"
    except OSError:
        return False


def _wipe() -> None:
    """Everything a child left where the next one could read it, whatever its mode (a 0555
    folder with files in it, a 0000 file, a fifo, a link loop, a tree too deep for a path).
    What cannot be removed ends the worker: its jail, /tmp and all, goes with it. Outside a
    jail (a zygote run by hand) /tmp is the host's: only a jailed zygote wipes."""
    if not JAILED:
        return
    _remove_sysv_ipc()
    left = [path for folder in ("/tmp", "/dev/shm") for path in _clear(folder, keep=(ZYGOTE_DIR,))]
    if left:
        raise SystemExit(f"opsynth worker: a job left what the wipe cannot remove ({', '.join(left[:3])}); "
                         "ending this worker")




def _rss_bytes(pid: int) -> int:
    return _status_kb(pid, "VmRSS:") * 1024


def _vm_bytes(pid: int) -> int:
    return _status_kb(pid, "VmSize:") * 1024


def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


# -- the child -----------------------------------------------------------------------------

def _child(job: dict, options: dict, workdir: str, write_fd: int, shared: mmap.mmap) -> None:
    def checks() -> dict:
        from filters.checks.measure import execution
        execution.report_gate_wait = lambda waited_s: struct.pack_into(GATE_WAIT, shared, 0, waited_s)
        return _evaluate(job, options)
    _run_in_child(checks, options, workdir, write_fd)


def _trace_child(job: dict, options: dict, workdir: str, write_fd: int, shared: mmap.mmap) -> None:
    def traced() -> dict:
        from filters.checks.measure import execution
        from filters.checks.registry import DEFAULTS
        from filters.checks.harness import read
        execution.report_gate_wait = lambda waited_s: struct.pack_into(GATE_WAIT, shared, 0, waited_s)
        sys.addaudithook(_refuse_escapes(workdir))
        cfg = {**DEFAULTS, **job["config"]}
        checks = _checks_device(cfg, options, cfg["gpu_alone"])
        reading = read(job["code"], cfg.get("untrusted", True), checks, cfg.get("in_full", False))
        return accepted({"op_graph": reading.graph, "partial": reading.partial})
    _run_in_child(traced, options, workdir, write_fd)


def _checks_device(cfg: dict, options: dict, alone: bool):
    """Where a trace runs a task at its own sizes: as its checks ran it (harness.ChecksDevice),
    and again as the job run alone if its job's memory runs out."""
    from filters.checks.harness import ChecksDevice, gpu_gate
    on_gpu = cfg["device"].startswith("cuda")
    start = functools.partial(_start_cuda, {**options, "alone": alone}) if on_gpu else (lambda: None)
    return ChecksDevice(cfg["device"], cfg["seed"], gpu_gate({**cfg, "gpu_alone": alone}), start,
                        None if alone else _checks_device(cfg, options, True))


def _trace_batch_child(job: dict, options: dict, workdir: str, write_fd: int, shared: mmap.mmap) -> None:
    def traced() -> dict:
        from filters.sandbox.trace_batch import trace_batch
        sys.addaudithook(_refuse_escapes(workdir))
        under_way = lambda index: struct.pack_into(UNDER_WAY, shared, 8, index + 1)  # noqa: E731
        return accepted(trace_batch(job["config"]["trace_batch"], _task_limit_s(job), under_way))
    _run_in_child(traced, options, workdir, write_fd)


def _task_limit_s(job: dict) -> float:
    """A batched task's time: as long as alone, or less where the job asks."""
    return min(float(job["config"].get("task_limit_s", TRACE_LIMIT_S)), TRACE_LIMIT_S)


def _run_in_child(body, options: dict, workdir: str, write_fd: int) -> None:
    """In a forked child: leave the zygote's session and descriptors behind, take the
    job's folder and limits, write `body()`'s result on the job's pipe, and exit."""
    try:
        # a session of its own, not only a group: the scheduler's autogroup (whose nice
        # /proc/self/autogroup sets) is the session's, and the zygote's session held every later job
        os.setsid()
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        _own_folders(workdir)
        restrict_writes_to(workdir)  # before any task code: the kernel refuses every write outside the job's folder
        _limit(options)
        result = body()
    except BaseException as error:  # SystemExit, KeyboardInterrupt from the task: a crash, not ours
        result = failure("crashed", f"{type(error).__name__}: {error}"[:MAX_DETAIL])
    try:
        os.write(write_fd, json.dumps(result, default=str).encode())
    finally:
        os._exit(0)


def _evaluate(job: dict, options: dict) -> dict:
    import torch

    from filters.checks.harness import evaluate
    sys.addaudithook(_refuse_escapes(tempfile.gettempdir()))
    began = time.perf_counter()
    if options.get("device", "cpu").startswith("cuda") and torch.cuda.is_available():
        _start_cuda(options)
    started_ms = (time.perf_counter() - began) * 1e3
    result = evaluate(job["code"], job["config"])
    metrics = {**result["metrics"], "t_cuda_start_ms": started_ms} if options.get("device", "").startswith("cuda") \
        else result["metrics"]
    return {**{key: result[key] for key in ("passed", "stage", "reason", "detail")}, "metrics": metrics}




def _own_folders(workdir: str) -> None:
    """The job's folder is its TMPDIR and holds its compiler caches: nothing a later job reads."""
    from filters.checks.harness import use_compiler_caches
    os.chdir(workdir)
    os.environ.update(TMPDIR=workdir, CUDA_CACHE_PATH=os.path.join(workdir, "cuda"))
    tempfile.tempdir = workdir
    use_compiler_caches(os.path.join(workdir, "inductor"))
    # headers the zygote built are remembered in memory and read from its folder; any other
    # (a zygote that never compiled: on a GPU host) is built here, for this job alone
    _keep_precompiled_headers(os.path.join(workdir, "precompiled-headers"))


def _limit(options: dict) -> None:
    import torch
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if options.get("rlimit_gb"):  # on top of what the zygote already maps: the task's own budget
        limit = _vm_bytes(os.getpid()) + int(options["rlimit_gb"] * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    torch.set_num_threads(options.get("threads") or 1)


def _refuse_escapes(workdir: str):
    """An audit hook (it cannot be removed): the second guard behind the static check."""
    refused, programs, write_flags = REFUSED_EVENTS, COMPILER_PROGRAMS, WRITE_FLAGS
    inside = workdir + os.sep

    def hook(event: str, args: tuple) -> None:
        if event in refused:
            raise PermissionError(f"the sandbox refuses {event}")
        if event in ("subprocess.Popen", "os.posix_spawn"):  # Triton starts ptxas through posix_spawn
            program = args[0] or (args[1][0] if args[1] else "")
            if os.path.basename(os.fsdecode(program)) not in programs:
                raise PermissionError(f"the sandbox refuses to start {os.fsdecode(program)!r}")
            steered = [arg for arg in map(os.fsdecode, args[1] or ()) if arg.startswith(STEERING_ARGUMENTS)]
            if steered:  # `gcc -wrapper /bin/sh,-c,...` starts any program (a red team's route)
                raise PermissionError(f"the sandbox refuses a compiler argument that starts other programs: "
                                      f"{steered[0]!r}")
        elif event == "open" and isinstance(args[0], (str, bytes)):
            mode, flags = args[1] or "", args[2] or 0
            writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & write_flags)
            path = os.path.realpath(os.fsdecode(args[0]))
            if writing and not (path == workdir or path.startswith(inside) or path == "/dev/null"):
                raise PermissionError(errno.EROFS, f"the sandbox refuses to write {path}")
    return hook


# -- start ---------------------------------------------------------------------------------



def main() -> None:
    global JAILED
    job_fd, result_fd, options = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    jail = drop_privileges()
    JAILED = _own_pid_namespace()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.makedirs(ZYGOTE_DIR, exist_ok=True)
    os.chdir(ZYGOTE_DIR)
    os.environ["TMPDIR"] = tempfile.tempdir = ZYGOTE_DIR

    began = time.monotonic()
    import torch
    torch.set_num_threads(1)  # no OpenMP pool in the zygote: each child starts its own after fork
    _keep_precompiled_headers(os.path.join(ZYGOTE_DIR, "precompiled-headers"))
    from filters.checks.harness import warm_up
    warmed = "compile not requested"
    if options.get("device", "cpu").startswith("cuda"):
        # Compiling, even for the CPU, makes Dynamo ask the CUDA runtime about the GPU, and a
        # process that did can fork no child that uses it: on a GPU host the zygote warms
        # only what needs no CUDA (`warm_for_gpu`).
        warmed = warm_for_gpu(options.get("gpu_warm_up") or "imports", os.path.join(ZYGOTE_DIR, "compiler-cache"))
    elif options.get("warm_up", True):
        # a failure is the host's (its compiler, say), not a candidate's: every candidate will say so too
        try:
            result = warm_up("cpu", os.path.join(ZYGOTE_DIR, "compiler-cache"))
            warmed = "passed" if result["passed"] else f"failed: {result['reason']}: {result['detail']}"
        except Exception as error:
            warmed = f"failed: {type(error).__name__}: {error}"
    from filters.checks.harness import WARM_UP_TASK, trace
    trace(WARM_UP_TASK)  # tracing on the meta device touches no GPU: every child traces warm
    gc.freeze()  # no child's collections walk (and copy) what the zygote holds: 80 ms a trace job without it
    if not options.get("device", "cpu").startswith("cuda"):  # 50 s of gcc on the H200 host, for C++ kernels
        _check_vector_instructions()
    if torch.cuda.is_initialized():  # a forked child could never use the GPU
        raise SystemExit("opsynth worker: CUDA was initialised before the first job; children could not use it")
    warmed += f" in {time.monotonic() - began:.1f} s"
    print(f"sandbox worker: {jail}; warm-up {warmed}", file=sys.stderr, flush=True)
    send(result_fd, {"ready": True, "jail": jail, "warm_up": warmed})
    serve(job_fd, result_fd, options)


if __name__ == "__main__":
    main()
