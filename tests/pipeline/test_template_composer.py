import dataclasses
import math
import random
import re
from collections import Counter

import pytest
import torch

from filters.grammar import static_check
from operators.layouts import LAYOUTS
from operators.records import Candidate, Verdict, task_id
from operators.roles import (ANCHOR, COMPUTE_HEAVY, EPILOGUE, LAYOUT, REAL, REDUCTION, discontinuous, domain_of, feeds,
                             range_of, role_of)
from pipeline.composers.screen import checks_fault, checks_fault_of, screen_sizes, screen_task
from tests.conftest import make_task
from pipeline.composers.template import (COVERAGE_EVERY, DEFAULT_OP_COUNT_MIX, CompositionFailed, TemplateComposer,
                                         _stop_screening, data_source, draw_op_count, layer_roles, lead_library,
                                         place)


def test_op_count_draws_hold_the_mix_in_every_window_of_consecutive_indexes():
    total = sum(DEFAULT_OP_COUNT_MIX.values())
    for seed, start, length in [(0, 0, 500), (3, 777, 500), (5, 4096, 100)]:
        draws = Counter(draw_op_count(index, seed, DEFAULT_OP_COUNT_MIX) for index in range(start, start + length))
        for count, share in DEFAULT_OP_COUNT_MIX.items():
            assert abs(draws[count] - share / total * length) <= 2.5, (seed, start, draws)
    assert draw_op_count(10, 0, {2: 0.5, 3: 0.0, 4: 0.5}) in (2, 4)  # a count steered to nothing is never drawn


# Synthetic acceptance rates shaped like the H200's: longer chains and library-led chains die more.
RATES = {1: 0.35, 2: 0.62, 3: 0.5, 4: 0.12, 5: 0.25}
LED_RATE = 0.4  # a transformers-led chain is accepted this much as often as a torch one


def simulated_run(steered: bool, wanted: int = 500, workers: int = 8):
    """Rounds as pipeline/run.py plans them, each candidate's op count and lead library drawn as
    the template composer draws them, accepted at the synthetic rates without noise (the n-th
    candidate of a kind passes when its running quota ticks): the accepted op-count mix and
    transformers share."""
    from pipeline.config import RunConfig
    from pipeline.run import round_size
    from pipeline.sampling import steer_config

    cfg = RunConfig(num_samples=wanted, op_count_mix=dict(DEFAULT_OP_COUNT_MIX), library_mix={"transformers": 0.012})
    records, seen = [], Counter()
    while sum(verdict.passed for _, verdict in records) < wanted:
        accepted = sum(verdict.passed for _, verdict in records)
        size = round_size(wanted - accepted, accepted, len(records), workers, 10**6)
        mix = steer_config(cfg, records, size) if steered else cfg
        for index in range(len(records), len(records) + size):
            count = draw_op_count(index, 0, mix.op_count_mix)
            lead = lead_library(index, mix.library_mix)
            rate = RATES[count] * (LED_RATE if lead else 1)
            kind = (count, lead)
            passed = math.floor(rate * (seen[kind] + 1)) > math.floor(rate * seen[kind])
            seen[kind] += 1
            candidate = Candidate(f"c{index}", tuple(f"op{i}" for i in range(count)), f"{lead or 'torch'}#{count}",
                                  "", "template", 0, {"index": index})
            records.append((candidate, Verdict(candidate.id, "accepted" if passed else "eager", passed)))
    kept = [candidate for candidate, verdict in records if verdict.passed]
    mix = {count: sum(len(c.ops) == count for c in kept) / len(kept) for count in RATES}
    return mix, sum(c.data_source.startswith("transformers") for c in kept) / len(kept), len(kept)


def test_steering_brings_the_accepted_mix_to_the_target_against_uneven_acceptance():
    total = sum(DEFAULT_OP_COUNT_MIX.values())
    target = {count: share / total for count, share in DEFAULT_OP_COUNT_MIX.items()}
    plain, plain_led, _ = simulated_run(steered=False)
    assert max(abs(plain[count] - target[count]) for count in target) > 0.02  # the drift steering must undo
    assert abs(plain_led - 0.012) > 0.005
    steered, led, accepted = simulated_run(steered=True)
    assert 500 <= accepted < 650
    for count in target:
        assert abs(steered[count] - target[count]) <= 0.01, (count, steered)
    assert abs(led - 0.012) <= 0.005, led


