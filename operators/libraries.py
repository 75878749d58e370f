"""What a --library value names: read by every command, so nothing here imports torch (a
cached `opsynth crawl` imports neither torch nor Beam)."""
from __future__ import annotations

DEFAULT_LIBRARIES = ("torch", "transformers")


class UnknownLibrary(ValueError):
    """A --library value that is neither a registered source nor an importable module."""


def library_name(library: str) -> str:
    """The library an op of this --library value belongs to: `transformers:llama` -> transformers."""
    return library.partition(":")[0].split(".")[0]
