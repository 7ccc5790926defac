"""The background loop every role runs: one pass over the mailbox, a pause, again.

A failing pass never kills the thread: store hiccups (``GradientMailError``) are logged as
warnings and anything else with its traceback, and the next pass tries again. A failure that
repeats (an object in the bucket that stops a fragment, an unreachable server) is logged once,
then once every ``REPEAT_REPORT_S`` with how often it recurred (``RepeatedFailures``), so ten
passes a second do not become ten warnings a second.

The pause is ``interval_s`` between rounds. When a round is due, ``hurry()`` tightens it: the
next pause is ``fast_interval_s`` and each one after grows by ``backoff`` until it is back at
``interval_s``, and in any case for no longer than the ``for_s`` the hurry asked for, so a
hurry costs a bounded number of extra passes (about a dozen with the defaults) whatever
happens. ``wake()`` runs the next pass at once; ``pause_at_most()`` (called from a pass)
shortens only the next pause, for a deadline the pass knows of, such as a grace window's end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gradientmail.errors import GradientMailError

__all__ = ["FAST_INTERVAL_S", "HURRY_S", "REPEAT_REPORT_S", "PollingLoop", "RepeatedFailures", "idle_interval"]

log = logging.getLogger(__name__)

FAST_INTERVAL_S = 0.01
"""The first pause of a hurry."""
BACKOFF = 1.3
"""Each pause of a hurry is this much longer than the one before, up to ``interval_s``."""
HURRY_S = 5.0
"""The longest a hurry lasts unless asked otherwise."""
REPEAT_REPORT_S = 60.0
"""A failure that recurs pass after pass is logged again at most this often, with its count."""


class RepeatedFailures:
    """Warnings for one source of failures (a loop, a fragment): each new message at once, the
    same message again at most once every ``REPEAT_REPORT_S`` with how often it recurred, and
    one line when it stops."""

    def __init__(self, logger: logging.Logger, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._what = what
        self._clock = clock
        self._message: str | None = None
        self._reported_at = 0.0
        self._repeats = 0
        self.reported = 0
        """Warnings logged so far (read by tests)."""

    def failed(self, message: str) -> None:
        now = self._clock()
        if message == self._message and now - self._reported_at < REPEAT_REPORT_S:
            self._repeats += 1
            return
        again = f" (again {self._repeats} times since)" if message == self._message and self._repeats else ""
        self._log.warning("%s: %s%s", self._what, message, again)
        self._message, self._reported_at, self._repeats = message, now, 0
        self.reported += 1

    def recovered(self) -> None:
        if self._message is not None:
            self._log.info("%s: recovered (after %d repeats of the last failure)", self._what, self._repeats)
            self._message, self._repeats = None, 0


def idle_interval(poll_interval_s: float, lease_ttl_s: float, idle_interval_s: float | None = None) -> float:
    """The pace of passes that only look for news while nothing is expected (docs/session.md,
    "Polling"): ``idle_interval_s`` when given, else a third of the lease TTL (how often leases
    are renewed, so lease reads at this pace miss no renewal), never below ``poll_interval_s``."""
    chosen = lease_ttl_s / 3 if idle_interval_s is None else idle_interval_s
    return max(poll_interval_s, chosen)


class PollingLoop:
    """Calls ``run_pass`` on its own thread every ``interval_s`` seconds, or sooner when woken
    or hurried (see the module docstring)."""

    def __init__(
        self,
        name: str,
        run_pass: Callable[[], None],
        interval_s: float,
        *,
        fast_interval_s: float = FAST_INTERVAL_S,
        backoff: float = BACKOFF,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if backoff < 1:
            raise ValueError("backoff must be at least 1")
        self.name = name
        self._run_pass = run_pass
        self.interval_s = interval_s
        self._fast_interval_s = min(fast_interval_s, interval_s)
        self._backoff = backoff
        self._clock = clock
        self._lock = threading.Lock()
        self._hurry_until = float("-inf")
        self._next_fast: float | None = None
        """The next pause while hurrying; None when not hurrying."""
        self._at_most: float | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        """Passes run so far (read by tests and benchmarks)."""
        self._failures = RepeatedFailures(log, name, clock)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def hurrying(self) -> bool:
        with self._lock:
            return self._next_fast is not None and self._clock() < self._hurry_until

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the next pass now instead of after the pause."""
        self._wake.set()

    def take_wake(self) -> bool:
        """Whether a wake-up is pending, clearing it: what the thread does as each pass begins
        (a wake-up during the pass still runs the next one at once). Public for a harness that
        runs the passes itself on a fake clock."""
        woken = self._wake.is_set()
        self._wake.clear()
        return woken

    def hurry(self, for_s: float = HURRY_S) -> None:
        """Poll fast for at most ``for_s`` seconds: pauses from ``fast_interval_s`` growing back
        to ``interval_s``; a hurry under way restarts at its fastest pace. From another thread
        it also runs the next pass now (whatever it was due to is probably there already)."""
        with self._lock:
            self._hurry_until = max(self._hurry_until, self._clock() + for_s)
            self._next_fast = self._fast_interval_s
        if threading.current_thread() is not self._thread:
            self._wake.set()

    def settle(self) -> None:
        """End a hurry now (what it waited for has happened): back to ``interval_s``."""
        with self._lock:
            self._next_fast = None
            self._hurry_until = float("-inf")

    def pause_at_most(self, seconds: float) -> None:
        """Make the next pause no longer than ``seconds`` (from a pass: a deadline it knows)."""
        with self._lock:
            self._at_most = seconds if self._at_most is None else min(self._at_most, seconds)

    def next_pause(self) -> float:
        """The pause before the next pass, advancing the hurry's backoff (the loop's clockwork,
        public so that tests can follow it without threads)."""
        with self._lock:
            pause = self.interval_s
            if self._next_fast is not None:
                remaining = self._hurry_until - self._clock()
                if remaining <= 0 or self._next_fast >= self.interval_s:
                    self._next_fast = None
                else:
                    pause = min(self._next_fast, remaining)
                    self._next_fast *= self._backoff
            if self._at_most is not None:
                pause = max(0.0, min(pause, self._at_most))
                self._at_most = None
            return pause

    def stop(self) -> None:
        """Ask the thread to stop and wait for the pass in progress to end."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.take_wake()  # a wake-up during the pass below still runs the next pass at once
            try:
                self._run_pass()
            except GradientMailError as exc:  # the store hiccuped: try again next pass
                self._failures.failed(f"pass failed, retrying: {exc}")
            except Exception:  # never let the thread die silently
                log.exception("%s: pass crashed, retrying", self.name)
            else:
                self._failures.recovered()
            self.passes += 1
            pause = self.next_pause()
            if pause > 0:
                self._wake.wait(pause)
