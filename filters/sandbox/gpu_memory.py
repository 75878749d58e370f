"""The memory of one GPU, counted: what each job of the workers sharing it holds.

A fixed share per worker split the GPU by the number of workers: on the H200 at 16 workers
each got 7.5 GB, 57 of 200 jobs outgrew it and ran again alone (every step exclusive), and
16 workers accepted less per hour than 8. Here a job holds what it has needed so far: it
starts with START_BYTES and grows, step by step, up to the most one job may hold (the same
at any number of workers, so a verdict does not change with them). The units of a GPU are
files in one folder beside its timing lock, one per UNIT_BYTES, and a job holds a unit by
an exclusive flock(2) on its file: the OS frees what a job held when its process ends,
however it ends, and a jailed worker needs only to read the files. The job's caching
allocator is capped at what it holds (torch.cuda.set_per_process_memory_fraction), so no
job takes memory another holds, and the units never add up to more than the GPU has.

Growing waits only while the job holds the GPU gate for no step (GpuGate.call), for at most
GROW_WAIT_S: growers that hold units while waiting for more can wait on each other, and a
job that cannot grow in time gives up with GpuMemoryBusy, which is no verdict on the task
(filters/sandbox/worker.py runs it again alone).

A job run again alone is the one job of its GPU (the flock of ALONE_LOCK, taken for its life)
that may grow into every unit but an eighth, which it leaves for the other workers' jobs to
start in (16 of 1 GiB on the H200; no task the checks accept needs the rest: the task cap
is 16 GB). It keeps each unit it takes and waits as long as it takes:
only the other jobs hold what it waits for, and they end or give up within GROW_WAIT_S. Its
steps share the GPU as every job's do: its memory is counted, so no other job can take it.
Its steps each holding the GPU alone cost 48 of its 57 worker-seconds on the H200 (16
workers: 20 such jobs took a third of the workers' time).
"""
from __future__ import annotations

import contextlib
import fcntl
import math
import os
import random
import time

UNIT_BYTES = 2**29  # 512 MiB
ALONE_LOCK = "alone"  # beside the units: held by the job of the GPU run again alone
START_BYTES = 2**30
GROW_WAIT_S = 10.0
POLL_S = (0.005, 0.02)  # a grower waits a random time in this range between tries


class GpuMemoryBusy(BaseException):
    """A job could not hold the memory a step needs while other jobs held the rest: no
    verdict on the task. A BaseException, so the checks' handlers of the task's own errors
    (an out-of-memory there is a size signal) let it through to the harness."""


def units_in(pool_gb: float) -> int:
    """How many units the jobs of one GPU share, `pool_gb` in all."""
    return int(pool_gb * 2**30 // UNIT_BYTES)


def units_folder(lock_path: str) -> str:
    return lock_path + ".memory"


def make_units(lock_path: str, units: int) -> None:
    """The unit files of the GPU whose timing lock is `lock_path` (made by the pool, which the
    jail lets its workers read)."""
    folder = units_folder(lock_path)
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o755)  # the jail's uid must reach the files inside
    for name in [f"{unit:04d}" for unit in range(units)] + [ALONE_LOCK]:
        fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT, 0o644)
        os.fchmod(fd, 0o644)
        os.close(fd)


