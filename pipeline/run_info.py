"""What a run records about itself in stats.json and the card: its settings, why it
stopped, its clock and rate, and the versions of everything that made the data."""
from __future__ import annotations

import platform
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, version

from operators.libraries import library_name
from pipeline.config import RunConfig


def run_info(cfg: RunConfig, device: str, reference, stop_reason: str, invocations: dict[str, dict],
              resumed: tuple[int, int], accepted: int, op_libraries: list[str] = ()) -> dict:
    """`wall_time_s` and `accepted_per_hour` add up every invocation of the run (the staging
    ledger, `invocations`: each one's clock up to its last finished round); `resumed_candidates`
    are those that earlier invocations decided; `accepted` counts every candidate the checks
    accepted, the rows and those held back alike."""
    wall_time_s = round(sum(entry["wall_time_s"] for entry in invocations.values()), 1)
    return {
        "device": device, "composer": cfg.composer, "sampling": cfg.sampling, "seed": cfg.seed,
        "window_ms": list(cfg.window_ms), "op_count_target": shares(cfg.op_count_mix),
        "atol": cfg.atol, "rtol": cfg.rtol, "determinism_tol": cfg.determinism_tol,
        "reference": reference.name if reference else None, "reference_revision": reference.revision if reference else None,
        "decontaminated": reference is not None, "similarity_threshold": cfg.similarity_threshold,
        "dedupe_threshold": cfg.dedupe_threshold,
        "target_samples": cfg.num_samples, "stop_reason": stop_reason, "wall_time_s": wall_time_s,
        "invocations": len(invocations), "resumed_candidates": resumed[0],
        "accepted_per_hour": round(accepted / wall_time_s * 3600) if wall_time_s else 0,
        "libraries": list(cfg.libraries), "versions": versions([*cfg.libraries, *op_libraries]),
    }


def shares(mix: dict) -> dict:
    total = sum(mix.values())
    return {str(key): round(value / total, 4) for key, value in sorted(mix.items())}


def versions(libraries=()) -> dict:
    """opsynth's own stack, and every op library of the run by its top-level package
    (`kornia.filters` -> kornia's distribution version)."""
    def of(package):
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"
    found = {"opsynth": of("opsynth"), "torch": of("torch"), "transformers": of("transformers"),
             "apache_beam": of("apache-beam"), "python": platform.python_version(), "platform": sys.platform}
    distributions = packages_distributions()
    for root in sorted({library_name(library) for library in libraries} - set(found)):
        installed = of(distributions.get(root, [root])[0])
        if installed != "not installed":  # a registered source's name is no package
            found[root] = installed
    return found
