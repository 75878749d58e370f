"""`opsynth report`: a dataset folder beside a reference, and the card's section of the same."""
import json
import re
import textwrap
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from huggingface_hub import HfApi

from filters.similarity.reference import load_reference
from operators.records import Candidate, Verdict
from outputs.dataset import write_dataset
from outputs.report import text_ops
from pipeline.cli import main
from tests.hub_standin import HubStandIn
from tests.outputs.test_dataset import RUN_INFO

# (ops, size constants, forward body): what a composer would have fused, and the task's shapes.
SAMPLES = [
    (("torch.nn.Linear", "torch.nn.ReLU"), {"batch_size": 128, "features": 512}, "return torch.relu(x)"),
    (("torch.nn.Linear", "torch.nn.functional.gelu"), {"batch_size": 100, "features": 256}, "return x * 2"),
    (("torch.cumsum",), {"batch_size": 64, "features": 30}, "return torch.cumsum(x, 1)"),
    (("torch.nn.Linear", "torch.nn.ReLU", "torch.tanh"), {"batch_size": 32, "features": 64}, "return x.tanh()"),
]

REFERENCE = {
    # a Linear built in __init__, relu and a product in forward; the Parameter's randn and the view are not ops
    "1_Linear_ReLU_Scale.py": ("""\
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(features, features)
            self.scale = nn.Parameter(torch.randn(features) * 0.02)

        def forward(self, x):
            x = torch.relu(self.fc(x)).view(batch_size, -1)
            return x * self.scale""", {"batch_size": 128, "features": 1024}),
    "2_Matmul_Transpose.py": ("""\
        def forward(self, x):
            return torch.matmul(x, x.transpose(0, 1))""", {"batch_size": 256, "features": 256}),
    "3_GELU.py": ("""\
        def forward(self, x):
            return F.gelu(x)""", {"batch_size": 16, "features": 24}),
}


def task(body: str, sizes: dict) -> str:
    constants = "\n".join(f"{name} = {value}" for name, value in sizes.items())
    if not body.lstrip().startswith("def "):
        body = f"def forward(self, x):\n    {body}"
    return (f"import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n{constants}\n\n\n"
            f"class Model(nn.Module):\n{textwrap.indent(textwrap.dedent(body), '    ')}\n\n\n"
            "def get_inputs():\n    return [torch.rand(batch_size, features)]\n\n\n"
            "def get_init_inputs():\n    return []\n")


def accepted(index: int, ops, sizes: dict, forward: str, eager_ms: float) -> tuple:
    candidate = Candidate(f"id{index}", ops, f"torch#{len(ops)}", task(forward, sizes), "template", 3, {"index": index})
    metrics = {"eager_ms": eager_ms, "compile_ms": 900.0, "output_max_abs": 10.0 ** index}
    return candidate, Verdict(candidate.id, "accepted", True, "", "", metrics)


def dataset_folder(folder, eager_ms=(2.0, 3.0, 4.0, 5.0), reference=None):
    records = [accepted(i, *sample, eager_ms[i]) for i, sample in enumerate(SAMPLES)]
    write_dataset(folder, records, RUN_INFO, reference)
    return folder


def reference_checkout(folder):
    for name, (body, sizes) in REFERENCE.items():
        path = folder / "level2" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(task(body, sizes))
    return folder


