"""Leases: liveness claims in the mailbox, judged on the observer's own clock and the store's.

Machines' wall clocks are never compared. A holder renews by writing a new ``sequence``;
an observer calls a lease expired once it has stood unchanged for the run's TTL (the
manifest's, never the TTL a lease claims for itself), or the holder released it. How long it
has stood still is the longer of two lower bounds:

* **sightings**: how long the observer has seen the same version token, on its monotonic
  clock (a new observer waits a full TTL);
* **the store's stamp** of the lease write (``ObjectInfo.modified_at``, read with the lease
  from stores that offer ``StampedGet``), when the node knows the store's clock
  (``store.store_clock``, sampled from its own lease writes): the store's time now, at its
  lowest, less the latest instant the stamp allows (stamp + resolution). It is not counted
  beyond the time since the observer last saw another token there (a store clock stepped
  back cannot age a lease it saw change). Within the stamp's tick, the holder's own claim
  narrows the latest instant: a holder that knows the store's clock writes in its lease
  (``info["sent_by"]``, :func:`sent_by`) the store's time, at its latest, when it sent the
  write, the instant it counts its own TTL from; observers take the earlier of that and the
  stamp's end, never earlier than the stamp itself.

So a dead holder's lease is judged dead within the TTL plus the clocks' uncertainty (plus the
stamp's resolution from a holder that makes no claim), however rarely the observer reads it,
instead of up to a read interval later; both bounds only ever call a lease dead after the
holder has given it up (a holder's claim wrong by a stepped clock, at most one tick early). A lease that does not
parse or does not verify under the run key is expired at once: nobody honest wrote it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from gradientmail.errors import DuplicateLearner, GradientMailError, KeyNotFound, VersionConflict
from gradientmail.records import Lease, check_learner_id, keys
from gradientmail.store.lease_records import LeaseRead
from gradientmail.store.run_store import RunStore
from gradientmail.store.store_clock import StoreClock

log = logging.getLogger(__name__)

__all__ = [
    "TRAINING",
    "Clock",
    "ClockProbing",
    "LeaseName",
    "LeaseObserver",
    "FoundThere",
    "LearnerLease",
    "SENT_BY",
    "first_sequence",
    "judge_found",
    "live_learners",
    "others_training",
    "sample_lease_write",
    "sent_by",
    "trains",
]

Clock = Callable[[], float]


@dataclass(frozen=True)
class LeaseName:
    """Which lease an observer judges, named by what it is instead of by its key: the run's syncer
    lease (:attr:`SYNCER`) or one learner's own (:meth:`of_learner`). The roles name leases this
    way; only the store turns a name into a key."""

    learner: str | None = None
    """The learner whose own lease it is; None for the syncer lease."""

    SYNCER: ClassVar[LeaseName]

    @classmethod
    def of_learner(cls, learner: str) -> LeaseName:
        """A learner's own lease; ``InvalidKey`` for an id that is not a valid learner id."""
        return cls(check_learner_id(learner))

    @property
    def key(self) -> str:
        """The lease's key in the mailbox (for the store layer)."""
        return keys.SYNCER_LEASE if self.learner is None else keys.learner_lease(self.learner)


LeaseName.SYNCER = LeaseName()


def _slot(name: LeaseName | str) -> str:
    """Where the observer files a lease: its key. A plain ``str`` is taken as the key itself, the form
    callers used before :class:`LeaseName`; both forms of one lease share one sighting."""
    return name if isinstance(name, str) else name.key


@dataclass
class _Sighting:
    token: str
    first_seen: float
    """The observer's clock at the first read that showed ``token``."""
    last_read: float
    """The observer's clock at the latest read that showed ``token``."""
    changed_after: float | None
    """The observer's clock at the last read that showed another token (None: first sighting):
    the write of ``token`` came after it."""
    written_at: float | None
    """The store's stamp of the write of ``token`` (None: the store gave none)."""
    resolution_s: float
    sent_by: float | None
    """The holder's claim (``info["sent_by"]``): the store's time, at its latest, when it sent the
    write (None: no claim)."""


