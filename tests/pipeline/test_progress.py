import io
import logging
import re
import time
from collections import Counter, deque

from pipeline import progress
from pipeline.progress import MIN_RECENT, Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True

    def text(self) -> str:
        """What was written, without the colour and cursor codes."""
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", self.getvalue())


def test_live_bar_in_a_terminal_counts_verdicts_and_keeps_log_lines_out_of_it(monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")  # a terminal this wide
    screen = Terminal()
    handler = logging.StreamHandler(screen)
    logging.getLogger().addHandler(handler)
    try:
        with Progress(target=10, stream=screen) as status:
            for passed, reason in [(True, ""), (False, "too_fast"), (True, ""), (False, "too_fast"), (False, "timeout")]:
                progress.report(passed, reason)
            time.sleep(0.8)
            assert "accepted  2/10" in screen.text() and "rejected 3 (too_fast 2, timeout 1)" in screen.text()
            logging.getLogger("opsynth").warning("round of 8 done")
            status.sync(4, Counter({"too_fast": 1}))
            time.sleep(0.8)
    finally:
        logging.getLogger().removeHandler(handler)
    lines = [line.rsplit("\r", 1)[-1] for line in screen.text().splitlines()]
    logged = [line for line in lines if "round of 8 done" in line]
    assert logged and all("accepted" not in line for line in logged)  # a line of its own, not inside the bar
    assert "4/10" in lines[-1] and "rejected 1 (too_fast 1)" in lines[-1]
    assert handler.stream is screen  # the handler writes where it did before the run
    progress.report(True, "")  # no run in progress: nothing to update, no error


def test_the_eta_is_a_time_left_and_never_negative():
    status = Progress(target=3, already_accepted=5, stream=io.StringIO())
    # the counts stats.json gives: 3 rows, and 2 beyond the target held back
    assert status.line().startswith("accepted 3/3 (+2 held back)") and status.line().endswith("ETA -")


def test_no_eta_is_guessed_from_the_first_acceptances():
    """From one acceptance after the set-up, the ETA said 31 minutes of a run that ended 103 s later."""
    status = Progress(target=40, stream=io.StringIO(), started=time.monotonic() - 50)
    status.record(True, "")
    assert status.line().endswith("ETA -")


def test_plain_log_lines_when_not_a_terminal_and_only_while_counts_change(caplog):
    plain = io.StringIO()
    with caplog.at_level("INFO", logger="opsynth"), Progress(target=3, stream=plain, log_every_s=0.2):
        progress.report(True, "")
        time.sleep(0.5)
        progress.report(False, "timeout")
        time.sleep(0.7)
    assert plain.getvalue() == ""  # no terminal control codes where there is no terminal
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" | ")[:2] for line in lines] == [["accepted 1/3", "rejected 0 (none)"],
                                                          ["accepted 1/3", "rejected 1 (timeout 1)"]]


def test_a_quiet_validation_is_never_silent(caplog):
    """No verdict for a while (a compile, a long candidate): a line says the run is still at it,
    first soon (the first verdict of a round came 28-85 s after it was composed, in silence),
    then less often."""
    with caplog.at_level("INFO", logger="opsynth"), Progress(target=3, stream=io.StringIO(), log_every_s=0.1,
                                                             heartbeat_s=0.6, first_heartbeat_s=0.2):
        time.sleep(1.1)
    said = [(r.created, r.getMessage()) for r in caplog.records]
    assert said and all(line.startswith("still validating, no new verdict for") for _, line in said)
    gaps = [b - a for (a, _), (b, _) in zip(said, said[1:])]
    assert 2 <= len(said) <= 3 and all(gap >= 0.5 for gap in gaps), said


def test_the_run_is_done_once_what_it_asked_for_is_accepted():
    status = Progress(target=2, stream=io.StringIO())
    status.stop_when(lambda accepted: len(accepted) >= 2, [])
    status.record(True, "", ("a", None))
    assert not status.done.is_set()
    status.record(True, "", ("b", None))
    assert status.done.is_set()
    status.sync(1, {}, [("a", None)])  # decontamination took one back: the run is not done after all
    assert not status.done.is_set()


def test_a_quiet_composition_says_it_is_composing(caplog):
    """While a round is composed no verdict can come: the heartbeat says so, not "validating"."""
    from pipeline import progress

    with caplog.at_level("INFO", logger="opsynth"), Progress(target=3, stream=io.StringIO(), log_every_s=0.1,
                                                             heartbeat_s=0.3):
        progress.doing("composing a round of 64")
        time.sleep(0.8)
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(line.startswith("still composing a round of 64, no new verdict for") for line in lines)


def test_the_eta_reads_the_recent_rate_not_the_set_up(monkeypatch):
    """A command that spent an hour setting up, then accepts 10 a second: the time left is
    read from the 10 a second, while the rate shown stays the command's own (stats.json's)."""
    monkeypatch.setattr(progress, "MIN_SPAN_S", 2.0)  # the recent rate from 4 s of acceptances
    status = Progress(target=1000, stream=io.StringIO(), started=time.monotonic() - 3600)
    assert status.line().endswith("ETA -")
    for _ in range(40):
        status.record(True, "")
        time.sleep(0.1)
    rate, _, eta = status._figures()
    hours, minutes, seconds = (int(part) for part in eta.split(":"))
    assert rate * 3600 < 60  # 40 in an hour and 4 seconds
    assert 60 <= hours * 3600 + minutes * 60 + seconds <= 200  # 960 left at about 10 a second


def test_an_eta_past_a_day_says_so():
    """strftime's %H wrapped 24 hours and 86 s to `00:01:26`."""
    status = Progress(target=10_000, stream=io.StringIO())
    for _ in range(MIN_RECENT):
        status.record(True, "")
    status.acceptances = deque(time.monotonic() - 100 + 25 * i for i in range(MIN_RECENT))  # one every 25 s
    hours = int(status._figures()[2].split(":")[0])
    assert 60 <= hours <= 80  # 9,995 left at one in 25 s: 69 hours
