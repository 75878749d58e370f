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

Steering is noisy at the end of a run (a share of a few rows in 500 is decided by the last
round's draws), so the rows written are chosen from all accepted (`written_rows`): each
op count and each library of the mix gets its quota of --num-samples, the rest is held back
(written apart, in held/: accepted, not rejected).
With `mix_tolerance` set, a run whose accepted rows cannot fill the quotas that closely
composes top-up rounds of what is lacking (`top_up_candidates`).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections import Counter, defaultdict, deque

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

def steer(target: dict, composed: Counter, accepted: Counter, goal: float, have: Counter | None = None) -> dict:
    """The shares a round should compose so that, by the time `goal` samples are accepted,
    each key holds its `target` share of them: what each still lacks (of what it `has`
    toward the goal: by default all it had accepted), divided by the rate at which its
    candidates were accepted so far (smoothed toward the overall rate). When none lacks
    anything, the target divided by those rates."""
    if not sum(accepted.values()):
        return dict(target)
    rate = _acceptance_rates(target, composed, accepted)
    have = accepted if have is None else have
    lacking = {key: max(0.0, share * goal - have[key]) for key, share in target.items()}
    if not any(lacking.values()):
        lacking = dict(target)
    wanted = {key: lacking[key] / rate[key] for key in target}
    total = sum(wanted.values())
    return {key: value / total for key, value in wanted.items()}


def _acceptance_rates(target: dict, composed: Counter, accepted: Counter) -> dict:
    overall = sum(accepted.values()) / max(1, sum(composed.values()))
    return {key: (accepted[key] + PRIOR_CANDIDATES * overall) / (composed[key] + PRIOR_CANDIDATES) for key in target}


def steer_config(cfg, records: list[tuple[Candidate, Verdict]], round_size: int):
    """`cfg` with the op-count and library mix a round of `round_size` candidates composes,
    after `records` (every earlier round's), aiming at the accepted total it should reach
    (once --num-samples are accepted, a top-up round aims at --num-samples: what the quotas
    still lack)."""
    fresh = [(candidate, verdict) for candidate, verdict in records if candidate.ops]
    accepted = sum(verdict.passed for _, verdict in fresh)
    goal = accepted + round_size * (accepted / len(fresh) if fresh else 0.5)
    counts, leads = (None, None)
    if accepted >= cfg.num_samples:  # a top-up: what the rows to be written lack
        goal = cfg.num_samples
        counts, leads = _held(written_rows(records, cfg), cfg)
    op_counts = steer(_normalised(cfg.op_count_mix), *_tallies(fresh, _op_count), goal, counts)
    led = steer(_library_target(cfg), *_tallies(fresh, lambda candidate: _lead(candidate, cfg.library_mix)), goal,
                leads)
    led.pop(OTHERS)
    return dataclasses.replace(cfg, op_count_mix=op_counts, library_mix=led)


def _op_count(candidate: Candidate) -> int:
    return len(candidate.ops)


def _library_target(cfg) -> dict:
    return {**cfg.library_mix, OTHERS: max(0.0, 1 - sum(cfg.library_mix.values()))}


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


# -- the rows written ----------------------------------------------------------------------

def written_rows(records: list[tuple[Candidate, Verdict]], cfg) -> list[tuple[Candidate, Verdict]]:
    """`records` with at most --num-samples accepted: those that meet the mix best, each op
    count and each library of the mix filled to its quota of --num-samples (earliest
    candidates first), the others marked held back (`surplus`, stage `mix`: accepted by every
    check, written apart from the rows and from the rejects, `held_back`)."""
    accepted = sorted((record for record in records if record[1].passed), key=_index)
    if len(accepted) <= cfg.num_samples:
        return records
    kept = {id(record) for record in _choose(accepted, cfg)}
    surplus = dict(stage="mix", passed=False, reason=HELD_BACK,
                   detail=f"accepted, but its op count or library already fills its share of --num-samples "
                          f"{cfg.num_samples}")
    return [record if not record[1].passed or id(record) in kept else (record[0], dataclasses.replace(record[1], **surplus))
            for record in records]


HELD_BACK = "surplus"  # the mark `written_rows` gives an accepted record it does not write as a row


def held_back(records: list[tuple[Candidate, Verdict]]) -> tuple[list, list]:
    """(the records that are rows or rejects, the accepted records held back)."""
    return ([record for record in records if record[1].reason != HELD_BACK],
            [record for record in records if record[1].reason == HELD_BACK])


def _choose(accepted: list, cfg) -> list:
    """--num-samples of `accepted`: each library of the mix its quota first (the rarest
    share), then the chains no library leads, then whatever is left; within each, the row
    of the op count that lacks the most of its target."""
    chosen, taken = [], Counter()
    count_target = {count: share * cfg.num_samples for count, share in _normalised(cfg.op_count_mix).items()}
    led = defaultdict(list)
    for record in accepted:
        led[_lead(record[0], cfg.library_mix)].append(record)
    for library, quota in quotas(_library_target(cfg), cfg.num_samples).items():
        if library != OTHERS:
            _fill(led[library], quota, count_target, taken, chosen)
    _fill(led[OTHERS], cfg.num_samples - len(chosen), count_target, taken, chosen)
    picked = {id(record) for record in chosen}
    _fill([record for record in accepted if id(record) not in picked], cfg.num_samples - len(chosen),
          count_target, taken, chosen)
    return chosen


def _fill(rows: list, slots: int, count_target: dict, taken: Counter, chosen: list) -> None:
    by_count = defaultdict(deque)
    for record in rows:
        by_count[_op_count(record[0])].append(record)
    for _ in range(slots):
        open_counts = [count for count, left in by_count.items() if left]
        if not open_counts:
            return
        count = max(open_counts, key=lambda c: (count_target.get(c, 0.0) - taken[c], -c))
        chosen.append(by_count[count].popleft())
        taken[count] += 1


def quotas(shares: dict, total: int) -> dict:
    """`total` split in proportion to `shares` in whole numbers (largest remainders)."""
    exact = {key: share * total for key, share in _normalised(shares).items()}
    whole = {key: math.floor(value) for key, value in exact.items()}
    by_remainder = sorted(exact, key=lambda key: whole[key] - exact[key])
    for key in by_remainder[:total - sum(whole.values())]:
        whole[key] += 1
    return whole


def mix_gaps(records: list[tuple[Candidate, Verdict]], cfg) -> dict:
    """How far the accepted rows are from the target mix, in rows, for each op count and
    each library of the mix (positive: lacking)."""
    counts, leads = _held(records, cfg)
    total = sum(counts.values())
    gaps = {f"{count} ops": share * total - counts[count] for count, share in _normalised(cfg.op_count_mix).items()}
    gaps.update({f"{library}-led": share * total - leads[library] for library, share in cfg.library_mix.items()})
    return gaps


def top_up_candidates(records: list[tuple[Candidate, Verdict]], cfg) -> int:
    """Candidates a top-up round should compose so that the quotas of --num-samples can be
    filled to within `mix_tolerance`: the rows each share of the rows to be written lacks,
    divided by the rate its candidates were accepted at so far. 0 when the mix is met (or
    no tolerance is set)."""
    if cfg.mix_tolerance is None:
        return 0
    written = written_rows(records, cfg)
    if _within_tolerance(written, cfg):
        return 0
    fresh = [(candidate, verdict) for candidate, verdict in records if candidate.ops]
    needed = []
    for target, key, have in zip((_normalised(cfg.op_count_mix), _library_target(cfg)),
                                 (_op_count, lambda candidate: _lead(candidate, cfg.library_mix)),
                                 _held(written, cfg)):
        rate = _acceptance_rates(target, *_tallies(fresh, key))
        needed.append(sum(max(0.0, share * cfg.num_samples - have[k]) / max(rate[k], 1e-3)
                          for k, share in target.items()))
    return max(1, math.ceil(max(needed)))


def rows_complete(accepted: list[tuple[Candidate, Verdict]], cfg) -> bool:
    """Whether these accepted records already give --num-samples rows that meet the mix (to
    within `mix_tolerance`, when one is set): what the run asked for is there."""
    return len(accepted) >= cfg.num_samples and (cfg.mix_tolerance is None
                                                 or _within_tolerance(written_rows(accepted, cfg), cfg))


def _within_tolerance(written: list, cfg) -> bool:
    return all(abs(gap) <= max(1.0, cfg.mix_tolerance * cfg.num_samples) for gap in mix_gaps(written, cfg).values())


def _held(records, cfg) -> tuple[Counter, Counter]:
    """The accepted rows of `records` by op count and by leading library."""
    accepted = [candidate for candidate, verdict in records if verdict.passed]
    return (Counter(_op_count(candidate) for candidate in accepted),
            Counter(_lead(candidate, cfg.library_mix) for candidate in accepted))


def _normalised(shares: dict) -> dict:
    total = sum(shares.values())
    return {key: share / total for key, share in shares.items()}


def _index(record) -> int:
    return record[0].provenance.get("index", 0)


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

    composer = TemplateComposer(catalog, op_count_mix, library_mix, usage=usage, numeric_screen=False,
                                checks_screen=False)
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
