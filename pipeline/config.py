"""The run configuration: defaults < config file (YAML) < command-line flags.

Every flag has a config key of the same name (`--num-samples` is `num_samples`). A bad key
or value raises ConfigError with a message that names the problem and the fix.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from filters.checks.registry import DEFAULTS as CHECK_DEFAULTS
from filters.sandbox.pool import SandboxOptions
from pipeline.composers.llm import LLMSettings
from operators.libraries import DEFAULT_LIBRARIES, is_added, library_name
from pipeline.composers.template import DEFAULT_OP_COUNT_MIX, SAMPLINGS
from pipeline.defaults import ConfigError, default_cache_dir

RECIPES_DIR = Path(__file__).parent / "recipes"
COMPOSERS = ("template", "llm")
# The llm: keys and their defaults are LLMSettings' own (the run's target_ms is passed apart).
LLM_DEFAULTS = {f.name: None if f.default is dataclasses.MISSING else f.default
                for f in dataclasses.fields(LLMSettings) if f.name != "target_ms"}


# Check settings the run sets itself, from its own keys or from where it runs.
RUN_SETS = {"device", "seed", "atol", "rtol", "determinism_tol", "window_ms", "target_ms", "max_task_memory_gb",
            "memory_budget_gb", "timing_lock"}


@dataclass
class RunConfig:
    out: str = "out"
    num_samples: int = 8
    max_candidates: int = 64
    composer: str = "template"
    sampling: str = "layers"  # the template composer's chains: shaped like fused layers, or uniform
    device: str = "auto"
    seed: int = 0
    reference: str | None = None
    reference_levels: list = field(default_factory=lambda: [1, 2, 3])
    similarity_threshold: float = 0.9
    dedupe_threshold: float = 0.95
    libraries: list = field(default_factory=lambda: list(DEFAULT_LIBRARIES))
    ops: list = field(default_factory=list)  # names or glob patterns; empty: every op in the catalog
    library_mix: dict = field(default_factory=lambda: {"transformers": 0.012})
    llm: dict = field(default_factory=lambda: dict(LLM_DEFAULTS))
    op_count_mix: dict = field(default_factory=lambda: dict(DEFAULT_OP_COUNT_MIX))
    # How far (a share: 0.005 is half a point) a written op count's or library's share may be
    # from its target; past it, a run with --num-samples accepted composes top-up rounds of
    # what it lacks (pipeline/sampling.py). None: the rows are chosen from what was accepted.
    mix_tolerance: float | None = None
    window_ms: list = field(default_factory=lambda: list(CHECK_DEFAULTS["window_ms"]))
    target_ms: float = CHECK_DEFAULTS["target_ms"]  # where re-sizing aims inside the window (KernelBench's median is ~3 ms)
    atol: float = CHECK_DEFAULTS["atol"]
    rtol: float = CHECK_DEFAULTS["rtol"]
    determinism_tol: float = CHECK_DEFAULTS["determinism_tol"]
    timeout_s: float = SandboxOptions.timeout_s
    max_memory_gb: float = SandboxOptions.max_memory_gb
    max_task_memory_gb: float = CHECK_DEFAULTS["max_task_memory_gb"]
    workers: int = 0
    cache_dir: str = field(default_factory=default_cache_dir)
    beam_args: list = field(default_factory=list)
    # Any other setting of the sandbox checks (filters/checks/registry.py), e.g. {ablation: false}.
    checks: dict = field(default_factory=dict)

    def check(self) -> "RunConfig":
        _require(self.num_samples >= 1, "num_samples must be at least 1")
        _require(self.max_candidates >= 1, "max_candidates must be at least 1")
        _require(self.composer in COMPOSERS, f"composer must be one of {', '.join(COMPOSERS)}, not {self.composer!r}")
        _require(self.sampling in SAMPLINGS, f"sampling must be one of {', '.join(SAMPLINGS)}, not {self.sampling!r}")
        _require(self.device == "auto" or self.device == "cpu" or self.device.split(":")[0] == "cuda",
                 f"device must be auto, cpu or cuda[:N], not {self.device!r}")
        _require(len(self.window_ms) == 2 and 0 < self.window_ms[0] < self.window_ms[1],
                 f"window_ms must be [low, high] with 0 < low < high, not {self.window_ms}")
        _require(self.timeout_s > 0 and self.max_memory_gb > 0, "timeout_s and max_memory_gb must be positive")
        _require(0 < self.similarity_threshold <= 1 and 0 < self.dedupe_threshold <= 1,
                 "similarity_threshold and dedupe_threshold must be in (0, 1]")
        _require(self.workers >= 0, "workers must be 0 (auto) or more")
        _require(bool(self.libraries), "libraries must name at least one op library, e.g. [torch]")
        self.library_mix = {str(k): float(v) for k, v in self.library_mix.items()}
        _require(all(0 <= v <= 1 for v in self.library_mix.values()) and sum(self.library_mix.values()) <= 1,
                 f"library_mix must give each library a share in [0, 1], together at most 1, not {self.library_mix}")
        self.library_mix = {**added_library_shares(self.libraries, self.library_mix), **self.library_mix}
        mix = {int(k): float(v) for k, v in self.op_count_mix.items()}
        _require(mix and all(1 <= k <= 5 and v >= 0 for k, v in mix.items()) and sum(mix.values()) > 0,
                 f"op_count_mix must map op counts 1-5 to non-negative weights, not {self.op_count_mix}")
        self.op_count_mix = mix
        _require(self.mix_tolerance is None or 0 <= self.mix_tolerance < 1,
                 f"mix_tolerance must be a share in [0, 1) (0.005 is half a point), or unset, not {self.mix_tolerance}")
        settable = sorted(set(CHECK_DEFAULTS) - RUN_SETS)
        unknown = sorted(set(self.checks) - set(settable))
        _require(not unknown, f"unknown checks key(s) {', '.join(unknown)}; valid: {', '.join(settable)}")
        unknown = sorted(set(self.llm) - set(LLM_DEFAULTS))
        _require(not unknown, f"unknown llm key(s) {', '.join(unknown)}; valid: {', '.join(sorted(LLM_DEFAULTS))}")
        self.llm = {**LLM_DEFAULTS, **self.llm}
        _require(self.llm["concurrency"] >= 1 and self.llm["max_attempts"] >= 1 and self.llm["repair_rounds"] >= 0,
                 "llm.concurrency and llm.max_attempts must be at least 1, llm.repair_rounds at least 0")
        return self


# The share of candidates an added library (kornia, einops: not torch, not transformers) leads
# when the configuration gives it none, split between the added libraries: drawn by how often
# model code calls them, their ops would otherwise seldom appear (a README run of 8 had none).
ADDED_LIBRARY_SHARE = 0.25


def added_library_shares(libraries: list[str], library_mix: dict) -> dict:
    """A share for every added library the mix does not name (`--library-mix kornia=0.1` sets one)."""
    added = sorted({library_name(library) for library in libraries if is_added(library)})
    left = max(0.0, 1.0 - sum(library_mix.values()))
    share = min(ADDED_LIBRARY_SHARE, left) / len(added) if added else 0.0
    return {library: round(share, 4) for library in added if library not in library_mix}


def build_config(config_file: str | None, overrides: dict) -> RunConfig:
    values = load_config_file(config_file) if config_file else {}
    llm_model = overrides.pop("llm_model", None)
    shares = overrides.pop("library_shares", None)  # --library-mix LIB=SHARE, repeatable
    values.update({key: value for key, value in overrides.items() if value is not None})
    if shares:
        values["library_mix"] = {**values.get("library_mix", RunConfig().library_mix), **dict(shares)}
    if llm_model:
        values["llm"] = {**values.get("llm", {}), "model": llm_model}
    return RunConfig(**coerce(values)).check()


def load_config_file(name: str) -> dict:
    path = Path(name)
    if not path.exists() and (RECIPES_DIR / f"{name}.yaml").exists():
        path = RECIPES_DIR / f"{name}.yaml"
    if not path.exists():
        recipes = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
        raise ConfigError(f"config file {name!r} does not exist (shipped recipes: {recipes})")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config keys, not a {type(data).__name__}")
    return {str(key).replace("-", "_"): _expand(value, path) for key, value in data.items()}


def _expand(value, path: Path):
    """${VAR} in a string value is the environment variable; an unset one is an error."""
    if isinstance(value, dict):
        return {key: _expand(item, path) for key, item in value.items()}
    if isinstance(value, list):
        return [_expand(item, path) for item in value]
    if isinstance(value, str) and "$" in value:
        expanded = os.path.expandvars(value)
        if "${" in expanded:
            raise ConfigError(f"{path}: {value} names an environment variable that is not set; set it and retry")
        return expanded
    return value


def coerce(values: dict) -> dict:
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(fields))}")
    return {key: _coerce_value(key, value, fields[key]) for key, value in values.items()}


def _coerce_value(key, value, spec):
    default = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()
    kind = type(default)
    if default is None or value is None:
        return value
    try:
        if kind in (int, float) and isinstance(value, bool):
            raise ValueError  # `true` is not a number
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError  # 2.5 samples is not 2
        if kind in (int, float, str):
            return kind(value)
        if kind is list:
            return list(value) if isinstance(value, (list, tuple)) else [v.strip() for v in str(value).split(",")]
        if kind is dict:
            return dict(value)
    except (TypeError, ValueError):
        pass
    raise ConfigError(f"config key {key} must be a {kind.__name__}, not {value!r}")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)
