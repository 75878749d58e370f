"""Re-sizing: change a task's module-level size constants (libcst), keeping everything else.

The timing check scales the whole problem, not the batch alone: batch, features or
channels, spatial and sequence sizes step together along ladders of the sizes real layers
use (operators/layouts.py, LADDERS), so a task brought into the timing window still reads as
a real layer (a 32-feature Linear no longer gets a batch of 229,391). A constant's name says
what it sizes; a name that says nothing (kernel_size, num_heads, `dim` (a reduction's axis,
as often as a width), a slug's constant such as `linear_in_features = features`, which
follows its layout constant) is left as it is.

`level` k of a task is its constants after k steps (negative: smaller). Each step moves the
next group of constants of one kind (the batch, then the widths, then the extents, and
round again) one rung along its ladder; a group at its ladder's end passes its step on. Level
0 is the task as written. A task whose model cannot be built at other widths or extents is
re-sized by its batch alone (`batch_only`).
"""
from __future__ import annotations

import functools
import math
import re

import libcst as cst

from operators.sizes import BATCH, CHANNELS, FRAMES, HIDDEN, LADDERS, SEQUENCE, SPATIAL

RESIZE_CONSTANT = "batch_size"
MAX_SIZE = 1 << 20  # no size constant a re-sized task is given is larger
SIZE_METRIC = "size."  # the metric `size.<name>` holds the value a re-sizing gave constant <name>

# What a constant's whole name says it sizes (KernelBench's names and the layouts' own).
KINDS = (
    (BATCH, r"batch_size|batch|bs|n_batch|num_batches"),
    (HIDDEN, r"features|in_features|out_features|hidden|hidden_size|hidden_dim|d_model|embed_dim|"
             r"input_size|input_dim|output_dim|d_ff|ffn_dim|intermediate_size|n_embd|model_dim|embedding_dim"),
    (CHANNELS, r"channels|in_channels|out_channels|num_channels|in_ch|out_ch|filters"),
    (SEQUENCE, r"seq_len|sequence_length|seq_length|length|seq|num_tokens|tokens|signal_length|input_length"),
    (SPATIAL, r"height|width|image_size|img_size|spatial_size|resolution|in_height|in_width"),
    (FRAMES, r"depth|frames|num_frames|in_depth"),
)
# The order groups take their steps: the batch first (it changes no weight), then what a
# layer's weights are sized by, then the extents its kernels sweep.
STEP_ORDER = (BATCH, HIDDEN, CHANNELS, SEQUENCE, SPATIAL, FRAMES)
# How much a step of each kind changes the work: a width sizes a layer's input and its
# output (a Linear's or a conv's work goes with in x out), the others once.
WORK_EXPONENT = {HIDDEN: 2, CHANNELS: 2}
MAX_LEVEL = 48


def kind_of(name: str) -> str | None:
    for kind, pattern in KINDS:
        if re.fullmatch(pattern, name, flags=re.IGNORECASE):
            return kind
    return None


def size_constants(code: str) -> dict[str, int]:
    """The module-level `NAME = <int>` constants (or int arithmetic: `_integer`) whose name
    says what they size, by name."""
    return {name: value for name, value in int_constants(code).items() if kind_of(name) and value > 0}


def int_constants(code: str) -> dict[str, int]:
    """Every module-level `NAME = <int>` of `code`, by name, whatever it sizes; the last
    assignment of a name wins, as it does at run time."""
    return {assign.targets[0].target.value: _integer(assign.value)
            for statement in _parsed(code).body if (assign := _is_constant(statement))}


def at_level(constants: dict[str, int], level: int, batch_only: bool = False) -> dict[str, int] | None:
    """The constants after `level` steps (module docstring), or None when no group can take
    that many. Level 0 is `constants` unchanged; any other level gives every constant it
    re-sizes a rung of its ladder."""
    groups = _groups(constants, batch_only)
    if not groups:
        return None
    values = dict(constants)
    direction = 1 if level > 0 else -1
    turn = 0
    for _ in range(abs(level)):
        for attempt in range(len(groups)):
            group = groups[(turn + attempt) % len(groups)]
            moved = _step(values, group, direction)
            if moved is not None:
                values.update(moved)
                turn = (turn + attempt + 1) % len(groups)
                break
        else:
            return None
    return values


def work_ratio(before: dict[str, int], after: dict[str, int]) -> float:
    """About how much more work the task does at `after` than at `before` (WORK_EXPONENT)."""
    return math.prod((after[name] / before[name]) ** WORK_EXPONENT.get(kind_of(name), 1)
                     for name in before if name in after)


