"""When the syncer reads what: the pace of its passes (docs/session.md, "Polling").

The rules, apart from the runtime that follows them and on the clock it passes in, so that a
fake clock pins them (tests/test_request_rate.py, tests/test_goodput.py):

* election: the holder renews when due (``Election.poll`` decides); a watcher reads the syncer
  lease once per idle interval (it is renewed every TTL/3), at its learner's look pace while
  that learner awaits a commit (a holder that resigned is replaced that soon), and at every
  pass once the token it watches has stood still for a TTL (expired in its judgement: take
  over now);
* learners' leases (the elected node only): once per ``LEASE_READ_IDLE_INTERVALS`` idle
  intervals, at ``poll_interval_s`` while a round waits for quorum, and when a live lease will
  have stood still for a TTL;
  each lease's ``due_in_s`` opens a window around when its next contribution is due, and a
  training learner's lease without one (its contribution is due now) a window from the read;
  the leases' step times give the run's shortest sync period;
* listings: a full pass lists every fragment's contributions every ``poll_interval_s`` after
  any activity (a contribution seen, a commit), backing off ×2 per quiet full pass to half the
  shortest sync period, at most the idle interval (to ``head_probe_s`` while no other live
  learner trains); inside an expected window
  and while a round is pending, at the look pace of the shortest period
  (``algorithms.schedule.look_interval``; ``poll_interval_s`` while no learner's step time is
  known);
* head pointer: probed once per ``HEAD_PROBE_TTLS`` lease TTLs per fragment (a version another
  node committed: a deposed holder, a lost race), or when the round says it lags.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gradientmail.algorithms.schedule import look_interval
from gradientmail.records import Lease

__all__ = ["HEAD_PROBE_TTLS", "LEASE_READ_IDLE_INTERVALS", "QUIET_LISTINGS_PER_PERIOD", "PassPace", "SyncerPacing"]

QUIET_LISTINGS_PER_PERIOD = 2
"""While nothing is expected the listing backs off to at most half the shortest sync period (and
at most the idle interval): a contribution no lease announced (a learner's last one, flushed at
close) waits at most that long."""
NOT_STEPPING_IDLE_INTERVALS = 3
"""While the other live learners have not stepped yet, the listing backs off to this many idle
intervals (a lease TTL by default)."""
LEASE_READ_IDLE_INTERVALS = 1.5
"""While no round waits, the elected node reads the learners' leases once per this many idle
intervals (TTL/2 by default): a live learner renews at least once between two reads (every
TTL/3), and a lease that stops is read again when it would expire, whatever this pace, so the
pace decides only how soon a new learner is counted (and, where reads carry no store stamp, how
late a dead one is). Once per idle interval it was 70 % of an idle 8-learner run's GETs."""
HEAD_PROBE_TTLS = 3
"""The elected syncer probes each fragment's head for a version it did not commit once per this
many lease TTLs (it reads the head again before each commit anyway, and contributions on a newer
base tell it sooner)."""

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

    def __init__(
        self,
        poll_interval_s: float,
        idle_interval_s: float,
        *,
        head_probe_s: float | None = None,
        me: str = "",
        sync_every: int = 1,
    ) -> None:
        self.poll_interval_s = poll_interval_s
        self._sync_every = sync_every
        self.steady_s = poll_interval_s
        """The listing pace inside a window or while a round is pending: the look pace of the
        shortest sync period the learners' leases show (``poll_interval_s`` before any shows one)."""
        self.idle_interval_s = idle_interval_s
        self.head_probe_s = idle_interval_s if head_probe_s is None else head_probe_s
        self._me = me
        """This node's learner id: its own lease opens no window (its uploads wake the syncer)."""
        self._regular_cap_s = max(poll_interval_s, idle_interval_s)
        self.collect_max_s = self._regular_cap_s
        """The backoff's cap: half the shortest sync period, at most the idle interval (the idle
        interval while no period is known), or ``head_probe_s`` while no other learner trains."""
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
    def election_due(
        self, now: float, *, holder: bool, lease_age_s: float | None, ttl_s: float, watch_every_s: float | None = None
    ) -> bool:
        """Whether the election pass polls now: always for the holder (renewing only when due),
        else once per idle interval (``watch_every_s`` when shorter: this node's learner awaits
        a commit, so a released or dead holder is replaced at its pace), or at once when the
        watched lease has stood still a TTL."""
        if holder:
            return True
        expired = lease_age_s is not None and lease_age_s >= ttl_s
        every = self.idle_interval_s if watch_every_s is None else min(self.idle_interval_s, watch_every_s)
        return expired or now - self.election_read_at >= 0.99 * every

    # -- learners' leases ----------------------------------------------------------
    def expect(self, now: float, leases: Iterable[Lease]) -> None:
        """Note when the leases just read (at ``now``) say contributions are due (``due_in_s``,
        a hint: it only sets the pace of the listing)."""
        windows, periods, others, unknown = [], [], False, False
        for lease in leases:
            if lease.holder == self._me or lease.info.get("training") is False:
                continue
            others = True
            step_time_s = lease.info.get("step_time_s")
            unknown = unknown or not isinstance(step_time_s, int | float) or isinstance(step_time_s, bool)
            if isinstance(step_time_s, int | float) and _positive(step_time_s):
                periods.append(self._sync_every * float(step_time_s))
            due_in = lease.info.get("due_in_s")
            if isinstance(due_in, int | float) and not isinstance(due_in, bool) and 0 <= due_in < 1e9:
                # written up to a renewal interval before this read; the upload takes a while after
                windows.append((now + due_in - self.idle_interval_s, now + due_in + self.idle_interval_s))
            elif _positive(step_time_s):  # training, and its contribution due now
                windows.append((now, now + self.idle_interval_s))
        self._expected = windows
        shortest = min(periods, default=None)
        self.steady_s = (
            self.poll_interval_s if shortest is None else look_interval(self.poll_interval_s, self.idle_interval_s, shortest)
        )
        if not others:
            # nobody else trains: only this node's learner (whose uploads wake the syncer)
            # contributes, and a newcomer shows in the next read of the leases: a safety net only
            self.collect_max_s = max(self._regular_cap_s, self.head_probe_s)
        elif shortest is not None:  # a contribution nobody announced is seen within half the shortest period
            self.collect_max_s = min(self._regular_cap_s, max(self.poll_interval_s, shortest / QUIET_LISTINGS_PER_PERIOD))
        elif unknown:  # a lease that says nothing of its step time (an older node's): the idle interval
            self.collect_max_s = self._regular_cap_s
        else:
            # others train but none has stepped yet (step time 0): nothing is published before a
            # learner's first due step, and its next renewal shows its step time
            self.collect_max_s = max(self._regular_cap_s, NOT_STEPPING_IDLE_INTERVALS * self.idle_interval_s)

    def expecting(self, now: float) -> tuple[bool, float]:
        """Whether a learner's contribution is due about now (its lease said so), and the
        seconds until the next such window opens (infinite when none)."""
        inside = any(start <= now <= end for start, end in self._expected)
        upcoming = [start - now for start, _ in self._expected if start > now]
        return inside, min(upcoming, default=float("inf"))

    def leases_in(self, now: float, *, waiting: bool, expiries_s: Iterable[float]) -> float:
        """Seconds until the learners' leases should be read again: once per
        ``LEASE_READ_IDLE_INTERVALS`` idle intervals, at ``poll_interval_s`` while a round is
        ``waiting`` for quorum, and when a live lease expires (``expiries_s``: each live lease's
        TTL less how long it has stood still)."""
        every = self.poll_interval_s if waiting else LEASE_READ_IDLE_INTERVALS * self.idle_interval_s
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
        """Whether to probe ``fragment``'s head now (once per ``head_probe_s``, or ``forced``);
        remembered."""
        probe = forced or now - self._head_at.get(fragment, _NEVER) >= self.head_probe_s
        if probe:
            self._head_at[fragment] = now
        return probe

    def end_pass(self, now: float, *, full: bool, active: bool, busy: bool, leases_in_s: float) -> PassPace:
        """The pace after a rounds pass: back to ``poll_interval_s`` on activity; with a pending
        round or an expected contribution, backing off to the steady pace; else ×2 per quiet full
        pass to the idle interval; the next pause ends no later than the next full pass, lease
        read or expected window."""
        expected, window_in = self.expecting(now)
        if active:
            self.collect_every_s = self.poll_interval_s
        elif busy or expected:
            self.collect_every_s = min(self.steady_s, max(self.poll_interval_s, 2 * self.collect_every_s))
        elif full:
            self.collect_every_s = min(self.collect_max_s, 2 * self.collect_every_s)
        interval_s = self.collect_every_s
        if window_in < self.collect_every_s:  # a window opens before the next full pass: be there
            self.collect_every_s = self.steady_s
        return PassPace(interval_s, max(0.0, min(self.full_at + self.collect_every_s - now, leases_in_s, window_in)))


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1e9
