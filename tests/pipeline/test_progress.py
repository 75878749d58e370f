import io
import time
from collections import Counter

from pipeline import progress
from pipeline.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_live_line_in_a_terminal_counts_verdicts_as_they_are_reported():
    screen = Terminal()
    with Progress(target=10, stream=screen) as status:
        for passed, reason in [(True, ""), (False, "too_fast"), (True, ""), (False, "too_fast"), (False, "timeout")]:
            progress.report(passed, reason)
        time.sleep(0.7)
        assert "accepted 2/10 | rejected 3 (too_fast 2, timeout 1)" in screen.getvalue()
        status.sync(4, Counter({"too_fast": 1}))
    final = screen.getvalue().rsplit("\x1b[2K", 1)[-1]
    assert final.startswith("accepted 4/10 | rejected 1 (too_fast 1)") and final.endswith("\n")
    progress.report(True, "")  # no run in progress: nothing to update, no error


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
