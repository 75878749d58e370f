"""Decontamination against a reference benchmark, and dedupe inside a generated set.

The reference is indexed once. A pair can only score above the threshold if its op
overlap does (score = min(structure, ops)), and op overlap is bounded by the op counts:
Jaccard <= min(n, m) / max(n, m). Token length bounds the structure term the same way:
Indel similarity <= 2 min(la, lb) / (la + lb). Pairs that fail either bound are never
scored; the rest are scored exactly. Both bounds are exact, so screening never misses a
pair the exact score would flag (tests/filters/test_decontaminate.py checks it on a sample).
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

from filters.similarity import Fingerprint, op_similarity, score


@dataclass(frozen=True)
class Match:
    """The closest reference task. `similarity` is exact; when no reference passes the
    bounds, it is the exact score against the reference with the most op overlap."""

    similarity: float
    nearest: str | None


@dataclass(frozen=True)
class DedupeResult:
    name: str
    kept: bool
    duplicate_of: str | None = None
    similarity: float | None = None


class SimilarityIndex:
    def __init__(self, fingerprints: list[Fingerprint] = ()):
        self.groups: dict[tuple, list[Fingerprint]] = defaultdict(list)
        self.sizes: list[tuple[int, tuple]] = []  # (op count, op key), sorted
        for fp in fingerprints:
            self.add(fp)

    def add(self, fp: Fingerprint) -> None:
        if fp.ops not in self.groups:
            bisect.insort(self.sizes, (fp.op_count, fp.ops))
        self.groups[fp.ops].append(fp)

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups.values())

    def survivors(self, fp: Fingerprint, threshold: float):
        """Every indexed fingerprint whose bounds allow a score above `threshold`."""
        n = fp.op_count
        low = bisect.bisect_left(self.sizes, (int(n * threshold), ()))
        for count, key in self.sizes[low:]:
            if n and count * threshold > n:
                break
            group = self.groups[key]
            if min(n, count) <= threshold * max(n, count) and (n or count):
                continue
            if op_similarity(fp, group[0]) <= threshold:
                continue
            for other in group:
                la, lb = len(fp.tokens), len(other.tokens)
                if 2 * min(la, lb) > threshold * (la + lb):
                    yield other

    def match(self, fp: Fingerprint, threshold: float) -> Match:
        best = max(((score(fp, other), other.name) for other in self.survivors(fp, threshold)), default=None)
        if best:
            return Match(*best)
        return self._closest_by_ops(fp)

    def _closest_by_ops(self, fp: Fingerprint) -> Match:
        if not self.groups:
            return Match(0.0, None)
        key = max(self.groups, key=lambda k: op_similarity(fp, self.groups[k][0]))
        other = min(self.groups[key], key=lambda o: abs(len(o.tokens) - len(fp.tokens)))
        return Match(score(fp, other), other.name)


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
        if near.similarity > threshold:
            results.append(DedupeResult(fp.name, False, near.nearest, near.similarity))
            continue
        by_digest[fp.digest] = fp.name
        kept.add(fp)
        results.append(DedupeResult(fp.name, True))
    return results
