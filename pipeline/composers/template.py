"""The template composer: shape-aware chaining of 1 to 5 catalog ops, no LLM.

Each op is placed against the shape the previous op produced (computed on the meta
device), so every chain it emits builds and runs at its default sizes. Composition is a
pure function of (run seed, candidate index): a rerun composes the same candidates.
"""
from __future__ import annotations

import math
import random
from collections import Counter

from operators.layouts import LAYOUTS
from operators.records import Candidate, OpSpec, Verdict
from operators.task import BoundOp, bind, chain_output, render_task, task_id

# CUDA-Agent-Ops-6K's op-count mix (share of tasks fusing 1..5 ops).
DEFAULT_OP_COUNT_MIX = {1: 0.034, 2: 0.838, 3: 0.076, 4: 0.028, 5: 0.012}
MAX_ELEMENTS = 1 << 26  # a chain whose intermediate grows past this at default sizes is redrawn
ATTEMPTS = 64


class CompositionFailed(Exception):
    """No chain of the drawn length could be built from the catalog."""


class TemplateComposer:
    name = "template"

    def __init__(self, catalog: list[OpSpec], op_count_mix: dict[int, float] | None = None,
                 library_mix: dict[str, float] | None = None):
        if not catalog:
            raise ValueError("the operator catalog is empty: crawl at least one library")
        self.catalog = sorted(catalog, key=lambda spec: spec.name)
        self.op_count_mix = dict(op_count_mix or DEFAULT_OP_COUNT_MIX)
        self.library_mix = {lib: share for lib, share in (library_mix or {}).items()
                            if any(spec.library == lib for spec in self.catalog)}
        self.base = [spec for spec in self.catalog if spec.library not in self.library_mix] or self.catalog

    def compose_many(self, jobs: list[dict], run_seed: int) -> list:
        """Each job becomes a Candidate, or (placeholder, Verdict) when no chain fits."""
        results = []
        for job in jobs:
            try:
                results.append(self.compose(job["index"], run_seed))
            except CompositionFailed as failure:
                placeholder = Candidate(f"compose-{run_seed}-{job['index']}", (), "", "", self.name, run_seed,
                                        {"index": job["index"]})
                results.append((placeholder, Verdict(placeholder.id, "compose", False, "compose_failed", str(failure))))
        return results

    def compose(self, index: int, run_seed: int) -> Candidate:
        rng = random.Random(f"{run_seed}:{index}")
        num_ops = draw_op_count(rng, self.op_count_mix)
        lead = lead_library(index, self.library_mix)
        first_pool = [spec for spec in self.catalog if spec.library == lead] if lead else self.base
        for _ in range(ATTEMPTS):
            built = self._try_chain(rng, num_ops, first_pool)
            if built:
                chain, layout = built
                code = render_task(chain, layout, layout.sizes)
                ops = tuple(bound.spec.name for bound in chain)
                return Candidate(
                    id=task_id(code), ops=ops, data_source=data_source(chain), code=code,
                    composer=self.name, seed=run_seed, provenance={"index": index, "layout": layout.name},
                )
        raise CompositionFailed(f"no runnable chain of {num_ops} ops after {ATTEMPTS} draws")

    def _try_chain(self, rng: random.Random, num_ops: int, first_pool: list[OpSpec]):
        layout = LAYOUTS[rng.choice(sorted({name for spec in first_pool for name in spec.keeps_rank or spec.layouts}))]
        chain: list[BoundOp] = []
        shape = layout.sizes
        for position in range(num_ops):
            last = position == num_ops - 1
            choices = [spec for spec in (first_pool if position == 0 else self.base)
                       if layout.name in (spec.layouts if last else spec.keeps_rank)
                       and spec.name not in {b.spec.name for b in chain}]
            if not choices:
                return None
            bound = bind(rng.choice(choices), layout, shape)
            try:
                out = chain_output(chain + [bound], layout, layout.sizes)
            except Exception:  # this op does not fit here; draw the chain again
                return None
            if out.numel() == 0 or out.numel() > MAX_ELEMENTS:
                return None
            chain.append(bound)
            shape = tuple(out.shape)
        return chain, layout


def lead_library(index: int, library_mix: dict[str, float]) -> str | None:
    """The library candidate `index` starts from: each library of the mix leads its share of
    candidates at every prefix of the run; the rest draw from the other libraries only."""
    for library, share in sorted(library_mix.items()):
        if math.floor(share * (index + 1)) > math.floor(share * index):
            return library
    return None


def draw_op_count(rng: random.Random, mix: dict[int, float]) -> int:
    counts = sorted(mix)
    return rng.choices(counts, weights=[mix[c] for c in counts])[0]


def data_source(chain: list[BoundOp]) -> str:
    """`<library>#<number of ops>`: a chain that uses any non-torch library is filed under it."""
    libraries = Counter(bound.spec.library for bound in chain)
    others = [lib for lib in libraries if lib != "torch"]
    return f"{others[0] if others else 'torch'}#{len(chain)}"