def test_steering_reads_only_the_records_so_a_resumed_run_steers_the_same():
    from pipeline.sampling import steer

    composed, accepted = Counter({1: 30, 2: 400, 4: 20}), Counter({1: 10, 2: 250, 4: 2})
    shares = steer({1: 0.04, 2: 0.86, 4: 0.1}, composed, accepted, goal=500)
    assert shares == steer({1: 0.04, 2: 0.86, 4: 0.1}, Counter(composed), Counter(accepted), goal=500)
    assert abs(sum(shares.values()) - 1) < 1e-9
    assert shares[4] > 0.1 and shares[2] < 0.86  # four-op chains lack most and pass least
    assert steer({1: 0.5, 2: 0.5}, Counter(), Counter(), goal=10) == {1: 0.5, 2: 0.5}  # nothing seen yet


@pytest.mark.parametrize("num_ops", [1, 5])
def test_chains_of_one_and_five_ops_are_valid_tasks(torch_catalog, num_ops):
    composer = TemplateComposer(torch_catalog[0], {num_ops: 1.0})
    composed = 0
    for index in range(20):
        try:
            candidate = composer.compose(index, run_seed=7)
        except CompositionFailed:  # five ops the value checks all accept are not always found in SCREENS tries
            continue
        composed += 1
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
    assert composed >= 16


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


def composer_for(catalog, sampling="layers", usage=None, mix=None):
    return TemplateComposer(catalog, mix or {1: 0.1, 2: 0.6, 3: 0.2, 4: 0.05, 5: 0.05}, None, sampling, usage)


def test_layer_chains_lead_with_a_compute_heavy_op_and_reduce_only_last(torch_catalog):
    composer = composer_for(torch_catalog[0])
    chains = [composer.compose(index, run_seed=2).ops for index in range(120)]
    for ops in (ops for ops in chains if len(ops) > 1):
        roles = [role_of(op) for op in ops]
        anchor = 1 if roles[0] == LAYOUT else 0
        assert roles[anchor] in COMPUTE_HEAVY, ops
        assert REDUCTION not in roles[:-1] or all(spec_keeps_rank(torch_catalog[0], op) for op in ops[:-1]), ops
    uniform = [composer_for(torch_catalog[0], "uniform").compose(index, 2).ops for index in range(120)]
    heavy = lambda chains: sum(role_of(ops[0]) in COMPUTE_HEAVY for ops in chains if len(ops) > 1)  # noqa: E731
    assert heavy(chains) > 2 * heavy(uniform)


def spec_keeps_rank(catalog, name):
    return bool(next(spec for spec in catalog if spec.name == name).keeps_rank)


def test_every_op_appears_within_four_candidates_per_op(torch_catalog):
    catalog = [spec for spec in torch_catalog[0]
               if spec.name.startswith(("torch.nn.Conv", "torch.nn.Linear", "torch.nn.functional.", "torch.sum"))][:40]
    # the order alone is tested here: the checks screen redraws chains (tested below)
    composer = TemplateComposer(catalog, {1: 0.1, 2: 0.6, 3: 0.2, 4: 0.05, 5: 0.05}, checks_screen=False)
    seen = {op for index in range(COVERAGE_EVERY * len(catalog)) for op in composer.compose(index, 9).ops}
    assert seen == {spec.name for spec in catalog}


def test_ops_real_code_calls_more_are_drawn_more(torch_catalog):
    catalog = torch_catalog[0]
    plain, favoured = composer_for(catalog, mix={2: 1.0}), composer_for(catalog, usage={"torch.tanh": 100_000},
                                                                         mix={2: 1.0})
    drawn = lambda composer: Counter(op for i in range(300) for op in composer.compose(i, 4).ops)  # noqa: E731
    # weight 1 + ln(1 + 100,000) = 12.5 against 1 for each other epilogue
    assert drawn(favoured)["torch.tanh"] >= 3 * max(drawn(plain)["torch.tanh"], 2)


