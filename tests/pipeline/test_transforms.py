"""The Beam stages on in-memory lists, with the real DirectRunner."""
import apache_beam as beam
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindow

from operators.records import Candidate
from pipeline.transforms import ComposeCandidates, DropDuplicates, _ValidateFn


def candidate(cid, index):
    return Candidate(cid, ("torch.relu",), "torch#1", "code", "template", 0, {"index": index})


def test_drop_duplicates_keeps_the_first_and_names_it():
    with test_pipeline.TestPipeline() as p:
        unique, rejected = (p | beam.Create([candidate("a", 2), candidate("a", 0), candidate("b", 1),
                                             candidate("seen", 3)])
                            | DropDuplicates(frozenset({"seen"})))
        assert_that(unique | "Index" >> beam.Map(lambda c: (c.id, c.provenance["index"])),
                    equal_to([("a", 0), ("b", 1)]), label="unique")
        assert_that(rejected | "Why" >> beam.MapTuple(lambda c, v: (c.id, v.reason, v.detail)),
                    equal_to([("a", "duplicate", "same normalized code as candidate 0"),
                              ("seen", "duplicate", "same normalized code as a candidate of an earlier round")]),
                    label="rejected")


def test_compose_turns_every_job_into_exactly_one_candidate(torch_catalog):
    with test_pipeline.TestPipeline() as p:
        jobs = p | beam.Create([{"index": i} for i in range(6)])
        candidates, rejected = jobs | ComposeCandidates("template", torch_catalog[0], 1, batch=4, op_count_mix={2: 1.0})
        assert_that(candidates | beam.Map(lambda c: (c.provenance["index"], len(c.ops))),
                    equal_to([(i, 2) for i in range(6)]), label="composed")
        assert_that(rejected, equal_to([]), label="none rejected")


def test_decontaminate_rejects_a_disguised_copy_and_keeps_the_score_on_the_rest():
    from pathlib import Path

    from filters.similarity.reference import load_reference
    from operators.records import Verdict
    from pipeline.transforms import Decontaminate
    from tests.disguise import disguise

    reference_dir = Path(__file__).parents[1] / "fixtures" / "reference"
    reference = load_reference(str(reference_dir)).fingerprints
    copy = Candidate("copy", ("torch.cumsum",), "torch#1", disguise((reference_dir / "level1" / "2_row_cumsum.py")
                                                                    .read_text()), "template", 0, {"index": 0})
    other = Candidate("other", ("torch.sort",), "torch#1",
                      "import torch\nclass Model:\n    def forward(self, x):\n        return x.sort()[0]\n",
                      "template", 0, {"index": 1})
    records = [(c, Verdict(c.id, "accepted", True, metrics={"eager_ms": 2.0})) for c in (copy, other)]
    with test_pipeline.TestPipeline() as p:
        clean, similar = p | beam.Create(records) | Decontaminate(reference, 0.9)
        assert_that(similar | "Why" >> beam.MapTuple(lambda c, v: (c.id, v.stage, v.reason, v.metrics["kernelbench_nearest"])),
                    equal_to([("copy", "decontaminate", "kernelbench_similar", "level1/2_row_cumsum.py")]), label="similar")
        assert_that(clean | "Kept" >> beam.MapTuple(lambda c, v: (c.id, v.passed, v.metrics["eager_ms"],
                                                                 v.metrics["kernelbench_max_similarity"] < 0.9)),
                    equal_to([("other", True, 2.0, True)]), label="clean")



def test_validation_streams_so_a_hanging_candidate_holds_back_no_other(cache_dir):
    """The hanging task goes in first and holds one of the two workers until its timeout;
    the other worker decides every quick task meanwhile, and their verdicts leave first, as
    each is known (in batches, a batch would wait for its slowest candidate)."""
    from tests.conftest import make_task, sandbox_options

    def task(cid, index, forward):
        return Candidate(cid, ("torch.sigmoid",), "torch#1", make_task(forward), "template", 0, {"index": index})

    hang = task("hang", 0, "while True:\n    pass")
    quick = [task(f"quick{i}", i + 1, f"return torch.sigmoid(x) * {i + 2}.0") for i in range(6)]
    checks = {"compile": False, "window_ms": [1e-6, 1e6]}
    validate_fn = _ValidateFn(sandbox_options(cache_dir, timeout_s=10, warm_up=False), checks, 2, None, None)
    validate_fn.setup()
    validate_fn.start_bundle()
    left = []
    for candidate in [hang, *quick]:
        left += [("process", *_record(output)) for output in validate_fn.process(candidate, 0, GlobalWindow())]
    left += [("finish_bundle", *_record(output)) for output in validate_fn.finish_bundle()]
    assert left[-1] == ("finish_bundle", "hang", "timeout")
    assert sorted(cid for _, cid, _ in left[:-1]) == [c.id for c in quick]
    assert all(reason == "accepted" for _, _, reason in left[:-1])
    assert any(step == "process" for step, _, _ in left)  # verdicts leave while candidates still arrive


def _record(output):
    windowed = output.value if isinstance(output, beam.pvalue.TaggedOutput) else output
    candidate, verdict = windowed.value
    return candidate.id, verdict.reason or "accepted"