def report(capsys, *args) -> tuple[int, str]:
    code = main(["report", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def rows(comparison: dict, section: str) -> dict:
    return {row["key"]: (row["dataset"], row["reference"]) for row in comparison[section]}


def test_a_reference_task_counts_the_ops_of_its_text():
    body, sizes = REFERENCE["1_Linear_ReLU_Scale.py"]
    assert sorted(text_ops(task(body, sizes))) == ["operator.mul", "torch.nn.Linear", "torch.relu"]
    body, sizes = REFERENCE["2_Matmul_Transpose.py"]
    assert sorted(text_ops(task(body, sizes))) == ["torch.Tensor.transpose", "torch.matmul"]


def test_one_op_spelt_as_a_layer_a_function_or_a_method_is_one_key():
    from outputs.report import op_key
    assert {op_key(name) for name in ("torch.nn.GroupNorm", "torch.nn.functional.group_norm")} == {"groupnorm"}
    assert {op_key(name) for name in ("torch.nn.ReLU", "torch.nn.functional.relu", "torch.relu", "torch.Tensor.relu_")} \
        == {"relu"}
    assert {op_key(name) for name in ("torch.nn.ConvTranspose2d", "torch.nn.functional.conv_transpose2d")} \
        == {"convtranspose2d"}
    assert op_key("kornia.filters.GaussianBlur2d") == "GaussianBlur2d"


def test_the_report_sets_the_dataset_beside_a_checkout(tmp_path, capsys):
    data, ref = dataset_folder(tmp_path / "data"), reference_checkout(tmp_path / "ref")
    code, out = report(capsys, data, "--against", ref, "--out", tmp_path / "report")
    assert code == 0 and out.strip() == str(tmp_path / "report" / "report.md")
    comparison = json.loads((tmp_path / "report" / "report.json").read_text())
    mix = rows(comparison, "op_count_mix")
    assert (mix["1"], mix["2"], mix["3"], mix["6+"]) == ((0.25, 0.3333), (0.5, 0.3333), (0.25, 0.3333), (0, 0))
    top = comparison["top_ops"]
    assert (top[0]["key"], top[0]["dataset"], top[0]["reference"]) == ("linear", 0.75, 0.3333)
    assert rows(comparison, "top_ops")["gelu"] == (0.25, 0.3333)  # F.gelu on both sides, however named
    families = rows(comparison, "op_families")
    assert families["torch.nn"] == (0.625, 0.1667) and families["arithmetic"] == (0, 0.1667)
    sizes = comparison["sizes"]
    # dataset sizes 128 512 100 256 64 30 32 64; reference 128 1024 256 256 16 24
    assert (sizes["dataset"]["multiple_of_8"], sizes["dataset"]["power_of_two"]) == (0.75, 0.75)
    assert (sizes["reference"]["multiple_of_8"], sizes["reference"]["power_of_two"]) == (1.0, 0.8333)
    assert sizes["dataset"]["tasks_all_multiple_of_8"] == 0.5
    assert comparison["eager_ms"]["dataset"]["p50"] == 3.5 and comparison["eager_ms"]["reference"] is None
    assert comparison["output_max_abs"]["dataset"]["tasks"] == 4
    assert comparison["similarity"]["tasks"] == 4 and sum(comparison["similarity"]["histogram"]["counts"]) == 4

    page = (tmp_path / "report" / "report.md").read_text()
    assert "| 2 | 50.0% | 33.3% |" in page and "| `linear` | 75.0% | 33.3% |" in page
    assert "| p50 ms | 3.5 | not measured |" in page
    linked = re.findall(r"!\[(\w+)\]\((plots/[\w.]+)\)", page)
    assert {name for name, _ in linked} == {"op_count_mix", "top_ops", "op_families", "sizes", "eager_ms",
                                            "output_max_abs", "similarity"}
    for _, path in linked:
        assert (tmp_path / "report" / path).stat().st_size > 1000
    assert sorted(p.name for p in (tmp_path / "report" / "plots").iterdir()) == sorted(p.split("/")[1] for _, p in linked)


def test_against_another_dataset_folder_both_sides_have_eager_time(tmp_path, capsys):
    mine = dataset_folder(tmp_path / "mine")
    theirs = dataset_folder(tmp_path / "theirs", eager_ms=(10.0, 20.0, 30.0, 40.0))
    code, out = report(capsys, mine, "--against", theirs)
    assert code == 0, out
    page = (mine / "report" / "report.md").read_text()
    assert "| p50 ms | 3.5 | 25 |" in page and "![eager_ms](plots/eager_ms.png)" in page
    comparison = json.loads((mine / "report" / "report.json").read_text())
    assert all(row["dataset"] == row["reference"] for row in comparison["op_count_mix"])  # the same tasks
    assert comparison["similarity"]["max"] == 1.0


def point_the_hub_clients_at(endpoint: str, monkeypatch) -> None:
    """huggingface_hub and datasets read HF_ENDPOINT once, at import: their constants move instead."""
    import datasets.config
    import huggingface_hub.constants
    monkeypatch.setenv("HF_TOKEN", "hf_standin_token")
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", endpoint)
    monkeypatch.setattr(datasets.config, "HUB_DATASETS_URL", endpoint + "/datasets/{repo_id}/resolve/{revision}/{path}")


def test_against_a_hub_id_reads_the_reference_from_the_hub(tmp_path, capsys, monkeypatch):
    repo = f"org/reference-{uuid.uuid4().hex[:8]}"  # the Hub cache outlives the session: a new name each time
    table = pa.table({"name": list(REFERENCE), "code": [task(*REFERENCE[name]) for name in REFERENCE]})
    pq.write_table(table, tmp_path / "level_2.parquet")
    with HubStandIn() as hub:
        point_the_hub_clients_at(hub.endpoint, monkeypatch)
        api = HfApi(endpoint=hub.endpoint, token="hf_standin_token")
        api.create_repo(repo, repo_type="dataset")
        api.upload_file(path_or_fileobj=str(tmp_path / "level_2.parquet"), path_in_repo="data/level_2-00000.parquet",
                        repo_id=repo, repo_type="dataset")
        code, out = report(capsys, dataset_folder(tmp_path / "data"), "--against", repo, "--levels", "2")
    assert code == 0, out
    comparison = json.loads((tmp_path / "data" / "report" / "report.json").read_text())
    assert comparison["reference"]["name"] == repo and comparison["reference"]["tasks"] == 3
    assert rows(comparison, "top_ops")["linear"] == (0.75, 0.3333)


def test_a_folder_that_is_no_dataset_is_one_clear_line(tmp_path, capsys):
    reference_checkout(tmp_path / "ref")
    code, out = report(capsys, tmp_path / "ref", "--against", tmp_path / "ref")
    assert code == 2 and "is not a dataset folder" in out and "Traceback" not in out
    code, out = report(capsys, dataset_folder(tmp_path / "data"), "--against", tmp_path / "nowhere")
    assert code == 2 and "no such file or folder" in out and "Traceback" not in out
    code, out = report(capsys, tmp_path / "data", "--against", tmp_path / "ref", "--levels", "two")
    assert code == 2 and "--levels must be comma-separated numbers" in out and "Traceback" not in out


def test_the_card_of_a_run_with_a_reference_has_the_comparison(tmp_path):
    reference = load_reference(str(reference_checkout(tmp_path / "ref")))
    folder = dataset_folder(tmp_path / "run", reference=reference)
    card = (folder / "README.md").read_text()
    assert f"## Beside {reference.name}" in card and "### Op-count mix" in card
    assert "| `linear` | 75.0% | 33.3% |" in card
    for path in re.findall(r"\((plots/vs_reference_[\w.]+)\)", card):
        assert (folder / path).is_file()
    assert len(re.findall(r"plots/vs_reference_", card)) == 6  # no similarity plot: the card has the run's own
    stats = json.loads((folder / "stats.json").read_text())
    assert stats["reference_comparison"]["dataset"]["tasks"] == 4

    plain = dataset_folder(tmp_path / "plain")
    assert "## Beside" not in (plain / "README.md").read_text()
    assert not list((plain / "plots").glob("vs_reference_*"))
