"""The checks in the order a worker runs them (`CHECKS`; filters/checks/harness.py runs it).
Their verdicts, in the same order, are filters/checks/registry.py `RULES`: the registry the
funnel, the card, the repair loop, the configuration and the zygote read, importing no
check's measuring code. `TimedAlone` lives here: it runs the checks at the chosen size again."""
from __future__ import annotations

from filters.checks.base import Check, TaskUnderTest
from filters.checks.compiles import Compiles
from filters.checks.depends_on_input import DependsOnInput, MovesPerElement
from filters.checks.deterministic import Deterministic
from filters.checks.measure.execution import release
from filters.checks.nothing_dead import NothingDead
from filters.checks.pure import Pure
from filters.checks.timing import EXECUTES, InTimingWindow
from filters.checks.well_conditioned import WellConditioned


class TimedAlone(InTimingWindow):
    """The timing check's precise measure (the GPU alone, every other worker's step waiting),
    taken once every check between passed at the size the quick measures chose. Taken before
    them, it was spent on every candidate they then rejected: on the H200 (512 candidates, 16
    workers) 230 of the 478 timed, 377 of the timers' 664 s of waiting, and the closures
    every other worker's steps waited behind. Where the precise measure sends the search on
    (a quick one reads slow beside other workers), those checks run again at the size it
    ends at: an accepted row passed every check at the size it keeps."""

    def run(self, t: TaskUnderTest) -> None:
        at_the_chosen_size = t.code
        t.other_out = []  # the checks between are done with it: the precise measure's peak is the task's own
        release(t.device)
        super().run(t)
        if t.code != at_the_chosen_size:
            for check in AT_THE_CHOSEN_SIZE:
                if check.enabled(t.cfg):
                    check.run(t)


AT_THE_CHOSEN_SIZE: tuple[Check, ...] = (Deterministic(), Pure(), DependsOnInput(), MovesPerElement(),
                                         WellConditioned(), NothingDead())
CHECKS: tuple[Check, ...] = (EXECUTES, InTimingWindow(precise=False), *AT_THE_CHOSEN_SIZE, TimedAlone(), Compiles())
