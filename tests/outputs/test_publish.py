"""Publishing: local git destinations end to end; the Hub path against a stand-in of the
Hub HTTP API on 127.0.0.1 (HF_ENDPOINT points at it)."""
import subprocess

import datasets
import pytest

from operators.records import Candidate, Verdict
from outputs.dataset import write_dataset
from outputs.hub import is_transient, retry_delay, version_key
from pipeline.cli import main
from tests.hub_standin import HubStandIn
from tests.outputs.test_dataset import RUN_INFO


def finished_run(folder, ids, decontaminated=True, ops=("torch.nn.Linear", "torch.nn.ReLU")):
    records = []
    for index, sample_id in enumerate(ids):
        candidate = Candidate(sample_id, ops, f"torch#{len(ops)}", f"# {sample_id}\n", "template", 0, {"index": index})
        records.append((candidate, Verdict(sample_id, "accepted", True, metrics={"eager_ms": 3.0})))
    info = {**RUN_INFO, "decontaminated": decontaminated, "reference": "ref" if decontaminated else None,
            "reference_revision": "abc" if decontaminated else None}
    write_dataset(folder, records, info)
    (folder / "workers.log").write_text("not published")
    return folder


def publish(capsys, *argv):
    code = main(["publish", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_local_versions_load_back_carry_tags_and_are_never_overwritten(tmp_path, capsys):
    v1 = finished_run(tmp_path / "run1", ["a", "b", "c"])
    dest = tmp_path / "dataset-repo"
    code, out = publish(capsys, v1, "--to", dest, "--version", "v1.0.0")
    assert code == 0 and "3 samples added" in out
    loaded = datasets.load_dataset(str(dest), split="train")
    assert sorted(loaded["id"]) == ["a", "b", "c"] and loaded.column_names[:3] == ["ops", "data_source", "code"]
    git = lambda *a: subprocess.run(["git", "-C", str(dest), *a], capture_output=True, text=True).stdout
    assert git("tag").split() == ["v1.0.0"]
    assert sorted(git("ls-tree", "-r", "--name-only", "v1.0.0").split()) == sorted(
        ["README.md", "stats.json", "data/train-00000-of-00001.parquet", "rejects/rejects-00000-of-00001.parquet",
         "plots/eager_ms.png", "plots/funnel.png", "plots/library_mix.png", "plots/op_count_mix.png",
         "plots/op_frequency.png"])
    head = git("rev-parse", "HEAD")

    code, out = publish(capsys, v1, "--to", dest, "--version", "v1.0.0")
    assert code == 2 and "already exists" in out and git("rev-parse", "HEAD") == head

    v2 = finished_run(tmp_path / "run2", ["b", "c", "d", "e"], ops=("torch.cumsum",))
    code, out = publish(capsys, v2, "--to", dest, "--version", "v1.1.0", "--dry-run")
    assert code == 0 and "2 samples added, 1 removed (+1) against v1.0.0" in out
    assert "op-count mix: 1: +4, 2: -3" in out and "+ d" in out and "- a" in out
    assert git("tag").split() == ["v1.0.0"] and git("rev-parse", "HEAD") == head

    assert publish(capsys, v2, "--to", dest, "--version", "v1.1.0")[0] == 0
    assert sorted(datasets.load_dataset(str(dest), split="train")["id"]) == ["b", "c", "d", "e"]
    assert git("log", "--format=%s").splitlines() == ["opsynth dataset v1.1.0", "opsynth dataset v1.0.0"]
    # opsynth's identity is on its own commits only, not written into the repository's configuration
    assert git("log", "-1", "--format=%an <%ae>") == "opsynth <opsynth@localhost>\n"
    assert git("config", "--local", "--get-regexp", "^user\\.") == ""

    code, out = publish(capsys, v2, "--to", dest, "--version", "v1.2.0")  # the same data again
    assert code == 2 and "nothing changed since v1.1.0" in out
    assert git("tag").split() == ["v1.0.0", "v1.1.0"] and len(git("log", "--format=%s").splitlines()) == 2


def test_an_undecontaminated_run_is_refused_unless_allowed(tmp_path, capsys):
    raw = finished_run(tmp_path / "raw", ["a"], decontaminated=False)
    code, out = publish(capsys, raw, "--to", tmp_path / "dest", "--version", "v1")
    assert code == 2 and "not decontaminated" in out and not (tmp_path / "dest").exists()
    assert publish(capsys, raw, "--to", tmp_path / "dest", "--version", "v1", "--allow-undecontaminated")[0] == 0


@pytest.mark.parametrize("argv, message", [
    (["--version", "bad version"], "not a valid tag name"),
    (["--version", "v1", "--to-missing"], None),
])
def test_bad_arguments_are_clear_errors(tmp_path, capsys, argv, message):
    run = finished_run(tmp_path / "run", ["a"])
    if message is None:
        with pytest.raises(SystemExit):
            main(["publish", str(run), *argv])
        return
    code, out = publish(capsys, run, "--to", tmp_path / "dest", *argv)
    assert code == 2 and message in out


def test_a_folder_that_is_not_a_finished_run_is_refused(tmp_path, capsys):
    code, out = publish(capsys, tmp_path, "--to", tmp_path / "dest", "--version", "v1")
    assert code == 2 and "not a finished opsynth output folder" in out


def test_a_dirty_or_foreign_destination_is_refused(tmp_path, capsys):
    run = finished_run(tmp_path / "run", ["a"])
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    code, out = publish(capsys, run, "--to", foreign, "--version", "v1")
    assert code == 2 and "not a git repository" in out and (foreign / "notes.txt").read_text() == "mine"


def test_hub_publish_creates_commits_and_tags_through_the_http_api(tmp_path, capsys, monkeypatch):
    with HubStandIn() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_TOKEN", "hf_standin_token")
        v1 = finished_run(tmp_path / "run1", ["a", "b"])
        hub.fail_next("commit", 503)  # a transient error: retried, not fatal
        code, out = publish(capsys, v1, "--to", "hf://datasets/org/kernels", "--version", "v1.0.0", "--private")
        assert code == 0, out
        repo = hub.repos["org/kernels"]
        assert repo.private and list(repo.tags) == ["v1.0.0"]
        oid, message, files = repo.commits[-1]
        assert repo.tags["v1.0.0"] == oid and message == "opsynth dataset v1.0.0"
        assert "data/train-00000-of-00001.parquet" in files and "workers.log" not in files
        posts = [path for method, path in hub.requests if method == "POST"]
        assert posts.count("/api/datasets/org/kernels/commit/main") == 2  # the injected 503, then the commit
        assert "/api/datasets/org/kernels/tag/" + oid in posts

        code, out = publish(capsys, v1, "--to", "hf://datasets/org/kernels", "--version", "v1.0.0")
        assert code == 2 and "already exists" in out and len(repo.commits) == 1

        v2 = finished_run(tmp_path / "run2", ["b", "c"])
        code, out = publish(capsys, v2, "--to", "hf://datasets/org/kernels", "--version", "v1.1.0", "--dry-run")
        assert code == 0 and "1 samples added, 1 removed (+0) against v1.0.0" in out and len(repo.commits) == 1

        hub.fail_next("tag", 403)  # not transient: one attempt, a clear error
        code, out = publish(capsys, v2, "--to", "hf://datasets/org/kernels", "--version", "v1.1.0")
        assert code == 2 and "create_tag failed" in out
        assert [p for m, p in hub.requests if m == "POST" and "/tag/" in p][-1:] and list(repo.tags) == ["v1.0.0"]


def test_retry_decisions_are_a_pure_function():
    import sys

    from huggingface_hub.errors import HfHubHTTPError

    # whichever httpx package this huggingface_hub is built on
    httpx = sys.modules[HfHubHTTPError.__mro__[1].__module__.split(".")[0]]

    def error(status, headers=None):
        response = httpx.Response(status, headers=headers or {}, request=httpx.Request("POST", "http://x"))
        return HfHubHTTPError("boom", response=response)

    assert [is_transient(error(s)) for s in (429, 500, 503, 400, 401, 404, 409)] == [True] * 3 + [False] * 4
    assert is_transient(httpx.ConnectError("down")) and is_transient(TimeoutError())
    assert not is_transient(ValueError("bug"))
    assert retry_delay(error(429, {"Retry-After": "7"}), 0, 1.0) == 7.0
    assert retry_delay(error(503), 3, 1.0) == 8.0
    assert sorted(["v1.10.0", "v1.2.0", "draft"], key=version_key)[-1] == "v1.10.0"


def test_a_dry_run_to_an_unreachable_hub_still_shows_what_would_be_published(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    run = finished_run(tmp_path / "run", ["a", "b"])
    code, output = publish(capsys, run, "--to", "hf://datasets/org/tasks", "--version", "v1", "--dry-run")
    assert code == 2
    assert "What" in output and "would publish, against no version: 2 samples added" in output
