"""What a round composes: the op-count and library mix steered toward the target by what
was accepted so far, and the LLM composer's op tuples, drawn as the template composer draws
a layer.

Longer chains and library-led chains are accepted less often, so composing the recipe's mix
gives an accepted mix off it (on the H200: 2.4 / 88.9 / 7.5 / 0.6 / 0.6% accepted against
3.4 / 83.8 / 7.6 / 2.8 / 1.2% asked). Each round therefore composes each share in proportion
to what its count (or library) still lacks, divided by the rate at which the run has
accepted it so far (`steer`). It reads only the records of earlier rounds, so composition
stays a pure function of (seed, index, earlier rounds' records): a resumed run composes the
same candidates.
"""
from __future__ import annotations

import dataclasses
import fnmatch
from collections import Counter

from operators.records import Candidate, OpSpec, Verdict

# Candidates of a count or library count as this many more, accepted at the run's overall
# rate: a share seen a few times (five-op chains: about 6 in a round of 512) is not steered
# by its noise alone. More hides how rarely the rare kinds pass: with 8, a simulated run of
# two rounds of 512 (tests/pipeline/test_template_composer.py) accepted 1.6% four-op chains
# against 2.8% asked; with 2, 2.8%.
PRIOR_CANDIDATES = 2
OTHERS = ""  # the library_mix key of the candidates no library of the mix leads


class NoOpsSelected(ValueError):
    """--ops matched nothing in the catalog."""


def select_ops(catalog: list[OpSpec], patterns: list[str] | None) -> list[OpSpec]:
    if not patterns:
        return list(catalog)
    chosen = [spec for spec in catalog if any(fnmatch.fnmatchcase(spec.name, p) for p in patterns)]
    if not chosen:
        raise NoOpsSelected(f"--ops {','.join(patterns)} matches no operator in the catalog "
                            f"(e.g. {', '.join(s.name for s in catalog[:3])})")
    return chosen


# -- the target mix ------------------------------------------------------------------------

def steer(target: dict, composed: Counter, accepted: Counter, goal: float) -> dict:
    """The shares a round should compose so that, by the time `goal` samples are accepted,
    each key holds its `target` share of them: what each still lacks, divided by the rate at
    which its candidates were accepted so far (smoothed toward the overall rate). When none
    lacks anything, the target divided by those rates."""
    total_composed, total_accepted = sum(composed.values()), sum(accepted.values())
    if not total_accepted:
        return dict(target)
    overall = total_accepted / total_composed
    rate = {key: (accepted[key] + PRIOR_CANDIDATES * overall) / (composed[key] + PRIOR_CANDIDATES)
            for key in target}
    lacking = {key: max(0.0, share * goal - accepted[key]) for key, share in target.items()}
    if not any(lacking.values()):
        lacking = dict(target)
    wanted = {key: lacking[key] / rate[key] for key in target}
    total = sum(wanted.values())
    return {key: value / total for key, value in wanted.items()}


def steer_config(cfg, records: list[tuple[Candidate, Verdict]], round_size: int):
    """`cfg` with the op-count and library mix a round of `round_size` candidates composes,
    after `records` (every earlier round's), aiming at the accepted total it should reach."""
    fresh = [(candidate, verdict) for candidate, verdict in records if candidate.ops]
    accepted = sum(verdict.passed for _, verdict in fresh)
    goal = accepted + round_size * (accepted / len(fresh) if fresh else 0.5)
    op_counts = steer(cfg.op_count_mix, *_tallies(fresh, lambda candidate: len(candidate.ops)), goal)
    libraries = {**{library: share for library, share in cfg.library_mix.items()},
                 OTHERS: 1 - sum(cfg.library_mix.values())}
    led = steer(libraries, *_tallies(fresh, lambda candidate: _lead(candidate, cfg.library_mix)), goal)
    led.pop(OTHERS)
    return dataclasses.replace(cfg, op_count_mix=op_counts, library_mix=led)


def _tallies(records, key) -> tuple[Counter, Counter]:
    composed, accepted = Counter(), Counter()
    for candidate, verdict in records:
        composed[key(candidate)] += 1
        accepted[key(candidate)] += verdict.passed
    return composed, accepted


def _lead(candidate: Candidate, library_mix: dict) -> str:
    """The library of the mix a candidate was led by: its ops of a mix library appear only in
    the chains it leads (`data_source` names it)."""
    library = candidate.data_source.split("#")[0]
    return library if library in library_mix else OTHERS


# -- the LLM composer's op tuples ----------------------------------------------------------

def sample_tuples(catalog: list[OpSpec], count: int, op_count_mix: dict[int, float],
                  library_mix: dict[str, float], seed: int, start: int = 0,
                  drawn: frozenset[tuple[str, ...]] = frozenset(), usage: dict[str, int] | None = None,
                  max_misses: int = 64) -> list[tuple[str, ...]]:
    """`count` op tuples for the LLM composer, drawn as the template composer draws a layer
    (pipeline/composers/template.py: roles, usage weights, coverage, shapes that fit) at
    indexes `start`, `start + 1`, ...; none repeats `drawn` (the run's earlier tuples) or
    another. A repeat is skipped, since the model would be sent the same request; after
    `max_misses` repeats in a row the catalog is taken to be spent and fewer are returned.
    A pure function of its arguments, so reruns and resumed runs agree."""
    from pipeline.composers.template import CompositionFailed, TemplateComposer

    composer = TemplateComposer(catalog, op_count_mix, library_mix, usage=usage, numeric_screen=False)
    seen, tuples, misses, index = set(drawn), [], 0, start
    while len(tuples) < count and misses < max_misses:
        try:
            ops = composer.compose(index, seed, frozenset(seen)).ops
        except CompositionFailed:
            ops = None
        index += 1
        if ops is None or ops in seen:
            misses += 1
            continue
        misses = 0
        seen.add(ops)
        tuples.append(ops)
    return tuples
