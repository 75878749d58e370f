"""The benchmarks' front door.

    python -m tests.benchmarks                 # every benchmark, grouped by the question it answers
    python -m tests.benchmarks NAME [ARGS...]  # run tests/benchmarks/NAME.py with ARGS, as `python -m` would

Each line names a script, what it measures and the rows of BENCHMARKS.md's "Today's figures"
it feeds, by their first cell ("history" where its figures are only in
docs/benchmarks-history.md; in parentheses, a helper's part); tests/test_docs_benchmarks.py
holds every script listed and every row named. The GPU stages
that drive these scripts on an H200 are `bash tests/benchmarks/h200.sh STAGE` (its header
lists them).
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).parent

# (question, [(script, what it measures, the BENCHMARKS.md row it feeds)])
GROUPS: list[tuple[str, list[tuple[str, str, str]]]] = [
    ("How many accepted an hour, and where the time goes", [
        ("bench_throughput", "a candidate folder through `opsynth validate`: accepted/h whole and steady, "
                             "worker-s per check, the GPU gate, the bounds",
                             "accepted/h, `opsynth validate` alone, H200; accepted/h, `opsynth validate`, this CPU; "
                             "workers per GPU"),
        ("bench_validate", "the warm worker pool against a fresh process per candidate",
                           "worker pool vs a fresh process per candidate"),
        ("bench_runners", "`opsynth run` in one Beam process against multi-process mode",
                          "one Beam process vs multi-process"),
        ("bench_cuda_start", "what starting CUDA costs a job's child, alone and 2-16 at once",
                             "CUDA's start in a job's child"),
        ("bench_gpu_warm_up", "what each GPU zygote warm-up level buys a child's compile", "history"),
        ("bench_compile", "the compile check's torch.compile, autotuned or not", "history"),
        ("gpu_crosscheck", "stored eager times against torch.profiler's kernel time", "GPU timing trusted"),
    ]),
    ("What the composer draws, and at what cost", [
        ("compose_candidates", "writes a fixed candidate set (.bench/cands) the other benches share",
                               "(input to the accepted/h rows)"),
        ("bench_screen", "what the checks screen turns down against the GPU's verdicts; writes .bench/screened",
                         "(its candidates feed accepted/h, `opsynth validate` alone, H200)"),
        ("bench_screen_pool", "a round screened serially against screened ahead in processes", "history"),
        ("bench_compose", "composition time and memory per candidate, the slowest ones", "history"),
        ("bench_repeats", "exact repeats round by round as a run grows", "composer repeats over a 6,000-sample run"),
        ("bench_domains", "candidates the numeric checks would reject, with and without the numeric screen",
                          "history"),
        ("bench_fusion_intent", "`uniform` against `layers` chains: acceptance, ops, eager time", "history"),
        ("bench_shapes", "how much a task set's sizes look like real layers", "history"),
    ]),
    ("Decontamination, dedupe and the trace", [
        ("bench_disguise", "KernelBench copies disguised or rewritten, caught per kind; false positives; "
                           "matching speed", "decontamination: disguised copies caught, per rewrite kind; "
                           "decontamination: false positives; decontamination: matching speed"),
        ("bench_fairness", "KernelBench level 2's 4,950 pairs above the threshold, from the shipped readings, "
                           "against a commit's", "decontamination: false positives"),
        ("bench_decontaminate", "screened matching against exact scoring of every pair (textual score)",
                                "history"),
        ("bench_dedupe", "`opsynth dedupe` of N template tasks against KernelBench", "`opsynth dedupe`"),
        ("bench_reference_trace", "the reference's cold trace (batches, then read in full), against a commit's",
                                  "reference trace (KernelBench L1-L3, cold)"),
        ("bench_trace_tail", "why some accepted tasks take seconds to trace", "history"),
        ("bench_trace_batch_guard", "what a trace batch's guards (torch_state at both ends) cost", "history"),
        ("bench_quarantine", "a batch whose child dies: the task it was tracing alone, against the rest one per child",
                             "a batch whose child dies"),
        ("gpu_trace_check", "the trace on the checks' device: the attack, fairness on KernelBench and rows",
                            "history"),
    ]),
    ("The jail and the checks on a GPU", [
        ("gpu_sandbox_check", "hostile and benign tasks through jailed CUDA workers", "history"),
        ("bench_isolation", "do hangs and memory hogs change another task's verdict", "fault isolation"),
        ("gpu_determinism", "colliding scatter_add_ refused on a GPU, the same task without collisions not",
                            "history"),
        ("gpu_reaudit", "a run's rows re-audited by plain torch (eager, compile, determinism, window)", "history"),
    ]),
    ("The grammar, the catalog, the report", [
        ("kernelbench_policy", "the grammar over KernelBench and a catalog: refusals and ms a task",
                               "grammar cost"),
        ("seed_audit", "crawled seeds of one library through `opsynth validate`", "history"),
        ("bench_report", "the card with and without the reference, and `opsynth report`", "report time"),
    ]),
    ("Probes and stand-ins", [
        ("llm_repair_yield", "yield and tokens per accepted sample with and without repair, on the LLM stand-in",
                             "history"),
        ("dask_runner_probe", "whether Beam's DaskRunner keeps tagged outputs apart and runs every sink",
                              "history"),
        ("naive_validator", "bench_validate's baseline: one fresh process per candidate (stdin to stdout)",
                            "(used by bench_validate)"),
    ]),
]


def listed() -> dict[str, tuple[str, str]]:
    return {name: (what, row) for _, entries in GROUPS for name, what, row in entries}


def scripts() -> set[str]:
    return {p.stem for p in HERE.glob("*.py") if not p.stem.startswith("__")}


def listing() -> str:
    lines = [__doc__.strip().splitlines()[0], ""]
    for question, entries in GROUPS:
        lines.append(question)
        width = max(len(name) for name, _, _ in entries)
        lines += [f"  {name:<{width}}  {what}  [{row}]" for name, what, row in entries]
        lines.append("")
    unlisted = sorted(scripts() - listed().keys())
    if unlisted:
        lines += ["Not yet listed here", *(f"  {name}" for name in unlisted), ""]
    lines.append("Run one: python -m tests.benchmarks NAME [ARGS...]   (NAME --help for its arguments)")
    lines.append("On the H200: bash tests/benchmarks/h200.sh STAGE    (its header lists the stages)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    name = argv[0].removesuffix(".py")
    if name not in scripts():
        print(f"no benchmark named {name!r}\n\n{listing()}", file=sys.stderr)
        return 2
    sys.argv = [str(HERE / f"{name}.py"), *argv[1:]]
    runpy.run_module(f"tests.benchmarks.{name}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
