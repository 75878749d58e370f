"""Progress of a run: a live status line in a terminal, plain log lines otherwise.

The validate stage reports each verdict as it is decided (`report`), which the live line
shows when Beam runs the stages in this process (the DirectRunner's default mode); when not
in a terminal, the same line goes to the log every `log_every_s` while it changes. Under a
multi-process or remote runner the line moves once a round, from the round's records.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter

log = logging.getLogger("opsynth")
_ACTIVE: "Progress | None" = None


def report(passed: bool, reason: str) -> None:
    if _ACTIVE is not None:
        _ACTIVE.record(passed, reason)


class Progress:
    def __init__(self, target: int, already_accepted: int = 0, stream=None, log_every_s: float = 15.0):
        self.target, self.stream, self.log_every_s = target, stream or sys.stderr, log_every_s
        self.accepted, self.rejected = already_accepted, Counter()
        self.started, self.base = time.monotonic(), already_accepted
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()

    def record(self, passed: bool, reason: str) -> None:
        with self.lock:
            if passed:
                self.accepted += 1
            else:
                self.rejected[reason] += 1

    def sync(self, accepted: int, rejected: Counter) -> None:
        """Align with the decided records at the end of a round (dedupe and decontamination
        may have changed verdicts after validation)."""
        with self.lock:
            self.accepted, self.rejected = accepted, Counter(rejected)

    def line(self) -> str:
        with self.lock:
            elapsed = max(time.monotonic() - self.started, 1e-9)
            rate = (self.accepted - self.base) / elapsed
            left = self.target - self.accepted
            eta = f"{left / rate:.0f} s" if rate > 0 and left > 0 else "-"
            top = ", ".join(f"{reason} {n}" for reason, n in self.rejected.most_common(4)) or "none"
            return (f"accepted {self.accepted}/{self.target} | rejected {sum(self.rejected.values())} ({top}) | "
                    f"{rate * 3600:.0f} accepted/h | ETA {eta}")

    def __enter__(self):
        global _ACTIVE
        _ACTIVE = self
        threading.Thread(target=self._refresh if self.live else self._log_changes, daemon=True).start()
        return self

    def __exit__(self, *exc):
        global _ACTIVE
        _ACTIVE = None
        self.stopped.set()
        if self.live:
            self.stream.write("\r\x1b[2K" + self.line() + "\n")
            self.stream.flush()

    def _refresh(self) -> None:
        while not self.stopped.wait(0.5):
            self.stream.write("\r\x1b[2K" + self.line())
            self.stream.flush()

    def _log_changes(self) -> None:
        logged = (self.accepted, sum(self.rejected.values()))
        while not self.stopped.wait(self.log_every_s):
            now = (self.accepted, sum(self.rejected.values()))
            if now != logged:
                log.info("%s", self.line())
                logged = now