def test_layer_roles_and_placement():
    rng = random.Random(1)
    for num_ops in range(1, 6):
        for _ in range(50):
            roles = layer_roles(rng, num_ops)
            assert len(roles) == num_ops
            if num_ops > 1:
                assert roles[0] in COMPUTE_HEAVY or roles[:2] == [LAYOUT, ANCHOR]
    assert place(ANCHOR, ["normalisation", "epilogue"]) == (["anchor", "epilogue"], 0)
    assert place(LAYOUT, ["anchor", "epilogue", "reduction"]) == (["layout", "anchor", "epilogue"], 0)
    assert place(REDUCTION, ["anchor", "epilogue", "epilogue"]) == (["anchor", "epilogue", "reduction"], 2)
    assert place(EPILOGUE, ["layout", "anchor", "reduction"]) == (["layout", "anchor", "epilogue"], 2)
    assert place(EPILOGUE, ["anchor", "normalisation"], keeps_rank=False) == (["anchor", "epilogue"], 1)


def test_one_added_library_alone_still_composes(torch_catalog):
    """A catalog without an op of some role (one library of filters) lends any op to that place
    (an op that jumps, featured, stands alone: leave those out)."""
    epilogues = [spec for spec in torch_catalog[0] if role_of(spec.name) == EPILOGUE]
    catalog = [spec for spec in epilogues if not discontinuous(spec.name)][:12]
    # three activations in a row are mostly redundant (the checks screen turns ELU -> CELU down)
    composer = TemplateComposer(catalog, {3: 1.0}, checks_screen=False)
    assert all(len(composer.compose(index, 1).ops) == 3 for index in range(10))


def test_later_rounds_hold_back_the_op_tuples_earlier_rounds_drew(torch_catalog):
    catalog, lone = torch_catalog[0], {1: 1.0}  # single ops: a small space, so draws repeat
    earlier = [TemplateComposer(catalog, lone).compose(index, 0) for index in range(40)]
    drawn = frozenset(candidate.ops for candidate in earlier)
    kept_all = [TemplateComposer(catalog, lone).compose(index, 0) for index in range(40, 120)]
    held_back = [TemplateComposer(catalog, lone, drawn=drawn).compose(index, 0) for index in range(40, 120)]
    assert sum(candidate.ops in drawn for candidate in kept_all) >= 5  # what it stops
    assert not any(candidate.ops in drawn for candidate in held_back)
    assert held_back == [TemplateComposer(list(reversed(catalog)), lone, drawn=drawn).compose(index, 0)
                         for index in range(40, 120)]  # still a pure function of the seed, index and rounds


def test_a_tuple_drawn_before_is_drawn_again_when_nothing_else_fits(torch_catalog):
    linear = [spec for spec in torch_catalog[0] if spec.name == "torch.nn.Linear"]
    composer = TemplateComposer(linear, {1: 1.0}, drawn=frozenset({("torch.nn.Linear",)}))
    assert composer.compose(0, 0).ops == ("torch.nn.Linear",)


# -- numeric fitness: domains, conditioning and the screen --------------------------------

NUMERIC_OPS = ("torch.nn.Linear", "torch.nn.Conv2d", "torch.nn.LayerNorm", "torch.nn.functional.gelu", "torch.tanh",
               "torch.sigmoid", "torch.exp", "torch.cosh", "torch.log", "torch.sqrt", "torch.acosh", "torch.atanh",
               "torch.floor", "torch.remainder", "torch.inverse", "torch.matrix_exp", "torch.sum", "torch.tan",
               "torch.special.erfcx", "torch.special.i1", "torch.linalg.pinv")


def numeric_catalog(torch_catalog):
    return [spec for spec in torch_catalog[0] if spec.name in NUMERIC_OPS]


def small_batch(candidate) -> str:
    batch = screen_sizes(LAYOUTS[candidate.provenance["layout"]])[0]
    return re.sub(r"^batch_size = \d+$", f"batch_size = {batch}", candidate.code, count=1, flags=re.M)


def test_an_op_with_a_restricted_domain_only_takes_values_inside_it(torch_catalog):
    catalog = numeric_catalog(torch_catalog)
    # where each op goes; the checks screen turns every chain down that ends in a floor
    composer = TemplateComposer(catalog, {2: 0.5, 3: 0.5}, checks_screen=False)
    chains = [composer.compose(index, 3).ops for index in range(4 * len(catalog))]
    for ops in chains:
        for previous, op in zip((None, *ops), ops):
            assert feeds(previous, op), ops
            if domain_of(op) != REAL and previous is not None:  # never straight after an anchor's any-real output
                assert range_of(previous) != REAL, ops
        assert not any(discontinuous(op) for op in ops[1:]), ops
    seen = {op for ops in chains for op in ops}
    assert {"torch.log", "torch.sqrt", "torch.acosh", "torch.atanh", "torch.floor"} <= seen  # still reached
    assert ("torch.nn.Linear", "torch.log") not in {ops[:2] for ops in chains}


