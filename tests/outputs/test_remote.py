"""--out on a Beam file system other than the local one. GCS and S3 cannot be reached here,
so a stand-in file system (a scheme `standin://` over a temporary folder, registered with
Beam the way its own file systems are) receives the dataset."""
import pytest
from apache_beam.io.localfilesystem import LocalFileSystem

from outputs.remote import RemoteOutputError, check_writable, is_remote, local_mirror, upload
from pipeline.cli import main

ROOT = {}


class StandInFileSystem(LocalFileSystem):
    """A remote-looking scheme whose objects live under ROOT["path"] (the stand-in for gs://)."""

    @classmethod
    def scheme(cls):
        return "standin"

    def _local(self, path):
        return str(ROOT["path"] / path[len("standin://"):])

    def join(self, base, *parts):
        return "/".join([base.rstrip("/"), *parts])

    def create(self, path, *args, **kwargs):
        return super().create(self._local(path), *args, **kwargs)

    def delete(self, paths):
        return super().delete([self._local(p) for p in paths])


@pytest.fixture
def remote(tmp_path):
    ROOT["path"] = tmp_path / "bucket"
    ROOT["path"].mkdir()
    return ROOT["path"]


def test_a_finished_folder_is_copied_without_its_staging(remote, tmp_path):
    local = tmp_path / "mirror"
    (local / "data").mkdir(parents=True)
    (local / "data" / "train-00000-of-00001.parquet").write_bytes(b"PAR1")
    (local / "README.md").write_text("card")
    (local / ".staging").mkdir()
    (local / ".staging" / "round-0.jsonl").write_text("{}")
    assert is_remote("standin://runs/v1") and not is_remote("out") and not is_remote("/tmp/out")
    check_writable("standin://runs/v1")
    written = upload(local, "standin://runs/v1")
    assert written == ["standin://runs/v1/README.md", "standin://runs/v1/data/train-00000-of-00001.parquet"]
    assert (remote / "runs/v1/data/train-00000-of-00001.parquet").read_bytes() == b"PAR1"
    assert not (remote / "runs/v1/.staging").exists()
    assert local_mirror("standin://runs/v1", tmp_path) == local_mirror("standin://runs/v1", tmp_path)
    assert local_mirror("standin://runs/v1", tmp_path) != local_mirror("standin://runs/v2", tmp_path)


def test_a_scheme_without_a_file_system_is_a_clear_error_before_any_work(tmp_path, capsys):
    with pytest.raises(RemoteOutputError, match="no file system for nosuchfs://"):
        check_writable("nosuchfs://bucket/run")
    code = main(["run", "--out", "nosuchfs://bucket/run", "--cache-dir", str(tmp_path), "--library", "torch"])
    assert code == 2 and "apache-beam[gcp]" in capsys.readouterr().err
    assert not (tmp_path / "catalogs").exists()  # it stopped before crawling
