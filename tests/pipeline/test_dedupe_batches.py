"""`opsynth dedupe` traces a batch of tasks per sandboxed child (filters/sandbox/trace_batch.py):
the same op sequences as one task per child, and no task steers the trace of a later task
of its batch."""
import logging
import re
from pathlib import Path

from filters.sandbox.pool import WorkerPool
from filters.similarity.reference import trace_all
from pipeline.dedupe import readings_in_batches, trace_in_batches
from tests.conftest import make_task, sandbox_options

FIXTURES = Path(__file__).parents[1] / "fixtures" / "reference"

FORWARDS = ("return torch.relu(x) * 2.0", "return torch.tanh(x).cumsum(-1)", "return torch.softmax(x, -1) + x",
            "return torch.sigmoid(x) * x", "return (x @ x.T).relu()")


def distinct_tasks(count: int) -> list[str]:
    """`count` tasks of distinct code (the cache is keyed by code): five forwards, many sizes."""
    return [make_task(FORWARDS[i % len(FORWARDS)], constants=f"batch_size = {8 + i}\nfeatures = 32")
            for i in range(count)]


def test_batches_give_what_one_task_per_child_gives(pool, tmp_path):
    codes = distinct_tasks(40)  # two batches: one full, one of 8
    batched = trace_in_batches(codes, pool, tmp_path / "batched", batch=32)
    alone = trace_all(codes, pool, tmp_path / "alone")
    assert batched == alone
    assert all(batched) and "relu" in batched[0].split() and "tanh" in batched[1].split()
    # and from the cache, now: same answer, no job
    assert trace_in_batches(codes, pool, tmp_path / "batched", batch=32) == batched


def test_a_task_that_runs_out_of_its_time_in_a_batch_is_untraced_and_costs_the_others_nothing(pool, tmp_path,
                                                                                              caplog):
    """A task still tracing at a trace's limit (KernelBench L3 networks on 2 cores) is
    untraced, as it would be alone, and not cached; the tasks after it are batched again, not
    traced one per child as when its batch ran out of time and failed."""
    # over a second to build on 2 cores (150 products took 0.25 s on a faster CPU), well under a
    # trace's 20 s alone; allowed by the static policy (which refuses a clock)
    slow = make_task("return torch.relu(x) * 5.0",
                     init="w = torch.rand(512, 512)\nfor _ in range(800):\n    w = torch.tanh(w @ w)")
    codes = distinct_tasks(6)
    codes.insert(2, slow)
    with caplog.at_level(logging.INFO, logger="pipeline.dedupe"):
        batched = [entry["op_graph"] for entry in readings_in_batches(codes, pool, tmp_path, task_limit_s=0.5)]
    assert batched[2] is None
    assert batched[:2] + batched[3:] == trace_all(codes[:2] + codes[3:], pool, tmp_path / "alone")
    assert "1 tasks ran out" in caplog.text and "one per child" not in caplog.text and "a batch of" not in caplog.text
    assert readings_in_batches([slow], pool, tmp_path)[0]["op_graph"] == "relu mul"  # not cached: alone, 20 s


def test_a_batch_whose_child_dies_tracing_a_task_traces_that_task_alone_and_batches_the_rest(pool, cache_dir,
                                                                                             tmp_path, caplog):
    """A child killed for its memory while tracing one task (on the H100, a KernelBench L3
    network took a batch's child past 8 GB, and its 31 companions went one per child) names
    that task through the memory it shares with its parent: the task goes alone, the others
    to a batch again."""
    hog = make_task("return x + self.w.sum()", init="self.w = torch.ones(3 << 28)")  # 3 GiB resident
    codes = distinct_tasks(5)
    codes.insert(2, hog)
    options = sandbox_options(cache_dir, memory_guard="rss", max_memory_gb=1.5, warm_up=False)
    with WorkerPool(1, options) as guarded, caplog.at_level(logging.INFO, logger="pipeline.dedupe"):
        graphs = [entry["op_graph"] for entry in readings_in_batches(codes, guarded, tmp_path)]
    assert graphs[2] is None
    assert graphs[:2] + graphs[3:] == trace_all(codes[:2] + codes[3:], pool, tmp_path / "alone")
    assert "1 tasks traced alone after their batch's child died" in caplog.text
    assert "one per child" not in caplog.text


