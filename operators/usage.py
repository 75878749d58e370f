"""How often real model code calls each op: the weight the template composer draws it by.

The corpus is transformers' modeling files (the code the crawl inlines layers from) and the
source of every added library. Calls are found with regular expressions over the source
text: on a 2-core machine, parsing the 538 modeling files into ASTs alone took 5.9 s; this
pass, kornia included, 3.1 s.
A call's first name is resolved through the file's imports, so `nn.Linear(`, `F.gelu(` and
`torch.nn.functional.gelu(` each count for their op; a method call such as `x.softmax(`
counts for the torch function of that name; a library's own names count by their last part
(`box_blur(` for `kornia.filters.box_blur`), however the library re-exports them.
"""
from __future__ import annotations

import functools
import importlib.util
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import torch

from operators.libraries import library_name

CALL = re.compile(r"(?<![\w.)\]])(?<!def )(?<!class )([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\(")
METHOD_ON_EXPRESSION = re.compile(r"[)\]]\.([A-Za-z_]\w*)\s*\(")
IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w.]+)(?:[ \t]+as[ \t]+(\w+))?", re.M)
FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)", re.M)
MAX_FILES_PER_LIBRARY = 5000


@dataclass
class CallCounts:
    qualified: Counter = field(default_factory=Counter)  # "torch.nn.Linear" -> calls
    methods: Counter = field(default_factory=Counter)  # "softmax" -> calls of x.softmax(...)
    leaves: Counter = field(default_factory=Counter)  # ("kornia", "box_blur") -> calls

    def of(self, name: str) -> int:
        """Calls of the op named `name` in the corpus."""
        root, leaf = name.split(".", 1)[0], name.rsplit(".", 1)[-1]
        if root != "torch":
            return self.leaves[(root, leaf)]
        as_method = self.methods[leaf] if name == f"torch.{leaf}" and hasattr(torch.Tensor, leaf) else 0
        return self.qualified[name] + as_method

    def add_file(self, text: str, module: str) -> None:
        aliases = _aliases(text, module)
        for match in CALL.finditer(text):
            first, _, rest = match.group(1).partition(".")
            if first in aliases:
                self._count(aliases[first] + ("." + rest if rest else ""))
            elif rest:
                self.methods[rest.rsplit(".", 1)[-1]] += 1
            else:
                self._count(f"{module}.{first}")
        for match in METHOD_ON_EXPRESSION.finditer(text):
            self.methods[match.group(1)] += 1

    def _count(self, qualified: str) -> None:
        self.qualified[qualified] += 1
        self.leaves[(qualified.split(".", 1)[0], qualified.rsplit(".", 1)[-1])] += 1


def op_usage(names: Iterable[str], libraries: Iterable[str]) -> dict[str, int]:
    """Calls of each named op in the corpus of transformers and the given libraries."""
    counts = corpus_counts(tuple(sorted({library_name(library) for library in libraries})))
    return {name: counts.of(name) for name in names}


@functools.lru_cache(maxsize=4)
def corpus_counts(roots: tuple[str, ...]) -> CallCounts:
    counts = CallCounts()
    for path, module in corpus_files(roots):
        counts.add_file(path.read_text(errors="replace"), module)
    return counts


def corpus_files(roots: tuple[str, ...]) -> list[tuple[Path, str]]:
    """(file, module name) for transformers' modeling files and every file of each other
    root package in `roots`; torch's own source is not model code and is left out."""
    files = []
    transformers = _package_dir("transformers")
    if transformers:
        modeling = sorted(transformers.glob("models/*/modeling_*.py")) + [transformers / "activations.py"]
        files += [(path, _module_name(path, transformers.parent)) for path in modeling if path.exists()]
    for root in roots:
        package = _package_dir(root) if root not in ("torch", "transformers") else None
        if package:
            paths = sorted(package.rglob("*.py"))[:MAX_FILES_PER_LIBRARY]
            files += [(path, _module_name(path, package.parent)) for path in paths]
    return files


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent if spec and spec.origin and spec.origin.endswith("__init__.py") else None


def _module_name(path: Path, site: Path) -> str:
    parts = path.relative_to(site).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _aliases(text: str, module: str) -> dict[str, str]:
    """The names a file imports, each to the dotted name it stands for."""
    aliases = {}
    for match in IMPORT.finditer(text):
        target, alias = match.group(1), match.group(2)
        aliases[alias or target.split(".")[0]] = target if alias else target.split(".")[0]
    for match in FROM_IMPORT.finditer(text):
        source = _absolute(match.group(1), module)
        for item in match.group(2).strip("()").replace("\n", " ").split(","):
            name, _, alias = item.strip().partition(" as ")
            if name and name != "*":
                aliases[(alias or name).strip()] = f"{source}.{name.strip()}"
    return aliases


def _absolute(source: str, module: str) -> str:
    """`..llama.modeling_llama` seen from `transformers.models.x.modeling_x` is
    `transformers.models.llama.modeling_llama`."""
    dots = len(source) - len(source.lstrip("."))
    if not dots:
        return source
    base = module.split(".")[:-dots]
    rest = source[dots:]
    return ".".join(base + ([rest] if rest else []))
