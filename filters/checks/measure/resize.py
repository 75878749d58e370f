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

import ast
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


SMALL_BATCH = 4  # the batch size of a trace on real tensors
# A trace on real tensors also shrinks every other module-level int of at least SHRINK_FROM
# (what a name like `dim1`, `M` or `features` holds; kernel sizes, strides, heads and groups
# are smaller and kept) by the largest power of two that divides it and leaves SMALL_EXTENT.
SHRINK_FROM, SMALL_EXTENT = 64, 16


def small_problem(code: str, every_divisor: bool = False) -> tuple[str, str]:
    """(the small problem, the small batch): `code` at a batch of SMALL_BATCH at most with its
    large constants shrunk (SHRINK_FROM), and at that batch alone, from one reading of its
    constants: where a task's trace reads it (harness.read) and the template composer's checks
    screen runs it (pipeline/composers/screen.py). op_graph's value comparisons cost seconds a
    tensor of KernelBench's full widths (a trace of 4096 x 4096 x 512 x 512 took 35 s of CPU,
    and the worker stops one at 20 s), and a power of two keeps what the constants' ratios and divisors were. A task
    whose model cannot be built so is traced at its widths, at the small batch: real
    tensors cost memory and time, and a batch of a few samples still has parts for a task
    that splits it (one sample would leave an empty half, which some ops refuse).

    A width keeps 8 to a part of each constant named a group or a head that divides it, or,
    `every_divisor`, of each small constant that divides it, whatever its name (a task read
    where the small problem made a dimension of one: harness.read)."""
    constants = int_constants(code)
    batch = RESIZE_CONSTANT if constants.get(RESIZE_CONSTANT, 0) > 0 else _first_input_size(code)
    small_batch = {batch: SMALL_BATCH} if (constants.get(batch) or 0) > SMALL_BATCH else {}
    splits = {name: value for name, value in constants.items() if re.search("group|head", name, re.IGNORECASE)
              or every_divisor and name != batch and 1 < value < SHRINK_FROM}
    shrunk = {}
    for name, value in constants.items():
        # a width split in groups or heads (a constant so named that divides it) keeps 8 to a
        # group: a group norm of groups of one or two is no norm to recognise
        floor = max([SMALL_EXTENT, *(8 * d for d in splits.values() if d > 1 and value % d == 0)])
        if name not in {*splits, batch} and value >= SHRINK_FROM and _halvings(value, floor):
            shrunk[name] = value >> _halvings(value, floor)
    at_batch = with_constants(code, small_batch) if small_batch else code
    return (with_constants(code, {**small_batch, **shrunk}) if shrunk else at_batch), at_batch


def _halvings(value: int, floor: int) -> int:
    """How many times `value` halves evenly and stays at least `floor`."""
    times = 0
    while value % 2 == 0 and value // 2 >= floor:
        value, times = value // 2, times + 1
    return times


def _first_input_size(code: str) -> str | None:
    """The module-level constant that sizes the first dimension of the first tensor
    `get_inputs` makes: the batch, in a task that calls it something else than
    `batch_size` (a renamed copy would otherwise trace at full size, past the time limit)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    builder = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "get_inputs"),
                   None)
    for call in (node for node in ast.walk(builder) if isinstance(node, ast.Call)) if builder else ():
        first = call.args[0] if call.args else None
        first = first.elts[0] if isinstance(first, (ast.Tuple, ast.List)) and first.elts else first
        if isinstance(first, ast.Name):
            return first.id
    return None

