"""Data each learner owns: a queue of work units shared through the mailbox.

A run's data is cut into ``units`` numbered units (shards, files, index ranges: the user maps a
number to its data). Learners take units through the mailbox and every unit is trained to its
end by exactly one of them, however learners join, leave, die and restart::

    for unit in session.queue("shards", units=256):
        for batch in load_shard(unit):
            ...
            session.step(samples=len(batch))

The rules (docs/session.md, "Data each learner owns"), keys in ``records/keys.py``:

1. A learner that restarts under its id first takes back a unit it claimed and did not finish
   (one its earlier process held).
2. Else it claims the lowest unit without a claim: a create-once ``QueueClaim``; a lost race
   tries the next.
3. Else, a unit whose holder's learner lease has stood still for the run's lease TTL (on this
   learner's clock, as every liveness judgement) is taken over by compare-and-swap of its
   claim (``generation`` + 1).
4. Else every unit left is in the hands of a live learner: wait (a poll) and look again, so a
   dead learner's unit is still trained; the iteration ends once every unit is done.

Asking for the next unit marks the one before done: a create-once ``QueueDone``, at most one per
unit. Leaving the loop early (``break``, an exception, a kill) leaves the unit claimed, for its
learner's restart or, once its lease expires, for another learner. A slow learner whose unit was
taken over may still finish it; the first done record wins and the other is logged. A done
record counts only when it parses, verifies and names its queue and unit (INV-24): one that
does not leaves the unit open, and the learner that finishes it writes over it. For fixed
slices (``ranks``), make a queue of as many units as slices and hold one for the whole run.

The position inside a unit: a queue made by ``Session.queue`` notes the session's
``total_steps`` when it hands out a unit, and the learner state (``state_dir``) saves those
marks. A restarted learner that takes back its unit learns from ``steps_into(unit)`` how many
steps of it the saved state had trained (the steps since the mark, as of the save), so it skips
that many batches instead of training the unit from its start; a unit taken over from another
learner, or claimed after the last save, starts at 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from gradientmail.errors import InvalidConfig, RecordExists, VersionConflict
from gradientmail.records import QueueClaim, QueueDone
from gradientmail.session.checks import checked_name, positive_int
from gradientmail.store import LeaseName, LeaseObserver, RunStore

__all__ = ["WorkQueue"]

log = logging.getLogger(__name__)


class WorkQueue:
    """``units`` work units named ``name``, shared by the run's learners (module docstring)."""

    def __init__(
        self,
        store: RunStore,
        learner_id: str,
        name: str,
        units: int,
        *,
        lease_ttl_s: float,
        poll_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        steps: Callable[[], int] | None = None,
        marks: dict[int, int] | None = None,
        before_claim: Callable[[], None] | None = None,
    ) -> None:
        self.name = checked_name("queue", name)
        self.units = positive_int("units", units)
        self._store = store
        self._learner = learner_id
        self._poll_interval_s = poll_interval_s
        self._clock = clock
        self._sleep = sleep
        self._observer = LeaseObserver(lease_ttl_s, clock)
        self._held: dict[int, tuple[int, str]] = {}
        """unit → (claim generation, token) of the units this learner holds."""
        self.completed: list[int] = []
        """Units this learner marked done, in order."""
        self.taken_over: list[int] = []
        """Units this learner took over from a learner whose lease expired."""
        self._steps = steps
        self._marks = marks if marks is not None else {}
        """unit → the learner's step count when it got the unit (shared with the saved state)."""
        self._before_claim = before_claim

    @property
    def holding(self) -> bool:
        """Whether this learner holds a unit it has not finished."""
        return bool(self._held)

    def steps_into(self, unit: int) -> int:
        """Steps this learner has trained of ``unit`` so far, those before a restart included (as
        of its last saved state). Asked as the unit is handed out: the batches to skip when
        going on with a unit taken back after a restart; 0 for a unit new to it."""
        if self._steps is None or unit not in self._marks:
            return 0
        return max(0, self._steps() - self._marks[unit])

    def __iter__(self) -> Iterator[int]:
        while (unit := self.claim_next()) is not None:
            yield unit  # left early (break, an exception): the unit stays claimed, never marked done
            self.finish(unit)

    def claim_next(self) -> int | None:
        """The next unit for this learner (rules 1-4), waiting while only live learners' units are
        left; None once every unit is done."""
        if self._before_claim is not None:
            self._before_claim()
        unit = self._next()
        if unit is not None and self._steps is not None:
            self._marks.setdefault(unit, self._steps())  # a unit taken back keeps its saved mark
        return unit

    def _next(self) -> int | None:
        while True:
            claimed, done = self._store.queues.units(self.name, below=self.units)
            if len(done) >= self.units:
                return None
            open_units = sorted(claimed - done)
            others: list[tuple[int, QueueClaim | None, str]] = []
            for unit in open_units:
                found = self._store.queues.read_claim(self.name, unit)
                if found is None:
                    continue
                claim, token = found
                self._check_size(claim)
                if claim is not None and claim.holder == self._learner and unit not in self._held:
                    self._held[unit] = (claim.generation, token)
                    log.info("%s takes back unit %d of queue %s, which it had claimed", self._learner, unit, self.name)
                    return unit
                others.append((unit, claim, token))
            for unit in range(self.units):
                if unit not in claimed and unit not in done and (taken := self._claim(unit)) is not None:
                    return taken
            for unit, claim, token in others:
                if claim is None or self._holder_gone(claim.holder):
                    taken = self._take_over(unit, claim, token)
                    if taken is not None:
                        return taken
            self._sleep(self._poll_interval_s)

    def finish(self, unit: int) -> None:
        """Mark ``unit`` trained to its end (create-once: the first learner to finish it wins)."""
        generation, _ = self._held.pop(unit, (1, ""))
        self._marks.pop(unit, None)
        if self._store.queues.create_done(QueueDone(queue=self.name, unit=unit, holder=self._learner, generation=generation)):
            self.completed.append(unit)
        else:
            log.info("%s finished unit %d of queue %s, which another learner had finished first", self._learner, unit, self.name)

    def _claim(self, unit: int) -> int | None:
        self._marks.pop(unit, None)
        claim = QueueClaim(queue=self.name, unit=unit, holder=self._learner, units=self.units)
        try:
            token = self._store.queues.create_claim(claim)
        except RecordExists:
            return None
        self._held[unit] = (claim.generation, token)
        return unit

    def _take_over(self, unit: int, claim: QueueClaim | None, token: str) -> int | None:
        generation = (claim.generation if claim is not None else 0) + 1
        replacement = QueueClaim(queue=self.name, unit=unit, holder=self._learner, units=self.units, generation=generation)
        try:
            token = self._store.queues.swap_claim(replacement, token)
        except VersionConflict:
            return None
        self._held[unit] = (generation, token)
        self._marks.pop(unit, None)  # another learner's unit: its position is not ours
        self.taken_over.append(unit)
        log.info(
            "%s takes over unit %d of queue %s from %s",
            self._learner,
            unit,
            self.name,
            claim.holder if claim else "an unreadable claim",
        )
        return unit

    def _holder_gone(self, holder: str) -> bool:
        """Whether ``holder``'s learner lease is absent, released or has stood still for a TTL."""
        found = self._store.leases.read_learner(holder, need_token=False)
        if found is None:
            return True
        if found.lease is None:
            return True
        return self._observer.expired(LeaseName.of_learner(holder), found)

    def _check_size(self, claim: QueueClaim | None) -> None:
        if claim is not None and claim.units != self.units:
            raise InvalidConfig(
                "units", f"queue {self.name!r} has {claim.units} units in the mailbox; this learner says {self.units}"
            )