def test_a_chain_that_starts_by_inverting_a_matrix_gets_a_well_conditioned_one(torch_catalog):
    catalog = [spec for spec in torch_catalog[0] if spec.name in ("torch.inverse", "torch.matrix_exp")]
    for index in range(2):
        candidate = TemplateComposer(catalog, {1: 1.0}).compose(index, 0)
        assert "torch.eye(width) + torch.rand(" in candidate.code
        namespace = {}
        exec(small_batch(candidate), namespace)
        torch.manual_seed(0)
        [matrices] = namespace["get_inputs"]()
        assert torch.linalg.cond(matrices.double()).max() < 10  # torch.rand's own are past 1e3
        assert screen_task(small_batch(candidate)) is None
    uniform = torch.rand(1, 32, 64, 64, dtype=torch.float64)
    assert torch.linalg.cond(uniform).max() > 100


def test_the_screen_names_what_the_sandbox_would_reject():
    assert screen_task(make_task("return torch.log(x - 0.5)")).startswith("non_finite")
    assert screen_task(make_task("return x * 1e5")).startswith("magnitude")
    assert screen_task(make_task("return torch.sin(x * 1e5)")).startswith("precision")  # float32 rounds the argument
    assert screen_task(make_task("return torch.nn.functional.gelu(x) * 3")) is None


def test_the_composer_redraws_what_the_screen_rejects_and_stays_a_pure_function(torch_catalog):
    catalog = numeric_catalog(torch_catalog)
    screened = composer_for(catalog, mix={2: 0.4, 3: 0.4, 4: 0.2})
    unscreened = TemplateComposer(catalog, {2: 0.4, 3: 0.4, 4: 0.2}, numeric_screen=False, checks_screen=False)
    indices = range(0, 48)
    faults = lambda candidates: [c.ops for c in candidates if screen_task(small_batch(c))]  # noqa: E731
    kept = [screened.compose(index, 5) for index in indices]
    assert faults(kept) == []
    assert faults([unscreened.compose(index, 5) for index in indices])  # what it stops (Conv2d -> exp -> cosh ...)
    again = TemplateComposer(list(reversed(catalog)), {2: 0.4, 3: 0.4, 4: 0.2})
    assert [again.compose(index, 5) for index in indices] == kept


def test_the_checks_screen_names_what_the_sandbox_value_checks_reject():
    assert checks_fault_of(make_task("return torch.relu(torch.relu(x - 0.5))")).startswith("ablation/redundant_op")
    assert checks_fault_of(make_task("return x * 0.0 + 1.0")).startswith("degenerate/constant_output")
    assert checks_fault_of(make_task("return torch.clamp(x, min=0.9)")).startswith("sensitivity/insensitive_output")
    assert checks_fault_of(make_task("return torch.relu(x - 0.5) * 3")) is None
    # what only the GPU at the task's own size decides is left to the sandbox
    assert checks_fault_of(make_task("return x @ torch.ones(3, 3)")) is None  # raises here: eager_error


def identity_pixel_shuffle(torch_catalog):
    """nn.PixelShuffle bound with a factor of 1, as OpInfo's first sample once bound its
    functional form: an identity, which the sandbox's ablation check rejects wherever it is."""
    spec = next(spec for spec in torch_catalog[0] if spec.name == "torch.nn.PixelShuffle")
    return dataclasses.replace(spec, init_args={**spec.init_args, "upscale_factor": 1})


def test_the_composer_redraws_what_the_checks_screen_rejects(torch_catalog):
    """The sandbox's ablation check rejects every chain that holds an identity, and so does
    the screen, here."""
    names = {"torch.nn.Conv2d", "torch.nn.functional.hardtanh", "torch.nn.functional.gelu", "torch.nn.functional.silu"}
    catalog = [spec for spec in torch_catalog[0] if spec.name in names] + [identity_pixel_shuffle(torch_catalog)]
    mix = {2: 0.5, 3: 0.5}
    jobs = [{"index": i} for i in range(24)]
    composed = lambda composer: [c for c in composer.compose_many(jobs, 2) if isinstance(c, Candidate)]  # noqa: E731
    screened = composed(TemplateComposer(catalog, mix))
    unscreened = composed(TemplateComposer(catalog, mix, checks_screen=False))
    assert len(unscreened) == 24 and len(screened) >= 18  # a few draw nothing else the checks pass
    shuffled = lambda candidates: [c for c in candidates if "torch.nn.PixelShuffle" in c.ops]  # noqa: E731
    assert shuffled(unscreened) and all(checks_fault(c.code) for c in shuffled(unscreened)[:3])
    assert not shuffled(screened)


