"""Leases judged by the store's stamp of their write (``store.leases``, INV-6): a dead holder's
lease is dead a TTL after its last write on the store's clock, however rarely an observer reads
it, never sooner; the node's lease writes pin the store's clock, then sample it now and then;
without a pinned clock or a stamp the observer's sightings decide, as before. The fake-clock
nodes of ``tests/node_sim.py`` show what that does to failover on each kind of store."""

from __future__ import annotations

from collections import Counter
from typing import Any

import gradientmail as gm
from gradientmail.mailbox import ForwardingMailbox
from gradientmail.records import Lease
from gradientmail.store import LearnerLease, LeaseName, LeaseObserver, LeaseRead, RunStore
from gradientmail.store.leases import CLOCK_RESAMPLE_WRITES, CLOCK_TARGET_S, PROBE_WRITES, SENT_BY
from gradientmail.store.store_clock import ClockSample, StoreClock
from gradientmail.syncer.assignment import orphaned
from tests.fake_clock import FakeClock
from tests.node_sim import IDLE_S, POLL_S, TTL_S, CoarseStamps, Sim

LEASE = Lease(kind="learner", holder="x", ttl_s=1e9)  # the TTL it claims does not count
X = LeaseName.of_learner("x")


def pinned(offset: float, width: float = 0.0) -> StoreClock:
    """A store clock known to be ``offset`` ahead of the local one (bounds ``width`` wide)."""
    clock = StoreClock()
    clock.add(ClockSample(sent_at=0.0, returned_at=width, stamp=offset, resolution_s=0.0))
    return clock


def test_a_stamped_lease_is_dead_a_ttl_after_its_write_on_the_stores_clock() -> None:
    """INV-6: a new observer reading a lease written long ago calls it dead at once; one written
    lately, a TTL after the latest instant its stamp allows (stamp + resolution), on the store's
    clock at its lowest bound, never sooner."""
    local = FakeClock(47.0)
    store_clock = pinned(offset=1000.0, width=0.2)  # store time = local + 999.8 … 1000
    observer = LeaseObserver(5.0, local, store_clock)
    assert observer.expired(X, LeaseRead(LEASE, "old", "", written_at=1040.0, written_resolution_s=1.0))
    late = LeaseObserver(5.0, local, store_clock)
    written = LeaseRead(LEASE, "t1", "", written_at=1044.0, written_resolution_s=1.0)  # landed by 1045
    assert not late.expired(X, written)
    assert abs(late.unchanged_for(X) - 1.8) < 1e-9  # 1046.8 at the lowest, less 1045
    local.now = 50.19  # store time ≥ 1049.99: 4.99 s after the latest landing
    assert not late.expired(X, written)
    local.now = 50.2  # ≥ 1050.0 on the store's clock at its lowest (its sightings: 3.2 s)
    assert late.expired(X, written)


def test_without_a_pinned_store_clock_or_a_stamp_the_sightings_decide() -> None:
    """INV-6: a store clock not yet sampled, or a read with no stamp, leaves the observer's own
    clock: a full TTL from the first read that showed the token."""
    local = FakeClock(50.0)
    for store_clock, written_at in ((StoreClock(), 1000.0), (pinned(1000.0), None)):
        observer = LeaseObserver(5.0, local, store_clock)
        local.now = 50.0
        assert not observer.expired(X, LeaseRead(LEASE, "t1", "", written_at=written_at))
        local.now = 54.9
        assert not observer.expired(X, LeaseRead(LEASE, "t1", "", written_at=written_at))
        local.now = 55.0
        assert observer.expired(X, LeaseRead(LEASE, "t1", "", written_at=written_at))


def test_a_store_clock_stepped_back_cannot_age_a_lease_seen_changing() -> None:
    """INV-6: a stamp far in the past of a token the observer saw appear counts no further back
    than the read before it, which still showed the old token (a store whose clock stepped back,
    or a stamp that lies): the lease is not called dead early."""
    local = FakeClock(0.0)
    observer = LeaseObserver(5.0, local, pinned(offset=0.0))
    assert not observer.expired(X, LeaseRead(LEASE, "t1", "", written_at=0.0))
    local.now = 3.0
    stepped_back = LeaseRead(LEASE, "t2", "", written_at=-100.0)  # written after t = 0, whatever it says
    assert not observer.expired(X, stepped_back)
    local.now = 4.9
    assert not observer.expired(X, stepped_back)
    local.now = 5.0
    assert observer.expired(X, stepped_back)


