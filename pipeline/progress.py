"""Progress of a run: a live rich progress bar in a terminal, plain log lines otherwise.

The validate stage reports each verdict as it is decided (`report`), which the bar shows
when Beam runs the stages in this process (the DirectRunner's default mode); when not in a
terminal, the same line goes to the log every `log_every_s` while it changes. Under a
multi-process or remote runner the bar moves once a round, from the round's records.
While the bar is live, log lines are printed above it (rich redirects stderr, and the
root logger's handlers are pointed at the redirected stream), never into it.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter, deque

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as Bar

log = logging.getLogger("opsynth")
_ACTIVE: "Progress | None" = None


def report(passed: bool, reason: str, record=None) -> None:
    if _ACTIVE is not None:
        _ACTIVE.record(passed, reason, record)


def doing(what: str) -> None:
    """What the run is doing now ("composing a round of 1024", "validating"): the quiet heartbeat says it."""
    if _ACTIVE is not None:
        _ACTIVE.doing = what


def stop_requested() -> bool:
    """Whether the run in progress has what it asked for: the work still in flight is not needed."""
    return _ACTIVE is not None and _ACTIVE.done.is_set()


ETA_WINDOW_S = 300.0  # the ETA reads the acceptance rate of the last five minutes
MIN_RECENT, MIN_SPAN_S = 5, 10.0


def _hours(seconds: float) -> str:
    """H:MM:SS with as many hours as there are (strftime's %H wrapped a 24-hour ETA to 1 minute)."""
    minutes, second = divmod(round(seconds), 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}:{second:02d}"


class Progress:
    def __init__(self, target: int, already_accepted: int = 0, stream=None, log_every_s: float = 15.0,
                 started: float | None = None, heartbeat_s: float = 60.0, first_heartbeat_s: float = 10.0):
        """`started`: when the command started (time.monotonic), so that the rate counts its
        set-up too, as stats.json's accepted_per_hour does. A quiet stretch is said first
        after `first_heartbeat_s`, then every `heartbeat_s`."""
        self.target, self.stream, self.log_every_s = target, stream or sys.stderr, log_every_s
        self.heartbeat_s, self.first_heartbeat_s = heartbeat_s, min(first_heartbeat_s, heartbeat_s)
        self.accepted, self.rejected = already_accepted, Counter()
        self.started, self.base = started or time.monotonic(), already_accepted
        self.lock = threading.Lock()
        self.stopped, self.done = threading.Event(), threading.Event()
        self.enough, self.kept = None, []
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.doing = "validating"
        self.acceptances: deque = deque()  # when each acceptance of this command came (time.monotonic)

    def record(self, passed: bool, reason: str, record=None) -> None:
        with self.lock:
            if passed:
                self.accepted += 1
                self.acceptances.append(time.monotonic())
                if record is not None:
                    self.kept.append(record)
            else:
                self.rejected[reason] += 1
            # judged on each acceptance until it holds: past --num-samples it chooses the rows by quota
            if passed and self.enough is not None and not self.done.is_set() and self.enough(self.kept):
                self.done.set()

    def stop_when(self, enough, accepted_records: list) -> None:
        """Set `done` once `enough(accepted records)` holds: a run whose target is met stops
        validating (pipeline/transforms.py) instead of finishing a round it no longer needs."""
        with self.lock:
            self.enough, self.kept = enough, list(accepted_records)
            if enough(self.kept):
                self.done.set()

    def sync(self, accepted: int, rejected: Counter, accepted_records: list | None = None) -> None:
        """Align with the decided records at the end of a round (dedupe and decontamination
        may have changed verdicts after validation): what is enough is judged again."""
        with self.lock:
            self.accepted, self.rejected = accepted, Counter(rejected)
            if accepted_records is not None:
                self.kept = list(accepted_records)
                if self.enough is not None and not self.enough(self.kept):
                    self.done.clear()

    def line(self) -> str:
        """The counts as stats.json gives them: past the target, the rows accepted beyond it
        are held back (held/), not rows."""
        rate, rejects, eta = self._figures()
        beyond = max(self.accepted - self.target, 0)
        accepted = f"{self.accepted - beyond}/{self.target}" + (f" (+{beyond} held back)" if beyond else "")
        return f"accepted {accepted} | rejected {rejects} | {rate * 3600:.0f} accepted/h | ETA {eta}"

    def _figures(self) -> tuple[float, str, str]:
        """(accepted per second over the command, the rejects by reason, the time left or '-'
        when unknown or done). The time left is read from the rate of the last ETA_WINDOW_S,
        and only once MIN_RECENT acceptances give one: the command's own rate counts its
        set-up (a crawl, the reference's trace, composing), and on the H200 it put the ETA at
        10 hours when the rate inside a round said 1.5; from the first acceptance alone it
        said 31 minutes of a run that ended 103 s later."""
        with self.lock:
            now = time.monotonic()
            elapsed = max(now - self.started, 1e-9)
            rate = (self.accepted - self.base) / elapsed
            left = self.target - self.accepted
            eta_rate = self._recent_rate(now)
            eta = _hours(left / eta_rate) if eta_rate and left > 0 else "-"
            top = ", ".join(f"{reason} {n}" for reason, n in self.rejected.most_common(4)) or "none"
            return rate, f"{sum(self.rejected.values())} ({top})", eta

    def _recent_rate(self, now: float) -> float | None:
        """Acceptances a second over the last ETA_WINDOW_S (None until MIN_RECENT of them
        span at least MIN_SPAN_S): from the first of them to now."""
        while self.acceptances and now - self.acceptances[0] > ETA_WINDOW_S:
            self.acceptances.popleft()
        if len(self.acceptances) < MIN_RECENT or now - self.acceptances[0] < MIN_SPAN_S:
            return None
        return (len(self.acceptances) - 1) / (now - self.acceptances[0])

    def __enter__(self):
        global _ACTIVE
        _ACTIVE = self
        if self.live:
            self._start_bar()
        threading.Thread(target=self._refresh if self.live else self._log_changes, daemon=True).start()
        return self

    def __exit__(self, *exc):
        global _ACTIVE
        _ACTIVE = None
        self.stopped.set()
        if self.live:
            self._update_bar()
            self.bar.stop()
            for handler, stream in self.redirected:
                handler.setStream(stream)

    def _start_bar(self) -> None:
        self.bar = Bar(TextColumn("accepted"), MofNCompleteColumn(), BarColumn(bar_width=16), TimeRemainingColumn(),
                       TextColumn("| {task.fields[rate]} | rejected {task.fields[rejects]}"),
                       console=Console(file=self.stream, force_terminal=True), redirect_stderr=True,
                       refresh_per_second=4)
        self.task = self.bar.add_task("run", total=self.target, completed=min(self.accepted, self.target),
                                      rate="", rejects="")
        self.bar.start()
        # Log lines go to the redirected stderr, which prints them above the bar.
        self.redirected = [(handler, handler.setStream(sys.stderr)) for handler in logging.getLogger().handlers
                           if type(handler) is logging.StreamHandler and handler.stream in (sys.__stderr__, self.stream)]

    def _update_bar(self) -> None:
        rate, rejects, _ = self._figures()
        self.bar.update(self.task, completed=min(self.accepted, self.target), rate=f"{rate * 3600:.0f} accepted/h",
                        rejects=rejects)

    def _refresh(self) -> None:
        while not self.stopped.wait(0.5):
            self._update_bar()

    def _log_changes(self) -> None:
        """A line whenever the counts changed (at most every `log_every_s`), and while they do
        not, one after `first_heartbeat_s` and then every `heartbeat_s`: a long validation is
        never silent, and the first verdict of a round is not waited for in silence."""
        logged = (self.accepted, sum(self.rejected.values()))
        quiet_since = time.monotonic()
        last_line = quiet_since - self.log_every_s  # the first verdicts are said at the first look
        said_quiet = False
        while not self.stopped.wait(min(self.log_every_s, self.first_heartbeat_s)):
            now, counts = time.monotonic(), (self.accepted, sum(self.rejected.values()))
            if counts != logged:
                if now - last_line >= self.log_every_s:
                    log.info("%s", self.line())
                    logged, last_line, quiet_since, said_quiet = counts, now, now, False
            elif now - max(quiet_since, last_line) >= (self.heartbeat_s if said_quiet else self.first_heartbeat_s):
                log.info("still %s, no new verdict for %.0f s: %s", self.doing, now - quiet_since, self.line())
                last_line, said_quiet = now, True
