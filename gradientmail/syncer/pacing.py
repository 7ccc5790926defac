"""When the syncer reads what: the pace of its passes (docs/session.md, "Polling").

The rules, apart from the runtime that follows them and on the clock it passes in, so that a
fake clock pins them (tests/test_request_rate.py, tests/test_goodput.py):

* election: the holder renews when due (``Election.poll`` decides); a watcher reads the syncer
  lease once per idle interval (it is renewed every TTL/3), and at every pass once the token
  it watches has stood still for a TTL (expired in its judgement: take over now);
* learners' leases (the elected node only): once per idle interval, at ``poll_interval_s``
  while a round waits for quorum, and when a live lease will have stood still for a TTL;
  each lease's ``due_in_s`` opens a window around when its next contribution is due;
* listings: a full pass lists every fragment's contributions every ``poll_interval_s`` after
  any activity, backing off ×2 per quiet full pass to the collect cap
  (``IDLE_COLLECT_MAX_S``, within [``poll_interval_s``, idle interval]); an expected window
  brings it back to ``poll_interval_s``;
* head pointer: probed once per idle interval per fragment, or when the round says it lags.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gradientmail.records import Lease

__all__ = ["IDLE_COLLECT_MAX_S", "PassPace", "SyncerPacing"]

IDLE_COLLECT_MAX_S = 2.0
"""The longest pause between two listings of contributions while none arrive (the backoff's
cap; never above the idle interval nor below ``poll_interval_s``). A contribution from another
process waits at most this long to be seen when it is the first after a quiet spell."""

_NEVER = float("-inf")


@dataclass(frozen=True)
class PassPace:
    """What a rounds pass leaves its loop: the regular pause and the longest next pause."""

    interval_s: float
    pause_at_most_s: float


class SyncerPacing:
    """The syncer's schedule of reads: when each was last made, and when each is due next.

    Every method takes ``now`` (the syncer's clock); none makes a request.
    """

    def __init__(self, poll_interval_s: float, idle_interval_s: float) -> None:
        self.poll_interval_s = poll_interval_s
        self.idle_interval_s = idle_interval_s
        self.collect_max_s = max(poll_interval_s, min(idle_interval_s, IDLE_COLLECT_MAX_S))
        self.collect_every_s = poll_interval_s
        """The pace of the full pass now: ``poll_interval_s`` after activity, doubling per quiet
        full pass up to ``collect_max_s``."""
        self.leases_read_at = _NEVER
        """When the learners' leases were last read (set before the read: a failed one counts)."""
        self.election_read_at = _NEVER
        self.full_at = _NEVER
        """When the last full pass began."""
        self._expected: list[tuple[float, float]] = []
        """Windows around which learners' leases say contributions are due."""
        self._head_at: dict[int, float] = {}

    def forget(self, election_read_at: float) -> None:
        """The election was just read; every other read is due now (``run_once``)."""
        self.election_read_at = election_read_at
        self.full_at = _NEVER
        self.leases_read_at = _NEVER
        self._head_at.clear()

    def stand_down(self) -> None:
        """Not elected: a future term starts with the leases unread and the regular pace."""
        self.leases_read_at = _NEVER
        self._expected = []
        self.collect_every_s = self.poll_interval_s

    # -- election ------------------------------------------------------------------
    def election_due(self, now: float, *, holder: bool, lease_age_s: float | None, ttl_s: float) -> bool:
        """Whether the election pass polls now: always for the holder (renewing only when due),
        else once per idle interval, or at once when the watched lease has stood still a TTL."""
        if holder:
            return True
        expired = lease_age_s is not None and lease_age_s >= ttl_s
        return expired or now - self.election_read_at >= 0.99 * self.idle_interval_s

    # -- learners' leases ----------------------------------------------------------
    def expect(self, now: float, leases: Iterable[Lease]) -> None:
        """Note when the leases just read (at ``now``) say contributions are due (``due_in_s``,
        a hint: it only sets the pace of the listing)."""
        windows = []
        for lease in leases:
            due_in = lease.info.get("due_in_s")
            if isinstance(due_in, int | float) and not isinstance(due_in, bool) and 0 <= due_in < 1e9:
                # written up to a renewal interval before this read; the upload takes a while after
                windows.append((now + due_in - self.idle_interval_s, now + due_in + self.idle_interval_s))
        self._expected = windows

    def expecting(self, now: float) -> tuple[bool, float]:
        """Whether a learner's contribution is due about now (its lease said so), and the
        seconds until the next such window opens (infinite when none)."""
        inside = any(start <= now <= end for start, end in self._expected)
        upcoming = [start - now for start, _ in self._expected if start > now]
        return inside, min(upcoming, default=float("inf"))

    def leases_in(self, now: float, *, waiting: bool, expiries_s: Iterable[float]) -> float:
        """Seconds until the learners' leases should be read again: once per idle interval, at
        ``poll_interval_s`` while a round is ``waiting`` for quorum, and when a live lease
        expires (``expiries_s``: each live lease's TTL less how long it has stood still)."""
        every = self.poll_interval_s if waiting else self.idle_interval_s
        return min([self.leases_read_at + every - now, *expiries_s])

    def leases_due(self, leases_in_s: float) -> bool:
        return leases_in_s <= 0.01 * self.idle_interval_s

    def live_set_older_than_a_poll(self, now: float) -> bool:
        """Whether the live set is too old to close a round on "every live learner is in"."""
        return now - self.leases_read_at > self.poll_interval_s

    # -- listings and head probes --------------------------------------------------
    def start_pass(self, now: float) -> bool:
        """Whether the pass beginning now is a full one (lists every fragment); remembered."""
        full = now - self.full_at >= 0.9 * self.collect_every_s
        if full:
            self.full_at = now
        return full

    def probe_head(self, fragment: int, now: float, *, forced: bool) -> bool:
        """Whether to probe ``fragment``'s head now (once per idle interval, or ``forced``);
        remembered."""
        probe = forced or now - self._head_at.get(fragment, _NEVER) >= self.idle_interval_s
        if probe:
            self._head_at[fragment] = now
        return probe

    def end_pass(self, now: float, *, full: bool, active: bool, busy: bool, leases_in_s: float) -> PassPace:
        """The pace after a rounds pass: back to ``poll_interval_s`` on activity, a pending
        round or an expected contribution, else ×2 per quiet full pass; the next pause ends no
        later than the next full pass, lease read or expected window."""
        expected, window_in = self.expecting(now)
        if active or busy or expected:
            self.collect_every_s = self.poll_interval_s
        elif full:
            self.collect_every_s = min(self.collect_max_s, 2 * self.collect_every_s)
        interval_s = self.collect_every_s
        if window_in < self.collect_every_s:  # a window opens before the next full pass: be there
            self.collect_every_s = self.poll_interval_s
        return PassPace(interval_s, max(0.0, min(self.full_at + self.collect_every_s - now, leases_in_s, window_in)))
