"""Usage errors: one clear line naming the problem, exit code 2, no traceback."""
import pytest
import torch

from pipeline.cli import main


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


def test_unknown_library_for_crawl(capsys, tmp_path):
    code, err = run_cli(capsys, "crawl", "--library", "no_such_lib_xyz", "--out", str(tmp_path / "c.parquet"))
    assert code == 2 and "neither a registered op source" in err
