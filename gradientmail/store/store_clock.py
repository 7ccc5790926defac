"""The store's clock, as this node can tell it: bounds on (store time − local time).

Nodes of a run share no clock, but they share the store, and the store stamps every write with
its own time (``ObjectInfo.modified_at``: S3's ``Last-Modified``, a file's mtime), truncated to
a resolution ``r`` (1 s for S3). A write sent at local time ``t0`` whose response came back at
``t1`` and was stamped ``s`` happened at some store time in ``[s, s + r)`` and some local time in
``[t0, t1]``, so the offset θ = store − local lies in ``[s − t1, s + r − t0]``. Each sample is
such an interval; the estimate is their intersection. With 1 s stamps one sample leaves a
second of doubt; writes timed so that the store's second turns while they land
(:meth:`StoreClock.next_probe_at`) narrow it to a few milliseconds within seconds. Samples
that do not intersect (a clock stepped, a store that rounds instead of truncating) restart the
estimate from the newest one.

Pure arithmetic on given times, so the rules are tested with a fake clock
(``tests/test_barrier.py``); ``session.barrier`` takes the samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["PROBES_PER_TICK", "ClockSample", "StoreClock"]

PROBES_PER_TICK = 3
"""Offsets one tick of the store's stamps tests per scan (module docstring): each write that
lands before the turn cuts a quarter off the bounds' top, one that lands after ends the tick's
scan with the bounds a quarter as wide; 1 s stamps narrow to 5 ms in one to five seconds."""


@dataclass(frozen=True)
class ClockSample:
    """One write: local times around it and the store's stamp of it."""

    sent_at: float
    """Local clock just before the write was sent."""
    returned_at: float
    """Local clock once its response came back."""
    stamp: float
    """The store's time of the write (``ObjectInfo.modified_at``), truncated to ``resolution_s``."""
    resolution_s: float

    def offset_bounds(self) -> tuple[float, float]:
        """The offsets (store − local) this write allows."""
        return self.stamp - self.returned_at, self.stamp + self.resolution_s - self.sent_at


class StoreClock:
    """Bounds on θ = store time − local time, narrowed by every sample that agrees with them."""

    def __init__(self) -> None:
        self.low = -math.inf
        self.high = math.inf
        self.samples = 0
        """Samples behind the current bounds (a restart counts from the sample it restarted at)."""
        self.restarts = 0
        self.resolution_s = 0.0
        """The coarsest stamp resolution seen (what a probe can learn at best is its round trip)."""
        self.round_trip_s = math.inf
        """The shortest write seen, sent to returned: what a probe costs and what it narrows to."""
        self._writes = 0

    @property
    def known(self) -> bool:
        return self.samples > 0

    @property
    def uncertainty_s(self) -> float:
        """Half the width of the bounds: how far :meth:`store_time` may be off (inf before a sample)."""
        return (self.high - self.low) / 2

    @property
    def offset(self) -> float:
        """The middle of the bounds: the estimate of θ."""
        if not self.known:
            raise ValueError("the store's clock is unknown before a sample")
        return (self.low + self.high) / 2

    def add(self, sample: ClockSample) -> bool:
        """Narrow the bounds by ``sample``; restart from it when it contradicts them. Returns
        whether it agreed (False: a restart)."""
        low, high = sample.offset_bounds()
        self.resolution_s = max(self.resolution_s, sample.resolution_s)
        self.round_trip_s = min(self.round_trip_s, sample.returned_at - sample.sent_at)
        agreed = max(low, self.low) <= min(high, self.high)
        if agreed:
            self.low, self.high = max(low, self.low), min(high, self.high)
            self.samples += 1
        else:
            self.low, self.high = low, high
            self.samples = 1
            self.restarts += 1
        return agreed

    def store_time(self, local: float) -> float:
        """The store's time at local time ``local`` (the middle estimate)."""
        return local + self.offset

    def local_time(self, store: float) -> float:
        """The local time at which the store's clock reads ``store`` (the middle estimate)."""
        return store - self.offset

    def worth_probing(self, target_s: float) -> bool:
        """Whether another write could narrow the bounds below ``target_s`` of uncertainty: they are
        wider than that and than what one write can resolve (its round trip)."""
        if not self.known:
            return True
        floor = max(target_s, self.round_trip_s / 2 if math.isfinite(self.round_trip_s) else 0.0)
        return self.resolution_s > 0 and self.uncertainty_s > floor

    def sample_due(self, target_s: float, every: int, wide_samples: int) -> bool:
        """Whether to sample the write about to be made (a HEAD for its stamp): each one while a
        sample could still narrow the bounds below ``target_s`` (:meth:`worth_probing`), for at
        most ``wide_samples`` samples behind the bounds (writes on a busy machine may never pin
        the clock, and a HEAD per renewal forever is a request per lease per TTL/3 that narrows
        nothing), then every ``every``-th, so a stepped store clock shows as a
        restart (which starts the count again). Counts the writes."""
        self._writes += 1
        return (self.worth_probing(target_s) and self.samples < wide_samples) or self._writes % every == 0

    def next_probe_at(self, now: float) -> float:
        """When to send the next probe, not before ``now`` (``now`` itself when the bounds are
        unknown or the stamps exact). A write landing at the instant the store's stamp turns
        (ticks of ``resolution_s``) tells whether θ is above or below the offset that instant
        implies; within one tick later writes can only test lower offsets, so a tick tests
        ``PROBES_PER_TICK`` offsets evenly spaced down from the top of the bounds, one write
        each, the first that lands after the turn ending the scan: each tick shrinks the bounds
        ``PROBES_PER_TICK + 1``-fold. Writes are sent half the shortest round trip early, so they
        land where aimed."""
        if not self.known or self.resolution_s <= 0:
            return now
        tick = self.resolution_s
        lead = self.round_trip_s / 2 if math.isfinite(self.round_trip_s) else 0.0
        spacing = (self.high - self.low) / (PROBES_PER_TICK + 1)
        boundary = math.ceil((now + lead + self.low) / tick) * tick
        while True:
            for j in range(1, PROBES_PER_TICK + 1):
                sent = boundary - (self.high - j * spacing) - lead
                if sent >= now:
                    return sent
            boundary += tick