class LeaseObserver:
    """Remembers when each lease last changed, on this node's clock and (with ``store_clock``)
    the store's (module docstring)."""

    def __init__(self, ttl_s: float, clock: Clock = time.monotonic, store_clock: StoreClock | None = None) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._store_clock = store_clock
        self._sightings: dict[str, _Sighting] = {}

    def expired(self, name: LeaseName | str, found: LeaseRead) -> bool:
        """Whether the lease ``name`` is dead: released, unreadable, or unchanged for a TTL."""
        if found.lease is None:
            return True
        slot = _slot(name)
        now = self._clock()
        sighting = self._sightings.get(slot)
        if sighting is None or sighting.token != found.token:
            changed_after = None if sighting is None else sighting.last_read
            sighting = _Sighting(
                found.token, now, now, changed_after, found.written_at, found.written_resolution_s, _claim(found.lease)
            )
            self._sightings[slot] = sighting
        sighting.last_read = now
        return found.lease.released or self._standing(sighting, now) >= self.ttl_s

    def _standing(self, sighting: _Sighting, now: float) -> float:
        """How long the lease has certainly stood still: the longer of the two bounds."""
        seen = now - sighting.first_seen
        clock = self._store_clock
        if sighting.written_at is None or clock is None or not clock.known:
            return seen
        stamped = now + clock.low - latest_write(sighting.written_at, sighting.resolution_s, sighting.sent_by)
        if sighting.changed_after is not None:
            stamped = min(stamped, now - sighting.changed_after)
        return max(seen, stamped)

    def unchanged_for(self, name: LeaseName | str) -> float:
        """Seconds the lease ``name`` has certainly stood still, as :meth:`expired` judges it; 0 if
        never seen. Its TTL less this is when it expires unless it changes meanwhile."""
        return self.age(name) or 0.0

    def age(self, name: LeaseName | str) -> float | None:
        """:meth:`unchanged_for`, None if never seen (read-only)."""
        sighting = self._sightings.get(_slot(name))
        return None if sighting is None else self._standing(sighting, self._clock())


def latest_write(stamp: float, resolution_s: float, claim: float | None) -> float:
    """The latest store time a lease write stamped ``stamp`` counts from: the stamp's end, or the
    holder's ``claim`` (:data:`SENT_BY`) where that is earlier, but never before the stamp, so a
    claim wrong by a stepped clock costs at most one tick."""
    latest = stamp + resolution_s
    return latest if claim is None else min(latest, max(stamp, claim))


SENT_BY = "sent_by"
"""The key of a lease's ``info`` holding the holder's claim: the store's time, at its latest
(``StoreClock.high``), when it sent the write. Absent until the holder has sampled the store's
clock; an old node's lease without it is judged by the stamp alone."""


def sent_by(store_clock: StoreClock | None, sent: float) -> dict[str, float]:
    """The claim to put in a lease's ``info`` for a write sent at local ``sent``: ``{SENT_BY: the
    store's time at its latest then}``, or nothing while the store's clock is unknown."""
    if store_clock is None or not store_clock.known:
        return {}
    return {SENT_BY: sent + store_clock.high}


def _claim(lease: Lease) -> float | None:
    """A lease's :data:`SENT_BY`, when it is a finite number (anything else is no claim)."""
    claim = lease.info.get(SENT_BY)
    if isinstance(claim, bool) or not isinstance(claim, int | float) or not math.isfinite(claim):
        return None
    return float(claim)


