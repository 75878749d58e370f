"""What the comparison with a reference costs: the card written with and without it, and
`opsynth report` on the same folder (BENCHMARKS.md). The samples are KernelBench level 1 and 2
tasks without an `ops` column, so every op is read from text (the slower path).

    python -m tests.benchmarks.bench_report --kernelbench /work/kb --samples 500
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from filters.similarity.reference import load_reference
from operators.records import Candidate, Verdict
from outputs.dataset import write_dataset
from outputs.report import write_report
from tests.outputs.test_dataset import RUN_INFO


def records(kernelbench: Path, samples: int) -> list:
    codes = [p.read_text() for p in sorted((kernelbench / "KernelBench").glob("level[12]/*.py"))]
    found = []
    for i in range(samples):  # a comment per copy: every sample its own id
        candidate = Candidate(f"id{i}", (), "external#0", f"{codes[i % len(codes)]}\n# {i}\n", "external", 0, {"index": i})
        found.append((candidate, Verdict(candidate.id, "accepted", True, "", "",
                                         {"eager_ms": 1.0 + i % 7, "output_max_abs": 3.0})))
    return found


def timed(what: str, action) -> None:
    began = time.perf_counter()
    action()
    print(f"{what}: {time.perf_counter() - began:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernelbench", default="/work/kb", help="a KernelBench checkout")
    parser.add_argument("--samples", type=int, default=500)
    args = parser.parse_args()
    rows = records(Path(args.kernelbench), args.samples)
    reference = load_reference(args.kernelbench)
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(2):  # the second of each is warm
            timed("card without a reference", lambda: write_dataset(Path(folder) / "plain", rows, RUN_INFO))
            timed("card with the reference", lambda: write_dataset(Path(folder) / "beside", rows, RUN_INFO, reference))
        timed("opsynth report (in process)",
              lambda: write_report(Path(folder) / "plain", args.kernelbench, Path(folder) / "report"))


if __name__ == "__main__":
    main()
