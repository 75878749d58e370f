"""Op sources: where the crawl finds operators.

A source is a callable returning (display name, object) pairs for one library. Built-in
sources are `torch` and `transformers` (layer classes inlined into self-contained source,
yielded as InlinedOp); any importable module name is crawled by walking its public names;
third-party packages register more under the entry-point group `opsynth.op_sources`.
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from operators.libraries import UnknownLibrary
from operators.transformers_source import transformers_ops

ENTRY_POINT_GROUP = "opsynth.op_sources"
# A source yields (qualified name, object) pairs, or (name, object, call recipe) when it
# knows arguments that work (torch's OpInfo samples); the prober fills in the rest.
OpSource = Callable[[], Iterable[tuple]]


def torch_ops() -> Iterable[tuple[str, object]]:
    yield from _torch_namespace_ops()
    yield from opinfo_ops()


def _torch_namespace_ops() -> Iterable[tuple[str, object]]:
    for attr in sorted(dir(nn)):
        obj = getattr(nn, attr)
        if isinstance(obj, type) and issubclass(obj, nn.Module):
            yield f"torch.nn.{attr}", obj
    for attr in sorted(dir(F)):
        obj = getattr(F, attr)
        if callable(obj) and not isinstance(obj, type) and not attr.startswith("_"):
            yield f"torch.nn.functional.{attr}", obj
    # torch.* tensor ops: the functions that are also Tensor methods (this leaves out
    # global-state setters such as set_default_dtype, which are not).
    for attr in sorted(dir(torch)):
        obj = getattr(torch, attr)
        if callable(obj) and not isinstance(obj, type) and hasattr(torch.Tensor, attr) and not attr.startswith("_"):
            yield f"torch.{attr}", obj


def opinfo_ops(shard: int = 0, shards: int = 1) -> Iterable[tuple]:
    """torch's own registry of ops with sample inputs known to be valid (OpInfo op_db; it
    needs the expecttest package). Each op comes with the arguments of its first sample
    whose input is one float tensor and whose other arguments are plain values. Building
    samples is most of a torch crawl's enumeration: a shard builds those of the op names
    whose rank (in order of first appearance) is `shard` modulo `shards`."""
    return (entry for _, entry in _opinfo_ops(shard, shards))


def _opinfo_ops(shard: int, shards: int) -> Iterable[tuple[int, tuple]]:
    """(position in op_db, entry) for opinfo_ops."""
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except Exception:  # an older or trimmed torch without the registry: signature probing only
        return
    seen, ranks = set(), {}
    for position, info in enumerate(op_db):
        name = "torch." + info.name
        if ranks.setdefault(name, len(ranks)) % shards != shard:
            continue
        obj = _resolve(name)
        if name in seen or obj is None:
            continue
        recipe = _sample_recipe(info, obj)
        if recipe is not None:
            seen.add(name)
            yield position, (name, obj, recipe)


def _resolve(name: str):
    target = torch
    for part in name.split(".")[1:]:
        target = getattr(target, part, None)
        if target is None:
            return None
    return target if callable(target) and not isinstance(target, type) else None


def _sample_recipe(info, op) -> dict | None:
    try:
        samples = info.sample_inputs("cpu", torch.float32)
        for sample in samples:
            values = list(sample.args) + list(sample.kwargs.values())
            if (isinstance(sample.input, torch.Tensor) and sample.input.dim() >= 1 and sample.input.numel()
                    and all(isinstance(v, (int, float, bool, str, tuple, list, type(None))) for v in values)
                    and not any(isinstance(v, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in v)
                                for v in values)
                    and not _identity_on(op, sample)):
                recipe = dict(sample.kwargs)
                if sample.args:
                    recipe["__args__"] = list(sample.args)
                return recipe
    except Exception:  # a registry entry that cannot build samples here
        return None
    return None


def _identity_on(op, sample) -> bool:
    """Whether `op`, with the sample's arguments, returns its input unchanged: on the sample's
    own input and on values of both signs in its shape. OpInfo's first sample of
    pixel_shuffle has a factor of 1 (the sandbox rejected every task built on it as
    redundant_op), softshrink's a lambda of 0, diff's an order of 0."""
    count = sample.input.numel()
    signed = (torch.arange(count) / count + 1) * torch.tensor([1.0, -1.0]).repeat((count + 1) // 2)[:count]
    for given in (sample.input, signed.reshape(sample.input.shape).to(sample.input.dtype)):
        before = given.clone()  # an in-place op returns its input, changed
        try:
            with torch.no_grad():
                out = op(given, *sample.args, **sample.kwargs)
        except Exception:  # a sample this build cannot run: the prober decides on it
            return False
        if not (isinstance(out, torch.Tensor) and out.shape == before.shape and torch.equal(out, before)):
            return False
    return True


def module_ops(module_name: str) -> OpSource:
    def walk() -> Iterable[tuple[str, object]]:
        module = importlib.import_module(module_name)
        public = getattr(module, "__all__", None) or [a for a in dir(module) if not a.startswith("_")]
        for attr in sorted(public):
            obj = getattr(module, attr, None)
            if isinstance(obj, type) and issubclass(obj, nn.Module) or callable(obj) and not isinstance(obj, type):
                yield f"{module_name}.{attr}", obj
    return walk


BUILTIN_SOURCES: dict[str, OpSource] = {"torch": torch_ops, "transformers": transformers_ops}


def registered_sources() -> dict[str, OpSource]:
    sources = dict(BUILTIN_SOURCES)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in sources:
            raise ValueError(f"op source {entry.name!r} is registered twice (entry point {entry.value})")
        sources[entry.name] = entry.load()
    return sources


def source_shard(library: str, shard: int, shards: int) -> Iterable[tuple[tuple, tuple]]:
    """One of `shards` parts of what source_for(library) yields, each entry with a key that
    orders it among all parts as the whole source orders it (the parts, merged by key, are
    the source). A part computes only its own entries where the source allows: torch's
    OpInfo samples by op name, transformers by family; any other source is walked whole by
    every part, each keeping every `shards`-th entry."""
    name, _, selector = library.partition(":")
    if library == "torch":
        namespace = list(_torch_namespace_ops())
        yield from (((0, i), entry) for i, entry in enumerate(namespace) if i % shards == shard)
        yield from (((1, position), entry) for position, entry in _opinfo_ops(shard, shards))
    elif name == "transformers":
        families = sorted(selector.split(",")) if selector else transformers_families()
        for f, family in enumerate(families):
            if f % shards == shard:
                yield from (((f, i), entry) for i, entry in enumerate(transformers_ops([family])))
    else:
        yield from (((i,), entry) for i, entry in enumerate(source_for(library)()) if i % shards == shard)


def transformers_families() -> list[str]:
    import pkgutil

    import transformers.models
    return sorted(m.name for m in pkgutil.iter_modules(transformers.models.__path__))


def source_for(library: str) -> OpSource:
    """The source for a --library value: a registered name, optionally with a selector after
    a colon that the source receives (`transformers:llama,bert` crawls two families), or an
    importable module name."""
    sources = registered_sources()
    name, _, selector = library.partition(":")
    if name in sources:
        source = sources[name]
        return (lambda: source(selector.split(","))) if selector else source
    try:
        importlib.import_module(library)
    except ImportError as error:
        raise UnknownLibrary(
            f"--library {library!r} is neither a registered op source ({', '.join(sorted(sources))}) "
            f"nor an importable module ({error}); install it or fix the name"
        ) from None
    return module_ops(library)