def test_what_a_batch_leaves_is_spread_over_every_worker():
    """On the H100, a batch that stopped at a slow network left 31 tasks, sent back as one
    batch while 10 of 11 workers were idle: its other slow networks were traced one after
    another. Batches are now no larger than what keeps every worker busy."""
    from pipeline.dedupe import _chunks, _spread
    assert [len(part) for part in _chunks(list(range(31)), _spread(31, 32, 11))] == [3] * 10 + [1]
    assert _spread(250, 32, 11) == 23 and _spread(250, 32, 2) == 32 and _spread(1, 32, 2) == 1


def test_a_task_that_rebinds_torch_steers_no_later_task_of_its_batch(pool, tmp_path):
    """An external task has passed no static check: in a process it shares, `torch.relu =
    torch.sigmoid` at import would make every later task's relu trace as a sigmoid (and a
    contaminated task look new). The batch's digest sees the rebinding, and the tasks after
    it are traced alone."""
    steering = make_task("return x * 3.0", header="torch.relu = torch.sigmoid\nnn.ReLU.forward = torch.tanh")
    victims = [make_task("return torch.relu(x) * 2.0", constants=f"batch_size = {8 + i}\nfeatures = 32")
               for i in range(6)]
    graphs = trace_in_batches([steering, *victims], pool, tmp_path / "graphs", batch=32)
    for graph in graphs[1:]:
        assert graph.split() == ["relu", "mul"], graph


def test_a_task_that_replaces_the_batch_guard_shares_no_child(pool, tmp_path):
    """The batch's guards run in the process they guard: a task holding the interpreter set
    `trace_batch.changed` to a function that finds no change, then rebound `torch._C._nn.silu`
    (read by F.silu when it runs), and every later silu of its batch traced as a relu. Only
    code the static policy lets through shares a child now."""
    steering = make_task("return x * 3.0", header="import sys\n"
                         "sys.modules['filters.sandbox.trace_batch'].changed = lambda before, now: False\n"
                         "torch._C._nn.silu = lambda x, *rest: torch.relu(x)")
    victims = [make_task("return torch.nn.functional.silu(x) * 2.0", constants=f"batch_size = {8 + i}\nfeatures = 32")
               for i in range(3)]
    graphs = trace_in_batches([steering, *victims], pool, tmp_path / "graphs", batch=32)
    for graph in graphs[1:]:
        assert graph.split() == ["silu", "mul"], graph


def test_a_reference_task_whose_code_the_shipped_table_holds_is_not_traced_again(pool, tmp_path):
    """The shipped readings (filters/similarity/kernelbench_readings.json) stand for the code
    they were read from, up to comments, docstrings and formatting: a task they hold is not
    traced (a copy whose text differs in those alone, as the Hub's may, neither), any other is."""
    from filters.similarity.reference import code_digest, load_reference
    from filters.similarity.score import with_graph
    from pipeline.dedupe import traced_in_batches
    reference = load_reference(str(FIXTURES), (2,))
    marker = "sigmoid sigmoid sigmoid sigmoid"  # no fixture computes this
    expected = with_graph(reference.fingerprints[0], marker).graph
    shipped = {code_digest(reference.codes[0]): marker}
    graphs = [fp.graph for fp in traced_in_batches(reference, pool, tmp_path / "graphs", shipped=shipped).fingerprints]
    assert graphs[0] == expected
    assert all(graph and graph != expected for graph in graphs[1:]), "the others are traced"
    reworded = '"""Reworded."""\n# a comment\n' + reference.codes[0].replace("\n", "\r\n") + "\n\n"
    assert code_digest(reworded) == code_digest(reference.codes[0])
    first = reference.codes[0]
    constant = next(line for line in first.splitlines() if re.fullmatch(r"\w+ = \d+", line))
    edited = first.replace(constant, constant + "1")  # another size: another task
    assert code_digest(edited) != code_digest(first)
    again = traced_in_batches(reference, pool, tmp_path / "graphs", shipped={code_digest(edited): marker})
    assert expected not in [fp.graph for fp in again.fingerprints]


