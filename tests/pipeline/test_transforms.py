"""The Beam stages on in-memory lists, with the real DirectRunner. Every stage takes and
gives records, (Candidate, Verdict | None), and passes on decided ones untouched."""
import apache_beam as beam
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from operators.records import Candidate, Verdict
from pipeline.transforms import ComposeCandidates, DropDuplicates, _ValidateFn


def candidate(cid, index):
    return Candidate(cid, ("torch.relu",), "torch#1", "code", "template", 0, {"index": index})


def test_drop_duplicates_keeps_the_first_names_it_and_passes_decided_records_on():
    rejected_earlier = (candidate("a", 4), Verdict("a", "compose", False, "compose_failed", "no chain fits"))
    with test_pipeline.TestPipeline() as p:
        records = (p | beam.Create([(candidate("a", 2), None), (candidate("a", 0), None), (candidate("b", 1), None),
                                    (candidate("seen", 3), None), rejected_earlier])
                   | DropDuplicates(frozenset({"seen"})))
        assert_that(records | beam.MapTuple(lambda c, v: (c.id, c.provenance["index"], v and (v.reason, v.detail))),
                    equal_to([("a", 0, None), ("b", 1, None),
                              ("a", 2, ("duplicate", "same normalized code as candidate 0")),
                              ("seen", 3, ("duplicate", "same normalized code as a candidate of an earlier round")),
                              ("a", 4, ("compose_failed", "no chain fits"))]))


def test_compose_turns_every_job_into_exactly_one_undecided_record(torch_catalog):
    with test_pipeline.TestPipeline() as p:
        jobs = p | beam.Create([{"index": i} for i in range(6)])
        records = jobs | ComposeCandidates("template", torch_catalog[0], 1, batch=4, op_count_mix={2: 1.0})
        assert_that(records | beam.MapTuple(lambda c, v: (c.provenance["index"], len(c.ops), v)),
                    equal_to([(i, 2, None) for i in range(6)]))


def test_decontaminate_rejects_a_disguised_copy_and_keeps_the_score_on_the_rest():
    from pathlib import Path

    from filters.similarity.reference import load_reference
    from pipeline.transforms import Decontaminate
    from tests.disguise import disguise

    reference_dir = Path(__file__).parents[1] / "fixtures" / "reference"
    reference = load_reference(str(reference_dir)).fingerprints
    copy_code = disguise((reference_dir / "level1" / "2_row_cumsum.py").read_text())
    copy = Candidate("copy", ("torch.cumsum",), "torch#1", copy_code, "template", 0, {"index": 0})
    other = Candidate("other", ("torch.sort",), "torch#1",
                      "import torch\nclass Model:\n    def forward(self, x):\n        return x.sort()[0]\n",
                      "template", 0, {"index": 1})
    failed = Candidate("failed", ("torch.cumsum",), "torch#1", copy_code, "template", 0, {"index": 2})
    records = [(c, Verdict(c.id, "accepted", True, metrics={"eager_ms": 2.0})) for c in (copy, other)]
    records.append((failed, Verdict("failed", "eager", False, "too_fast", "0.01 ms")))
    with test_pipeline.TestPipeline() as p:
        decided = p | beam.Create(records) | Decontaminate(reference, 0.9)
        assert_that(decided | beam.MapTuple(lambda c, v: (c.id, v.stage, v.reason or "accepted",
                                                          v.metrics.get("kernelbench_nearest"),
                                                          v.metrics.get("kernelbench_max_similarity", 0) < 0.9)),
                    equal_to([("copy", "decontaminate", "kernelbench_similar", "level1/2_row_cumsum.py", False),
                              ("other", "accepted", "accepted", None, True),  # no reference task near it
                              ("failed", "eager", "too_fast", None, True)]))


def test_decontaminate_rejects_an_accepted_task_whose_trace_failed_when_the_reference_is_traced():
    """A task can make its own trace fail (run past the trace's time limit, or take an op the
    meta device cannot run at a size it hides a branch behind): it must not be left to the
    text comparison alone, which a disguise passes."""
    from pathlib import Path

    from filters.similarity.reference import load_reference
    from filters.similarity.score import with_graph
    from pipeline.transforms import Decontaminate

    reference_dir = Path(__file__).parents[1] / "fixtures" / "reference"
    traced = tuple(with_graph(fp, "cumsum") for fp in load_reference(str(reference_dir)).fingerprints)
    code = "import torch\nclass Model:\n    def forward(self, x):\n        return x.sort()[0]\n"
    tasks = [Candidate(cid, ("torch.sort",), "torch#1", code, "template", 0, {"index": i})
             for i, cid in enumerate(("traced", "untraced", "empty"))]
    graphs = {"traced": "sort", "untraced": None, "empty": ""}  # "": traced, and none of its ops is named
    records = [(c, Verdict(c.id, "accepted", True, metrics={"op_graph": graphs[c.id]})) for c in tasks]
    with test_pipeline.TestPipeline() as p:
        decided = p | beam.Create(records) | Decontaminate(traced, 0.9)
        assert_that(decided | beam.MapTuple(lambda c, v: (c.id, v.reason or "accepted")),
                    equal_to([("traced", "accepted"), ("untraced", "untraced"), ("empty", "accepted")]))
    with test_pipeline.TestPipeline() as p:  # a reference that was not traced compares text alone, as before
        untraced_reference = load_reference(str(reference_dir)).fingerprints
        decided = p | beam.Create(records) | Decontaminate(untraced_reference, 0.9)
        assert_that(decided | beam.MapTuple(lambda c, v: (c.id, v.reason or "accepted")),
                    equal_to([("traced", "accepted"), ("untraced", "accepted"), ("empty", "accepted")]))


def test_validation_streams_so_a_hanging_candidate_holds_back_no_other(cache_dir):
    """The hanging task comes first in its group and holds one of the two workers until its
    timeout; the other worker decides every quick task meanwhile, and their verdicts leave
    first, each as it is known. A record decided before validation leaves at once."""
    from tests.conftest import make_task, sandbox_options

    def task(cid, index, forward):
        return Candidate(cid, ("torch.sigmoid",), "torch#1", make_task(forward), "template", 0, {"index": index})

    hang = task("hang", 0, "for _ in range(x.shape[0] ** 9):\n    x = x * 1.0\nreturn x")  # endless, and grammatical
    quick = [task(f"quick{i}", i + 1, f"return torch.sigmoid(x) * {i + 2}.0") for i in range(6)]
    duplicate = (task("dup", 7, "return x"), Verdict("dup", "dedupe", False, "duplicate", "same as candidate 1"))
    checks = {"compile": False, "window_ms": [1e-6, 1e6]}
    validate_fn = _ValidateFn(sandbox_options(cache_dir, timeout_s=10, warm_up=False), checks, 2, None, None)
    validate_fn.setup()
    group = [(hang, None), *((c, None) for c in quick), duplicate]
    left = [(c.id, v.reason or "accepted") for c, v in validate_fn.process((0, group))]
    assert left[0] == ("dup", "duplicate")
    assert left[-1] == ("hang", "timeout")
    assert sorted(cid for cid, _ in left[1:-1]) == [c.id for c in quick]
    assert all(reason == "accepted" for _, reason in left[1:-1])
