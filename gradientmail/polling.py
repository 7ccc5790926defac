"""The background loop every role runs: one pass over the mailbox, a pause, again.

A failing pass never kills the thread: store hiccups (``GradientMailError``) are logged as
warnings and anything else with its traceback, and the next pass tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gradientmail.errors import GradientMailError

__all__ = ["PollingLoop"]

log = logging.getLogger(__name__)


class PollingLoop:
    """Calls ``run_pass`` on its own thread every ``interval_s`` seconds, or sooner when woken."""

    def __init__(self, name: str, run_pass: Callable[[], None], interval_s: float) -> None:
        self.name = name
        self._run_pass = run_pass
        self._interval_s = interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the next pass now instead of after the pause."""
        self._wake.set()

    def stop(self) -> None:
        """Ask the thread to stop and wait for the pass in progress to end."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._run_pass()
            except GradientMailError as exc:  # the store hiccuped: try again next pass
                log.warning("%s: pass failed, retrying: %s", self.name, exc)
            except Exception:  # never let the thread die silently
                log.exception("%s: pass crashed, retrying", self.name)
            self._wake.wait(self._interval_s)
            self._wake.clear()
