import itertools
import os
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from filters.similarity.decontaminate import SimilarityIndex, dedupe
from filters.similarity.reference import ReferenceSetError, graph_key, load_reference
from filters.similarity.score import encode, fingerprint, score
from pipeline.composers.template import TemplateComposer
from pipeline.cli import main
from tests.conftest import make_task
from tests.disguise import KINDS, REWRITES, disguise

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"


@pytest.fixture(scope="module")
def generated(torch_catalog):
    composer = TemplateComposer(torch_catalog[0])
    return [fingerprint(composer.compose(i, 3).code, f"gen{i}") for i in range(300)]


def test_screening_never_misses_a_pair_the_exact_score_flags(generated):
    reference = load_reference(str(REFERENCE)).fingerprints
    sample = generated + [fingerprint(disguise(code), f"copy{i}") for i, code in enumerate(
        p.read_text() for p in sorted(REFERENCE.rglob("*.py")))]
    index = SimilarityIndex(list(reference) + generated[:150])
    everything = list(reference) + generated[:150]
    for threshold in (0.5, 0.8, 0.9):
        exact = {(a.name, b.name) for a, b in itertools.product(sample, everything) if score(a, b) > threshold}
        screened = {(a.name, b.name) for a in sample for b in index.survivors(a, threshold) if score(a, b) > threshold}
        assert exact == screened and exact


def test_match_reports_the_nearest_reference_task():
    index = SimilarityIndex(load_reference(str(REFERENCE)).fingerprints)
    copy = fingerprint(disguise((REFERENCE / "level1" / "2_row_cumsum.py").read_text()))
    match = index.match(copy, 0.9)
    assert match.nearest == "level1/2_row_cumsum.py" and match.similarity > 0.9
    unrelated = index.match(fingerprint("import torch\nclass Model:\n    def forward(self, x):\n        return x.sort()\n"), 0.9)
    assert unrelated.similarity < 0.5


def test_dedupe_keeps_the_first_and_names_what_each_removal_duplicated():
    codes = [p.read_text() for p in sorted(REFERENCE.rglob("*.py"))]
    fps = [fingerprint(code, f"t{i}") for i, code in enumerate(codes)]
    fps.append(fingerprint(codes[0], "exact-copy"))
    fps.append(fingerprint(disguise(codes[1]), "near-copy"))
    results = {r.name: r for r in dedupe(fps, 0.95)}
    assert results["t0"].kept and results["t1"].kept
    assert (results["exact-copy"].duplicate_of, results["exact-copy"].similarity) == ("t0", 1.0)
    assert not results["near-copy"].kept and results["near-copy"].duplicate_of == "t1"


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "missing", "no such file or folder"),
    (lambda tmp: tmp, "holds no tasks"),
])
def test_a_wrong_or_empty_reference_is_a_clear_error(tmp_path, make, message):
    with pytest.raises(ReferenceSetError, match=message):
        load_reference(str(make(tmp_path)))


def test_kernelbench_layout_levels_and_parquet_references(tmp_path):
    checkout = tmp_path / "KernelBench-checkout"
    (checkout / "KernelBench").mkdir(parents=True)
    for level in ("level1", "level2"):
        (checkout / "KernelBench" / level).symlink_to(REFERENCE / level)
    assert {fp.name.split("/")[0] for fp in load_reference(str(checkout), (2,)).fingerprints} == {"level2"}
    import pyarrow as pa
    pq.write_table(pa.table({"name": ["a"], "code": [(REFERENCE / "level1" / "1_scaled_tanh.py").read_text()]}),
                   tmp_path / "ref.parquet")
    assert [fp.name for fp in load_reference(str(tmp_path / "ref.parquet")).fingerprints] == ["a"]
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(ReferenceSetError, match="no `code` column"):
        load_reference(str(tmp_path / "bad.parquet"))


