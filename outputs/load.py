"""Loading a task from an opsynth dataset, for the dataset's user: the same static policy the
sandbox applied before any of the task's code ran, applied again before it runs on the
user's machine.

A task's code is only as safe as the policy it passed. The sandbox checks run it jailed, and a
task that does harm only when some condition holds (an environment variable, a host name, a
date) passes them and does its harm later, on whoever runs it: `exec(row["code"])` gives it the
user's interpreter. The grammar (filters/grammar/) holds whatever the task does
at run time, since it refuses the code that could reach the file system, processes or the
network at all. A dataset from anywhere, opsynth's own or not, is checked the same way.
"""
from __future__ import annotations

import types
from collections.abc import Mapping

from filters.grammar import static_check
from operators.libraries import is_added


class UnsafeTask(ValueError):
    """A task's code is outside opsynth's static policy: it was not run."""

    def __init__(self, reason: str, detail: str, library_ops: frozenset[str], row_library_ops: tuple[str, ...] = ()):
        self.reason, self.detail = reason, detail
        if row_library_ops and not library_ops:
            libraries = sorted({op.split(".")[0] for op in row_library_ops})
            fix = (f"This row uses ops of {', '.join(libraries)}, which a task may use only when you name them: "
                   f"opsynth takes them from you, never from the row. If you trust {' and '.join(libraries)}, "
                   f"load it with load_task(row, library_ops={list(row_library_ops)!r}) (the dataset card lists "
                   "every op of its rows).")
        else:
            fix = ("Do not run it: opsynth accepts no task this check refuses, so the row was changed, made "
                   "elsewhere or accepted under an older policy. Drop the row, or read its code yourself first.")
        super().__init__(f"refused to run this task ({reason}: {detail}). {fix}")


def load_task(code_or_row: str | Mapping, library_ops=()) -> types.ModuleType:
    """The task as a fresh module (`task.Model`, `task.get_inputs`, `task.get_init_inputs`),
    from its code or a dataset row holding it in `code`. Raises UnsafeTask, before running any
    of it, when the code is outside the static policy. `library_ops`: the dotted names of ops
    of added libraries the task may use (`kornia.filters.MedianBlur`). They are never taken
    from the row: a row that named `os.system` as an op would let its code call it."""
    code = code_or_row["code"] if isinstance(code_or_row, Mapping) else code_or_row
    if not isinstance(code, str):
        raise TypeError(f"a task's code is a string, not {type(code).__name__}")
    allowed = frozenset(library_ops)
    refused = static_check(code, allowed)
    if refused:
        raise UnsafeTask(*refused, allowed, _library_ops_of(code_or_row))
    module = types.ModuleType("opsynth_task")
    exec(compile(code, "<opsynth task>", "exec"), module.__dict__)
    return module


def _library_ops_of(row) -> tuple[str, ...]:
    """The ops of an added library a row names (`kornia.filters.GaussianBlur2d`), for the
    message: never to widen the policy."""
    ops = row.get("ops") if isinstance(row, Mapping) else None
    return tuple(op for op in (ops or ()) if isinstance(op, str) and is_added(op))