class _Heads(ForwardingMailbox):
    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()

    def head(self, key: str) -> Any:
        self.calls["head"] += 1
        return self.inner.head(key)


def claiming(claim: object) -> Lease:
    return Lease(kind="learner", holder="x", ttl_s=1e9, info={SENT_BY: claim})


def test_a_holders_claim_narrows_the_stamps_tick_but_never_below_the_stamp() -> None:
    """INV-6: with 1 s stamps the holder's claim of when it sent the write (``sent_by``, on the
    store's clock) is the latest instant the lease counts from when it lies within the stamp's
    tick; a claim before the stamp counts from the stamp (a wrong claim costs at most a tick),
    one beyond the tick or that is not a number is no claim."""
    local = FakeClock(0.0)
    cases = [(1044.3, 1044.3), (1043.0, 1044.0), (1046.0, 1045.0), ("1044.3", 1045.0), (True, 1045.0), (None, 1045.0)]
    for claim, counted_from in cases:
        observer = LeaseObserver(5.0, local, pinned(offset=1000.0))
        local.now = 46.0
        observer.expired(X, LeaseRead(claiming(claim), "t1", "", written_at=1044.0, written_resolution_s=1.0))
        assert abs(observer.unchanged_for(X) - (1046.0 - counted_from)) < 1e-9, claim


def test_a_holder_claims_the_stores_time_at_its_latest_when_it_sent_the_write() -> None:
    """INV-6: once a learner's lease writes have pinned the store's clock, each lease says when it
    was sent on that clock at its latest: never before the true instant (its holder counts its
    TTL from then), within the clock's uncertainty of it."""
    local = FakeClock(0.0)
    box = CoarseStamps(gm.MemoryMailbox(clock=lambda: local.now + 1000.0), 1.0)
    store_clock = StoreClock()
    lease = LearnerLease(RunStore(box), "x", 10.0, clock=local, store_clock=store_clock)
    lease.renew({})
    assert lease.written is not None and SENT_BY not in lease.written.info  # the clock was unknown when it went
    for _ in range(40):
        local.now += lease.next_probe_in() or 3.0
        sent, width = local.now, 2 * store_clock.uncertainty_s  # the bounds the claim is made from
        lease.renew({})
        claim = lease.written.info[SENT_BY]
        assert sent + 1000.0 <= claim <= sent + 1000.0 + width + 1e-9
    assert store_clock.uncertainty_s <= CLOCK_TARGET_S


def test_lease_writes_are_timed_to_the_stores_ticks_until_its_clock_is_pinned() -> None:
    """With 1 s stamps a lease holder times its next renewals to the store's ticks
    (``ClockProbing``) until the clock is pinned within ``CLOCK_TARGET_S``: a few seconds, a few
    writes, at most ``PROBE_WRITES``; then, or with exact stamps, the regular pace."""
    for resolution in (1.0, 0.0):
        local = FakeClock(0.37)
        inner = gm.MemoryMailbox(clock=lambda: local.now + 1000.123)
        box = CoarseStamps(inner, resolution) if resolution else inner
        store_clock = StoreClock()
        lease = LearnerLease(RunStore(box), "x", 10.0, clock=local, store_clock=store_clock)
        lease.renew({})
        timed = 0
        while (pause := lease.next_probe_in()) is not None:
            assert 0.0 <= pause <= 2 * resolution
            local.now += pause
            lease.renew({})
            timed += 1
        assert timed <= PROBE_WRITES and store_clock.uncertainty_s <= CLOCK_TARGET_S
        assert (timed > 0) == (resolution > 0) and local.now < 6.0, (resolution, timed, local.now)