CLOCK_TARGET_S = 0.01
"""How closely lease writes pin the store's clock before they are sampled only now and then: a
lease is judged dead at most this much (besides the stamp's resolution) after its TTL."""
CLOCK_RESAMPLE_WRITES = 10
"""Once the clock is pinned, every this many lease writes is sampled (at TTL 10 s and two
leases a node, a HEAD every 17 s): a store clock that stepped restarts the bounds that soon."""
CLOCK_WIDE_SAMPLES = 20
"""While the clock is not pinned, each lease write is sampled until this many samples stand
behind the bounds (the timed writes of :class:`ClockProbing` and a few more), then one in
``CLOCK_RESAMPLE_WRITES``: on a loaded machine the bounds may stay wider than
``CLOCK_TARGET_S``, and a HEAD per renewal would then be a third of a node's idle requests."""


PROBE_WRITES = 16
"""Lease writes a node times to the store's ticks (``StoreClock.next_probe_at``) while its clock
estimate is wider than ``CLOCK_TARGET_S``, per restart of the estimate: 1 s stamps narrow to
50 ms in about three ticks (``PROBES_PER_TICK`` writes each), so this is room to spare."""
PROBE_RESTARTS = 3
"""After this many restarts of the estimate (a store whose stamps contradict each other, such as
one that rounds them) writes are no longer timed: the stamp then counts on its own."""


class ClockProbing:
    """When a lease holder's next write should go so that it also pins the store's clock: the
    holder's claim (:func:`sent_by`) is only as tight as that clock, and writes at the regular
    pace fall at phases of the store's tick that narrow it slowly (a renewal every TTL/3 of 10 s
    repeats its phase every three writes). Bounded: at most :data:`PROBE_WRITES` timed writes
    per restart of the estimate, none after :data:`PROBE_RESTARTS` restarts."""

    def __init__(self, store_clock: StoreClock) -> None:
        self._store_clock = store_clock
        self._restarts = store_clock.restarts
        self._probes = 0

    def next_in(self, now: float) -> float | None:
        """Seconds from ``now`` until the next write should be sent, counted as one timed write;
        None to keep the regular pace (the clock is pinned, unknown, exact or not worth it)."""
        clock = self._store_clock
        if not clock.known or clock.resolution_s <= 0 or clock.restarts > PROBE_RESTARTS:
            return None
        if not clock.worth_probing(CLOCK_TARGET_S):
            return None
        if clock.restarts != self._restarts:
            self._restarts, self._probes = clock.restarts, 0
        if self._probes >= PROBE_WRITES:
            return None
        self._probes += 1
        return clock.next_probe_at(now) - now


def sample_lease_write(store: RunStore, store_clock: StoreClock, name: LeaseName, token: str, sent: float, clock: Clock) -> None:
    """Add the write of lease ``name`` that this node sent at ``sent`` (on ``clock``) and that
    returned ``token`` to ``store_clock`` when a sample is due (``StoreClock.sample_due``): one
    HEAD for the store's stamp of it. A failed HEAD only costs the sample."""
    returned = clock()
    if not store_clock.sample_due(CLOCK_TARGET_S, CLOCK_RESAMPLE_WRITES, CLOCK_WIDE_SAMPLES):
        return
    try:
        sample = store.leases.write_sample(name.key, token, sent, returned)
    except GradientMailError as exc:
        log.debug("no clock sample from the write of %s: %s", name.key, exc)
        return
    if sample is not None:
        store_clock.add(sample)


def live_learners(
    store: RunStore,
    observer: LeaseObserver,
    own: Lease | None = None,
    on_expired: Callable[[str, LeaseRead], None] | None = None,
) -> dict[str, Lease]:
    """Learners whose lease has not expired in ``observer``'s judgement (a lease counts only at its
    own holder's key). ``own``: the lease this node's learner wrote last, taken as it is instead of
    read back (the node knows it is live; a released one is not). ``on_expired``: told of each
    learner whose lease it judged expired without being released (for telemetry)."""
    live: dict[str, Lease] = {}
    if own is not None and not own.released:
        live[own.holder] = own
    for learner in store.leases.learners():
        if own is not None and learner == own.holder:
            continue
        found = store.leases.read_learner(learner, need_token=False)
        if found is None or found.lease is None:
            continue
        lease = found.lease
        name = LeaseName.of_learner(learner)
        if lease.kind != "learner" or lease.holder != learner:
            continue
        if not observer.expired(name, found):
            live[lease.holder] = lease
        elif on_expired is not None and not lease.released:
            on_expired(learner, found)
    return live