def test_a_round_screened_ahead_in_processes_is_the_round_composed_alone(torch_catalog):
    """Processes compose the jobs on their own and send back what they screened; the round
    composed after is the same as without them, and screens (almost) nothing itself."""
    catalog = [spec for spec in torch_catalog[0] if spec.name in NUMERIC_OPS] + [identity_pixel_shuffle(torch_catalog)]
    jobs = [{"index": i} for i in range(16)]
    alone = TemplateComposer(catalog, {2: 0.5, 3: 0.5}, screen_workers=1)
    pooled = TemplateComposer(catalog, {2: 0.5, 3: 0.5}, screen_workers=2, screen_pool_from=len(jobs))
    ids = lambda results: [getattr(r, "id", None) or r[1].reason for r in results]  # noqa: E731
    try:
        assert ids(pooled.compose_many(jobs, 3)) == ids(alone.compose_many(jobs, 3))
    finally:
        _stop_screening()  # the processes are kept for a run's next round: none is coming
    assert alone.screens_run > len(jobs) and pooled.screens_run <= alone.screens_run // 4
    assert set(alone.screened) <= set(pooled.screened) and any(alone.screened.values())


def test_a_round_composed_in_one_call_holds_back_its_own_tuples(torch_catalog):
    names = {"torch.nn.Linear", "torch.nn.ReLU", "torch.nn.GELU", "torch.nn.Tanh", "torch.nn.Sigmoid", "torch.nn.SiLU"}
    composer = TemplateComposer([spec for spec in torch_catalog[0] if spec.name in names], {2: 1.0},
                                numeric_screen=False)
    alone = [composer.compose(index, 0).ops for index in range(8)]
    together = [candidate.ops for candidate in composer.compose_many([{"index": i} for i in range(8)], 0)]
    assert len(set(alone)) < 8 and len(set(together)) == 8  # Linear > ReLU thrice alone, once together
    assert together[0] == alone[0]
    assert together == [c.ops for c in composer.compose_many([{"index": i} for i in range(8)], 0)]  # pure


def _traced_fingerprint(code: str, name: str):
    from filters.checks.harness import read
    from filters.similarity.score import fingerprint
    return fingerprint(code, name, read(code, untrusted=False).graph)


def test_the_reference_screen_draws_again_a_chain_too_close_to_the_reference_and_only_such_a_chain(torch_catalog):
    """A disguised copy of what candidate 0 would be is in the reference: the composer draws
    candidate 0 again, as something decontamination passes; a candidate whose chain was not
    too close is composed exactly as without the screen; and composing stays a pure function."""
    from filters.similarity.decontaminate import SimilarityIndex
    from tests.disguise import disguise

    catalog = torch_catalog[0]
    plain = TemplateComposer(catalog, screen_workers=1)
    unscreened = [plain.compose(index, 1) for index in range(4)]
    reference = (_traced_fingerprint(disguise(unscreened[0].code), "level2/copy_0.py"),)
    index = SimilarityIndex(list(reference))
    assert index.match(_traced_fingerprint(unscreened[0].code, "c0"), 0.9).too_close(0.9)

    screened = TemplateComposer(catalog, screen_workers=1, reference=reference, similarity_threshold=0.9)
    composed = [screened.compose(index, 1) for index in range(4)]
    assert composed[0].id != unscreened[0].id and screened.turned_down["kernelbench_similar"] >= 1
    for before, after in zip(unscreened, composed):
        if before.id != after.id:  # drawn again only where the chain was too close
            assert index.match(_traced_fingerprint(before.code, "before"), 0.9).too_close(0.9)
        assert not index.match(_traced_fingerprint(after.code, "after"), 0.9).too_close(0.9)
    again = TemplateComposer(catalog, screen_workers=1, reference=reference, similarity_threshold=0.9)
    assert [again.compose(index, 1).id for index in range(4)] == [c.id for c in composed]
