"""The acceptance checks a candidate meets in a sandbox worker, in order (docs/architecture.md,
"Acceptance"; docs/acceptance.md says what each asks and why).

Each check is two halves. Its rule (verdicts.py) declares its stage, its reasons and what each
means, what an LLM may repair, its settings and its measures, and `judge`s the measures: pure,
importing nothing that runs a task. Its measuring half (a file of its own here: timing.py,
deterministic.py, pure.py, depends_on_input.py, well_conditioned.py, nothing_dead.py,
compiles.py) subclasses the rule with `run`, which measures in the process that runs the task.

- registry.py: `RULES` in order, and what the funnel, the card, the repair loop, the
  configuration and the zygote read (`DEFAULTS`, `CHECK_STAGES`, `glossary`, `decide` ...);
- order.py: `CHECKS`, the measuring halves in the same order; harness.py runs them (`evaluate`)
  and traces what a task computes for decontamination (`read`, filters/computation/);
- measure/: how a task is loaded, run, timed and measured (execution, resize, and the probes
  of numerics, purity and ablation).
The jail they run in is filters/sandbox/.
"""
