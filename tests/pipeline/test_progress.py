import io
import logging
import re
import time
from collections import Counter

from pipeline import progress
from pipeline.progress import Progress


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
    assert status.line().startswith("accepted 3/3") and status.line().endswith("ETA -")


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
