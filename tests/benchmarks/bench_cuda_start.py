"""What starting CUDA costs a job's child, alone and with other children starting at once.

    python -m tests.benchmarks.bench_cuda_start [--rounds 3] [--concurrency 1 4 8 16]

A parent that imported torch and never touched the GPU (as a sandbox zygote) forks
CONCURRENCY children at once, CONCURRENCY children per round; each makes its CUDA context,
a first allocation and a cuBLAS handle (cuda_start._start_cuda's steps) and reports how long
each took. Printed per concurrency: the median and the 90th percentile of each step and of
the whole, and the starts per second the round reached. If the starts share one resource
(a driver lock), the whole time grows with the concurrency and starts per second stay flat.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def start_cuda() -> dict:
    """cuda_start._start_cuda's steps, timed one by one (ms)."""
    marks = {"began": time.perf_counter()}
    torch.cuda.init()
    marks["context"] = time.perf_counter()
    a = torch.ones(8, 8, device="cuda")
    torch.cuda.synchronize()
    marks["allocation"] = time.perf_counter()
    torch.mm(a, a)
    torch.cuda.synchronize()
    marks["cublas"] = time.perf_counter()
    names = list(marks)
    steps = {name: (marks[name] - marks[before]) * 1e3 for before, name in zip(names, names[1:])}
    return {**steps, "whole": (marks["cublas"] - marks["began"]) * 1e3}


def round_of(concurrency: int) -> tuple[list[dict], float]:
    """CONCURRENCY children forked together; their timings and the round's wall time (s)."""
    began = time.perf_counter()
    children = []
    for _ in range(concurrency):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                os.write(write_fd, json.dumps(start_cuda()).encode())
            except BaseException as error:
                os.write(write_fd, json.dumps({"error": repr(error)}).encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        children.append((pid, read_fd))
    timings = []
    for pid, read_fd in children:
        data = b""
        while chunk := os.read(read_fd, 65536):
            data += chunk
        os.close(read_fd)
        os.waitpid(pid, 0)
        timing = json.loads(data)
        if "error" in timing:
            raise SystemExit(f"a child could not start CUDA: {timing['error']}")
        timings.append(timing)
    return timings, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    args = parser.parse_args()
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # is_available() without starting CUDA here
    if not torch.cuda.is_available():
        raise SystemExit("bench_cuda_start measures CUDA's start: run it on a GPU host")
    print(f"torch {torch.__version__}, {os.cpu_count()} cores; ms per child (median / p90)")
    for concurrency in args.concurrency:
        timings, walls = [], []
        for _ in range(args.rounds):
            got, wall = round_of(concurrency)
            timings += got
            walls.append(wall)
        cells = []
        for step in ("context", "allocation", "cublas", "whole"):
            values = sorted(t[step] for t in timings)
            cells.append(f"{step} {statistics.median(values):.0f}/{values[int(0.9 * (len(values) - 1))]:.0f}")
        rate = concurrency * args.rounds / sum(walls)
        print(f"{concurrency:>3} at once: " + ", ".join(cells) + f"; {rate:.1f} starts/s")


if __name__ == "__main__":
    main()
