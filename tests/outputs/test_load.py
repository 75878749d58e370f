"""The dataset's user is safe: a row's code runs only through `load_task`, which applies the
sandbox's static policy first, and the card tells the user to load rows that way."""
import re

import pytest
import torch

from operators.records import Candidate, Verdict
from outputs.dataset import write_dataset
from outputs.load import UnsafeTask, load_task
from tests.conftest import make_task
from tests.outputs.test_dataset import RUN_INFO

BENIGN = make_task("return torch.sigmoid(x).cumsum(-1)", constants="batch_size = 4\nfeatures = 8")


def dormant(payload_header: str, trigger: str) -> str:
    """A task that computes like any other and does harm only when `trigger` holds: under
    validation it never does, on a user's machine it may."""
    return make_task(f"if {trigger}:\n    harm()\nreturn torch.sigmoid(x)", header=payload_header,
                     constants="batch_size = 4\nfeatures = 8")


def test_a_dormant_payload_is_refused_before_any_of_it_runs(tmp_path, monkeypatch):
    marker = tmp_path / "harmed"
    through_os = dormant(f"import os\n\n\ndef harm():\n    os.system('touch {marker}')\n",
                         "os.environ.get('OPSYNTH_TEST_TRIGGER')")
    through_open = dormant(f"def harm():\n    open({str(marker)!r}, 'w').close()\n",
                           "x.shape[0] == 4")
    monkeypatch.setenv("OPSYNTH_TEST_TRIGGER", "1")
    for code, reason in ((through_os, "forbidden_import"), (through_open, "forbidden_call")):
        with pytest.raises(UnsafeTask, match="refused to run this task") as refused:
            load_task({"code": code, "ops": ["torch.sigmoid"]})
        assert refused.value.reason == reason and "Do not run it" in str(refused.value)
        assert not marker.exists()
    namespace = {}  # what the card used to show: the payload runs on the user's host
    exec(through_open, namespace)
    namespace["Model"]()(*namespace["get_inputs"]())
    assert marker.exists()


def test_a_row_cannot_widen_the_policy_through_its_ops():
    """Library ops come from the user, never from the row: a row naming `os.system` as its
    op would otherwise let its code call it."""
    code = make_task("os.system('true')\nreturn x", header="import os")
    with pytest.raises(UnsafeTask, match="library_ops"):
        load_task({"code": code, "ops": ["os.system"]})


def test_an_accepted_task_loads_and_runs():
    task = load_task(BENIGN)
    output = task.Model(*task.get_init_inputs())(*task.get_inputs())
    assert output.shape == (4, 8) and torch.all(output > 0)
    assert load_task({"code": BENIGN}).Model is not task.Model  # a fresh module every time


def test_the_cards_loading_snippet_works_against_a_local_folder(tmp_path):
    candidate = Candidate("id0", ("torch.sigmoid", "torch.cumsum"), "torch#2", BENIGN, "template", 3, {})
    verdict = Verdict("id0", "accepted", True, "", "", {"eager_ms": 2.0, "compile_ms": 900.0})
    write_dataset(tmp_path, [(candidate, verdict)], RUN_INFO)
    card = (tmp_path / "README.md").read_text()
    [snippet] = re.findall(r"## Loading\n\n```python\n(.*?)```", card, re.DOTALL)
    assert "load_task(" in snippet and "exec(" not in snippet
    namespace = {}
    exec(snippet.replace('"ORG/NAME"', repr(str(tmp_path))), namespace)
    assert namespace["output"].shape == (4, 8)
