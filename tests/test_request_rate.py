"""Requests an idle run makes, counted per node on a simulated clock (no threads, no wall time).

Each node is a learner's exchange, its lease, and its syncer runtime (election and rounds), all
on one in-memory mailbox, each node through a mailbox wrapper that counts its calls. The loops'
passes are run in the order of their due times on a fake clock, as their threads would run them
(docs/session.md, "Polling"): an idle learner's requests per second must not grow with the
number of learners, and failover, dead-learner detection and commits must still come in time.
"""

from __future__ import annotations

import numpy as np

import gradientmail as gm
from gradientmail.session.looking import BULLETIN_CHECK_TTLS
from gradientmail.store import ContributionCounts
from gradientmail.store.leases import CLOCK_RESAMPLE_WRITES
from gradientmail.syncer.pacing import HEAD_PROBE_TTLS, LEASE_READ_IDLE_INTERVALS
from tests.node_sim import IDLE_S, POLL_S, TTL_S, Sim, idle_rates


def test_idle_requests_per_learner_do_not_grow_with_the_learner_count():
    """What each idle node reads, by the rules of docs/session.md "Polling", and that a learner's
    share falls as learners are added (the elected node's reads are spread over more of them)."""
    rates = {k: idle_rates(k) for k in (1, 2, 4, 8)}
    per_learner = {k: rate for k, (rate, _) in rates.items()}
    assert per_learner[8] <= per_learner[4] <= per_learner[2], per_learner
    # Every node: a lease PUT and a read (or renewal) of the syncer lease, each once per TTL/3:
    # the read is the election's watch, and the learner follows the bulletin in it without a
    # request of its own; a node not elected checks one fragment from its head pointer (a GET
    # and two HEADs) once per BULLETIN_CHECK_TTLS TTLs. The elected node besides: a LIST of the
    # learners' leases and a GET of each but its own, once per LEASE_READ_IDLE_INTERVALS idle
    # intervals (TTL/2); a LIST of its
    # contributions, backed off to once per TTL/3 (once per HEAD_PROBE_TTLS TTLs while no other
    # learner trains); and a HEAD of the fragment's next version once per HEAD_PROBE_TTLS TTLs.
    # Every node's lease writes (its own, and the syncer lease while it holds it) sample the
    # store's clock: a HEAD each until it is pinned (one write, on this store), then one in
    # CLOCK_RESAMPLE_WRITES.
    slow = HEAD_PROBE_TTLS * TTL_S
    for k, rate in per_learner.items():
        every_node = 2 / IDLE_S + (1 + 1 / k) / IDLE_S / CLOCK_RESAMPLE_WRITES
        check = 3 / (BULLETIN_CHECK_TTLS * TTL_S) * (k - 1) / k
        collect = 1 / IDLE_S if k > 1 else 1 / slow
        elected = (1 + (k - 1)) / (LEASE_READ_IDLE_INTERVALS * IDLE_S) + collect + 1 / slow
        assert rate <= 1.05 * (every_node + check + elected / k), (k, rate, rates[k][1])


def test_an_idle_learner_reads_no_lease_but_the_syncers():
    sim = Sim(4)
    sim.run_until(2 * TTL_S)
    sim.reset()
    sim.run_until(sim.clock.now + 60.0)
    leader = sim.leader()
    assert leader is not None
    for node in sim.nodes:
        if node is not leader:
            assert node.box.counts["list"] == 0  # rounds others opened are in the syncer's bulletin
            assert node.box.counts["exists"] == 0  # so are the fragments' new versions
            assert node.box.counts["get_versioned"] <= 60.0 / IDLE_S + 1  # the syncer lease only, once per idle interval
    assert leader.box.counts["get_versioned"] <= 4 * (60.0 / (LEASE_READ_IDLE_INTERVALS * IDLE_S) + 1)  # the learners' leases


def test_a_dead_syncer_is_replaced_within_a_ttl_and_a_poll():
    """INV-6: the other nodes read the syncer lease at the idle pace, but judge it by the store's
    stamp of its last write, so they take over within TTL + one poll of the dead holder's last
    renewal (this store stamps exactly; tests/test_lease_stamps.py: coarser stamps, none)."""
    sim = Sim(3)
    sim.run_until(2 * TTL_S)
    dead = sim.leader()
    assert dead is not None
    sim.run_until(sim.clock.now + 5.0)
    dead.alive = False
    last_renewal = dead.syncer.election.renewed_at
    sim.run_until(last_renewal + 3 * TTL_S, until=lambda: sim.leader() is not None)
    successor = sim.leader()
    assert successor is not None and successor is not dead
    assert sim.clock.now - last_renewal <= TTL_S + POLL_S + 0.01


def test_a_dead_learner_is_dropped_by_the_syncer_within_a_ttl_and_a_poll():
    """INV-6: the elected syncer reads the learners' leases at the idle pace, and re-reads one
    when its stamp says it expires: a dead learner leaves the live set within TTL + one poll of
    its last renewal."""
    sim = Sim(3)
    sim.run_until(2 * TTL_S)
    leader = sim.leader()
    assert leader is not None
    victim = next(node for node in sim.nodes if node is not leader)
    assert victim.name in leader.syncer.live
    victim.lease_alive = False
    died_at = sim.clock.now  # its last renewal was before this
    sim.run_until(died_at + 3 * TTL_S, until=lambda: victim.name not in leader.syncer.live)
    assert victim.name not in leader.syncer.live
    assert sim.clock.now - died_at <= TTL_S + POLL_S + 0.01
    assert leader.syncer.learners.expired == 1


