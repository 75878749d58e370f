"""A job's start on the GPU, in its child before any task code runs (filters/sandbox/worker.py):
its share of the GPU's memory, counted (filters/sandbox/gpu_memory.py) or capped, the CUDA
context, the caching allocator and a cuBLAS handle."""
from __future__ import annotations

import os


ALONE_SHARE = 0.9  # of the GPU's memory, for a job run again alone
_uncounted_alone = False  # this process's trace ran out of its counted memory and runs alone, uncounted


def _start_cuda(options: dict) -> None:
    """The worker's share of the GPU's memory, the CUDA context, the caching allocator and a
    cuBLAS handle, made before any task code runs on the GPU and outside the GPU gate: a
    child is the first process of its job to touch the GPU, and starting CUDA is a few
    hundred ms of driver work. Done inside the job's first gated step, it held the gate that
    long, and every timer, and every worker behind the timer, waited for it. Trusted code,
    in the job's own process: nothing of it outlives the job."""
    import torch

    if options.get("gpu_memory_gb"):
        # Workers share the GPU: a job holds what it needs of the GPU's counted memory, up to
        # the most one job may hold (gpu_memory.py), or without a count, its worker's share.
        # A job run again alone (`retried_alone`) may grow into all the counted memory (one
        # such job a GPU at once), or without a count, take what the GPU has free.
        total = torch.cuda.get_device_properties(0).total_memory
        lock = os.environ.get("OPSYNTH_TIMING_LOCK")
        if options.get("gpu_pool_gb") and lock and not _uncounted_alone:
            count_gpu_memory(options, lock, total, torch.cuda.set_per_process_memory_fraction)
        else:
            share = ALONE_SHARE if options.get("alone") else options["gpu_memory_gb"] * 2**30 / total
            torch.cuda.set_per_process_memory_fraction(min(1.0, share))
    a = torch.ones(8, 8, device="cuda")
    torch.mm(a, a)
    torch.cuda.synchronize()


def count_gpu_memory(options: dict, lock: str, total: int | None, cap) -> None:
    """The job's counted GPU memory (gpu_memory.held), started, or run alone: `cap(share)`
    sets the allocator's cap where the job's memory is no longer counted."""
    global _uncounted_alone
    from filters.checks.measure import execution
    from filters.sandbox import gpu_memory
    held = gpu_memory.held  # started before, in this process: what it holds stands
    if held is None:
        held = gpu_memory.held = gpu_memory.GpuMemory(lock, gpu_memory.units_in(options["gpu_pool_gb"]),
                                                      int(options["gpu_memory_gb"] * 2**30), total)
    report = lambda: execution.report_gate_wait(held.waited_now_s)  # noqa: E731
    if options.get("alone") and held.held and not held.alone:
        # A trace whose counted memory ran out (harness._read_on): its own 20 s could pass
        # waiting for the turn to run alone, so it takes the GPU uncounted, each step alone,
        # as a job run alone did before memory was counted.
        held.give_back()
        gpu_memory.held, _uncounted_alone = None, True
        cap(ALONE_SHARE)
        return
    if options.get("alone") and not held.alone:
        held.run_alone(report)
    if not held.held:
        held.start(report)
    execution.report_gate_wait(held.waited_s)