class GpuMemory:
    """What one job holds of its GPU's memory, and the cap on its allocator that follows it."""

    def __init__(self, lock_path: str, units: int, most_bytes: int, total_bytes: int | None):
        self.folder, self.units = units_folder(lock_path), units
        self.most = self.ordinary_most = max(1, min(units, math.ceil(most_bytes / UNIT_BYTES)))
        self.total_bytes = total_bytes  # None: no allocator to cap (the tests, on the CPU)
        self.held: dict[int, int] = {}  # unit -> the open file whose flock holds it
        self.waited_s = 0.0  # waits that ended
        self.waiting_since: float | None = None  # the wait under way, if one is
        self.grown = 0  # how many times a step outgrew what the job held
        self.alone = False  # the job run again alone: it may hold every unit (run_alone)
        self.alone_lock: int | None = None  # the open ALONE_LOCK whose flock says so

    @property
    def held_bytes(self) -> int:
        return len(self.held) * UNIT_BYTES

    @property
    def waited_now_s(self) -> float:
        """The time the job has waited for memory, the wait under way included."""
        return self.waited_s + (time.perf_counter() - self.waiting_since if self.waiting_since else 0.0)

    def start(self, report=None) -> None:
        """Hold START_BYTES, waiting as long as it takes: a job that holds nothing keeps no
        one waiting, and other jobs' units come free as they end. `report()` is called as
        the wait goes on (the zygote adds what the job waited to its time limit)."""
        self._hold(min(self.most, math.ceil(START_BYTES / UNIT_BYTES)), math.inf, report)

    def run_alone(self, report=None) -> None:
        """Become the job of this GPU run again alone, once the one before it has ended: from
        now on it may hold every unit but an eighth. What it held goes back first: the job
        run alone now may be waiting for it."""
        self.give_back()
        fd = os.open(os.path.join(self.folder, ALONE_LOCK), os.O_RDONLY | os.O_CLOEXEC)
        with self._waiting():
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # kept until the process ends
                    break
                except BlockingIOError:
                    _pause(report)
        self.alone_lock, self.alone, self.most = fd, True, max(self.most, self.units - self.units // 8)

    def grow(self, report=None) -> bool:
        """Hold twice as much, up to the most a job may hold. False when the job already
        holds the most (the step's out-of-memory is the task's own); GpuMemoryBusy when the
        other jobs hold what it needs past GROW_WAIT_S (a job run alone waits on)."""
        if len(self.held) >= self.most:
            return False
        wanted = min(self.most, 2 * len(self.held))
        if not self._hold(wanted, math.inf if self.alone else GROW_WAIT_S, report):
            raise GpuMemoryBusy(f"out of memory: the job held {self.held_bytes / 2**30:.1f} GiB and needed "
                                f"{wanted * UNIT_BYTES / 2**30:.1f} GiB, which the other jobs on this GPU held "
                                f"for {GROW_WAIT_S:g} s")
        self.grown += 1
        return True

    def give_back(self) -> None:
        """Free every unit the job holds, and its place as the job run alone (its process's
        end does the same)."""
        for fd in self.held.values():
            os.close(fd)
        self.held.clear()
        if self.alone_lock is not None:
            os.close(self.alone_lock)
            self.alone_lock, self.alone, self.most = None, False, self.ordinary_most

    def _hold(self, wanted: int, wait_s: float, report=None) -> bool:
        """Hold `wanted` units in all, taking only free ones; what a failed try took goes back."""
        with self._waiting() as began:
            while True:
                taken = self._take(wanted - len(self.held))
                if len(self.held) + len(taken) >= wanted:
                    self.held.update(taken)
                    self._cap()
                    return True
                if self.alone:  # the one job that keeps what it took: no other keeper to wait on it
                    self.held.update(taken)
                    taken = {}
                for fd in taken.values():
                    os.close(fd)  # closing the file frees its flock
                if time.perf_counter() - began >= wait_s:
                    return False
                _pause(report)

    @contextlib.contextmanager
    def _waiting(self):
        """A wait for others' memory: counted in `waited_s` once over, seen in `waited_now_s` meanwhile."""
        self.waiting_since = began = time.perf_counter()
        try:
            yield began
        finally:
            self.waited_s += time.perf_counter() - began
            self.waiting_since = None

    def _take(self, count: int) -> dict[int, int]:
        """Up to `count` free units, looked for from a random place (two growers at once
        rarely contend for the same files)."""
        taken: dict[int, int] = {}
        first = random.randrange(self.units)
        for step in range(self.units):
            if len(taken) >= count:
                break
            unit = (first + step) % self.units
            if unit in self.held:
                continue
            fd = os.open(os.path.join(self.folder, f"{unit:04d}"), os.O_RDONLY | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                taken[unit] = fd
            except BlockingIOError:
                os.close(fd)
        return taken

    def _cap(self) -> None:
        if self.total_bytes:
            import torch
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.held_bytes / self.total_bytes))

    def metrics(self) -> dict:
        return {"gpu_memory_held_mb": self.held_bytes / 2**20, "gpu_memory_grown": self.grown,
                "gpu_memory_wait_ms": self.waited_s * 1e3}


def _pause(report) -> None:
    """Between two tries: say the wait goes on, and let others' units come free."""
    if report:
        report()
    time.sleep(random.uniform(*POLL_S))


# The memory the job of this process holds, when its worker counts memory (cuda_start._start_cuda
# sets it before any task code runs): the process's allocator has one cap, as a job has one.
held: GpuMemory | None = None


def at_the_most() -> bool:
    """Whether this process's job holds all it may: an out-of-memory then is the task's own
    size, the same at any number of workers (other jobs crowding it out is GpuMemoryBusy)."""
    return held is not None and len(held.held) >= held.most