TRAINING = "training"
"""The key of a learner lease's ``info`` that is ``False`` while the learner does not train (an
``"either"`` node serving as the syncer, docs/session.md "Roles"): rounds do not wait for it."""


def trains(lease: Lease) -> bool:
    """Whether a learner's lease says it is training (every lease but a paused one's)."""
    return lease.info.get(TRAINING) is not False


def others_training(live: Mapping[str, Lease], me: str) -> int:
    """How many of the ``live`` learners other than ``me`` are training."""
    return sum(1 for learner, lease in live.items() if learner != me and trains(lease))


FoundThere = Literal["foreign", "older", "newer"]
"""What a learner found at its own lease key after a write of its conflicted (:func:`judge_found`)."""


def judge_found(there: Lease | None, learner: str, writing: int) -> FoundThere:
    """What the object at ``learner``'s lease key is, to a learner about to write ``writing``
    there: ``"foreign"`` (garbage, another holder's or kind's, or in a signed run one that does
    not verify: no learner of this id wrote it), ``"older"`` (a valid lease of this id with a
    lower sequence: a replay of an earlier write, ours or a predecessor's) or ``"newer"`` (a
    valid lease of this id at or above it: another process with this id, or a replay of nothing
    this learner has passed, until it proves live by changing)."""
    if there is None or there.kind != "learner" or there.holder != learner:
        return "foreign"
    return "older" if there.sequence < writing else "newer"


def first_sequence(there: Lease | None, learner: str, wall_s: float) -> int:
    """The sequence a learner's first write carries: above every earlier write of its id, so a
    replay of any of them is judged ``"older"``. The wall clock in milliseconds (renewals come
    every TTL/3, so a predecessor on this host never reached it) or one above the lease found
    there, whichever is higher (a predecessor on a host whose clock runs ahead)."""
    start = max(int(wall_s * 1000), 1)
    if judge_found(there, learner, start) == "newer" and there is not None:
        start = there.sequence + 1
    return start


@dataclass
class _Rival:
    """A newer lease of our id found at our key, watched until it changes (a live process) or
    stands still a TTL (a dropped object)."""

    sequence: int
    first_seen: float


