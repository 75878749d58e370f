"""Decontamination against a reference benchmark, and dedupe inside a generated set.

A match is the larger of two exact maxima: the computed score (traced op sequences, every
reference compared in rapidfuzz's C++ `extractOne`) and the textual score, screened:
the reference is indexed once. A pair can only score above the threshold if its op
overlap does (score = min(structure, ops)); op overlap is a cheap multiset Jaccard found
through an inverted index from op name to groups of reference tasks with the same op
multiset. Token length bounds the structure term: Indel similarity <= 2 min(la, lb) /
(la + lb). Pairs that fail either bound are never scored; the rest are scored exactly. Both bounds are exact, so screening never misses a
pair the exact score would flag (tests/filters/test_decontaminate.py checks it on a sample).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from filters.similarity.score import Fingerprint, nearest_computation, textual_similarity


@dataclass(frozen=True)
class Match:
    """The closest reference task. `similarity` is exact; when no reference passes the
    bounds, it is the exact score against the reference with the most op overlap."""

    similarity: float
    nearest: str | None

    def too_close(self, threshold: float) -> bool:
        """The one accept rule, against the reference and between samples: above `threshold` is out."""
        return self.similarity > threshold


@dataclass(frozen=True)
class DedupeResult:
    name: str
    kept: bool
    duplicate_of: str | None = None
    similarity: float | None = None


class SimilarityIndex:
    """Reference fingerprints grouped by op multiset, with an inverted index from op name to
    groups: a group that shares no op with a task has op overlap 0, so it scores 0 exactly
    on the textual side; and the traced op sequences, compared whole."""

    def __init__(self, fingerprints: list[Fingerprint] = ()):
        self.groups: dict[tuple, list[Fingerprint]] = defaultdict(list)
        self.by_op: dict[str, set[tuple]] = defaultdict(set)
        self.sizes: dict[tuple, int] = {}  # ops in each group's multiset
        self.graphs: list[str] = []  # traced op sequences, and whose they are
        self.graph_names: list[str] = []
        for fp in fingerprints:
            self.add(fp)

    def add(self, fp: Fingerprint) -> None:
        self.groups[fp.ops].append(fp)
        self.sizes[fp.ops] = sum(n for _, n in fp.ops)
        for op, _ in fp.ops:
            self.by_op[op].add(fp.ops)
        if fp.graph:
            self.graphs.append(fp.graph)
            self.graph_names.append(fp.name)

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups.values())

    def survivors(self, fp: Fingerprint, threshold: float, overlaps=None):
        """Every indexed fingerprint whose bounds allow a textual score above `threshold`
        (`overlaps`: `_overlaps(fp)`, where the caller has them)."""
        for key, overlap in self._overlaps(fp) if overlaps is None else overlaps:
            if overlap <= threshold:
                continue
            for other in self.groups[key]:
                la, lb = len(fp.tokens), len(other.tokens)
                if 2 * min(la, lb) > threshold * (la + lb):
                    yield other

    def match(self, fp: Fingerprint, threshold: float) -> Match:
        computed = nearest_computation(fp, self.graphs, self.graph_names)
        return Match(*max(self._textual_match(fp, threshold), computed, key=lambda pair: pair[0]))

    def _textual_match(self, fp: Fingerprint, threshold: float) -> tuple[float, str | None]:
        overlaps = list(self._overlaps(fp))
        best = max(((textual_similarity(fp, other), other.name) for other in self.survivors(fp, threshold, overlaps)),
                   default=None)
        if best:
            return best
        if not overlaps:
            return 0.0, None
        key, _ = max(overlaps, key=lambda pair: pair[1])
        other = min(self.groups[key], key=lambda o: abs(len(o.tokens) - len(fp.tokens)))
        return textual_similarity(fp, other), other.name

    def _overlaps(self, fp: Fingerprint):
        """(group key, op multiset Jaccard) for every group sharing an op with `fp`."""
        if not fp.ops:
            if () in self.groups:
                yield (), 1.0
            return
        keys = set().union(*(self.by_op.get(op, ()) for op, _ in fp.ops))
        mine = dict(fp.ops)
        size = sum(mine.values())
        for key in keys:  # summed over the group's ops: a candidate's helpers can hold ten times as many
            shared = sum(min(n, mine.get(op, 0)) for op, n in key)
            yield key, shared / (size + self.sizes[key] - shared)


def decontaminate(fingerprints: list[Fingerprint], reference: SimilarityIndex, threshold: float) -> list[Match]:
    return [reference.match(fp, threshold) for fp in fingerprints]


def dedupe(fingerprints: list[Fingerprint], threshold: float) -> list[DedupeResult]:
    """Walk in order; keep a task unless it duplicates one already kept (exactly, by its
    canonical digest, or nearly, above `threshold`)."""
    by_digest: dict[str, str] = {}
    kept = SimilarityIndex()
    results = []
    for fp in fingerprints:
        if fp.digest in by_digest:
            results.append(DedupeResult(fp.name, False, by_digest[fp.digest], 1.0))
            continue
        near = kept.match(fp, threshold) if len(kept) else Match(0.0, None)
        if near.too_close(threshold):
            results.append(DedupeResult(fp.name, False, near.nearest, near.similarity))
            continue
        by_digest[fp.digest] = fp.name
        kept.add(fp)
        results.append(DedupeResult(fp.name, True))
    return results
