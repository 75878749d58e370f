"""Landlock (Linux 5.13+): the kernel refuses a process every write outside the folders it
was given, whatever its uid may do and whatever Python it runs.

A job's child calls `restrict_writes_to(job_folder)` before any task code runs: from then on
it and every program it starts may write, make, rename, link and remove only inside its job
folder, and open for writing only the device files named (/dev/null, the GPU's nodes).
Reading is left to the jail's read-only layout. Where the kernel's Landlock has them (ABI
6+), the child may also signal no process and reach no abstract Unix socket outside its own
domain: the zygote that forked it is out of its reach. Landlock has no right for chmod,
chown or times: those stay with the file's owner (a task's uid owns nothing writable
outside its job folder but the zygote's own folder, which the zygote watches).

A kernel without Landlock (gVisor reports 4.4.0 and has none) is no error: `status()` says
so for the worker's ready message and `restrict_writes_to` returns 0; the jail's other
layers hold. Only the access rights the running ABI knows are asked for, and IOCTL_DEV is
never handled: the GPU driver is driven by ioctls.
"""
from __future__ import annotations

import ctypes
import errno
import glob
import os
import platform
import struct

# System call numbers: the same on every architecture (the unified table, 444 on).
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1

# File system rights, with the ABI that brought each.
WRITE_FILE = 1 << 1
REMOVE_DIR, REMOVE_FILE = 1 << 4, 1 << 5
MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = (1 << bit for bit in range(6, 13))
REFER = 1 << 13  # ABI 2: a rename or link into another folder
TRUNCATE = 1 << 14  # ABI 3
WRITES_BY_ABI = {1: WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK
                 | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM, 2: REFER, 3: TRUNCATE}
FILE_RIGHTS = WRITE_FILE | TRUNCATE  # all a rule on a file (not a folder) may grant
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4: the jail has no network; none is granted
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
DEVICES = ("/dev/null",)  # what a job's child opens for writing outside its folder, with the GPU's nodes


class LandlockError(OSError):
    """The kernel has Landlock but refused a ruleset: the child must not go on unconfined."""


def abi_version() -> tuple[int, str]:
    """The kernel's Landlock ABI version, 0 with the reason where there is none."""
    if platform.system() != "Linux":
        return 0, f"not Linux ({platform.system()})"
    libc = _libc()
    version = libc.syscall(CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    if version < 0:
        code = ctypes.get_errno()
        return 0, f"{errno.errorcode.get(code, code)}: {os.strerror(code)} (kernel {platform.release()})"
    return version, ""


def status() -> str:
    """One line for the worker's ready message and workers.log."""
    version, why = abi_version()
    return f"landlock: ABI {version}" if version else f"landlock: unavailable ({why})"


def restrict_writes_to(folder: str, devices: tuple[str, ...] | None = None) -> int:
    """From now on this process and its children write only inside `folder`, to `devices`
    (default: DEVICES and every /dev/nvidia* node) and to this process's own /proc entry,
    signal no process and reach no abstract socket outside their own domain (ABI 6+). Returns the ABI version applied, 0
    where the kernel has no Landlock. Irreversible. Needs no_new_privs (the jail sets it)."""
    version, _ = abi_version()
    if not version:
        return 0
    writes = 0
    for abi, rights in WRITES_BY_ABI.items():
        writes |= rights if version >= abi else 0
    handled = [writes, NET_BIND_TCP | NET_CONNECT_TCP, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL]
    fields = 1 if version < 4 else 2 if version < 6 else 3  # what struct landlock_ruleset_attr holds at this ABI
    attr = struct.pack(f"={fields}Q", *handled[:fields])
    libc = _libc()
    ruleset = _check(libc.syscall(CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)),
                     "create a ruleset")
    try:
        _allow(libc, ruleset, folder, writes)
        nodes = DEVICES + tuple(sorted(glob.glob("/dev/nvidia*"))) if devices is None else devices
        for device in nodes:
            if os.path.exists(device):
                _allow(libc, ruleset, device, writes if os.path.isdir(device) else writes & FILE_RIGHTS)
        # Its own /proc entry: CUDA names its threads (pthread_setname_np writes
        # /proc/self/task/TID/comm) and fails to start, error 304, when it cannot (seen on the
        # H200). What lies there is this process's own, which it holds anyway.
        _allow(libc, ruleset, f"/proc/{os.getpid()}", writes & FILE_RIGHTS)
        _check(libc.syscall(RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)), "restrict itself")
    finally:
        os.close(ruleset)
    return version


def _allow(libc, ruleset: int, path: str, rights: int) -> None:
    """A rule: `rights` beneath `path` (on `path` itself, for a file)."""
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr, packed
        _check(libc.syscall(ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), rule,
                            ctypes.c_uint32(0)), f"allow writes beneath {path}")
    finally:
        os.close(fd)


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise LandlockError(code, f"landlock could not {what}: {os.strerror(code)}")
    return result


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc
