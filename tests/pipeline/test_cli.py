"""Usage errors: one clear line naming the problem, exit code 2, no traceback."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.cli import main
from tests.conftest import interruptible

SCALED_TANH = Path(__file__).parents[1] / "fixtures" / "reference" / "level1" / "1_scaled_tanh.py"


def task_folder(tmp_path, files: dict[str, str]) -> Path:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, code in files.items():
        (tasks / name).write_text(code)
    return tasks


def run_cli(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    return code, capsys.readouterr().err


def test_unknown_flag(capsys):
    code, err = run_cli(capsys, "run", "--num-sampels", "3")
    assert code == 2 and "unrecognized arguments: --num-sampels" in err


def test_bad_flag_value(capsys):
    code, err = run_cli(capsys, "run", "--num-samples", "many")
    assert code == 2 and "invalid int value" in err


def test_bad_config_key(capsys, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("sead: 1\n")
    code, err = run_cli(capsys, "run", "--config", str(path))
    assert code == 2 and err.startswith("opsynth: error: unknown config key(s) sead") and "Traceback" not in err


def test_unwritable_out(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, err = run_cli(capsys, "run", "--out", str(blocker / "sub"), "--cache-dir", str(tmp_path))
    assert code == 2 and "is not writable" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_missing_gpu(capsys, tmp_path):
    code, err = run_cli(capsys, "run", "--device", "cuda", "--out", str(tmp_path))
    assert code == 2 and "torch sees no CUDA device" in err


@pytest.mark.parametrize("command", ["crawl", "run"])
def test_unknown_library_is_one_line(capsys, tmp_path, command):
    out = ["--out", str(tmp_path / ("c.parquet" if command == "crawl" else "out"))]
    cache = ["--cache-dir", str(tmp_path / "cache")] if command == "run" else []
    code, err = run_cli(capsys, command, "--library", "no_such_lib_xyz", *out, *cache)
    assert code == 2 and err.startswith("opsynth: error: --library 'no_such_lib_xyz' is neither a registered op source")
    assert "Traceback" not in err and err.count("\n") == 1, err


def test_validate_reaudits_a_folder_and_records_each_source(tmp_path, capsys):
    import pyarrow.parquet as pq

    tasks = task_folder(tmp_path, {"good.py": SCALED_TANH.read_text().replace("rows = 512", "rows = 4096"),
                                   "hostile.py": "import os\nos.system('touch /tmp/pwned')\n",
                                   "broken.py": "def (:\n"})
    out = tmp_path / "audit"
    assert main(["validate", str(tasks), "--out", str(out), "--workers", "1", "--cache-dir", str(tmp_path)]) == 0
    rows = {r["source"]: r for r in pq.read_table(out / "rejects").to_pylist()}
    assert rows["hostile.py"]["reason"] == "bad_interface" and rows["broken.py"]["reason"] == "syntax_error"
    assert [r["source"] for r in pq.read_table(out / "data").to_pylist()] == ["good.py"]
    code, err = run_cli(capsys, "validate", str(tmp_path / "nothing"), "--out", str(out))
    assert code == 2 and "not a folder" in err


def test_crawl_reports_counts_per_library_and_kind_and_a_second_crawl_is_cached(capsys, tmp_path):
    args = ["crawl", "--library", "transformers:llama", "--library", "torch.special", "--cache-dir",
            str(tmp_path / "cache")]
    assert main(args + ["--out", str(tmp_path / "first.parquet")]) == 0
    report = capsys.readouterr().out
    # each line is labelled by the --library value it crawled, not the package the ops belong to
    assert re.search(r"transformers:llama: \d+ runnable \(\d+ modules, 0 functions\) from 1 model families", report)
    assert re.search(r"torch.special: \d+ runnable \(0 modules, \d+ functions\)", report)
    assert "not_layer_level" in report
    cached = list((tmp_path / "cache" / "catalogs").glob("*.parquet"))
    modified = cached[0].stat().st_mtime_ns
    assert main(args + ["--out", str(tmp_path / "second.parquet")]) == 0
    assert cached[0].stat().st_mtime_ns == modified  # served from the cache, not crawled again
    assert (tmp_path / "second.parquet").read_bytes() == (tmp_path / "first.parquet").read_bytes()
    # a cached crawl, as a user runs it, imports neither torch, transformers nor Beam (6.7 s -> 0.9 s here)
    third = [*args, "--out", str(tmp_path / "third.parquet")]
    imported = subprocess.run([sys.executable, "-c", "import sys\nfrom pipeline.cli import main\n"
                               f"assert main({third!r}) == 0\n"
                               "print(sorted({'torch', 'transformers', 'apache_beam'} & set(sys.modules)))"],
                              capture_output=True, text=True, cwd=Path(__file__).parents[2], timeout=120)
    assert imported.returncode == 0 and imported.stdout.splitlines()[-1] == "[]", imported.stderr[-2000:]
    assert (tmp_path / "third.parquet").read_bytes() == (tmp_path / "first.parquet").read_bytes()


def test_workers_that_cannot_start_end_the_run_with_one_clear_line(tmp_path, capsys, monkeypatch):
    """A host where the sandbox worker cannot start (a stand-in: its interpreter exits at
    once) stops the run with exit 3 and says where to look, instead of a Beam traceback."""
    tasks = task_folder(tmp_path, {"good.py": SCALED_TANH.read_text()})
    monkeypatch.setattr("filters.sandbox.pool.sys.executable", "/bin/false")
    out = tmp_path / "audit"
    code, err = run_cli(capsys, "validate", str(tasks), "--out", str(out), "--workers", "1",
                        "--cache-dir", str(tmp_path))
    assert code == 3
    assert err.strip().splitlines()[-1] == (
        f"opsynth: error: a sandbox worker did not start (it exited before it was ready); see {out}/workers.log. "
        "Finished work is kept; fix that and run the same command again.")


def test_a_full_output_disk_ends_the_run_with_one_clear_line_and_keeps_the_verdicts(tmp_path):
    """A real full disk: --out on a 12 KiB tmpfs, mounted in a mount namespace of the test's
    own. Beam re-raises the write's OSError as a RuntimeError; the cause is still found."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    tasks, tiny = task_folder(tmp_path, {"good.py": SCALED_TANH.read_text()}), tmp_path / "tiny"
    tiny.mkdir()
    script = (f"mount -t tmpfs -o size=12k tmpfs {tiny} && echo MOUNTED && exec {sys.executable} -m pipeline.cli "
              f"validate {tasks} --out {tiny}/out --workers 1 --cache-dir {tmp_path}/cache")
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    if "MOUNTED" not in done.stdout:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 3, done.stderr[-2000:]
    assert re.fullmatch(r"opsynth: error: no space left on the disk of --out or --cache-dir \(.*No space left on "
                        r"device\): free some space there\. Finished work is kept; fix that and run the same "
                        r"command again\.", done.stderr.strip().splitlines()[-1]), done.stderr[-2000:]
    assert done.stderr.count("no space left on the disk") == 1  # said once, not as a log line and again
    assert list((tmp_path / "cache" / "verdicts").rglob("*.json"))  # the same command resumes without redoing it


