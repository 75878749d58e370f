"""What a job leaves, removed (the zygote's wipe after each child, filters/sandbox/worker.py
`_wipe`): every file and folder in /tmp and /dev/shm, whatever its mode, and every System V
IPC object, which no folder holds."""
from __future__ import annotations

import os
import stat


# System V IPC objects live in the jail's IPC namespace, not in a folder: /proc/sysvipc lists
# them, and each kind's control call removes one by its id.
SYSV_IPC = (("shm", "shmctl"), ("sem", "semctl"), ("msg", "msgctl"))
IPC_RMID = 0


def _remove_sysv_ipc() -> None:
    """Every shared memory segment, semaphore set and message queue a job left: the wipe of
    /tmp and /dev/shm does not reach them, and a job's 2 GB of segments stayed resident for
    every later job of the worker (a red team's, session 20). All are the jail uid's: no job
    before this one had another."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, control in SYSV_IPC:
        for ipc_id in _sysv_ids(kind):
            getattr(libc, control)(ipc_id, *((0,) if kind == "sem" else ()), IPC_RMID, None)
        if _sysv_ids(kind):
            raise SystemExit(f"opsynth worker: a job left System V {kind} objects the wipe cannot remove; "
                             "ending this worker")


def _sysv_ids(kind: str) -> list[int]:
    try:
        with open(f"/proc/sysvipc/{kind}") as table:
            return [int(line.split()[1]) for line in list(table)[1:] if line.strip()]
    except OSError:  # no System V IPC in this kernel
        return []


def _clear(folder: str, keep: tuple[str, ...] = ()) -> list[str]:
    """Remove everything inside `folder` but `keep` and mount points (the GPU timing locks are
    bound in read-only) with the folders that lead to them; returns what could not be removed.
    It walks by changing folder, one level at a time: no path grows with the depth, no
    descriptor is held per level, nothing is followed (no task runs now: nothing moves)."""
    left, home = [], os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.chdir(folder)
        device = os.lstat(".").st_dev
        trail = []  # (name, holds a mount) of each folder walked into
        pending = [[n for n in os.listdir(".") if os.path.join(folder, n) not in keep]]
        while pending:
            if not pending[-1]:  # this folder is done: leave it, and remove it unless it must stay
                pending.pop()
                if not trail:
                    break
                name, holds_mount = trail.pop()
                os.chdir("..")
                if holds_mount:
                    _holds_mount(trail)
                elif not _removed(name, os.rmdir):
                    left.append(name)
                continue
            name = pending[-1].pop()
            try:
                info = os.lstat(name)
            except FileNotFoundError:
                continue
            if info.st_dev != device:  # a mount: it stays, and so do the folders to it
                _holds_mount(trail)
            elif stat.S_ISDIR(info.st_mode):
                _removed(name, lambda n: os.chmod(n, stat.S_IRWXU))  # owner's rights: to list and empty it
                try:
                    entries = os.listdir(name)
                    os.chdir(name)
                except OSError:
                    left.append(name)
                    continue
                trail.append((name, False))
                pending.append(entries)
            elif not _removed(name, os.unlink):
                left.append(name)
    finally:
        os.fchdir(home)
        os.close(home)
    return left


def _holds_mount(trail: list) -> None:
    """The folder walked into last holds a mount: it stays."""
    if trail:
        trail[-1] = (trail[-1][0], True)


def _removed(name: str, remove) -> bool:
    try:
        remove(name)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False
