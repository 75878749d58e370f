"""The sandbox: what a candidate may reach (static_check), the jail it runs in (jail), the
warm worker pool and its per-job children (pool, worker), and the acceptance checks they
run (harness, checks, execution). `validate` is the entry point: candidates in, verdicts out."""
