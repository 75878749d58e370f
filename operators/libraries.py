"""What a --library value names: read by every command, so nothing here imports torch (a
cached `opsynth crawl` imports neither torch nor Beam)."""
from __future__ import annotations

DEFAULT_LIBRARIES = ("torch", "transformers")


class UnknownLibrary(ValueError):
    """A --library value that is neither a registered source nor an importable module."""


def library_name(library: str) -> str:
    """The library an op of this --library value belongs to: `transformers:llama` -> transformers."""
    return library.partition(":")[0].split(".")[0]


def is_added(library_or_op: str) -> bool:
    """Whether a --library value or an op name belongs to an added library (kornia, einops):
    one a task imports, and whose ops a user names to load its rows (torch and transformers,
    whose layers are inlined, are not)."""
    return library_name(library_or_op) not in DEFAULT_LIBRARIES