def test_version_names_the_installed_package(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and re.fullmatch(r"opsynth \d+\.\d+\.\d+\S*\n", capsys.readouterr().out)


def test_a_file_that_is_not_parquet_is_a_clear_error(capsys, tmp_path):
    corrupt = tmp_path / "tasks.parquet"
    corrupt.write_bytes(b"PAR1 but not really a parquet file")
    code, err = run_cli(capsys, "validate", str(corrupt), "--out", str(tmp_path / "out"))
    assert code == 2 and "is not a readable Parquet file" in err and "Traceback" not in err


def test_ctrl_c_during_a_crawl_ends_with_one_line_and_no_catalog(tmp_path):
    import signal
    crawl = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "crawl", "--library", "torch",
                              "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "c.parquet")],
                             stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    for line in crawl.stderr:  # interrupt once the crawl itself is under way
        if "crawling" in line:
            break
    crawl.send_signal(signal.SIGINT)
    err = crawl.stderr.read()
    assert crawl.wait(timeout=60) == 130
    assert "interrupted" in err and "Traceback" not in err
    assert not (tmp_path / "c.parquet").exists() and not list((tmp_path / "cache").rglob("*.parquet"))


def test_a_round_asks_for_what_the_yield_needs_within_its_bounds():
    from pipeline.run import FIRST_ROUND_PER_WORKER, ROUND_PER_WORKER, round_size

    assert round_size(10, 0, 0, 8, 1000) == 24  # 50% guessed: 10 / 0.5 * 1.2
    assert round_size(10, 30, 100, 2, 1000) == 40  # 30% seen
    assert round_size(1, 99, 100, 4, 1000) == 8  # one batch for every worker at least
    # a big run's first round is small (its first verdicts come soon), the next ones large
    assert round_size(6000, 0, 0, 8, 20000) == FIRST_ROUND_PER_WORKER * 8
    assert round_size(6000, 20, 32, 8, 20000) == ROUND_PER_WORKER * 8
    assert round_size(6000, 0, 0, 8, 100) == 32 and round_size(6000, 20, 32, 8, 100) == 100  # never past --max-candidates


def test_beams_traceback_of_an_interrupt_or_a_full_disk_is_not_shown():
    """The CLI says in one line what happened (and the fix); Beam's stage logged the same
    error with its traceback first, the rest of its errors stay."""
    import errno
    import logging

    from pipeline import cli

    def record(error, name="apache_beam.runners.common"):
        return logging.LogRecord(name, logging.ERROR, __file__, 1, str(error), None, (type(error), error, None))
    full = OSError(errno.ENOSPC, "No space left on device")
    assert not cli._drop_beam_noise(record(full))
    assert not cli._drop_beam_noise(record(KeyboardInterrupt()))
    assert cli._drop_beam_noise(record(ValueError("a real bug")))
    assert cli._drop_beam_noise(record(full, name="opsynth"))  # our own lines stay


def test_ops_narrow_a_first_crawl_to_the_ops_they_name(tmp_path):
    """`opsynth run --ops` on an empty cache crawls the named ops alone (a whole library's
    crawl takes minutes), keeps that narrow part apart from a whole library's, and runs."""
    cache = tmp_path / "cache"
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "--library", "torch", "--ops",
                           "torch.nn.Linear,torch.nn.functional.gelu", "--num-samples", "1", "--max-candidates", "1",
                           "--workers", "1", "--out", str(tmp_path / "out"), "--cache-dir", str(cache)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "crawling torch for --ops torch.nn.Linear,torch.nn.functional.gelu" in done.stderr
    assert "catalog: 2 runnable ops from torch" in done.stderr
    parts = sorted(path.name for path in (cache / "catalogs").glob("library-*.parquet"))
    assert len(parts) == 1 and parts[0].count("-") == 2  # the narrow part, never taken for the whole library's
    from operators.catalog import read_catalog
    assert sorted(spec.name for spec in read_catalog(cache / "catalogs" / parts[0])) == [
        "torch.nn.Linear", "torch.nn.functional.gelu"]