def test_lease_writes_pin_the_store_clock_then_sample_it_now_and_then() -> None:
    """A learner's lease writes are the node's clock samples (a HEAD for the stamp): each while a
    sample could still narrow the bounds, then one in ``CLOCK_RESAMPLE_WRITES``; the clock they
    pin is the store's (here 1000 s ahead of the node's)."""
    local = FakeClock(0.0)
    box = _Heads(gm.MemoryMailbox(clock=lambda: local.now + 1000.0))
    store_clock = StoreClock()
    lease = LearnerLease(RunStore(box), "x", 10.0, clock=local, store_clock=store_clock)
    lease.renew({})
    assert store_clock.known and store_clock.low == store_clock.high == 1000.0 and box.calls["head"] == 1
    for _ in range(2 * CLOCK_RESAMPLE_WRITES - 1):
        local.now += 3.0
        lease.renew({})
    assert box.calls["head"] == 3 and store_clock.samples == 3  # the first, the 10th and the 20th writes


def test_a_fragment_whose_owner_left_is_orphaned_until_its_new_owner_reads_it() -> None:
    """INV-23: the rule of which reassigned fragments the coordinator closes meanwhile."""
    assert orphaned(("a", "b", "c"), ("a", "c", "c"), ["a", "c"]) == {1}
    assert orphaned(("a", "b", "c"), ("a", "c", "b"), ["a", "b", "c"]) == set()  # b still closes: it hands over
    assert orphaned((), ("a", "b"), ["a", "b"]) == set() and orphaned(("a",), ("a", "b"), ["a"]) == set()
    assert orphaned(("", "b"), ("a", "a"), ["a"]) == {1}


def syncer_replaced_after(resolution: float | None, seed: int) -> float:
    """Seconds from a dead syncer holder's last renewal until another node holds the lease."""
    sim = Sim(3, stamp_resolution_s=resolution, phase_seed=seed)
    sim.run_until(2 * TTL_S, until=lambda: sim.leader() is not None)
    sim.run_until(sim.clock.now + 1.3 + 0.7 * seed)
    dead = sim.leader()
    assert dead is not None
    dead.alive = False
    renewed = dead.syncer.election.renewed_at
    sim.run_until(renewed + 3 * TTL_S, until=lambda: sim.leader() is not None)
    successor = sim.leader()
    assert successor is not None and successor is not dead
    return sim.clock.now - renewed


def test_a_dead_syncer_is_replaced_within_a_ttl_and_a_poll_where_the_store_stamps_exactly() -> None:
    """INV-6 on the fake clock, nodes at random phases, killed in the run's first seconds: exact
    stamps (memory, a directory's 10 ms) give TTL + one poll; S3's 1 s stamps add up to that
    second while the clocks are not pinned yet; a store whose reads carry no stamp leaves the
    sightings' bound, TTL + an idle interval + a poll."""
    for seed in range(3):
        assert syncer_replaced_after(0.0, seed) <= TTL_S + POLL_S + 0.01
        assert syncer_replaced_after(0.01, seed) <= TTL_S + 0.01 + POLL_S + 0.01
        assert syncer_replaced_after(1.0, seed) <= TTL_S + 1.0 + POLL_S + 0.01
        assert syncer_replaced_after(None, seed) <= TTL_S + IDLE_S + POLL_S + 0.01


def test_with_s3s_stamps_a_running_nodes_claims_give_a_ttl_and_a_poll() -> None:
    """INV-6 with 1 s stamps, nodes that have run a minute (their clocks pinned by timed lease
    writes): a dead learner is dropped, and a dead syncer replaced, within TTL + one poll + the
    two clocks' uncertainty of the last renewal, never before a TTL."""
    for seed in range(3):
        sim = Sim(3, stamp_resolution_s=1.0, phase_seed=seed)
        sim.run_until(60.0 + 0.9 * seed)
        leader = sim.leader()
        assert leader is not None
        victim = next(node for node in sim.nodes if node is not leader)
        victim.lease_alive = False
        renewed = victim.lease_written_at
        sim.run_until(renewed + 3 * TTL_S, until=lambda: victim.name not in leader.syncer.live)
        assert TTL_S <= sim.clock.now - renewed <= TTL_S + POLL_S + 2 * CLOCK_TARGET_S + 0.01
        leader.alive = False
        renewed = leader.syncer.election.renewed_at
        sim.run_until(renewed + 3 * TTL_S, until=lambda: sim.leader() is not None)
        assert TTL_S <= sim.clock.now - renewed <= TTL_S + POLL_S + 2 * CLOCK_TARGET_S + 0.01
