"""The jail alone, with the static check and the worker's audit hook out of the way: an
attacker with all of Python inside it, as a task that got past both would be. Each attack
must fail and leave no trace on the host. CI runs as root, so the root form is tested there;
the form for any other user is tested by running bwrap as uid 65534."""
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from filters.sandbox import jail, landlock
from tests.conftest import make_task

ATTACKER_PREAMBLE = """\
import ctypes, os, sys
from filters.sandbox.jail import drop_privileges
drop_privileges()
libc = ctypes.CDLL(None, use_errno=True)
def refused(result):
    assert result == -1, result
    return ctypes.get_errno()
"""


def run_jailed(script: str, extra_env: dict | None = None, readable: tuple[str, ...] = (),
               setup: str = "") -> subprocess.CompletedProcess:
    seccomp = jail.seccomp_pipe()
    command = jail.command([sys.executable, "-c", ATTACKER_PREAMBLE + setup + textwrap.dedent(script)], gpu=False,
                           env=jail.environment(extra_env or {}), seccomp_fd=seccomp, readable=readable)
    try:
        return subprocess.run(command, pass_fds=(seccomp,), capture_output=True, text=True, timeout=60)
    finally:
        os.close(seccomp)


def assert_held(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0 and "HELD" in result.stdout, (result.stdout, result.stderr)


def test_the_task_runs_unprivileged_with_no_capabilities_and_a_seccomp_filter():
    assert_held(run_jailed("""
        status = dict(l.split(":", 1) for l in open("/proc/self/status"))
        assert os.getuid() != 0 and os.geteuid() != 0 and os.getgid() != 0 and os.getgroups() == []
        assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
        assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
        print("HELD")
    """))


def test_the_host_file_system_cannot_be_written_or_remounted(tmp_path):
    target = Path.cwd() / f".jail-probe-{os.getpid()}"
    assert_held(run_jailed(f"""
        MS_REMOUNT, MS_BIND = 32, 4096
        refused(libc.mount(None, b"/", None, MS_REMOUNT | MS_BIND, None))
        refused(libc.umount2(b"/proc", 2))
        for path in ({str(target)!r}, "/etc/opsynth-owned", "/proc/sys/kernel/core_pattern",
                     "/sys/fs/cgroup/cgroup.procs"):
            try:
                open(path, "w").write("owned")
            except OSError:
                continue
            raise SystemExit("wrote " + path)
        print("HELD")
    """))
    assert not target.exists() and not Path("/etc/opsynth-owned").exists()


def test_no_host_process_is_visible_and_no_namespace_can_be_entered_or_made():
    assert_held(run_jailed("""
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        commands = [open(f"/proc/{p}/cmdline", "rb").read() for p in pids]
        assert not any(b"py" + b"test" in c for c in commands), commands  # split: this script says it
        assert len(pids) < 6, pids
        own = os.open("/proc/self/ns/net", os.O_RDONLY)
        refused(libc.setns(own, 0))
        refused(libc.unshare(0x10000000))  # a user namespace
        refused(libc.unshare(0x40000000))  # a network namespace
        refused(libc.ptrace(16, 1, None, None))  # attach to the jail's init
        print("HELD")
    """))


def test_no_network_socket_can_be_made_and_no_listener_on_the_hosts_loopback_is_reached():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    result = run_jailed(f"""
        import socket, errno
        for family in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, socket.AF_PACKET):
            try:
                made = socket.socket(family)
                if family == socket.AF_INET:
                    made.connect(("127.0.0.1", {port}))
            except OSError as error:
                assert error.errno == errno.EAFNOSUPPORT, error
                continue
            raise SystemExit("a socket was made")
        print("HELD")
    """)
    assert_held(result)
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()


def test_shared_memory_and_tmp_are_the_jails_own():
    name = f"opsynth-jail-probe-{os.getpid()}"
    assert_held(run_jailed(f"""
        for folder in ("/dev/shm", "/tmp"):
            open(folder + "/{name}", "w").write("left behind")
        print("HELD")
    """))
    assert not Path("/dev/shm", name).exists() and not Path("/tmp", name).exists()


def test_secrets_in_the_environment_or_the_home_folder_never_reach_the_jail(monkeypatch):
    home = Path(__file__).parent / f".jail-home-{os.getpid()}"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    try:
        (home / ".cache" / "huggingface" / "token").write_text("hf_home_secret_123456")
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("OPENAI_API_KEY", "sk-env-secret-123456")
        monkeypatch.setenv("HF_TOKEN", "hf_env_secret_123456")
        monkeypatch.setenv("TORCH_AUTH_TOKEN", "looks-passed-but-is-a-secret")
        result = run_jailed(f"""
            assert not any("secret" in value for value in os.environ.values()), dict(os.environ)
            assert not os.path.exists({str(home / '.cache' / 'huggingface' / 'token')!r})
            print("HELD")
        """)
    finally:
        import shutil
        shutil.rmtree(home)
    assert_held(result)


def test_the_form_for_an_ordinary_user_holds_too():
    """bwrap run by uid 65534 (no privileges): a user namespace, the same filter and folders."""
    seccomp = jail.seccomp_pipe()
    probe = ("grep -E '^(Uid|CapEff|NoNewPrivs|Seccomp)' /proc/self/status; "
             "touch /opsynth-owned 2>/dev/null && echo WROTE; echo done")
    command = jail.command(["/bin/sh", "-c", probe], gpu=False, env={"PATH": "/usr/bin:/bin"}, seccomp_fd=seccomp,
                           privileged=False, bind_python=False)
    try:
        result = subprocess.run(command, pass_fds=(seccomp,), capture_output=True, text=True, timeout=60,
                                **({"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}))
    finally:
        os.close(seccomp)
    assert result.returncode == 0 and result.stdout.endswith("done\n"), (result.stdout, result.stderr)
    status = dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)
    assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
    assert "WROTE" not in result.stdout and not Path("/opsynth-owned").exists()


def test_no_process_can_change_another_ones_limits_priority_or_cpus():
    """Every process of a jail runs as one uid: a child that lowered its zygote's limits,
    priority or CPUs would hand them to every later job of the worker (as root and as any
    user, the kernel lets one process of a uid do that to another). Each such call is refused
    when it names another process, and works on the caller itself."""
    assert_held(run_jailed(script="""
        import errno, resource, signal
        def ioprio_set(which, who, priority):  # no Python wrapper: x86-64's syscall 251
            if libc.syscall(251, which, who, priority) == -1:
                raise OSError(ctypes.get_errno(), "ioprio_set")
        zygote = os.fork()
        if zygote == 0:
            signal.pause()
        before = (os.getpriority(os.PRIO_PROCESS, zygote), os.sched_getaffinity(zygote),
                  os.sched_getscheduler(zygote), open(f"/proc/{zygote}/limits").read())
        attacks = [lambda: os.setpriority(os.PRIO_PROCESS, zygote, 19),
                   lambda: os.setpriority(os.PRIO_USER, 0, 19),  # every process of the uid
                   lambda: os.setpriority(os.PRIO_PGRP, 0, 19),
                   lambda: resource.prlimit(zygote, resource.RLIMIT_NOFILE, (3, 3)),
                   lambda: resource.prlimit(zygote, resource.RLIMIT_AS, (1 << 30, 1 << 30)),
                   lambda: os.sched_setaffinity(zygote, {min(os.sched_getaffinity(0))}),
                   lambda: os.sched_setscheduler(zygote, os.SCHED_IDLE, os.sched_param(0)),
                   lambda: os.sched_setparam(zygote, os.sched_param(0)),
                   lambda: ioprio_set(1, zygote, 3 << 13),  # the idle I/O class
                   lambda: ioprio_set(3, 0, 3 << 13)]  # every process of the uid
        for attack in attacks:
            try:
                attack()
            except OSError as error:
                assert error.errno == errno.EPERM, error
                continue
            raise SystemExit("allowed: an attribute of another process")
        assert (os.getpriority(os.PRIO_PROCESS, zygote), os.sched_getaffinity(zygote),
                os.sched_getscheduler(zygote), open(f"/proc/{zygote}/limits").read()) == before
        os.nice(1)  # its own, as a program may
        resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
        os.sched_setaffinity(0, os.sched_getaffinity(0))
        os.kill(zygote, signal.SIGKILL)
        print("HELD")
    """))


def entries_bound_under(folder: str) -> set[str]:
    """The entries of `folder` in the jail that lead to host folders bound into it: of the
    checkout, its code packages and, where `make` put it, its .venv; of /tmp, a checkout or
    virtual environment under it (where CI may clone) or a test's folder on sys.path."""
    paths = [jail.PROJECT_ROOT, *(os.path.join(jail.PROJECT_ROOT, p) for p in jail.CODE_PACKAGES), sys.prefix,
             *sys.path]
    real = [os.path.realpath(p) for p in paths if os.path.isabs(p)]  # not a path hook's name
    return {os.path.relpath(p, folder).split(os.sep)[0] for p in real if p.startswith(folder + os.sep)}


def test_host_files_outside_the_binds_are_not_in_the_jail(tmp_path):
    """Only the system, the Python installation and opsynth's code packages are bound: a
    world-readable file anywhere else on the host (another folder of the checkout, /opt,
    /var, a test's own folder) is not there at all."""
    out = Path(jail.PROJECT_ROOT) / "out"
    made_out = not out.exists()
    probes = [Path(f"/opt/opsynth-probe-{os.getpid()}"), Path(f"/var/lib/opsynth-probe-{os.getpid()}"),
              out / f"opsynth-probe-{os.getpid()}", tmp_path / "probe"]
    try:
        for probe in probes:
            probe.parent.mkdir(parents=True, exist_ok=True)
            probe.write_text("host secret")
            probe.chmod(0o644)
        result = run_jailed(f"""
            for path in {[str(p) for p in probes]!r}:
                assert not os.path.lexists(path), path
            assert sorted(os.listdir({jail.PROJECT_ROOT!r})) == {sorted(entries_bound_under(jail.PROJECT_ROOT))!r}
            import torch  # and what a job needs is there
            print("HELD")
        """)
    finally:
        for probe in probes:
            probe.unlink(missing_ok=True)
        if made_out:
            out.rmdir()
    assert_held(result)


def test_no_folder_on_the_module_search_path_is_writable():
    assert_held(run_jailed("""
        import importlib.util
        writable = [p for p in sys.path if os.access(p or ".", os.W_OK)]
        assert not writable and "" not in sys.path, sys.path
        print("HELD")
    """))


LANDLOCKED = """\
import errno, signal, socket, subprocess, tempfile
from filters.sandbox.landlock import restrict_writes_to
outside = tempfile.mkdtemp(dir="/tmp")  # what the jail's uid could write without Landlock
os.mkdir(outside + "/sub")
open(outside + "/file", "w").write("kept")
job = tempfile.mkdtemp(prefix="job-", dir="/tmp")
open(job + "/mine", "w").write("mine")
def denied(action, *args):
    try:
        action(*args)
    except OSError as error:
        assert error.errno in (errno.EACCES, errno.EPERM, errno.EXDEV, errno.EROFS), (action, args, error)
        return
    raise SystemExit(f"allowed: {action.__name__}{args}")
"""


@pytest.mark.skipif(not landlock.abi_version()[0], reason="this kernel has no Landlock")
def test_landlock_refuses_every_write_outside_the_job_folder():
    """As the worker's child does, before any task code: from then on every write, make,
    rename, link and removal outside its job folder is the kernel's to refuse, for it and for
    every program it starts; inside the job folder all of them work."""
    assert_held(run_jailed(setup=LANDLOCKED + f"BOUND = {entries_bound_under('/tmp')!r}\n", script="""
        assert restrict_writes_to(job) >= 1
        denied(open, outside + "/file", "w")
        denied(open, "/tmp/new", "w")
        denied(os.truncate, outside + "/file", 0)
        denied(os.rename, outside + "/file", outside + "/renamed")
        denied(os.rename, outside + "/file", job + "/stolen")
        denied(os.rename, job + "/mine", outside + "/mine")
        denied(os.mkdir, outside + "/made")
        denied(os.mkdir, "/tmp/opsynth_plant")
        denied(os.symlink, job, "/tmp/link")
        denied(os.link, job + "/mine", outside + "/hard")
        denied(os.mkfifo, "/tmp/fifo")
        denied(os.unlink, outside + "/file")
        denied(os.rmdir, outside + "/sub")
        denied(os.chmod, "/tmp", 0o777)  # not its own: the owner's right; the host's are read-only
        denied(os.chmod, "/usr", 0o777)
        shell = subprocess.run(["/bin/sh", "-c", f"echo owned > {outside}/file || mkdir /tmp/by-a-child"])
        assert shell.returncode != 0 and open(outside + "/file").read() == "kept"
        assert sorted(os.listdir(outside)) == ["file", "sub"]
        open(job + "/new", "w").write("fine")
        os.mkdir(job + "/folder")
        os.rename(job + "/new", job + "/folder/moved")
        os.symlink("folder/moved", job + "/link")
        os.link(job + "/mine", job + "/folder/hard")
        os.unlink(job + "/folder/hard")
        open("/dev/null", "w").write("fine")
        assert set(os.listdir("/tmp")) - BOUND == {os.path.basename(outside), os.path.basename(job)}
        print("HELD")
    """))


@pytest.mark.skipif(landlock.abi_version()[0] < 6, reason="this kernel's Landlock scopes no signal or socket")
def test_landlock_keeps_the_child_from_signalling_or_calling_processes_outside_its_domain():
    """The zygote stands outside the child's domain: the child can neither signal it nor
    connect to an abstract socket it listens on."""
    assert_held(run_jailed(setup=LANDLOCKED, script="""
        zygote = os.fork()
        if zygote == 0:
            signal.pause()
        listener = socket.socket(socket.AF_UNIX)
        listener.bind("\\0opsynth-zygote-probe")
        listener.listen(1)
        os.kill(zygote, 0)  # allowed before
        restrict_writes_to(job)
        denied(os.kill, zygote, signal.SIGKILL)
        denied(socket.socket(socket.AF_UNIX).connect, "\\0opsynth-zygote-probe")
        os.kill(os.getpid(), 0)  # its own domain is its own
        print("HELD")
    """))


def test_without_landlock_the_worker_says_so_and_the_child_goes_on():
    """gVisor's kernel has no Landlock: the ready message says why, and restricting is no error."""
    assert_held(run_jailed(setup=LANDLOCKED, script="""
        import pyseccomp
        no_landlock = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
        no_landlock.add_rule(pyseccomp.ERRNO(errno.ENOSYS), 444)
        no_landlock.load()
        assert drop_privileges is not None and restrict_writes_to(job) == 0
        from filters.sandbox.landlock import status
        assert status().startswith("landlock: unavailable (ENOSYS"), status()
        print("HELD")
    """))


def test_the_wipe_removes_whatever_a_job_left_whatever_its_mode(tmp_path):
    """As the jail's uid, in the jail's /tmp: a 0555 folder holding a package, a 0000 file and
    folder, a link loop, a link out of the job, a fifo, a tree deeper than a path can name. The
    zygote's folder and a folder bound in (the GPU timing locks) stay."""
    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / "gpu0.lock").write_text("")
    kept = {"zygote", *(locks.parts[2:3] if locks.parts[1] == "tmp" else ())}  # and the folders to the locks
    assert_held(run_jailed(f"""
        from filters.sandbox.wipe import _clear
        os.makedirs("/tmp/zygote/headers")
        open("/tmp/zygote/headers/kept.h", "w").write("kept")
        job = "/tmp/job-left"
        os.makedirs(job + "/plant/opsynth_plant")
        open(job + "/plant/opsynth_plant/__init__.py", "w").write("owned")
        for folder in (job + "/plant/opsynth_plant", job + "/plant"):
            os.chmod(folder, 0o555)
        open(job + "/closed", "w").write("x"); os.chmod(job + "/closed", 0)
        os.makedirs(job + "/shut/inside"); os.chmod(job + "/shut", 0)
        os.symlink("loop-b", job + "/loop-a"); os.symlink("loop-a", job + "/loop-b")
        os.symlink("/tmp/zygote", job + "/to-zygote")
        os.mkfifo(job + "/fifo"); os.mkfifo("/dev/shm/fifo")
        os.chdir(job)
        for _ in range(3000):  # 6000 characters: past PATH_MAX
            os.mkdir("d"); os.chdir("d")
        os.chdir("/")
        assert _clear("/tmp", keep=("/tmp/zygote",)) == [] and _clear("/dev/shm") == []
        assert set(os.listdir("/tmp")) - {entries_bound_under('/tmp')!r} == {kept!r}, os.listdir("/tmp")
        assert open("/tmp/zygote/headers/kept.h").read() == "kept" and not os.listdir("/dev/shm")
        assert os.path.exists({str(locks / "gpu0.lock")!r})
        print("HELD")
    """, readable=(str(locks),)))


def test_the_wipe_removes_the_system_v_ipc_a_job_left():
    """Shared memory segments, semaphore sets and message queues live in the jail's IPC
    namespace, where no wipe of a folder reaches: a job's segments stayed resident for every
    later job of its worker. The zygote removes every one after each job; a POSIX message
    queue, in the same namespace, cannot be made."""
    assert_held(run_jailed("""
        import errno
        from filters.sandbox.wipe import _remove_sysv_ipc
        libc.shmat.restype = ctypes.c_void_p
        segment = libc.shmget(0, 1 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
        address = ctypes.c_void_p(libc.shmat(segment, None, 0))
        ctypes.memset(address, 1, 1 << 20)
        libc.shmdt(address)  # detached, as a job that ended leaves it
        assert libc.semget(0, 1, 0o1600) >= 0 and libc.msgget(0, 0o1600) >= 0
        tables = lambda: [line for kind in ("shm", "sem", "msg") for line in open(f"/proc/sysvipc/{kind}")][3:]
        assert len(tables()) == 3, tables()
        _remove_sysv_ipc()
        assert tables() == [], tables()
        libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        assert refused(libc.mq_open(b"/left", os.O_CREAT | os.O_RDONLY, 0o600, None)) == errno.EPERM  # no wipe reaches one
        print("HELD")
    """))


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="this kernel has no scheduler autogroups")
def test_a_nice_written_to_the_autogroup_stays_in_the_writers_session():
    """A process that makes itself dumpable may write its own /proc/self/autogroup, whose nice
    is its whole session's: written from the zygote's session it reaches the zygote and so
    every later job; from a session of its own (a job's child calls setsid) it reaches none."""
    assert_held(run_jailed("""
        import time
        def renice_own_autogroup(new_session):
            child = os.fork()
            if child == 0:
                if new_session:
                    os.setsid()
                libc.prctl(4, 1)  # PR_SET_DUMPABLE
                for _ in range(20):  # the kernel takes one autogroup nice a tenth of a second (EAGAIN)
                    try:
                        with open("/proc/self/autogroup", "w") as autogroup:
                            autogroup.write("19")
                        os._exit(0)
                    except BlockingIOError:
                        time.sleep(0.15)
                os._exit(1)
            assert os.waitpid(child, 0)[1] == 0, "the autogroup's nice could not be written"
            return open("/proc/self/autogroup").read().split()[-1]
        assert renice_own_autogroup(new_session=True) == "0"
        assert renice_own_autogroup(new_session=False) == "19"  # what a job could do before
        print("HELD")
    """))


def test_thread_placement_set_on_the_host_does_not_reach_the_jail(monkeypatch):
    """The seccomp filter lets a thread be pinned only as 0 (the caller), and libgomp pins by
    thread id: with OMP_PROC_BIND set it aborted every CPU job. Other OpenMP settings pass."""
    monkeypatch.setenv("OMP_PROC_BIND", "true")
    monkeypatch.setenv("GOMP_CPU_AFFINITY", "0-3")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    env = jail.environment({})
    assert "OMP_PROC_BIND" not in env and "GOMP_CPU_AFFINITY" not in env and env["OMP_NUM_THREADS"] == "2"


# -- through the real pool: raw code with no static check, the attacker with the interpreter --

FAST = {"compile": False, "window_ms": [1e-6, 1e6]}
PLANT = make_task("return torch.sigmoid(x).cumsum(-1)", header=f"""\
import os, sys
targets = ["/tmp", "/dev/shm", *[p for p in sys.path if os.path.isabs(p)]]  # the others: path hooks
planted = []
for folder in targets:
    try:
        os.makedirs(folder + "/opsynth_plant", exist_ok=True)
        open(folder + "/opsynth_plant/__init__.py", "w").write("raise SystemExit('planted')")
        os.chmod(folder + "/opsynth_plant", 0o555)
        planted.append(folder)
    except OSError:
        pass
assert not ({landlock.abi_version()[0] > 0} and planted), planted
if not os.path.exists("opsynth_plant"):  # in its own folder, where it may: a 0555 package, a 0000 file, a fifo
    os.makedirs("opsynth_plant/deeper")
    open("opsynth_plant/__init__.py", "w").write("raise SystemExit('planted')")
    open("closed", "w").write("x")
    os.chmod("closed", 0)
    os.mkfifo("fifo")
    os.chmod("opsynth_plant", 0o555)
""")
# What else lies in /tmp leads to a host folder bound in (a checkout under /tmp): read-only.
CENSUS = make_task("return torch.sigmoid(x).cumsum(-1)", header="""\
import importlib.util, os, sys
assert importlib.util.find_spec("opsynth_plant") is None, "a plant is importable"
left = set(os.listdir("/tmp")) - {"zygote", os.path.basename(os.getcwd())}
assert not [name for name in left if os.access("/tmp/" + name, os.W_OK)], os.listdir("/tmp")
assert not os.listdir("/dev/shm"), os.listdir("/dev/shm")
assert not [p for p in sys.path if os.access(p or ".", os.W_OK)], sys.path
""")


def test_a_plant_never_reaches_a_later_job_on_any_worker(pool):
    """A job tries a package in /tmp, /dev/shm and every folder of its search path (Landlock
    and the read-only layout refuse it) and leaves one, 0555, in its own folder with a 0000
    file and a fifo: the next job on every worker finds none of it, nothing importable, and
    no writable folder on its search path. Each worker says whether Landlock holds."""
    planted = pool.run_many([{"code": PLANT, "config": FAST}] * len(pool.workers))  # one on each worker
    assert all(result["passed"] for result in planted), planted
    checked = pool.run_many([{"code": CENSUS, "config": FAST}] * len(pool.workers))
    assert all(result["passed"] for result in checked), checked
    for worker in pool.workers:
        assert worker.info["jail"].endswith(landlock.status()), worker.info
