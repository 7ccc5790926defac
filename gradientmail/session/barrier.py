"""Hold nodes at a named point until ``parties`` of them have arrived, then release them together.

    release = session.barrier("epoch-3", parties=4)                       # inside a session
    gm.Barrier("eval-10", 4, mailbox=box, node_id="evaluator").wait()     # any process

The nodes share no clock, so the barrier uses the store's: every write is stamped with the
store's time (``ObjectInfo.modified_at``), which every node reads alike, and each node keeps
bounds on how far its own clock is from it (``store.store_clock``). The rules (docs/session.md,
"Barriers"; keys in ``records/keys.py``):

1. **Arrival.** A node creates its arrival record ``barriers/{name}/arrivals/{node}.json`` once;
   the store's stamp of that write is its arrival time. The write also gives the node its
   first bounds on the store's clock.
2. **Opening.** Arrivals count once read, parsed, of this barrier and node, of the same
   ``parties`` and, in a signed run, verified under the run key: a dropped object is never a
   party. With ``parties`` of them the barrier opens at ``T``, the ``parties``-th earliest
   stamp. A node decides ``T`` only from a listing made once the store's clock is surely past
   ``T`` + one stamp step + ``settle_s`` (how long a write may take to show in a listing), so an
   arrival stamped before ``T`` but still in flight cannot give two nodes two openings.
3. **Release** (:func:`release_instant`, the one rule): at store time ``R = T + margin_s``; each
   node returns once its estimate of the store's clock reaches ``R``. While it waits it may
   rewrite its clock probe ``barriers/{name}/clock/{node}.json`` (at most ``MAX_PROBES`` writes),
   each timed to halve its bounds, and it returns the half-width left (``uncertainty_s``): two
   nodes return at most the sum of theirs apart.
4. **Late nodes.** A node that learns the opening after ``R`` (it arrived late, or its reads
   were slow) returns at once, ``late`` set. A name serves once per run: loop over names
   (``f"epoch-{n}"``); the records stay (a few hundred bytes per node and barrier).
5. **Timeout.** ``timeout_s`` without an opening raises ``TimeoutError`` naming who arrived; the
   arrival stays, so waiting again resumes.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gradientmail.errors import GradientMailError, InvalidConfig
from gradientmail.mailbox import Mailbox
from gradientmail.records import BarrierArrival, check_learner_id
from gradientmail.records.auth import RunKey
from gradientmail.session.checks import checked_name, positive_int
from gradientmail.store import RunStore
from gradientmail.store.store_clock import ClockSample, StoreClock

__all__ = ["Barrier", "BarrierRelease", "release_instant"]

log = logging.getLogger(__name__)

MAX_PROBES = 24
"""Clock probes one wait writes at most (a PUT and a HEAD each): 1 s stamps narrow to 5 ms in
at most 24 (tests/test_barrier.py), within one to five seconds of waiting."""
READS_PER_POLL = 64
"""Arrivals one poll reads at most: a flood of names under the prefix costs bounded reads."""


def release_instant(stamps: Iterable[float], parties: int, margin_s: float) -> float | None:
    """The store time at which a barrier of ``parties`` releases, given its arrivals' stamps:
    the ``parties``-th earliest stamp plus ``margin_s``; None while fewer have arrived."""
    ordered = sorted(stamps)
    return ordered[parties - 1] + margin_s if len(ordered) >= parties else None


@dataclass(frozen=True)
class BarrierRelease:
    """What a wait at a barrier saw."""

    name: str
    arrived: tuple[str, ...]
    """Nodes whose arrivals opened the barrier (the ``parties`` earliest), in arrival order."""
    opened_at: float
    """Store time (seconds since the epoch on the store's clock) of the ``parties``-th arrival."""
    release_at: float
    """Store time every node returns at: ``opened_at + margin_s``."""
    uncertainty_s: float
    """How far this node's return may be from ``release_at`` on the store's clock (half its bounds)."""
    late: bool
    """This node learned of the opening after ``release_at`` and returned at once."""
    waited_s: float
    """Seconds this node spent in the wait, on its own clock."""


class Barrier:
    """A rendezvous of ``parties`` nodes named ``name`` through the mailbox (module docstring)."""

    def __init__(
        self,
        name: str,
        parties: int,
        *,
        mailbox: Mailbox | None = None,
        node_id: str,
        run_key: RunKey | str | None = None,
        store: RunStore | None = None,
        poll_interval_s: float = 0.5,
        margin_s: float = 3.0,
        settle_s: float = 1.0,
        precision_s: float = 0.005,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.name = checked_name("barrier", name)
        self.parties = positive_int("parties", parties)
        for field, value in (("poll_interval_s", poll_interval_s), ("settle_s", settle_s), ("precision_s", precision_s)):
            if not (math.isfinite(value) and value > 0):
                raise InvalidConfig(field, f"must be a positive number of seconds, got {value!r}")
        if not (math.isfinite(margin_s) and margin_s > settle_s):
            raise InvalidConfig(
                "margin_s", f"must exceed settle_s ({settle_s} s): the opening is decided within it, got {margin_s!r}"
            )
        if store is None:
            if mailbox is None:
                raise InvalidConfig("mailbox", "a barrier needs the run's mailbox (or a store)")
            store = RunStore(mailbox, RunKey.given(run_key))
        self.node_id = check_learner_id(node_id)
        self._store = store
        self._poll_interval_s = poll_interval_s
        self._margin_s = margin_s
        self._settle_s = settle_s
        self._precision_s = precision_s
        self._clock = clock
        self._sleep = sleep
        self.store_clock = StoreClock()
        """This node's bounds on the store's clock (narrowed by every write it times)."""
        self.probes = 0
        self._stamps: dict[str, float] = {}
        """Valid arrivals read so far (create-once: read once each) and their store stamps."""
        self._warned: set[str] = set()
        self._listed: set[str] = set()
        """The nodes the last listing named (read or not)."""

    def wait(self, timeout_s: float | None = None) -> BarrierRelease:
        """Arrive, and return at the barrier's release (module docstring). ``TimeoutError`` after
        ``timeout_s`` without an opening, naming who arrived; ``GradientMailError`` when the
        store stamps no writes (no clock to share)."""
        started = self._clock()
        deadline = None if timeout_s is None else started + timeout_s
        arrival = BarrierArrival(barrier=self.name, node=self.node_id, parties=self.parties)
        self._add(self._store.barriers.arrive(arrival, self._clock))
        while True:
            listed_at = self._clock()
            opened_at = self._opening()
            if opened_at is not None and self._decided(listed_at, opened_at):
                break
            now = self._clock()
            if deadline is not None and now >= deadline:
                raise TimeoutError(
                    f"barrier {self.name!r}: {len(self._listed)} of {self.parties} nodes arrived within {timeout_s} s "
                    f"({', '.join(sorted(self._listed))})"
                )
            self._probe_or_sleep(min(now + self._poll_interval_s, deadline if deadline is not None else math.inf), hard=False)
        release_at = opened_at + self._margin_s
        late = self._clock() >= self.store_clock.local_time(release_at)
        while not late:
            now = self._clock()
            release_local = self.store_clock.local_time(release_at)
            if now >= release_local:
                break
            self._probe_or_sleep(release_local, hard=True)
        arrived = tuple(node for node, _ in sorted(self._stamps.items(), key=lambda item: (item[1], item[0]))[: self.parties])
        return BarrierRelease(
            self.name, arrived, opened_at, release_at, self.store_clock.uncertainty_s, late, self._clock() - started
        )

    def _add(self, sample: ClockSample | None) -> None:
        if sample is not None:
            self.store_clock.add(sample)

    def _opening(self) -> float | None:
        """The store time the barrier opened at, from a fresh listing and the arrivals read so far;
        None while fewer than ``parties`` valid arrivals are known."""
        self._listed = self._store.barriers.nodes(self.name)
        new = sorted(self._listed - self._stamps.keys())
        if len(self._stamps) + len(new) < self.parties:
            return None
        for node in new[:READS_PER_POLL]:
            found = self._store.barriers.read_arrival(self.name, node)
            if found is None:
                self._warn(node, "not a valid arrival (garbage, unsigned or another key's): not counted")
                continue
            arrival, stamp = found
            if stamp is None:
                raise GradientMailError(f"the mailbox at {self._store.url} stamps no writes: a barrier needs the store's clock")
            if arrival.parties != self.parties:
                self._warn(node, f"arrived expecting {arrival.parties} parties, this node {self.parties}: not counted")
                continue
            self._stamps[node] = stamp
        return release_instant(self._stamps.values(), self.parties, 0.0)

    def _decided(self, listed_at: float, opened_at: float) -> bool:
        """Whether a listing sent at local ``listed_at`` is late enough to fix the opening: the
        store's clock was surely past it by a stamp step and ``settle_s`` (rule 2)."""
        bounds = self.store_clock
        if not bounds.known:
            return True  # a store without write stamps fails in _opening; nothing else leaves them unknown
        return listed_at + bounds.low >= opened_at + bounds.resolution_s + self._settle_s

    def _probe_or_sleep(self, until: float, *, hard: bool) -> None:
        """Until local time ``until``: write a clock probe when one can narrow the bounds and is
        due before it (``hard``: and back before it: the release), else sleep."""
        now = self._clock()
        bounds = self.store_clock
        if self.probes < MAX_PROBES and bounds.worth_probing(self._precision_s):
            probe_at = bounds.next_probe_at(now)
            round_trip = bounds.round_trip_s if math.isfinite(bounds.round_trip_s) else 0.0
            if probe_at + (2 * round_trip if hard else 0.0) < until:
                if probe_at > now:
                    self._sleep(probe_at - now)
                self.probes += 1
                self._add(self._store.barriers.probe_clock(self.name, self.node_id, self._clock))
                return
        if until > now:
            self._sleep(min(until - now, self._poll_interval_s))

    def _warn(self, node: str, why: str) -> None:
        if node not in self._warned:
            self._warned.add(node)
            log.warning("barrier %s: the arrival of %s is %s", self.name, node, why)
