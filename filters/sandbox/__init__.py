"""The sandbox: the jail a candidate runs in (jail), the warm worker pool and its per-job
children (pool, worker), and the acceptance checks they run (harness, checks, execution).
`validate` is the entry point: candidates in, verdicts out; what a candidate may be at all is
decided before, from its source, by filters/grammar."""
