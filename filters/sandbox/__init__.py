"""The sandbox: the jail a candidate runs in (jail, landlock, and redaction of what a child
says), the warm worker pool and its per-job children (pool, worker, with the zygote's warm-up,
a child's CUDA start and the wipe after each job: warm, cuda_start, wipe), each job's count of
GPU memory (gpu_memory) and the batched trace of many tasks in one child (trace_batch). What
the children run is filters/checks/. `validate` is the entry point: candidates in, verdicts
out; what a candidate may be at all is decided before, from its source, by filters/grammar."""
