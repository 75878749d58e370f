"""The template composer: shape-aware chaining of 1 to 5 catalog ops, no LLM.

Each op is placed against the shape the previous op produced (computed on the meta
device), so every chain it emits builds and runs at its drawn sizes. Composition is a
pure function of (run seed, candidate index): a rerun composes the same candidates.

Two ways to draw a chain (`sampling`):
- `layers` (the default) shapes it like a real fused layer: a compute-heavy anchor (a
  matmul, convolution, attention, recurrent cell; sometimes a normalisation, sometimes with
  padding before it), then an epilogue of normalisation, activations and elementwise math,
  perhaps ending in a reduction or pooling (operators/roles.py). Within a role, an op is
  drawn by how often real model code calls it (operators/usage.py), weighted
  1 + ln(1 + calls): nn.Linear's 5,600 calls in transformers weigh 9.6, an op never called
  weighs 1 (steeper weights repeat the favourites: squared, 37% of 2,000 candidates were
  exact repeats, against 24% with this and 17% drawn uniformly). And
  every fourth candidate is built around the next op of a seeded permutation of the
  catalog, so every op still appears, at the place its role allows, within the first
  4 x (number of ops) candidates.
- `uniform` draws every position uniformly from the ops that fit there: coverage first,
  with no notion of a layer.

A run's later rounds pass the op tuples its earlier rounds drew (`drawn`), and a round's
candidates, composed in order in one `compose_many`, hold back each other's: a draw that
repeats one is drawn again, and kept only when no other chain fits. The layered sampling
otherwise repeats itself as a run grows: in a 3,584-candidate run on the H200, 291 of the
seventh round's 512 candidates were exact repeats (docs/benchmarks-history.md). Composition stays a
pure function of (run seed, index, earlier rounds, the round's earlier indexes), so a
resumed run composes the same.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import hashlib
import itertools
import math
import multiprocessing
import os
import pickle
import random
import signal
import warnings
import zlib
from collections import Counter

import torch

from operators.layouts import LAYOUTS, Layout, draw_sizes
from operators.records import Candidate, OpSpec, Verdict, task_id
from operators.roles import (ANCHOR, EPILOGUE, LAYOUT, NORMALISATION, REAL, REDUCTION, discontinuous, domain_of,
                             feeds, numerically_sensitive, role_of)
from operators.task import BoundOp, bind, chain_output, render_task
from pipeline.composers.screen import ReferenceScreen, checks_fault, screen

# CUDA-Agent-Ops-6K's op-count mix (share of tasks fusing 1..5 ops).
DEFAULT_OP_COUNT_MIX = {1: 0.034, 2: 0.838, 3: 0.076, 4: 0.028, 5: 0.012}
MAX_ELEMENTS = 1 << 26  # a chain whose intermediate grows past this at its drawn sizes is redrawn
ATTEMPTS = 64
# Chains the screens may turn down per candidate, and of them those built around the
# featured op: an op that fails wherever it is placed (floor of a computed value) costs a few
# CPU runs, then the candidate goes on without it.
SCREENS = 12
FEATURED_SCREENS = 4
SAMPLINGS = ("layers", "uniform")
GOLDEN = (math.sqrt(5) - 1) / 2  # the step of draw_op_count's low-discrepancy sequence
COVERAGE_EVERY = 4  # every 4th candidate is built around the next op of the coverage order
# A `compose_many` of this many jobs screens ahead in a pool of processes, whose start (torch
# imported in each) costs seconds: a test's round of 20 composes serially.
SCREEN_POOL_FROM = 128
# The role of a lone op (KernelBench level 1 is mostly matmuls, convolutions, norms, reductions)
# and of each place after a chain's anchor.
SINGLE_ROLES = {ANCHOR: 0.5, NORMALISATION: 0.1, EPILOGUE: 0.2, REDUCTION: 0.15, LAYOUT: 0.05}
MIDDLE_ROLES = {EPILOGUE: 0.6, NORMALISATION: 0.25, REDUCTION: 0.15}
LAST_ROLES = {EPILOGUE: 0.55, REDUCTION: 0.35, NORMALISATION: 0.1}
NORMALISATION_LEADS = 0.15  # LayerNorm -> GELU: a normalisation is the compute-heavy op
LAYOUT_LEADS = 0.1  # ConstantPad2d -> Conv2d -> ...: padding before the anchor (chains of 3 or more)


class CompositionFailed(Exception):
    """No chain of the drawn length could be built from the catalog."""


class TemplateComposer:
    name = "template"

    def __init__(self, catalog: list[OpSpec], op_count_mix: dict[int, float] | None = None,
                 library_mix: dict[str, float] | None = None, sampling: str = "layers",
                 usage: dict[str, int] | None = None, drawn: frozenset[tuple[str, ...]] = frozenset(),
                 numeric_screen: bool = True, checks_screen: bool = True, screen_workers: int | None = None,
                 screen_pool_from: int = SCREEN_POOL_FROM, reference: tuple = (), similarity_threshold: float = 0.9):
        """`usage`: calls of each op in real model code (operators/usage.py); none: all equal.
        `numeric_screen`: run each drawn chain once on the CPU and redraw one whose output the
        sandbox would reject as non-finite, huge or unstable; `checks_screen`: also run the
        sandbox's value checks on it there, and redraw one they reject (off: only to measure
        them). `screen_workers` processes (None: one per core) screen ahead for a
        `compose_many` of `screen_pool_from` jobs or more (`_screen_ahead`). `reference`: the
        run's reference fingerprints (traced); a chain more than `similarity_threshold` similar
        to one of them is redrawn (the reference screen)."""
        self.arguments = dict(catalog=catalog, op_count_mix=op_count_mix, library_mix=library_mix, sampling=sampling,
                              usage=usage, drawn=drawn, numeric_screen=numeric_screen, checks_screen=checks_screen,
                              reference=reference, similarity_threshold=similarity_threshold)
        self.screen_workers = screen_workers or os.cpu_count() or 1
        self.screen_pool_from = screen_pool_from
        if not catalog:
            raise ValueError("the operator catalog is empty: crawl at least one library")
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, not {sampling!r}")
        self.catalog = sorted(catalog, key=lambda spec: spec.name)
        self.op_count_mix = dict(op_count_mix or DEFAULT_OP_COUNT_MIX)
        self.library_mix = {lib: share for lib, share in (library_mix or {}).items()
                            if any(spec.library == lib for spec in self.catalog)}
        self.base = [spec for spec in self.catalog if spec.library not in self.library_mix] or self.catalog
        self.sampling = sampling
        self.drawn = drawn  # the op tuples of earlier rounds' candidates
        self.weight = {spec.name: usage_weight((usage or {}).get(spec.name, 0)) for spec in self.catalog}
        self.by_role: dict[str, list[OpSpec]] = {}
        for spec in self.base:
            self.by_role.setdefault(role_of(spec.name), []).append(spec)
        self.coverage_orders: dict[int, list[OpSpec]] = {}  # run seed -> its permutation of the catalog
        self.numeric_screen, self.checks_screen = numeric_screen, checks_screen
        self.reference = ReferenceScreen(reference, similarity_threshold) if reference else None
        self.screened: dict[bytes, str | None] = {}  # a chain's code (its hash) -> the screen's verdict
        self.screens_run = 0  # chains this process screened (the rest came from `_screen_ahead`)
        self.turned_down: Counter = Counter()  # chains the screens turned down, by screen (its fault's first word)

    def compose_many(self, jobs: list[dict], run_seed: int) -> list:
        """Each job becomes a Candidate, or (placeholder, Verdict) when no chain fits. Jobs
        are composed in order, and each holds back the op tuples the ones before it drew as
        well as earlier rounds' (`drawn`): a run composes a round in one call, so the round's
        candidates do not repeat each other."""
        screens = self.numeric_screen or self.checks_screen or self.reference
        if screens and self.screen_workers > 1 and len(jobs) >= self.screen_pool_from:
            self._screen_ahead(jobs, run_seed)
        results = []
        drawn = set(self.drawn)
        for job in jobs:
            try:
                results.append(self.compose(job["index"], run_seed, frozenset(drawn)))
                drawn.add(results[-1].ops)
            except CompositionFailed as failure:
                placeholder = Candidate(f"compose-{run_seed}-{job['index']}", (), "", "", self.name, run_seed,
                                        {"index": job["index"]})
                results.append((placeholder, Verdict(placeholder.id, "compose", False, "compose_failed", str(failure))))
        return results

    def _screen_ahead(self, jobs: list[dict], run_seed: int) -> None:
        """Fill the screens' cache in parallel: `screen_workers` processes compose the jobs
        each on its own, holding back earlier rounds' op tuples but not the round's, and send
        back the verdicts they screened. The serial pass after it draws the same chains but
        where a round's own candidates repeat one another, and finds them screened:
        composition stays a pure function of the same arguments, and its CPU runs (75 ms a
        candidate here, 30 s a round of 512) are spread over every core."""
        pool = _screening_pool({**self.arguments, "drawn": frozenset()}, self.screen_workers)
        chunk = max(1, len(jobs) // (4 * self.screen_workers))
        indexes = [job["index"] for job in jobs]
        with _one_thread_each():  # the pool's processes start at its first map
            for verdicts in pool.map(_screened_by_composing, indexes, itertools.repeat(run_seed),
                                     itertools.repeat(self.drawn), chunksize=chunk):
                self.screened.update(verdicts)

    def compose(self, index: int, run_seed: int, drawn: frozenset[tuple[str, ...]] | None = None) -> Candidate:
        """Candidate `index` of the run seeded `run_seed`; `drawn`: the op tuples it draws
        again only when nothing else fits (default: the earlier rounds' this composer holds)."""
        drawn = self.drawn if drawn is None else drawn
        rng = random.Random(f"{run_seed}:{index}")
        num_ops = draw_op_count(index, run_seed, self.op_count_mix)
        lead = lead_library(index, self.library_mix)
        first_pool = [spec for spec in self.catalog if spec.library == lead] if lead else self.base
        featured = self._featured(index, run_seed) if self.sampling == "layers" and not lead else None
        repeat = None  # the first chain of ops an earlier round drew: taken only if no other fits
        faults: list[str] = []  # what the screens found in each chain it turned down
        for attempt in range(ATTEMPTS):
            if len(faults) >= SCREENS:
                break
            if featured is not None and (attempt >= ATTEMPTS // 2 or len(faults) >= FEATURED_SCREENS):
                featured = None  # the featured op gets half the draws; a chain without it beats no chain
            if self.sampling == "uniform":
                built = self._try_chain(rng, num_ops, first_pool)
            else:
                built = self._try_layer(rng, num_ops, first_pool if lead else None, featured)
            if built and tuple(bound.spec.name for bound in built[0]) in drawn:
                repeat = repeat or built
            elif built and not self._screened_out(built, faults):
                return self._candidate(*built, index, run_seed)
        if repeat and not self._screened_out(repeat, faults):
            return self._candidate(*repeat, index, run_seed)
        if faults:
            raise CompositionFailed(f"no chain of {num_ops} ops passed the screens in {len(faults)} tries; "
                                    f"last: {faults[-1]}")
        raise CompositionFailed(f"no runnable chain of {num_ops} ops after {ATTEMPTS} draws")

    def _screened_out(self, built, faults: list[str]) -> bool:
        """Run the screens (pipeline/composers/screen.py) on a drawn chain: the numeric screen
        where it holds a numerically sensitive op (operators/roles.py), then the checks screen,
        then the reference screen; a fault is noted in `faults`. The verdict is cached by the
        chain's code, which decides it."""
        chain, layout = built
        if not self.numeric_screen and not self.checks_screen and not self.reference:
            return False
        code = render_task(chain, layout, layout.sizes)
        key = hashlib.sha256(code.encode()).digest()
        if key not in self.screened:
            sensitive = self.numeric_screen and any(numerically_sensitive(bound.spec.name) for bound in chain)
            fault = screen(chain, layout) if sensitive else None
            fault = fault or (checks_fault(code) if self.checks_screen else None)
            self.screened[key] = fault or (self.reference.fault(code) if self.reference else None)
            self.screens_run += 1
        if self.screened[key]:
            faults.append(f"{' + '.join(bound.spec.name for bound in chain)}: {self.screened[key]}")
            self.turned_down[self.screened[key].split(":")[0].split("/")[0]] += 1
        return bool(self.screened[key])

    def _candidate(self, chain: list[BoundOp], layout, index: int, run_seed: int) -> Candidate:
        code = render_task(chain, layout, layout.sizes)
        return Candidate(id=task_id(code), ops=tuple(bound.spec.name for bound in chain), data_source=data_source(chain),
                         code=code, composer=self.name, seed=run_seed,
                         provenance={"index": index, "layout": layout.name})

    def _featured(self, index: int, run_seed: int) -> OpSpec | None:
        """The op candidate `index` is built around: every COVERAGE_EVERY-th candidate takes
        the next op of a permutation of the catalog that depends only on the run seed."""
        if index % COVERAGE_EVERY:
            return None
        if run_seed not in self.coverage_orders:
            self.coverage_orders[run_seed] = sorted(
                self.base, key=lambda spec: (zlib.crc32(f"{run_seed}:{spec.name}".encode()), spec.name))
        order = self.coverage_orders[run_seed]
        return order[(index // COVERAGE_EVERY) % len(order)]

    def _try_layer(self, rng: random.Random, num_ops: int, lead_pool: list[OpSpec] | None,
                   featured: OpSpec | None):
        """One draw of a layer-shaped chain; None when this draw does not fit together."""
        roles = layer_roles(rng, num_ops)
        pinned = None
        if featured is not None:
            roles, pinned = place(role_of(featured.name), roles, bool(featured.keeps_rank))
            roles, pinned = make_way(featured.name, roles, pinned)
            num_ops = len(roles)
        pools = [[featured] if position == pinned else self.by_role.get(role, []) for position, role in enumerate(roles)]
        if lead_pool is not None:
            pools[0] = lead_pool
        # The op that decides the layout (the featured op, else the first) is drawn first, by
        # weight; a layout drawn first would favour ops that run on every layout (nn.Linear).
        decider = pinned if pinned is not None else 0
        fits = lambda spec: spec.layouts if decider == num_ops - 1 else spec.keeps_rank  # noqa: E731
        choices = [spec for spec in pools[decider] if fits(spec)] or [spec for spec in self.base if fits(spec)]
        if not choices:
            return None
        first = self._draw_op(rng, choices)
        layout = sized(LAYOUTS[rng.choice(sorted(fits(first)))], rng, first)
        pools[decider] = [first]
        chain: list[BoundOp] = []
        shape = layout.sizes
        for position, pool in enumerate(pools):
            last, used = position == num_ops - 1, {b.spec.name for b in chain}
            previous = chain[-1].spec.name if chain else None
            feeds_next = pinned is not None and position == pinned - 1  # must put out what the featured op takes
            fitting = lambda specs: [spec for spec in specs  # noqa: E731
                                     if layout.name in (spec.layouts if last else spec.keeps_rank)
                                     and spec.name not in used and feeds(previous, spec.name)
                                     and (not feeds_next or feeds(spec.name, featured.name))]
            # A catalog with no op of this role for this layout (one added library alone) lends any op.
            choices = fitting(pool) or fitting(self.base)
            if not choices:
                return None
            shape = _append(chain, self._draw_op(rng, choices), layout, shape)
            if shape is None:
                return None
        return chain, layout

    def _try_chain(self, rng: random.Random, num_ops: int, first_pool: list[OpSpec]):
        layout = LAYOUTS[rng.choice(sorted({name for spec in first_pool for name in spec.keeps_rank or spec.layouts}))]
        layout = sized(layout, rng)
        chain: list[BoundOp] = []
        shape = layout.sizes
        for position in range(num_ops):
            last, used = position == num_ops - 1, {b.spec.name for b in chain}
            previous = chain[-1].spec.name if chain else None
            choices = [spec for spec in (first_pool if position == 0 else self.base)
                       if layout.name in (spec.layouts if last else spec.keeps_rank) and spec.name not in used
                       and feeds(previous, spec.name)]
            if not choices:
                return None
            shape = _append(chain, rng.choice(choices), layout, shape)
            if shape is None:
                return None
        return chain, layout

    def _draw_op(self, rng: random.Random, choices: list[OpSpec]) -> OpSpec:
        return rng.choices(choices, weights=[self.weight[spec.name] for spec in choices])[0]


def sized(layout: Layout, rng: random.Random, first: OpSpec | None = None) -> Layout:
    """The layout at sizes drawn for this candidate (operators/layouts.py). A chain led by an
    inlined layer keeps the default sizes its config was resolved against."""
    if first is not None and first.definitions:
        return layout
    return draw_sizes(layout, rng)


def _append(chain: list[BoundOp], spec: OpSpec, layout, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Bind `spec` against `shape` and add it to `chain`: the shape it puts out, or None when
    it does not fit there (the draw is then given up)."""
    bound = bind(spec, layout, shape)
    try:
        out = chain_output(chain + [bound], layout, layout.sizes)
    except Exception:  # this op does not fit here
        return None
    if out.numel() == 0 or out.numel() > MAX_ELEMENTS:
        return None
    chain.append(bound)
    return tuple(out.shape)


def usage_weight(calls: int) -> float:
    return 1 + math.log1p(calls)


def layer_roles(rng: random.Random, num_ops: int) -> list[str]:
    """The role of each place in a chain of `num_ops` ops shaped like a fused layer."""
    if num_ops == 1:
        return [_draw(rng, SINGLE_ROLES)]
    if num_ops >= 3 and rng.random() < LAYOUT_LEADS:
        roles = [LAYOUT, ANCHOR]
    else:
        roles = [NORMALISATION if rng.random() < NORMALISATION_LEADS else ANCHOR]
    while len(roles) < num_ops:
        mix = LAST_ROLES if len(roles) == num_ops - 1 else MIDDLE_ROLES
        if roles[-1] == NORMALISATION:  # one normalisation after another is no layer
            mix = {role: share for role, share in mix.items() if role != NORMALISATION}
        roles.append(_draw(rng, mix))
    return roles


def place(role: str, roles: list[str], keeps_rank: bool = True) -> tuple[list[str], int]:
    """Where an op of `role` goes in a chain drawn as `roles`: (the roles, its position).
    An anchor takes the anchor's place and padding goes before it; a reduction, or an op
    that changes its input's rank, goes last; anything else right after the anchor."""
    if len(roles) == 1:
        return [role], 0
    if role == LAYOUT and keeps_rank:
        rest = roles[2:] if roles[0] == LAYOUT else roles[1:]
        return ([LAYOUT, ANCHOR] + rest)[:len(roles)], 0
    anchor = 1 if roles[0] == LAYOUT else 0
    if not keeps_rank or role in (REDUCTION, LAYOUT):
        position = len(roles) - 1
    elif role == ANCHOR or role == roles[anchor]:
        position = anchor
    else:
        position = anchor + 1
    return roles[:position] + [role] + roles[position + 1:], position


def make_way(name: str, roles: list[str], position: int) -> tuple[list[str], int]:
    """Where `place` put an op, moved to where its input suits it (operators/roles.py): an op
    that jumps stands alone, on the chain's own input (first in a longer chain, it would break
    the layer's shape); an op with a restricted domain that would follow the anchor (whose
    output is any real) moves one place on, behind an epilogue whose range fits it
    (Linear -> sigmoid -> log); a chain of two grows to three."""
    if position and discontinuous(name):
        return [roles[position]], 0
    if position == 0 or domain_of(name) == REAL or roles[position - 1] == EPILOGUE:
        return roles, position
    grown = roles[:position] + [EPILOGUE] + roles[position:]
    return grown[:max(len(roles), position + 2)], position + 1


# The screening processes of `_screen_ahead`, kept from round to round (each one imports torch
# and receives the catalog: seconds), for the composer arguments they were started with.
_pool: tuple[bytes, int, concurrent.futures.ProcessPoolExecutor] | None = None
_worker_composer: TemplateComposer | None = None  # in a screening process
SCREEN_START_METHOD = "forkserver"  # how the screening processes start (see _screening_pool)


def _screening_pool(arguments: dict, workers: int) -> concurrent.futures.ProcessPoolExecutor:
    global _pool
    key = hashlib.sha256(pickle.dumps(arguments)).digest()
    if _pool is not None and _pool[:2] == (key, workers):
        return _pool[2]
    _stop_screening()
    # Not a fork of the caller, which may hold threads (a fork could copy a held lock), and not a
    # spawn either: each spawned process imports torch on its own, 18.2 s for 8 processes on
    # this 2-core host against 4.8 s from a fork server that imported it once (and on the H200
    # host, where a fresh Python with torch took 19 s, a round of 320 was composed in 141 s
    # against 16 s for 64 composed serially).
    context = multiprocessing.get_context(SCREEN_START_METHOD)
    context.set_forkserver_preload([__name__])  # read when the server starts, once a process
    _pool = (key, workers, concurrent.futures.ProcessPoolExecutor(workers, context, initializer=_start_screening,
                                                                  initargs=(arguments,)))
    return _pool[2]


@atexit.register
def _stop_screening() -> None:
    global _pool
    if _pool is not None:
        _pool[2].shutdown(cancel_futures=True)
        _pool = None


@contextlib.contextmanager
def _one_thread_each():
    """The screening processes started meanwhile run their math libraries on one thread each:
    one process a core, and torch.set_num_threads (in `_start_screening`) comes after numpy's
    and OpenMP's thread pools are sized from the environment at import."""
    saved = {name: os.environ.get(name) for name in ONE_THREAD}
    os.environ.update(ONE_THREAD)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def _start_screening(arguments: dict) -> None:
    global _worker_composer
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the pool
    torch.set_num_threads(1)  # one process per core
    warnings.filterwarnings("ignore")
    _worker_composer = TemplateComposer(**arguments, screen_workers=1)


def _screened_by_composing(index: int, run_seed: int, drawn: frozenset) -> dict:
    """The screens' verdicts composing candidate `index` took (the process's cache's new entries)."""
    known = len(_worker_composer.screened)
    try:
        chosen = _worker_composer.compose(index, run_seed, drawn)
        # The serial pass draws on where a round's earlier candidate took this op tuple: the
        # chains it would screen next are screened here too, beside the other processes.
        _worker_composer.compose(index, run_seed, drawn | {chosen.ops})
    except CompositionFailed:
        pass
    return dict(itertools.islice(_worker_composer.screened.items(), known, None))


def _draw(rng: random.Random, mix: dict[str, float]) -> str:
    return rng.choices(list(mix), weights=list(mix.values()))[0]


def lead_library(index: int, library_mix: dict[str, float]) -> str | None:
    """The library candidate `index` starts from: each library of the mix leads its share of
    any run of consecutive candidates, to within one (so a round leads its share even when
    the share changes from round to round); the rest draw from the other libraries only."""
    for library, share in sorted(library_mix.items()):
        if math.floor(share * (index + 1)) > math.floor(share * index):
            return library
    return None


def draw_op_count(index: int, run_seed: int, mix: dict[int, float]) -> int:
    """The op count of candidate `index`: the index-th point of a Weyl sequence (steps of the
    golden ratio from a seeded start) read through the mix's cumulative shares. Any run of
    consecutive indexes then holds each count in its share to within a few candidates, where
    independent draws stray by the square root (five-op chains: 6 +- 2.4 in 500), so a round
    composes the mix it was given (pipeline/sampling.py steers that mix round by round)."""
    point = (zlib.crc32(f"op-count:{run_seed}".encode()) / 2**32 + index * GOLDEN) % 1.0
    counts = sorted(count for count in mix if mix[count] > 0)
    total = sum(mix[count] for count in counts)
    reached = 0.0
    for count in counts:
        reached += mix[count] / total
        if point < reached:
            return count
    return counts[-1]


def data_source(chain: list[BoundOp]) -> str:
    """`<library>#<number of ops>`: a chain that uses any non-torch library is filed under it."""
    libraries = Counter(bound.spec.library for bound in chain)
    others = [lib for lib in libraries if lib != "torch"]
    return f"{others[0] if others else 'torch'}#{len(chain)}"
