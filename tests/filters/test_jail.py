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

from filters.sandbox import jail

ATTACKER_PREAMBLE = """\
import ctypes, os, sys
from filters.sandbox.jail import drop_privileges
drop_privileges()
libc = ctypes.CDLL(None, use_errno=True)
def refused(result):
    assert result == -1, result
    return ctypes.get_errno()
"""


def run_jailed(script: str, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    seccomp = jail.seccomp_pipe()
    command = jail.command([sys.executable, "-c", ATTACKER_PREAMBLE + textwrap.dedent(script)], gpu=False,
                           env=jail.environment(extra_env or {}), seccomp_fd=seccomp)
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