def git(folder, *args):
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def test_a_reference_is_named_by_what_it_is_never_by_a_local_path(tmp_path):
    """Its own checkout: the origin's OWNER/NAME and its commit. A copy inside another
    repository: KernelBench by its layout and its content, not that repository's commit."""
    outer = tmp_path / "some-project"
    (outer / "vendor").mkdir(parents=True)
    shutil.copytree(REFERENCE / "level1", outer / "vendor" / "KernelBench" / "KernelBench" / "level1")
    git(outer, "init", "-q")
    git(outer, "add", ".")
    git(outer, "commit", "-qm", "outer")
    copy = load_reference(str(outer / "vendor" / "KernelBench"), (1,))
    assert copy.name == "KernelBench" and copy.revision.startswith("content-")
    own = tmp_path / "kb"
    shutil.copytree(REFERENCE / "level1", own / "KernelBench" / "level1")
    git(own, "init", "-q")
    git(own, "remote", "add", "origin", "https://github.com/ScalingIntelligence/KernelBench.git")
    git(own, "add", ".")
    git(own, "commit", "-qm", "kb")
    checkout = load_reference(str(own), (1,))
    head = subprocess.run(["git", "-C", str(own), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert checkout.name == "ScalingIntelligence/KernelBench" and checkout.revision == head
    assert str(tmp_path) not in checkout.name + checkout.revision + copy.name + copy.revision
    # a clone of a local copy: its origin is a folder of this machine, which names nothing
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", f"file://{own}", str(clone)], check=True, capture_output=True)
    cloned = load_reference(str(clone), (1,))
    assert cloned.name == "KernelBench" and cloned.revision == head


def test_dedupe_command_flags_disguised_copies_and_not_unrelated_tasks(tmp_path, capsys):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "copy.py").write_text(disguise((REFERENCE / "level2" / "4_Conv2d_ReLU_AvgPool.py").read_text()))
    (tasks / "other.py").write_text(make_task("return torch.cumprod(x.sort(dim=1).values, 1)"))
    assert main(["dedupe", str(tasks), "--against", str(REFERENCE), "--out", str(tmp_path / "d.parquet")]) == 0
    rows = {r["source"]: r for r in pq.read_table(tmp_path / "d.parquet").to_pylist()}
    assert not rows["copy.py"]["kept"] and rows["copy.py"]["nearest"] == "level2/4_Conv2d_ReLU_AvgPool.py"
    assert rows["other.py"]["traced"] and rows["other.py"]["kept"] and rows["other.py"]["max_similarity"] < 0.5
    assert main(["dedupe", str(tasks), "--against", str(tmp_path / "nope"), "--out", str(tmp_path / "e.parquet")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


# -- seeing through disguise: what a task computes, traced in the sandbox ---------------------

SEQUENTIAL = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_channels, out_channels, kernel_size), nn.ReLU(), nn.AvgPool2d(2))

    def forward(self, x):
        return self.body(x)


def get_inputs():
    return [torch.rand(8, 3, 32, 32)]


def get_init_inputs():
    return [3, 16, 3]
'''
FUNCTIONAL_WITH_SIZES_IN_INIT = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(sizes[1], sizes[0]))
        self.bias = nn.Parameter(torch.zeros(sizes[1]))
        self.norm = nn.LayerNorm(sizes[1])

    def forward(self, x):
        return self.norm(F.gelu(F.linear(x, self.weight, self.bias)))


def get_inputs():
    return [torch.rand(64, 256)]


def get_init_inputs():
    return [(256, 512)]
'''
SHARES_ONE_OP = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(256, 256)

    def forward(self, x):
        return torch.cumsum(torch.sigmoid(self.proj(x)), dim=-1)


def get_inputs():
    return [torch.rand(64, 256)]


def get_init_inputs():
    return []
'''
DATA_DEPENDENT = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return torch.tanh(x) * 2.0
        return x


def get_inputs():
    return [torch.rand(64, 256)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def traced_reference(pool, tmp_path_factory):
    from filters.similarity.reference import traced
    cache = tmp_path_factory.mktemp("op-graphs")
    return SimilarityIndex(traced(load_reference(str(REFERENCE)), pool, cache).fingerprints), cache


def traced_fingerprint(code, name, pool, cache):
    from filters.similarity.reference import trace_all
    [graph] = trace_all([code], pool, cache)
    return fingerprint(code, name, graph)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_disguise_of_a_reference_task_is_caught(kind, traced_reference, pool):
    index, cache = traced_reference
    for path in sorted((REFERENCE / "level2").glob("*.py")):
        copy = traced_fingerprint(KINDS[kind](path.read_text()), f"{kind} of {path.name}", pool, cache)
        match = index.match(copy, 0.9)
        assert match.similarity > 0.9, (kind, path.name, match)


def _outputs(code):
    from filters.checks.measure.execution import build_model, forward, load_task, make_inputs
    import torch
    task = load_task(code)  # a fixture of ours or its rewrite: trusted, run here
    model = build_model(task, 0, torch.device("cpu"))
    torch.manual_seed(1)
    return forward(model, make_inputs(task, torch.device("cpu")))


@pytest.mark.parametrize("kind", sorted(REWRITES))
def test_every_rewrite_of_a_reference_task_is_caught(kind, traced_reference, pool):
    """The same function in other ops (activations written out), under a condition on the
    data the meta device cannot decide, or computed in two halves: each rewrite computes
    what its original computes (checked here), and each is caught."""
    from filters.grammar import static_check
    index, cache = traced_reference
    for path in sorted((REFERENCE / "level2").glob("*.py")):
        original, copy = path.read_text(), REWRITES[kind](path.read_text())
        # a branch on the data is refused by the static check too; decontamination catches it alone
        verdict = static_check(copy)
        assert verdict is None or kind in ("guarded", "rewritten") and verdict[0] == "impure_forward", verdict
        a, b = _outputs(original), _outputs(copy)
        assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b)), (kind, path.name)
        match = index.match(traced_fingerprint(copy, f"{kind} of {path.name}", pool, cache), 0.9)
        assert match.similarity > 0.9, (kind, path.name, match)


@pytest.mark.parametrize("name, code, original", [
    ("nn.Sequential instead of explicit calls", SEQUENTIAL, "level2/4_Conv2d_ReLU_AvgPool.py"),
    ("functional form, sizes passed through get_init_inputs", FUNCTIONAL_WITH_SIZES_IN_INIT,
     "level2/1_Linear_GELU_LayerNorm.py"),
])
def test_the_same_computation_written_another_way_is_caught(name, code, original, traced_reference, pool):
    index, cache = traced_reference
    match = index.match(traced_fingerprint(code, name, pool, cache), 0.9)
    assert match.similarity == 1.0 and match.nearest in (original, "level2/5_Linear_GELU_LayerNorm_wide.py"), match


def test_sharing_an_op_is_not_contamination_and_data_dependent_code_is_traced_on_real_tensors(traced_reference,
                                                                                              pool):
    index, cache = traced_reference
    shares = traced_fingerprint(SHARES_ONE_OP, "shares", pool, cache)
    assert shares.graph and index.match(shares, 0.9).similarity < 0.9
    branching = traced_fingerprint(DATA_DEPENDENT, "data-dependent", pool, cache)
    # `if x.sum() > 0` has no value on the meta device: traced again on the CPU, the branch
    # it took (tanh, a multiplication) is recorded, and the condition's sum is not
    assert branching.graph == encode(["tanh", "mul"])
    assert index.match(branching, 0.9).similarity < 0.9


SIZE_DEPENDENT = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = torch.logsumexp(self.linear(x), dim=1, keepdim=True)
        x = F.leaky_relu(F.leaky_relu(x, 0.01), 0.01)
        return F.gelu(x)


batch_size = 64
in_features = 128
out_features = 1024


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
'''


def test_a_reference_task_read_partially_at_the_small_problem_is_read_where_its_copy_is(pool, tmp_path):
    """At the small problem (a width of 16) the log-sum-exp is at times negative, and the
    two leaky relus in a row are one: it leaves one unspelled, and a copy (untrusted) is read
    at its own width of 1,024, where the activations after a positive log-sum-exp are
    identities. The reference task is read there too, so the copy and its original read alike."""
    from filters.similarity.reference import readings, trace_all, traced
    from tests.disguise import EQUIVALENTS
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "lse.py").write_text(SIZE_DEPENDENT)
    [small] = readings([SIZE_DEPENDENT], pool, tmp_path / "cache")
    assert small["partial"] and small["op_graph"].split()[-1] == "gelu", small
    [copy_graph] = trace_all([EQUIVALENTS["leaky_relu"](SIZE_DEPENDENT)], pool, tmp_path / "cache", as_candidates=True)
    copy = fingerprint(EQUIVALENTS["leaky_relu"](SIZE_DEPENDENT), "copy", copy_graph)
    assert score(copy, fingerprint(SIZE_DEPENDENT, "small", small["op_graph"])) < 0.9  # what a partial reading missed
    reference = traced(load_reference(str(tmp_path / "tasks")), pool, tmp_path / "cache")
    assert reference.fingerprints[0].graph == copy.graph and SimilarityIndex(reference.fingerprints).match(
        copy, 0.9).similarity > 0.9


def test_a_reading_is_cached_apart_for_each_way_and_device_it_was_read():
    """A copy read at its own sizes on a GPU must not be served a CPU reading (its values,
    and so its reading, can differ), nor a candidate's reading a reference task's."""
    code = "class Model: pass\n"
    keys = {graph_key(code), graph_key(code, as_candidate=True), graph_key(code, as_candidate=True, device="cuda"),
            graph_key(code, in_full=True), graph_key(code, in_full=True, device="cuda")}
    assert len(keys) == 5
    assert graph_key(code, as_candidate=True, device="cuda") == graph_key(code, as_candidate=True, device="cuda")
