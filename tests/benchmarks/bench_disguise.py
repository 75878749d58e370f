"""Decontamination against disguise, on a real KernelBench checkout.

    python -m tests.benchmarks.bench_disguise /path/to/KernelBench [--candidates 1000] [--workers 2] [--device cuda]

Every task of levels 1-3 is traced in the sandbox, then disguised in each way of
tests/disguise.py (sizes as products, aliased imports, an identity op, a helper method,
reordered definitions, renamed and renumbered, all together) and rewritten in each way
(activations written out in the ops they are made of, forward under a condition on the
data, the batch computed in two halves, all three), traced again, and matched against the
whole reference. Prints, per disguise, how many copies score above the
threshold with the textual score alone (the score before tracing) and with the combined
score; the scores between distinct level-2 tasks (false positives among the benchmark's
own tasks); the scores of template candidates against KernelBench; and the time to match
10,000 candidates (fingerprints and traces cached, as a run has them).
"""
from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from filters.similarity.decontaminate import SimilarityIndex
from filters.similarity.reference import load_reference, trace_all, traced
from filters.sandbox.pool import SandboxOptions, WorkerPool
from filters.similarity.score import fingerprint, score, textual_similarity
from operators.catalog import crawl
from pipeline.composers.template import CompositionFailed, TemplateComposer
from tests.disguise import EQUIVALENTS, KINDS, REWRITES, NotApplicable


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kernelbench")
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--cache-dir", default=None, help="traced op sequences (default: a temporary folder)")
    parser.add_argument("--kinds", nargs="*", default=None, help="disguises and rewrites to run (default: all)")
    parser.add_argument("--tasks", default=None, help="a folder of .py candidates (default: compose template ones)")
    parser.add_argument("--levels", type=int, nargs="*", default=[1, 2, 3], help="KernelBench levels to disguise")
    parser.add_argument("--no-templates", action="store_true", help="skip the template candidates and the speed run")
    parser.add_argument("--device", default="cpu", help="where a copy (and a reference task) is read at its own "
                        "sizes, as a run's checks would have run it: cpu or cuda")
    args = parser.parse_args()
    cache = args.cache_dir or tempfile.mkdtemp(prefix="opsynth-bench-disguise-")

    with WorkerPool(args.workers, sandbox_options(args.device, args.workers)) as pool:
        began = time.perf_counter()
        reference = traced(load_reference(args.kernelbench, tuple(args.levels)), pool, cache,
                           {"device": args.device, "seed": 0})
        print(f"reference: {len(reference.fingerprints)} tasks, {reference.traced} traced "
              f"in {time.perf_counter() - began:.0f} s")
        index = SimilarityIndex(reference.fingerprints)
        textual_index = SimilarityIndex([replace(fp, graph="") for fp in reference.fingerprints])
        copies = disguises(reference, index, textual_index, pool, cache, args.threshold, args.kinds, args.levels,
                           args.device)
        false_positives(reference, args.threshold)
        if args.no_templates:  # the traced disguised copies stand in for candidates: all are near a reference task
            speed([fp for fp, _ in copies], [code for _, code in copies], index, args.threshold)
            return
        codes = ([path.read_text() for path in sorted(Path(args.tasks).glob("*.py"))][:args.candidates] if args.tasks
                 else template_codes(args.candidates, 0))
        fingerprints = candidates(codes, pool, cache)
    templates(fingerprints, index, textual_index, args.threshold)
    speed(fingerprints, codes, index, args.threshold)


def sandbox_options(device: str, workers: int) -> SandboxOptions:
    """The pool's options; on a GPU, a run's: the timing lock and GPU memory counted per job."""
    if device == "cpu":
        return SandboxOptions(timeout_s=120, threads=1, warm_up=False)
    from pipeline.devices import gpu_lock_dir, gpu_share_gb, job_memory_gb
    return SandboxOptions(device=device, timeout_s=120, threads=1, warm_up=False, memory_guard="rss",
                          timing_lock_dir=gpu_lock_dir(), gpu_memory_gb=job_memory_gb([0], workers),
                          gpu_pool_gb=gpu_share_gb([0], 1))