def test_a_contribution_from_another_process_is_committed_and_fetched_in_time():
    """A node with quorum 1 publishes after a quiet spell; the syncer sees it within its idle
    listing pace, and an idle learner elsewhere has the commit within its idle interval: the
    syncer renews its lease with the new head at once, and the learner's election watch reads
    it at the idle pace and hands it to the exchange."""
    sim = Sim(3, quorum=1)
    sim.run_until(3 * TTL_S)
    leader = sim.leader()
    assert leader is not None
    other = next(node for node in sim.nodes if node is not leader)
    delta = {"w": np.full(8, 0.5, np.float32)}
    other.store.publish_contribution(other.name, 0, 0, delta, ContributionCounts(steps=4, samples=4))
    published_at = sim.clock.now
    sim.run_until(published_at + 10.0, until=lambda: leader.syncer.commits > 0)
    assert leader.syncer.commits == 1
    assert sim.clock.now - published_at <= IDLE_S + POLL_S
    third = next(node for node in sim.nodes if node not in (leader, other))
    committed_at = sim.clock.now
    sim.run_until(committed_at + 10.0, until=lambda: third.exchange.known_versions[0] == 1)
    assert third.exchange.known_versions[0] == 1
    assert sim.clock.now - committed_at <= IDLE_S + 2 * POLL_S


def test_the_syncer_lists_at_the_regular_pace_when_a_lease_says_a_contribution_is_due():
    """A learner's lease carries ``due_in_s``: around then the elected node lists contributions
    every ``poll_interval_s`` instead of its idle backoff, so a contribution arriving on time is
    seen within a poll interval."""
    sim = Sim(2, quorum=1)
    sim.run_until(3 * TTL_S)
    leader = sim.leader()
    assert leader is not None
    other = next(node for node in sim.nodes if node is not leader)
    due_at = sim.clock.now + 20.0
    other.lease_info = lambda: {"due_in_s": due_at - sim.clock.now} if due_at > sim.clock.now else {}
    sim.run_until(due_at)
    delta = {"w": np.full(8, 0.5, np.float32)}
    other.store.publish_contribution(other.name, 0, 0, delta, ContributionCounts(steps=4, samples=4))
    sim.run_until(due_at + 10.0, until=lambda: leader.syncer.commits > 0)
    assert leader.syncer.commits == 1 and sim.clock.now - due_at <= POLL_S + 1e-9
    sim.run_until(sim.clock.now + IDLE_S + 5.0)  # the window's tail and the backoff's ramp
    sim.reset()
    sim.run_until(sim.clock.now + 60.0)  # no more due: back to the idle pace
    assert leader.box.counts["list"] <= 2 * 60 / IDLE_S + 2  # its contributions and the leases, each per idle interval


def test_a_learner_lease_says_when_its_next_contribution_is_due():
    model = {"w": np.zeros(4, np.float32)}
    with gm.Session(model, algorithm=gm.DiLoCo(sync_every=10), mailbox=gm.MemoryMailbox(), backend="numpy") as session:
        assert "due_in_s" not in session.lease_info()  # no step time yet
        session.step()
        session.step()
        info = session.lease_info()
        assert isinstance(info["due_in_s"], float) and info["due_in_s"] >= 0


def test_a_round_waits_for_quorum_when_the_live_set_was_read_before_a_learner_came_back():
    """The elected node reads the learners' leases once per idle interval: a round must not close
    on "every live learner is in" from a view older than a poll (here one where the other learner
    was gone), or quorum 2 would commit a single contribution."""
    sim = Sim(2, quorum=2)
    sim.run_until(2 * TTL_S)
    leader = sim.leader()
    assert leader is not None
    other = next(node for node in sim.nodes if node is not leader)
    other.lease_alive = False
    sim.run_until(sim.clock.now + 2 * TTL_S)  # its lease expires; the leader sees only itself
    read_at = leader.syncer.leases_read_at
    sim.run_until(sim.clock.now + TTL_S, until=lambda: leader.syncer.leases_read_at > read_at)
    assert set(leader.syncer.live) == {leader.name}
    other.lease_alive = True
    other.exchange.renew_lease()  # back just after the leader's read, as its lease thread would be
    sim.run_until(sim.clock.now + 3 * POLL_S)  # the leader's view is now older than a poll
    delta = {"w": np.full(8, 0.5, np.float32)}
    counts = ContributionCounts(steps=4, samples=4)
    leader.store.publish_contribution(leader.name, 0, 0, delta, counts)
    leader.syncer.contribution_published(0)  # what its learner's upload tells it, in one process
    sim.run_until(sim.clock.now + 2.0, until=lambda: leader.syncer.commits > 0)
    assert leader.syncer.commits == 0, "a quorum-2 round closed on one contribution"
    other.store.publish_contribution(other.name, 0, 0, delta, counts)
    sim.run_until(sim.clock.now + 10.0, until=lambda: leader.syncer.commits > 0)
    assert leader.syncer.commits == 1
    record = leader.store.read_round(0, 1)
    assert sorted(p.learner for p in record.participants) == sorted([leader.name, other.name])
