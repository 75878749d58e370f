"""Op-tuple sampling for the LLM composer: the configured op-count mix, a share per library
(kept as a running quota, so it holds at every prefix of the run; a library in the mix
appears only in the tuples it leads, the rest draw from the other libraries), balanced
coverage (every op is used before any is reused), and no tuple twice.

Sampling is a pure function of (catalog, configuration, seed, how many tuples): the n-th
tuple of a run is always the same, so reruns and Beam workers agree.
"""
from __future__ import annotations

import fnmatch
import random
from collections import Counter

from operators.records import OpSpec
from pipeline.composers.template import draw_op_count


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


def sample_tuples(catalog: list[OpSpec], count: int, op_count_mix: dict[int, float],
                  library_mix: dict[str, float], seed: int) -> list[tuple[str, ...]]:
    rng = random.Random(f"sample:{seed}")
    names = sorted(spec.name for spec in catalog)
    by_library: dict[str, list[str]] = {}
    for spec in catalog:
        by_library.setdefault(spec.library, []).append(spec.name)
    # Ops of a library in the mix appear only in the tuples it leads, at its share.
    base = sorted(spec.name for spec in catalog if spec.library not in library_mix) or names
    uses: Counter = Counter({name: 0 for name in names})
    seen: set[tuple[str, ...]] = set()
    tuples = []
    led_by: Counter = Counter()  # tuples whose first op came from each library
    for _ in range(count):
        library = _behind_quota(library_mix, by_library, led_by, len(tuples))
        for _ in range(100):
            size = min(draw_op_count(rng, op_count_mix), len(names))
            first_pool = sorted(by_library[library]) if library else base
            picked = [_least_used(rng, first_pool, uses, ())]
            while len(picked) < size:
                picked.append(_least_used(rng, base, uses, picked))
            candidate = tuple(picked)
            if candidate not in seen:
                break
        else:
            break  # every tuple this catalog allows has been drawn
        seen.add(candidate)
        uses.update(candidate)
        tuples.append(candidate)
        if library:
            led_by[library] += 1
    return tuples


def _behind_quota(library_mix, by_library, led_by, drawn: int) -> str | None:
    """A library whose share of tuples would fall under its minimum without this one."""
    for library, share in sorted(library_mix.items()):
        if by_library.get(library) and led_by[library] < share * (drawn + 1):
            return library
    return None


def _least_used(rng, pool, uses, taken) -> str:
    free = [name for name in pool if name not in taken] or list(pool)
    fewest = min(uses[name] for name in free)
    return rng.choice([name for name in free if uses[name] == fewest])
