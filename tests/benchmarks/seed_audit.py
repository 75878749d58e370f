"""How many crawled seeds pass the acceptance rules: a random sample of one library's seeds
through `opsynth validate`, with the pass rate and the reject reasons.

    python -m tests.benchmarks.seed_audit --sample-library transformers --sample 200 --device cuda

Seeds that pass are exactly the `<library>#1` samples a run can accept.
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from operators.catalog import load_or_crawl
from pipeline.cli import main as opsynth
from pipeline.defaults import default_cache_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--libraries", default="torch,transformers",
                        help="the catalog to crawl (comma-separated --library values; the run's default)")
    parser.add_argument("--sample-library", default="transformers", help="draw seeds of this library")
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", default="0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    began = time.perf_counter()
    _, catalog = load_or_crawl(args.libraries.split(","), Path(default_cache_dir()))
    crawl_s = time.perf_counter() - began
    catalog = [spec for spec in catalog if spec.library == args.sample_library]
    seeds = random.Random(args.seed).sample(catalog, min(args.sample, len(catalog)))
    work = Path(args.out or tempfile.mkdtemp(prefix="seed-audit-"))
    tasks = work / "seeds.parquet"
    work.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{"code": spec.seed_code, "ops": [spec.name],
                                          "data_source": f"{spec.library}#1"} for spec in seeds]), tasks)
    began = time.perf_counter()
    opsynth(["validate", str(tasks), "--out", str(work / "audit"), "--device", args.device,
             "--workers", args.workers, "--timeout-s", "240"])
    stats = json.loads((work / "audit" / "stats.json").read_text())
    rejects = pq.read_table(work / "audit" / "rejects").to_pylist()
    print(json.dumps({
        "library": args.sample_library, "catalog_ops": len(catalog), "crawl_s": round(crawl_s, 1),
        "seeds": len(seeds), "accepted": stats["accepted"], "validate_s": round(time.perf_counter() - began, 1),
        "rejected_by_reason": stats["rejected_by_reason"],
        "families_accepted": len({op.split(".")[2] for op in _accepted_ops(work / "audit")}),
    }, indent=1))
    examples = Counter((row["reason"], row["detail"][:100]) for row in rejects)
    for (reason, detail), count in examples.most_common(12):
        print(f"{count:4d}  {reason}: {detail}")


def _accepted_ops(out: Path) -> list[str]:
    rows = pq.read_table(out / "data").to_pylist()
    return [op for row in rows for op in row["ops"]]


if __name__ == "__main__":
    main()