class LearnerLease:
    """A learner's own lease. The first write is a plain put (its id is its own: a restarted
    learner takes over its predecessor's lease), at a sequence above every earlier write of the
    id (:func:`first_sequence`); every later one is a compare-and-swap against the token of our
    last write. A conflict is judged by :func:`judge_found`: anything no learner of our id
    wrote, or an older lease of our id put back (a replay), is overwritten and logged; a newer
    one is watched, not written over: when it changes again another process renews it, and the
    next renewal raises ``DuplicateLearner`` (the newer process trains on; this one is told
    through ``step()``); when it stands still a TTL nobody renews it, and it is overwritten at a
    sequence above it. So no object put in the bucket stops a learner: a static one costs at
    most a TTL of renewals. Requests: the writes, one read before the first and one after each
    conflict, and, given a ``store_clock``, a HEAD for the store's stamp of a write when a clock
    sample is due (``sample_lease_write``)."""

    def __init__(
        self,
        store: RunStore,
        learner: str,
        ttl_s: float,
        *,
        clock: Clock = time.monotonic,
        store_clock: StoreClock | None = None,
        wall: Clock = time.time,
    ) -> None:
        self._store = store
        self._learner = check_learner_id(learner)
        self._ttl_s = ttl_s
        self._clock = clock
        self._wall = wall
        self._store_clock = store_clock
        """Sampled by this lease's writes when a sample is due (``sample_lease_write``): what this
        node's observers judge stamps on."""
        self._probing = None if store_clock is None else ClockProbing(store_clock)
        self._sequence: int | None = None
        self._token: str | None = None
        self._rival: _Rival | None = None
        self.written: Lease | None = None
        """The lease as this learner last wrote it successfully (None before the first write)."""
        self.overwritten = 0
        """Objects found at our key and written over: foreign ones, replays, dropped newer ones."""

    def renew(self, info: dict[str, object]) -> None:
        self._write(released=False, info=info)

    def release(self) -> None:
        self._write(released=True, info={})

    def next_probe_in(self) -> float | None:
        """Seconds until the next renewal should be sent to pin the store's clock
        (:class:`ClockProbing`); None: renew at the regular pace."""
        return None if self._probing is None else self._probing.next_in(self._clock())

    def _write(self, *, released: bool, info: dict[str, object]) -> None:
        if self._sequence is None:
            found = self._store.leases.read_learner(self._learner, need_token=False)
            self._sequence = first_sequence(None if found is None else found.lease, self._learner, self._wall()) - 1
        sent = self._clock()
        info = {**info, **sent_by(self._store_clock, sent)}
        lease = Lease(
            kind="learner", holder=self._learner, sequence=self._sequence + 1, ttl_s=self._ttl_s, released=released, info=info
        )
        put = self._put(lease)
        if put is None:
            return
        self._sequence = put.sequence
        self.written = put
        if self._store_clock is not None and self._token is not None:
            name = LeaseName.of_learner(self._learner)
            sample_lease_write(self._store, self._store_clock, name, self._token, sent, self._clock)

    def _put(self, lease: Lease) -> Lease | None:
        """Write ``lease`` (above a dropped newer one's sequence); returns what was written, None
        when a newer lease of our id stands there and is left alone."""
        if self._token is None:
            self._token = self._store.leases.put_learner(lease)
            return lease
        try:
            self._token = self._store.leases.swap_learner(lease, self._token)
            return lease
        except KeyNotFound:  # deleted under us (retention never does): write it again
            self._token = self._store.leases.put_learner(lease)
            return lease
        except VersionConflict:
            found = self._store.leases.read_learner(self._learner, need_token=False)
        there = found.lease if found is not None else None
        judged = judge_found(there, self._learner, lease.sequence)
        if judged == "newer" and there is not None:
            if not self._rival_dropped(there):
                return None
            lease = lease.model_copy(update={"sequence": there.sequence + 1})
            log.warning(
                "learner %s: a newer lease of its id (sequence %d) stood still for a TTL: nobody renews it; writing over it",
                self._learner, there.sequence,
            )  # fmt: skip
        elif judged == "older" and there is not None:
            log.warning(
                "learner %s: an older lease of its id (sequence %d, ours is %d) was put back; writing over it",
                self._learner, there.sequence, lease.sequence - 1,
            )  # fmt: skip
        else:
            log.warning("the lease of learner %s was overwritten by something no learner writes; writing it again", self._learner)
        self._rival = None
        self.overwritten += 1
        self._token = self._store.leases.put_learner(lease)
        return lease

    def _rival_dropped(self, there: Lease) -> bool:
        """Whether the newer lease ``there`` is a dropped object (it stood still a TTL) rather
        than another process's; raises ``DuplicateLearner`` once it changed since first seen."""
        now = self._clock()
        rival = self._rival
        if rival is None:
            self._rival = _Rival(there.sequence, now)
            log.warning(
                "learner %s: a newer lease of its id (sequence %d) is at its key; another process with this id, "
                "or an object put there: watching it for up to a TTL", self._learner, there.sequence,
            )  # fmt: skip
            return False
        if there.sequence != rival.sequence:
            raise DuplicateLearner(self._learner)
        return now - rival.first_seen >= self._ttl_s
