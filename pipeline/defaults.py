"""What every command reads before any heavy import (a cached `opsynth crawl` imports
neither torch nor Beam): where caches live, and the error a configuration problem raises."""
from __future__ import annotations

import os
from pathlib import Path


class ConfigError(ValueError):
    """A configuration problem the user must fix; the CLI prints it and exits with 2."""


def default_cache_dir() -> str:
    return os.environ.get("OPSYNTH_CACHE_DIR") or str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "opsynth")
