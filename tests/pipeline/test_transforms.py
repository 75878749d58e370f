"""The Beam stages on in-memory lists, with the real DirectRunner."""
import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from operators.records import Candidate
from pipeline.transforms import ComposeCandidates, DropDuplicates


def candidate(cid, index):
    return Candidate(cid, ("torch.relu",), "torch#1", "code", "template", 0, {"index": index})


def test_drop_duplicates_keeps_the_first_and_names_it():
    with TestPipeline() as p:
        unique, rejected = (p | beam.Create([candidate("a", 2), candidate("a", 0), candidate("b", 1),
                                             candidate("seen", 3)])
                            | DropDuplicates(frozenset({"seen"})))
        assert_that(unique | "Index" >> beam.Map(lambda c: (c.id, c.provenance["index"])),
                    equal_to([("a", 0), ("b", 1)]), label="unique")
        assert_that(rejected | "Why" >> beam.MapTuple(lambda c, v: (c.id, v.reason, v.detail)),
                    equal_to([("a", "duplicate", "same normalized code as candidate 0"),
                              ("seen", "duplicate", "same normalized code as a candidate of an earlier round")]),
                    label="rejected")


def test_compose_turns_every_index_into_exactly_one_candidate(torch_catalog):
    with TestPipeline() as p:
        candidates, rejected = p | beam.Create(range(6)) | ComposeCandidates(torch_catalog[0], {2: 1.0}, 1)
        assert_that(candidates | beam.Map(lambda c: (c.provenance["index"], len(c.ops))),
                    equal_to([(i, 2) for i in range(6)]), label="composed")
        assert_that(rejected, equal_to([]), label="none rejected")
