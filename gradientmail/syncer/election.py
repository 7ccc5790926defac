"""Electing the node that closes rounds, through one lease record and compare-and-swap.

``leases/syncer.json`` holds the holder and a term. The holder renews it by CAS every
``ttl_s / 3``; every other node watches it (``store.leases.LeaseObserver``: its version token
on the node's own monotonic clock and, where the store stamps reads, the stamp on the store's
clock) and, once it has stood unchanged for ``ttl_s`` — the run's TTL from the manifest,
whatever the lease claims — (or was released), tries to take over with ``term + 1`` by CAS.
The holder counts its TTL from just before each write it made, so it gives up no later than
any observer judges its lease dead; its writes sample the store's clock (``sample_lease_write``).
A lease that does not parse or does not verify under the run key is expired at once and replaced the same
way, so garbage in the lease cannot stop commits. Exactly one CAS wins. Safety does not rest
on the election (commits are create-once); it only keeps one node doing the work. The
syncer runtime polls the election on a thread of its own, so renewals never wait for transfers.

| action | outcome | reaction |
|---|---|---|
| create (no lease yet) | created | we hold term 1 |
| create | ``RecordExists`` | someone else was first; watch it |
| renew (CAS with our token) | new token | still the holder |
| renew | ``VersionConflict`` / ``KeyNotFound`` | we were deposed: stop closing rounds |
| take over (CAS with the watched token) | new token | we hold term + 1 |
| take over | ``VersionConflict`` | another node won; watch the new holder |
| read: unreadable or unauthenticated lease | — | take over at once by CAS on its token |
| read as a dedicated syncer: a training node's live lease | — | take over at once by CAS (term + 1) |

A dedicated syncer (``gm.SyncerNode``, ``GRADIENTMAIL_ROLE=syncer``) outranks a node that also
trains, never another dedicated one. Its lease says so (``info["dedicated"]``); a training node that holds the
lease learns it was deposed at its next renewal (create-once keeps a round it commits
meanwhile safe) and watches from then on like any other, taking over once the dedicated
syncer's lease expires.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from gradientmail.errors import KeyNotFound, RecordExists, VersionConflict
from gradientmail.records import Lease
from gradientmail.store import LeaseRead, RunStore
from gradientmail.store.leases import Clock, ClockProbing, LeaseName, LeaseObserver, sample_lease_write, sent_by
from gradientmail.store.store_clock import StoreClock

__all__ = ["Election"]

log = logging.getLogger(__name__)


class Election:
    """This node's view of who holds the syncer lease; ``poll()`` advances it."""

    def __init__(
        self,
        store: RunStore,
        node_id: str,
        ttl_s: float,
        clock: Clock = time.monotonic,
        *,
        dedicated: bool = False,
        info: Callable[[], dict[str, Any]] | None = None,
        announce_gap_s: float = 0.0,
        on_read: Callable[[LeaseRead | None], None] | None = None,
        store_clock: StoreClock | None = None,
    ) -> None:
        self._store = store
        self._store_clock = store_clock
        self.node_id = node_id
        self.dedicated = dedicated
        """A node that only syncs: it outranks the holder of a lease that is not dedicated."""
        self.ttl_s = ttl_s
        self._clock = clock
        self._observer = LeaseObserver(ttl_s, clock, store_clock)
        self._probing = None if store_clock is None else ClockProbing(store_clock)
        self._probe_at: float | None = None
        """When the holder's next renewal should go to pin the store's clock (None: when due)."""
        self._token: str | None = None  # our lease's token while we hold it
        self._renewed_at = 0.0
        self._sequence = 0
        self.term = 0
        self.holder: str | None = None
        self.elections_won = 0
        self.takeovers = 0
        self.leases_expired = 0
        """Syncer leases this node saw expire unreleased (a dead or cut-off holder), for telemetry."""
        self._expired_token: str | None = None
        self._unreadable_token: str | None = None
        self._info = info
        self._announce_gap_s = announce_gap_s
        self._announced = False
        self._urgent = False
        self._on_read = on_read
        self._expired_holder: tuple[str, float] | None = None
        """The holder whose unreleased lease this node took over as expired, and when."""

    @property
    def is_leader(self) -> bool:
        return self._token is not None

    @property
    def renewed_at(self) -> float:
        """This node's clock at its last renewal (or win) of the lease; 0.0 before any."""
        return self._renewed_at

    def lease_age(self) -> float | None:
        """Seconds since the syncer lease last changed as this node judges it (for telemetry): since
        its own last renewal while it holds the lease, else since it last saw the lease's token
        change; None before it has read the lease."""
        if self._token is not None:
            return self._clock() - self._renewed_at
        return self._observer.age(LeaseName.SYNCER)

    def holds_for(self, seconds: float) -> bool:
        """Whether this node holds the lease and will for at least ``seconds`` more, even if no
        renewal lands meanwhile (checked before committing, so a cut-off holder stops early)."""
        return self._token is not None and self._clock() - self._renewed_at + seconds < self.ttl_s

    def poll(self) -> bool:
        """Renew, watch or take over as due; return whether this node now holds the lease."""
        if self._token is not None and self._clock() - self._renewed_at >= self.ttl_s:
            log.warning("node %s could not renew the syncer lease for a whole TTL; stepping down", self.node_id)
            self._token = None
        if self._token is not None:
            age = self._clock() - self._renewed_at
            probe = self._probe_at is not None and self._clock() >= self._probe_at
            if probe or age >= self.ttl_s / 3 or (self._announced and (age >= self._announce_gap_s or self._urgent)):
                self._renew()
            return self.is_leader
        found = self._store.leases.read_syncer()
        if self._on_read is not None:
            self._on_read(found)
        if found is None:
            self._create()
            return self.is_leader
        lease, token = found.lease, found.token
        if lease is None:
            if token != self._unreadable_token:
                self._unreadable_token = token
                log.warning("node %s: the syncer lease is unusable (%s); replacing it", self.node_id, found.problem)
            self._swap(token, self.term + 1, takeover=True)
            return self.is_leader
        self.holder, self.term = lease.holder, lease.term
        if lease.holder == self.node_id and not lease.released:
            # our own lease from an earlier incarnation: take it back with a new term
            self._swap(token, lease.term + 1, takeover=False)
        elif self._observer.expired(LeaseName.SYNCER, found):
            if not lease.released and token != self._expired_token:
                self._expired_token = token
                self.leases_expired += 1
            self._swap(token, lease.term + 1, takeover=True)
            if self.is_leader and not lease.released:
                self._expired_holder = (lease.holder, self._clock())
        elif self.dedicated and (lease.released or not lease.info.get("dedicated")):
            log.info("node %s (a dedicated syncer) takes the syncer lease from %s, which also trains", self.node_id, lease.holder)
            self._swap(token, lease.term + 1, takeover=True)
        return self.is_leader

    def expired_holder(self, within_s: float) -> str | None:
        """The holder whose expired lease this node took over, if within the last ``within_s``
        seconds: dead as far as the election tells, before its learner lease has stood still
        for a TTL in this node's judgement (a spread run reassigns its fragments at once)."""
        found = self._expired_holder
        if found is None or self._clock() - found[1] > within_s:
            return None
        return found[0]

    def announce(self, *, at_once: bool = False) -> None:
        """The holder's bulletin changed: renew at the next pass (no sooner than ``announce_gap_s``
        after the last renewal, ``at_once``: whatever the gap) instead of waiting for TTL/3.
        Nothing while not the holder."""
        self._announced = self._token is not None
        self._urgent = self._announced and (at_once or self._urgent)

    def resign(self) -> None:
        """Release the lease so another node takes over without waiting for the TTL."""
        if self._token is None:
            return
        lease = self._lease(self.term, self._clock(), released=True)
        with contextlib.suppress(VersionConflict, KeyNotFound):  # deposed already: nothing to release
            self._store.leases.swap_syncer(lease, self._token)
        self._token = None

    def _lease(self, term: int, sent: float, released: bool = False) -> Lease:
        """The lease to write at local time ``sent`` (the holder's claim of it, ``sent_by``)."""
        self._sequence += 1
        info: dict[str, object] = {} if released or self._info is None else dict(self._info())
        if self.dedicated:
            info["dedicated"] = True
        info.update(sent_by(self._store_clock, sent))
        self._announced = self._urgent = False
        return Lease(
            kind="syncer", holder=self.node_id, term=term, sequence=self._sequence, ttl_s=self.ttl_s, released=released, info=info
        )

    def _create(self) -> None:
        sent = self._clock()
        try:
            self._token = self._store.leases.create_syncer(self._lease(1, sent))
        except RecordExists:
            return
        self._won(1, sent, takeover=False)

    def _swap(self, expected: str, term: int, *, takeover: bool) -> None:
        sent = self._clock()
        try:
            self._token = self._store.leases.swap_syncer(self._lease(term, sent), expected)
        except (VersionConflict, KeyNotFound):
            return
        self._won(term, sent, takeover=takeover)

    def _renew(self) -> None:
        if self._token is None:
            return
        sent = self._clock()
        try:
            self._token = self._store.leases.swap_syncer(self._lease(self.term, sent), self._token)
        except (VersionConflict, KeyNotFound):
            log.warning("node %s lost the syncer lease (term %d)", self.node_id, self.term)
            self._token = None
            return
        self._wrote(sent)

    def _wrote(self, sent: float) -> None:
        """Our write sent at ``sent`` landed: the TTL counts from then, and (with a store clock)
        the write is a clock sample."""
        self._renewed_at = sent
        self._probe_at = None
        if self._store_clock is not None and self._token is not None:
            sample_lease_write(self._store, self._store_clock, LeaseName.SYNCER, self._token, sent, self._clock)
        if self._probing is not None:
            now = self._clock()
            probe_in = self._probing.next_in(now)
            self._probe_at = None if probe_in is None else now + probe_in

    def next_probe_in(self) -> float | None:
        """Seconds until the holder's next renewal should go so that it also pins the store's
        clock (``store.leases.ClockProbing``); None: it renews when due. For the loop's pause."""
        if self._token is None or self._probe_at is None:
            return None
        return max(0.0, self._probe_at - self._clock())

    def _won(self, term: int, sent: float, *, takeover: bool) -> None:
        self.term, self.holder = term, self.node_id
        self._wrote(sent)
        self.elections_won += 1
        self.takeovers += int(takeover)
        log.info("node %s holds the syncer lease, term %d%s", self.node_id, term, " (takeover)" if takeover else "")
