"""Re-sizing along ladders of real layer sizes (filters/checks/measure/resize.py), without the sandbox."""
import random

from filters.checks.measure.resize import (at_level, chosen_sizes, int_constants, kind_of, nearest_level, size_constants,
                                    with_constants, work_ratio)
from operators.layouts import LAYOUTS, draw_sizes, size_table
from operators.sizes import LADDERS, in_ladders, power_of_two

from tests.conftest import make_task

LINEAR = make_task("return self.linear(x)", init="self.linear = nn.Linear(features, features)",
                   constants="batch_size = 2\nfeatures = 32\nkernel_size = 3\ndim = 1")


def test_only_constants_whose_name_says_what_they_size_are_resized():
    assert size_constants(LINEAR) == {"batch_size": 2, "features": 32}
    assert kind_of("dim") is None and kind_of("kernel_size") is None and kind_of("linear_in_features") is None


def test_each_level_moves_the_next_group_one_rung_and_every_moved_size_is_real():
    constants = {"batch_size": 16, "channels": 64, "height": 56, "width": 56}
    levels = [at_level(constants, level) for level in range(0, 7)]
    assert levels[0] == constants
    assert levels[1] == {**constants, "batch_size": 32}
    assert levels[2] == {**levels[1], "channels": 96}
    assert levels[3] == {**levels[2], "height": 64, "width": 64}  # height and width step together: the aspect stays
    for sizes in levels[1:]:
        assert all(sizes[name] % 8 == 0 and in_ladders(sizes[name]) for name in sizes)
    assert all(work_ratio(constants, b) > work_ratio(constants, a) for a, b in zip(levels, levels[1:]))


def test_a_group_at_the_end_of_its_ladder_passes_its_step_on():
    constants = {"batch_size": 8, "features": 512}
    assert at_level(constants, -1) == {"batch_size": 8, "features": 384}
    assert at_level({"batch_size": 8, "features": 64}, -1) is None
    assert at_level(constants, 3, batch_only=True) == {"batch_size": 64, "features": 512}


def test_the_nearest_level_stays_inside_the_bracket():
    constants = {"batch_size": 2, "features": 32}
    level = nearest_level(constants, 1000.0, float("-inf"), float("inf"))
    assert 500 <= work_ratio(constants, at_level(constants, level)) <= 2000
    assert nearest_level(constants, 1000.0, 0, 3) in (1, 2)
    assert nearest_level(constants, 1000.0, 2, 3) is None


def test_the_pool_takes_only_sizes_that_name_a_size_constant_and_are_sane():
    good = {"resized": True, "size.batch_size": 64, "size.features": 256}
    assert chosen_sizes(LINEAR, good) == {"batch_size": 64, "features": 256}
    for forged in ({"size.kernel_size": 5}, {"size.batch_size": True}, {"size.batch_size": 0},
                   {"size.batch_size": 1 << 40}, {"size.features": 2.5}, {"size.torch": 3}):
        assert chosen_sizes(LINEAR, {**good, **forged}) == {}, forged
    rebuilt = with_constants(LINEAR, chosen_sizes(LINEAR, good))
    assert "batch_size = 64\nfeatures = 256\nkernel_size = 3\n" in rebuilt


def test_drawn_sizes_are_real_layer_sizes_with_real_aspect_ratios():
    rng = random.Random(0)
    for layout in LAYOUTS.values():
        table = size_table(layout)
        assert len(table) >= 20, layout.name
        shapes = [draw_sizes(layout, rng).sizes for _ in range(50)]
        assert len(set(shapes)) > 10, layout.name
        for shape in shapes:
            assert all(size % 8 == 0 and in_ladders(size) for size in shape), shape
            if layout.name == "image":
                assert shape[2] == shape[3] and 1024 <= shape[1] * shape[3] <= 16384, shape
    drawn = [size for _ in range(200) for size in draw_sizes(LAYOUTS["features"], rng).sizes]
    assert sum(map(power_of_two, drawn)) / len(drawn) > 0.6


def test_ladders_hold_only_multiples_of_eight():
    assert all(rung % 8 == 0 for ladder in LADDERS.values() for rung in ladder)


def test_setting_constants_changes_the_module_level_ints_alone_and_keeps_every_other_character():
    code = ("import torch  # sizes below\n\n"
            "batch_size = 2  # the batch\n"
            "features = (16 *\n            2)\n"
            "a = b = 8\n"
            "height = 4; width = 4\n"
            "dim: int = 1\n\n\n"
            "class Model(torch.nn.Module):\n"
            "    batch_size = 2\n"
            "    features = 32\n")
    sizes = {"batch_size": 64, "features": 256, "a": 1, "height": 1, "width": 1, "dim": 3}
    assert int_constants(code) == {"batch_size": 2, "features": 32}  # one name to one int, at module level
    assert with_constants(code, sizes) == code.replace("batch_size = 2  #", "batch_size = 64  #", 1).replace(
        "(16 *\n            2)", "256", 1)
    assert with_constants(code, {}) == code
    assert with_constants(with_constants(code, sizes), {"batch_size": 2}) == \
        code.replace("(16 *\n            2)", "256", 1)  # from the rebuilt text, not a stale parse
