"""Where a run validates and how many sandbox workers it starts: the device, the GPUs, the
workers a host can hold, their threads and GPU memory."""
from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path

from filters.sandbox.pool import SandboxOptions
from pipeline.config import ConfigError, RunConfig


def resolve_device(requested: str) -> tuple[str, list[int]]:
    import torch
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cpu":
        return "cpu", []
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {requested}: torch sees no CUDA device (torch.cuda.is_available() is False, "
                          f"torch {torch.__version__}); use --device cpu or --device auto")
    if ":" in requested:
        index = int(requested.split(":")[1])
        if index >= torch.cuda.device_count():
            raise ConfigError(f"--device {requested}: only {torch.cuda.device_count()} CUDA device(s) are visible")
        return "cuda", [index]
    return "cuda", list(range(torch.cuda.device_count()))


MIN_WORKER_GPU_GB = 6.0  # the smallest share of a GPU's memory a default worker gets
# On the H200 (16 cores), on one machine start, the same 512 screened candidates: 16 workers
# 4,037 accepted/h steady, 8 workers 3,219 (session 23; +8% in session 18). 24 lost to 16
# (more workers than cores: CUDA starts queue, memory reruns). docs/sandbox.md, section 6.
MAX_WORKERS_PER_GPU = 16


def default_workers(device: str, gpus: list[int], beam_args: list[str] = ()) -> int:
    """One sandbox worker a core; on a CPU host at most 8, on a GPU host at most
    MAX_WORKERS_PER_GPU a GPU, and no more than each GPU can give MIN_WORKER_GPU_GB of memory.
    A candidate's work is mostly CPU (compiling, the correctness checks' Python) and the GPU
    gate is held only around GPU work; timing takes turns on each GPU, and a job whose GPU
    memory runs out in its share runs again alone. Under the multi-process DirectRunner every
    Beam process has its own pool: they share the cores."""
    cores = os.cpu_count() or 1
    processes = beam_processes(beam_args)
    per_host = min(cores, min(workers_per_gpu(gpus), MAX_WORKERS_PER_GPU) * len(gpus)) if device == "cuda" else min(cores, 8)
    return max(1, per_host // processes)


def workers_per_gpu(gpus: list[int]) -> int:
    """How many workers the smallest of `gpus` holds at MIN_WORKER_GPU_GB each (gpu_share_gb's 90%)."""
    import torch
    smallest_gb = min(torch.cuda.get_device_properties(g).total_memory for g in gpus) / 2**30
    return max(1, math.floor(0.9 * smallest_gb / MIN_WORKER_GPU_GB))


def beam_processes(beam_args) -> int:
    args = " ".join(beam_args)
    if "multi_processing" not in args:
        return 1
    found = re.search(r"--direct_num_workers[= ](\d+)", args)
    return max(1, int(found.group(1))) if found else 1


def gpu_share_gb(gpus: list[int], workers: int) -> float:
    """GPU memory each worker may take: 90% of the smallest GPU, split among its workers."""
    import torch
    per_gpu = math.ceil(workers / len(gpus))
    return 0.9 * min(torch.cuda.get_device_properties(g).total_memory for g in gpus) / 2**30 / per_gpu


BUDGET_WORKERS_PER_GPU = 8  # the task memory budget is half the share 8 workers of a GPU would get


def task_memory_budget_gb(gpus: list[int]) -> float:
    """GPU memory the resize search gives one task's forward: half the share of 8 workers a
    GPU, whatever the number of workers, so the same candidate gets the same verdict. The
    later checks hold more (the float64 probe up to about 3.7 times a memory-bound chain's
    forward peak): a job may hold four budgets (`job_memory_gb`). A third (5.3 GB on the
    H200) held memory-bound chains under 1 ms: 5 GB of traffic is about 1 ms at 4.8 TB/s. A
    job that still runs out of the most one job may hold runs again alone
    (filters/sandbox/worker.py: retried_alone)."""
    return gpu_share_gb(gpus, BUDGET_WORKERS_PER_GPU * len(gpus)) / 2


JOB_WORKERS_PER_GPU = 4  # the most one job may hold is the share of 4 workers a GPU: four task budgets


def job_memory_gb(gpus: list[int], workers: int) -> float:
    """The most GPU memory one job may hold (filters/sandbox/gpu_memory.py): its worker's
    share, and never less than the share of JOB_WORKERS_PER_GPU workers a GPU, four times
    the task budget, whatever the number of workers. The checks after timing hold more than
    the forward the budget bounds: the float64 probe holds the task in float32 (model,
    inputs, output and a full-float32 reference) beside its float64 copy and that copy's
    intermediates, up to about 3.7 times a memory-bound chain's forward peak. The jobs of a
    GPU hold what they need of it, counted, so a job grows that far only when it must."""
    return gpu_share_gb(gpus, min(workers, JOB_WORKERS_PER_GPU * len(gpus)))


def sandbox_options(cfg: RunConfig, device: str, gpus: list[int], workers: int, out_dir: Path) -> SandboxOptions:
    on_host = workers * beam_processes(cfg.beam_args)  # every Beam process of the host has a pool this size
    return SandboxOptions(
        device=device, timeout_s=cfg.timeout_s, max_memory_gb=cfg.max_memory_gb,
        threads=max(1, (os.cpu_count() or 1) // on_host), log_path=str(out_dir / "workers.log"),
        timing_lock_dir=gpu_lock_dir() if device == "cuda" else None,
        gpu_memory_gb=job_memory_gb(gpus, on_host) if device == "cuda" else None,
        gpu_pool_gb=gpu_share_gb(gpus, len(gpus)) if device == "cuda" else None,
        task_memory_budget_gb=task_memory_budget_gb(gpus) if device == "cuda" else None,
        # until tests/benchmarks/bench_gpu_warm_up.py has shown on a GPU host what each level buys
        gpu_warm_up=os.environ.get("OPSYNTH_GPU_WARM_UP", "imports"))


def gpu_lock_dir() -> str:
    """Host-local, not in the cache: on a distributed runner the cache is a shared mount,
    and a lock there would make every host's GPU 0 take turns with every other's."""
    return os.path.join(tempfile.gettempdir(), f"opsynth-gpu-locks-{os.getuid()}")