def disguises(reference, index, textual_index, pool, cache, threshold, kinds=None, levels=(1, 2, 3),
              device: str = "cpu") -> list:
    """Each kind of disguise of every task it applies to (a written form needs the op it
    rewrites), traced and matched against the whole reference. Returns the traced copies,
    (fingerprint, code)."""
    print(f"\ndisguised copies of every task caught above {threshold} (textual alone -> combined):")
    traced_copies = []
    for kind, disguise in {**KINDS, **REWRITES, **EQUIVALENTS}.items():
        if kinds and kind not in kinds:
            continue
        copies = []
        for fp, code in zip(reference.fingerprints, reference.codes):
            if int(fp.name.split("/")[0].removeprefix("level") or 0) not in levels:
                continue
            try:
                copies.append((fp.name, disguise(code)))
            except (StopIteration, SyntaxError, ValueError, IndexError, NotApplicable):  # nothing to rewrite
                continue
        graphs = trace_all([code for _, code in copies], pool, cache, as_candidates=True, device=device)
        prints = [fingerprint(code, name, graph) for (name, code), graph in zip(copies, graphs)]
        textual = sum(textual_index.match(fp, threshold).similarity > threshold for fp in prints)
        # a copy whose trace failed is rejected as `untraced` in a run (pipeline/transforms.py)
        combined = sum(graph is None or index.match(fp, threshold).similarity > threshold
                       for fp, graph in zip(prints, graphs))
        untraced = sum(graph is None for graph in graphs)
        missed = [fp.name for fp, graph in zip(prints, graphs)
                  if graph is not None and index.match(fp, threshold).similarity <= threshold]
        print(f"  {kind:14s} {textual:3d} -> {combined:3d} of {len(prints)} ({untraced} copies not traceable, "
              "rejected as untraced)"
              + (f"; missed: {', '.join(n.split(' ')[0] for n in missed[:6])}" if missed else ""), flush=True)
        traced_copies += [(fp, code) for fp, (_, code) in zip(prints, copies) if fp.graph]
    return traced_copies


def false_positives(reference, threshold) -> None:
    level2 = [fp for fp in reference.fingerprints if fp.name.startswith("level2/")]
    pairs = list(itertools.combinations(level2, 2))
    for label, measure in (("textual", textual_similarity), ("combined", score)):
        scores = [measure(a, b) for a, b in pairs]
        buckets = Counter(min(int(s * 10), 9) / 10 for s in scores)
        above = [(a.name, b.name) for (a, b), s in zip(pairs, scores) if s > threshold]
        print(f"\nscores between distinct level-2 tasks, {label}: {len(pairs)} pairs, {len(above)} above {threshold}")
        print("  " + ", ".join(f"[{low:.1f},{low + 0.1:.1f}) {buckets[low]}" for low in sorted(buckets)))
        for a, b in above[:8]:
            print(f"    {a} ~ {b}")


def template_codes(count: int, seed: int) -> list[str]:
    """The first `count` template candidates the torch catalog composes with `seed`."""
    composer = TemplateComposer(crawl(["torch"])[0])
    codes = []
    for i in itertools.count():
        if len(codes) == count:
            return codes
        try:
            codes.append(composer.compose(i, seed).code)
        except CompositionFailed:
            continue


def candidates(codes, pool, cache) -> list:
    began = time.perf_counter()
    graphs = trace_all(codes, pool, cache)
    print(f"\n{len(codes)} template candidates traced in {time.perf_counter() - began:.0f} s "
          f"({sum(bool(g) for g in graphs)} traceable)")
    return [fingerprint(code, f"c{i}", graph) for i, (code, graph) in enumerate(zip(codes, graphs))]


def templates(fingerprints, index, textual_index, threshold) -> None:
    print(f"template candidates above {threshold} against KernelBench, by op count (textual -> combined):")
    rows: dict = {}
    for fp in fingerprints:
        ops = sum(n for _, n in fp.ops) if not fp.graph else len(fp.graph)
        row = rows.setdefault(min(ops, 5), [0, 0, 0])
        row[0] += 1
        row[1] += textual_index.match(fp, threshold).similarity > threshold
        row[2] += index.match(fp, threshold).similarity > threshold
    for ops, (total, textual, combined) in sorted(rows.items()):
        print(f"  {ops}{'+' if ops == 5 else ''} traced ops: {textual} -> {combined} of {total}")


def speed(fingerprints, codes, index, threshold, count: int = 10_000) -> None:
    batch = [replace(fp, name=f"{fp.name}#{i}") for i, fp in zip(range(count), itertools.cycle(fingerprints))]
    began = time.perf_counter()
    flagged = sum(index.match(fp, threshold).similarity > threshold for fp in batch)
    match_s = time.perf_counter() - began
    each_s = _fingerprint_time(codes[:200])
    print(f"\n{count} candidates matched against {len(index)} reference tasks in {match_s:.1f} s "
          f"({flagged} flagged); fingerprinting {each_s * 1e3:.2f} ms a candidate, so "
          f"{match_s + each_s * count:.0f} s for {count} end to end (tracing is part of validation)")


def _fingerprint_time(codes: list[str]) -> float:
    """Seconds to fingerprint one candidate (parse, canonicalise, encode), over these."""
    began = time.perf_counter()
    for i, code in enumerate(codes):
        fingerprint(code, str(i), "mm add relu")
    return (time.perf_counter() - began) / len(codes)


if __name__ == "__main__":
    main()