def nearest_level(constants: dict[str, int], factor: float, low: float, high: float,
                  batch_only: bool = False) -> int | None:
    """The level strictly between `low` and `high` whose work is nearest (in log) `factor`
    times the work at level 0; None when none lies between."""
    best, best_gap = None, math.inf
    first, last = math.floor(max(low, -MAX_LEVEL - 1)) + 1, math.ceil(min(high, MAX_LEVEL + 1)) - 1
    for level in range(first, last + 1):
        sizes = at_level(constants, level, batch_only)
        if sizes is None:
            continue
        gap = abs(math.log(work_ratio(constants, sizes)) - math.log(max(factor, 1e-9)))
        if gap < best_gap:
            best, best_gap = level, gap
    return best


def _groups(constants: dict[str, int], batch_only: bool) -> list[list[str]]:
    kinds = (BATCH,) if batch_only else STEP_ORDER
    return [group for kind in kinds if (group := sorted(n for n in constants if kind_of(n) == kind))]


def _step(values: dict[str, int], group: list[str], direction: int) -> dict[str, int] | None:
    """Every constant of the group one rung up or down its ladder; None when one is at its end."""
    ladder = LADDERS[kind_of(group[0])]
    moved = {}
    for name in group:
        rungs = [r for r in ladder if (r > values[name] if direction > 0 else r < values[name])]
        if not rungs:
            return None
        moved[name] = min(rungs) if direction > 0 else max(rungs)
    return moved


def sizes_metrics(original: dict[str, int], chosen: dict[str, int]) -> dict[str, int]:
    """What the timing check records of a re-sizing: `size.<name>` for each constant changed."""
    return {SIZE_METRIC + name: value for name, value in chosen.items() if original.get(name) != value}


def chosen_sizes(code: str, metrics: dict) -> dict[str, int]:
    """The sizes a child says it chose for `code` (its `size.<name>` metrics), kept only if
    every one names a size constant of `code` and is an int in [1, MAX_SIZE]: the numbers
    come from a child that ran the task, so a bad one voids them all. Empty: none valid."""
    constants = size_constants(code)
    chosen = {}
    for key, value in metrics.items():
        if not key.startswith(SIZE_METRIC):
            continue
        name = key[len(SIZE_METRIC):]
        if name not in constants or isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
            return {}
        chosen[name] = value
    return chosen


def as_stored(code: str, metrics: dict) -> str:
    """`code` as the pool stores it: at the sizes the checks chose (`chosen_sizes`),
    when they re-sized it. The pool builds the row with it, and the worker traces it: a trace
    of the code as submitted missed a task whose ops change past its submitted batch."""
    chosen = chosen_sizes(code, metrics) if metrics.get("resized") is True else {}
    return with_constants(code, chosen) if chosen else code


def with_constants(code: str, values: dict[str, int]) -> str:
    """`code` with each `name = <int>` of `values` set (a task the checks re-sized, rebuilt
    from its original code and the sizes they chose). Only the module's own statements are
    rebuilt: visiting the whole tree was most of a trace's cost in `opsynth dedupe`."""
    module = _parsed(code)
    return module.with_changes(body=[_set_constant(statement, values) for statement in module.body]).code


@functools.lru_cache(maxsize=8)
def _parsed(code: str) -> cst.Module:
    """One parse for the several readings and re-sizings of one task (libcst's trees are immutable)."""
    return cst.parse_module(code)


def _set_constant(statement: cst.CSTNode, values: dict[str, int]) -> cst.CSTNode:
    assign = _is_constant(statement)
    name = assign.targets[0].target.value if assign else None
    if name not in values:
        return statement
    return statement.with_changes(body=[assign.with_changes(value=cst.Integer(str(values[name])))])


def _is_constant(node: cst.CSTNode) -> cst.Assign | None:
    if not isinstance(node, cst.SimpleStatementLine):
        return None
    statement = node.body[0] if len(node.body) == 1 else None
    if (isinstance(statement, cst.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0].target, cst.Name) and _integer(statement.value) is not None):
        return statement
    return None


# The arithmetic of a written size (`M = 256 * 8`, `N = 1 << 14`, `2 ** 14`): its value is read and set as one int.
_ARITHMETIC = {cst.Multiply: lambda a, b: a * b, cst.Add: lambda a, b: a + b, cst.Subtract: lambda a, b: a - b,
               cst.FloorDivide: lambda a, b: a // b if b else None, cst.LeftShift: lambda a, b: a << b if 0 <= b < 40 else None,
               cst.Power: lambda a, b: a ** b if 0 <= b < 40 and abs(a) <= 1 << 20 else None}


def _integer(node: cst.BaseExpression) -> int | None:
    """The value of an int literal, or of + - * // << ** between them; None for anything else."""
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value)
    if isinstance(node, cst.BinaryOperation) and type(node.operator) in _ARITHMETIC:
        left, right = _integer(node.left), _integer(node.right)
        if left is not None and right is not None:
            return _ARITHMETIC[type(node.operator)](left, right)
    return None