def test_the_shipped_readings_are_those_of_this_graph_version():
    """A canonical form read otherwise (GRAPH_VERSION bumped) makes the shipped table stale:
    ignored at run time (the reference is traced), and this test asks for a rebuild."""
    import json

    from filters.similarity.reference import GRAPH_VERSION, SHIPPED_READINGS, shipped_readings
    table = json.loads(SHIPPED_READINGS.read_text())
    assert table["graph_version"] == GRAPH_VERSION, "rebuild it: python -m pipeline.shipped_readings KERNELBENCH"
    assert len(shipped_readings()) >= 250 and table["levels"] == [1, 2, 3]


def test_dedupe_reads_the_reference_from_the_shipped_table(pool, tmp_path):
    """`opsynth dedupe` against a stock KernelBench traces none of it: a task the table holds
    is compared by the table's reading (here a marker that only the new task computes)."""
    from filters.similarity.reference import code_digest, load_reference
    from pipeline.dedupe import dedupe_report
    reference = load_reference(str(FIXTURES), (2,))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "sigmoids.py").write_text(make_task("return x.sigmoid().sigmoid().sigmoid().sigmoid()"))
    shipped = {code_digest(reference.codes[0]): "sigmoid sigmoid sigmoid sigmoid"}
    rows = dedupe_report(str(tasks), str(FIXTURES), (2,), 0.9, 0.95, tmp_path / "d.parquet", pool,
                         tmp_path / "cache", shipped=shipped)
    assert rows[0]["nearest"] == reference.fingerprints[0].name and rows[0]["max_similarity"] > 0.9, rows


PARTIAL_AT_THE_SMALL_PROBLEM = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = torch.logsumexp(self.linear(x), dim=1, keepdim=True)
        return torch.nn.functional.gelu(torch.nn.functional.leaky_relu(x, negative_slope=0.01))


batch_size = 16
in_features = 64
out_features = 8192


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
'''
WRITTEN_OUT = ("h = x @ self.w.T + self.b\nh = h.logsumexp(1, keepdim=True)\nh = torch.where(h > 0, h, 0.01 * h)\n"
               "return 0.5 * h * (1 + torch.erf(h / 2 ** 0.5))")


def test_dedupe_reads_a_task_as_a_run_reads_it_where_the_small_problem_reads_part_of_it(pool, tmp_path):
    """Over a width of 8,192 the log-sum-exp is positive and the activations after it are
    identities; at the small problem they are not (the reading is partial). The table holds
    such a reference task read at its own sizes, so a copy (written out: its text is unlike)
    is read there too, not small."""
    from filters.similarity.reference import code_digest
    from pipeline.dedupe import dedupe_report
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "lse.py").write_text(PARTIAL_AT_THE_SMALL_PROBLEM)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "copy.py").write_text(make_task(
        WRITTEN_OUT, init="self.w = nn.Parameter(torch.randn(features, 64) / 8)\nself.b = nn.Parameter(torch.zeros(features))",
        inputs="[torch.randn(batch_size, 64)]", constants="batch_size = 16\nfeatures = 8192"))
    rows = dedupe_report(str(tasks), str(tmp_path / "reference"), (2,), 0.9, 0.95, tmp_path / "d.parquet", pool,
                         tmp_path / "cache", shipped={code_digest(PARTIAL_AT_THE_SMALL_PROBLEM): "mm add logsumexp"})
    assert rows[0]["max_similarity"] > 0.99 and not rows[0]["kept"], rows


def test_dedupe_removes_a_task_it_cannot_read_unless_asked_to_keep_it(pool, tmp_path):
    """Compared by its text alone, an adversary's copy of a KernelBench task that traced past
    its time limit was kept (0.32): a run rejects such a candidate (`untraced`), and so does
    dedupe unless told to keep it."""
    from pipeline.dedupe import dedupe_report
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "unreadable.py").write_text(make_task("return x.reshape(3, 7)"))  # fails on every input
    (tasks / "readable.py").write_text(make_task("return torch.tanh(x).cumsum(1)"))
    for keep in (False, True):
        rows = {row["source"]: row for row in dedupe_report(
            str(tasks), str(FIXTURES), (2,), 0.9, 0.95, tmp_path / "d.parquet", pool, tmp_path / "cache",
            keep_untraced=keep)}
        assert not rows["unreadable.py"]["traced"] and rows["unreadable.py"]["kept"] == keep, rows
        assert rows["readable.py"]["traced"] and rows["readable.py"]["kept"], rows
