"""What a zygote readies before it forks its first child (filters/sandbox/worker.py `main`):
Inductor's vector-instruction probe and precompiled headers, and on a GPU host what needs no
CUDA (`warm_for_gpu`)."""
from __future__ import annotations

import gc
import os
import sys


def _check_vector_instructions() -> None:
    """Inductor tries which vector instructions the CPU runs by loading a test build in a
    Python subprocess, once per process. Done here, children inherit the answer and never
    start Python (the audit hook would refuse it) on a zygote that did not compile."""
    try:
        from torch._inductor import cpu_vec_isa
        cpu_vec_isa.pick_vec_isa()
    except Exception:  # an older torch, or no compiler: the children's compiles will say so
        pass


def _keep_precompiled_headers(folder: str) -> None:
    """Inductor precompiles its C++ headers once per process (about 150 MB, seconds of gcc,
    then most of a CPU compile's time saved) into a folder it fixed at import, under the
    temporary folder: here, a folder of the zygote's own, which `_wipe` keeps and `serve`
    watches. The warm-up builds them; every child reuses them."""
    from torch._inductor import codecache
    if hasattr(codecache, "_HEADER_DIR"):
        codecache._HEADER_DIR = folder
        codecache._HEADER_LOCK_DIR = os.path.join(folder, "locks")


GPU_WARM_UPS = ("imports", "triton", "dynamo")


def warm_for_gpu(level: str, cache_dir: str) -> str:
    """What a GPU zygote readies for its children without starting CUDA, by `level`:
    - "imports": Inductor imported, nothing run (every child compiles from cold);
    - "triton": also Triton's CUDA driver helpers, a C module gcc builds on first use into
      the Triton cache, which in a child is its job's own: every child built it again. Built
      here, in this zygote's folder (watched: a job that changes it retires the worker), by
      a process that never ran task code, and loaded once: children inherit it in memory;
    - "dynamo": also a trusted compile of the warm-up task on the CPU through Dynamo and
      AOTAutograd (not Inductor: its C++ build would cost this zygote the vector-instruction
      probe), with torch told there is no GPU while it runs (Dynamo saves the CUDA RNG when
      one is there, which starts CUDA), and every memo torch took meanwhile cleared.
    Returns what it did, for the worker's ready line."""
    if level not in GPU_WARM_UPS:
        raise SystemExit(f"opsynth worker: unknown GPU warm-up {level!r} (one of {', '.join(GPU_WARM_UPS)})")
    from filters.checks.harness import use_compiler_caches
    use_compiler_caches(cache_dir)
    done = ["imports"]
    if level in ("triton", "dynamo"):
        try:
            from triton.runtime import driver
            driver.active.utils  # noqa: B018  the helpers are built and loaded on first access
            done.append("triton driver")
        except Exception as error:  # no Triton, or no CUDA driver: children build what they need
            done.append(f"no triton driver ({type(error).__name__})")
    if level == "dynamo":
        _warm_dynamo_without_cuda()
        done.append("dynamo")
    gc.freeze()  # what the imports made is no longer traversed by each child's collections
    return " + ".join(done) + " (each job's child is the first to touch the GPU)"


def _warm_dynamo_without_cuda() -> None:
    import torch

    from filters.checks.measure.execution import load_task
    from filters.checks.harness import WARM_UP_TASK
    available = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        task = load_task(WARM_UP_TASK)
        model = task.Model(*task.get_init_inputs()).eval()
        with torch.no_grad():
            torch.compile(model, backend="aot_eager")(*task.get_inputs())
    finally:
        torch.cuda.is_available = available
        torch._dynamo.reset()
    _clear_memos(("torch", "triton"))


def _clear_memos(packages: tuple[str, ...]) -> None:
    """Empty every functools cache at module level in `packages`: nothing memoized while
    torch was told there is no GPU reaches a child."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(packages):
            continue
        for value in list(vars(module).values()):
            try:
                clear = getattr(value, "cache_clear", None)
                if callable(clear):
                    clear()
            except Exception:  # a lazy module's lookup, a cache_clear that wants arguments: not a memo
                pass
