"""Build the table of KernelBench's readings that opsynth ships
(filters/similarity/kernelbench_readings.json), after GRAPH_VERSION changed:

    python -m pipeline.shipped_readings /path/to/KernelBench [--levels 1 2 3] [--device cuda] [--workers N]

Every task is traced and read in full exactly as a run's reference is (pipeline.dedupe's
traced_in_batches, the run's sandbox options, seed 0), from an empty cache. Build it where
every task can be read at its own sizes (a GPU: on 2 CPU cores, 28 of the 45 tasks read
again at their own sizes run out of the trace's 20 s and keep their small reading). A task
whose code is not byte for byte in the table (another revision, an edited copy) is traced
as before.
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from filters.similarity.reference import GRAPH_VERSION, SHIPPED_READINGS, code_digest, load_reference
from pipeline.config import RunConfig
from pipeline.dedupe import reference_graphs
from filters.sandbox.pool import shared_pool
from pipeline.devices import default_workers, resolve_device, sandbox_options


def build(kernelbench: str, levels: tuple[int, ...], device: str, workers: int | None) -> dict:
    import torch

    reference = load_reference(kernelbench, levels)
    device, gpus = resolve_device(device)
    with tempfile.TemporaryDirectory() as cache:
        cfg = RunConfig(device=device, cache_dir=cache, out=cache, reference=kernelbench, reference_levels=list(levels))
        workers = workers or default_workers(device, gpus, [])
        pool = shared_pool(workers, sandbox_options(cfg, device, gpus, workers, Path(cache)), gpus or None)
        began = time.monotonic()
        graphs = reference_graphs(list(reference.codes), pool, cache, {"device": device, "seed": cfg.seed}, shipped={})
        took = time.monotonic() - began
    return {"graph_version": GRAPH_VERSION, "source": reference.name, "revision": reference.revision,
            "levels": list(levels), "built_with": {"torch": torch.__version__, "device": device, "seed": cfg.seed,
                                                   "workers": workers, "seconds": round(took)},
            "readings": {code_digest(code): graph for code, graph in zip(reference.codes, graphs)}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernelbench", help="a KernelBench checkout")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])  # a run's reference_levels
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out", default=str(SHIPPED_READINGS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    table = build(args.kernelbench, tuple(args.levels), args.device, args.workers)
    Path(args.out).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    stood = sum(graph is not None for graph in table["readings"].values())
    print(f"{args.out}: {stood} of {len(table['readings'])} tasks read, GRAPH_VERSION {GRAPH_VERSION}, "
          f"{table['built_with']}")


if __name__ == "__main__":
    main()
