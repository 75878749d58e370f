"""Composers turn jobs into candidate tasks: `template` (offline) and `llm`.

A composer has a `name` and `compose_many(jobs, run_seed)`, which returns, per job, a
Candidate or a (placeholder Candidate, Verdict) reject. The registry is explicit.
"""
from __future__ import annotations

from pathlib import Path

from operators.records import OpSpec


def make_composer(kind: str, catalog: list[OpSpec], *, op_count_mix: dict | None = None,
                  library_mix: dict | None = None, sampling: str = "layers", usage: dict | None = None,
                  llm_settings=None, cache_dir: str = "", drawn: frozenset = frozenset(), reference: tuple = (),
                  similarity_threshold: float = 0.9):
    """`drawn`: the op tuples of earlier rounds, which the template composer draws again only
    when nothing else fits (the LLM composer is given its tuples, pipeline/planning.py).
    `reference`: the run's traced reference fingerprints, which the template composer's chains
    must stay `similarity_threshold` away from (the LLM composer's code is not ours to run
    outside the sandbox: decontamination decides its tasks)."""
    if kind == "template":
        from pipeline.composers.template import TemplateComposer
        return TemplateComposer(catalog, op_count_mix, library_mix, sampling, usage, drawn, reference=reference,
                                similarity_threshold=similarity_threshold)
    if kind == "llm":
        from pipeline.composers.llm import LLMComposer
        return LLMComposer(catalog, llm_settings, Path(cache_dir))
    raise ValueError(f"unknown composer {kind!r}; known: template, llm")
