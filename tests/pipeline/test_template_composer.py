import random
from collections import Counter

import pytest
import torch

from filters.static_check import static_check
from operators.task import task_id
from pipeline.composers.template import DEFAULT_OP_COUNT_MIX, TemplateComposer, data_source, draw_op_count


def test_op_count_draws_follow_the_cuda_agent_mix():
    rng = random.Random(0)
    draws = Counter(draw_op_count(rng, DEFAULT_OP_COUNT_MIX) for _ in range(20_000))
    for count, share in DEFAULT_OP_COUNT_MIX.items():
        assert abs(draws[count] / 20_000 - share) < 0.01


@pytest.mark.parametrize("num_ops", [1, 5])
def test_chains_of_one_and_five_ops_are_valid_tasks(torch_catalog, num_ops):
    composer = TemplateComposer(torch_catalog[0], {num_ops: 1.0})
    for index in range(20):
        candidate = composer.compose(index, run_seed=7)
        assert len(candidate.ops) == num_ops == len(set(candidate.ops))
        assert static_check(candidate.code) is None
        assert candidate.data_source == f"torch#{num_ops}"
        namespace = {}
        exec(candidate.code, namespace)
        # Shapes fit together (values, e.g. a singular matrix, are the filters' job); ops with no
        # meta kernel run on small real tensors instead.
        try:
            with torch.device("meta"):
                model = namespace["Model"](*namespace["get_init_inputs"]())
                out = model(*namespace["get_inputs"]())
        except NotImplementedError:
            model = namespace["Model"](*namespace["get_init_inputs"]())
            out = model(*namespace["get_inputs"]())
        assert out.numel() > 0


def test_composition_is_a_pure_function_of_seed_and_index(torch_catalog):
    first, second = TemplateComposer(torch_catalog[0]), TemplateComposer(list(reversed(torch_catalog[0])))
    assert first.compose(11, 5) == second.compose(11, 5)
    assert first.compose(11, 5).id != first.compose(12, 5).id
    candidate = first.compose(3, 5)
    assert candidate.id == task_id(candidate.code)


def test_empty_catalog_is_a_clear_error():
    with pytest.raises(ValueError, match="catalog is empty"):
        TemplateComposer([])


def test_data_source_names_the_non_torch_library(torch_catalog):
    spec = torch_catalog[0][0]
    other = spec.__class__(**{**spec.__dict__, "library": "torchvision"})
    from operators.task import BoundOp
    assert data_source([BoundOp(spec), BoundOp(other)]) == "torchvision#2"


def test_a_library_in_the_mix_leads_its_share_of_chains_and_only_those(torch_catalog):
    catalog = list(torch_catalog[0])
    gelu = next(spec for spec in catalog if spec.name == "torch.nn.functional.gelu")
    plugin = [gelu.__class__(**{**gelu.__dict__, "name": "torch.nn.functional.silu", "library": "mylib"})]
    composer = TemplateComposer([s for s in catalog if s.name != plugin[0].name] + plugin, {2: 1.0}, {"mylib": 0.2})
    sources = [composer.compose(index, run_seed=3).data_source for index in range(20)]
    assert sources.count("mylib#2") == 4
    assert [i for i, source in enumerate(sources) if source == "mylib#2"] == [4, 9, 14, 19]
