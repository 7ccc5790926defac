"""Requests an idle run makes, counted per node on a simulated clock (no threads, no wall time).

Each node is a learner's exchange, its lease, and its syncer runtime (election and rounds), all
on one in-memory mailbox, each node through a mailbox wrapper that counts its calls. The loops'
passes are run in the order of their due times on a fake clock, as their threads would run them
(docs/session.md, "Polling"): an idle learner's requests per second must not grow with the
number of learners, and failover, dead-learner detection and commits must still come in time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import gradientmail as gm
from gradientmail.backends import get_backend
from gradientmail.session.exchange import Exchange
from gradientmail.session.fragment import LearnerFragment
from gradientmail.session.join import RunProposal, join_run
from gradientmail.session.node_loops import LoopPass, NodeLoops
from gradientmail.store import ContributionCounts, RunSpec, RunStore
from gradientmail.syncer import SyncerRuntime
from gradientmail.syncer.runtime import IDLE_COLLECT_MAX_S
from tests.fake_clock import FakeClock

NUMPY = get_backend("numpy")
TTL_S = 10.0
POLL_S = 0.2
IDLE_S = TTL_S / 3
_OPS = frozenset({"get", "get_versioned", "head", "exists", "put", "create", "swap", "list", "delete"})


class CountingMailbox:
    """Forwards to a mailbox, counting each request-making call by name."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.counts: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in _OPS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            return attr(*args, **kwargs)

        return call


@dataclass
class Node:
    name: str
    box: CountingMailbox
    store: RunStore
    loops: NodeLoops | None = None
    lease_info: Callable[[], dict[str, object]] = dict
    """What the node's lease says at each renewal (a test may change it)."""
    passes: list[LoopPass] = field(default_factory=list)
    next_at: list[float] = field(default_factory=list)
    alive: bool = True
    lease_alive: bool = True

    @property
    def exchange(self) -> Exchange:
        assert self.loops is not None
        return self.loops.exchange

    @property
    def syncer(self) -> SyncerRuntime:
        assert self.loops is not None and self.loops.syncer is not None
        return self.loops.syncer


class Sim:
    """``k`` nodes of one run, their loops' passes run in due order on a fake clock: each node is
    the library's own wiring (``NodeLoops``), its threads never started."""

    def __init__(self, k: int, quorum: int = 2) -> None:
        self.clock = FakeClock()
        shared = gm.MemoryMailbox()
        algorithm = gm.DiLoCo(sync_every=100, fragments=1, quorum_size=quorum)
        self.spec: RunSpec
        self.spec, _ = join_run(
            RunStore(shared), NUMPY, {"w": np.zeros(8, np.float32)}, RunProposal(algorithm, lease_ttl_s=TTL_S), "creator"
        )
        self.anchor = RunStore(shared).read_params(self.spec, RunStore(shared).read_round(0, 0))
        self.nodes: list[Node] = []
        for i in range(k):
            box = CountingMailbox(shared)
            node = Node(f"l{i}", box, RunStore(box))  # type: ignore[arg-type]
            node.loops = NodeLoops(
                node.store,
                self.spec,
                node.name,
                [LearnerFragment.joined(0, ["w"], self.anchor, 0)],
                backend=NUMPY,
                poll_interval_s=POLL_S,
                idle_interval_s=None,
                on_change=lambda: None,
                lease_info=lambda node=node: node.lease_info(),
                clock=self.clock,
            )
            node.loops.start(threads=False)  # the first lease renewal and election pass
            node.passes = node.loops.passes()
            node.next_at = [0.0] * len(node.passes)
            self.nodes.append(node)

    def run_until(self, end: float, until: Callable[[], bool] | None = None) -> None:
        while True:
            due = [(at, n, i) for n, node in enumerate(self.nodes) if node.alive for i, at in enumerate(node.next_at)]
            at, n, i = min(due)
            if at > end:
                self.clock.now = end
                return
            self.clock.now = max(self.clock.now, at)
            node = self.nodes[n]
            loop_pass = node.passes[i]
            if loop_pass.name != "lease" or node.lease_alive:
                loop_pass.run()
            node.next_at[i] = self.clock.now + max(loop_pass.loop.next_pause(), 1e-3)
            if until is not None and until():
                return

    def leader(self) -> Node | None:
        leaders = [node for node in self.nodes if node.alive and node.syncer.election.is_leader]
        assert len(leaders) <= 1
        return leaders[0] if leaders else None

    def reset(self) -> None:
        for node in self.nodes:
            node.box.counts.clear()


def idle_rates(k: int, seconds: float = 120.0) -> tuple[float, Counter[str]]:
    """Requests per second per learner, and the calls by name, of ``k`` idle nodes."""
    sim = Sim(k)
    sim.run_until(2 * TTL_S)  # the election settles; one-time reads done
    sim.reset()
    start = sim.clock.now
    sim.run_until(start + seconds)
    total: Counter[str] = Counter()
    for node in sim.nodes:
        total.update(node.box.counts)
    return sum(total.values()) / seconds / k, total


def test_idle_requests_per_learner_do_not_grow_with_the_learner_count():
    one, by_op_one = idle_rates(1)
    four, by_op_four = idle_rates(4)
    eight, _ = idle_rates(8)
    assert four <= one and eight <= four, (one, four, eight, by_op_one, by_op_four)
    # Every node: a lease PUT, a HEAD and a LIST for its fragment, a read (or renewal) of the
    # syncer lease, each once per TTL/3, and the head pointer's check (3 requests) once per 3
    # TTLs. The elected node besides: a LIST of the learners' leases and a GET of each, and a
    # HEAD of the fragment's next version, once per TTL/3, and a LIST of its contributions,
    # backing off to one per IDLE_COLLECT_MAX_S.
    every_node = 4 / IDLE_S + 3 / (3 * TTL_S)
    for k, rate in ((1, one), (4, four), (8, eight)):
        elected = (2 + k) / IDLE_S + 1 / IDLE_COLLECT_MAX_S
        assert rate <= 1.05 * (every_node + elected / k), (k, rate)


def test_an_idle_learner_reads_no_lease_but_the_syncers():
    sim = Sim(4)
    sim.run_until(2 * TTL_S)
    sim.reset()
    sim.run_until(sim.clock.now + 60.0)
    leader = sim.leader()
    assert leader is not None
    for node in sim.nodes:
        if node is not leader:
            assert node.box.counts["list"] <= 60.0 / IDLE_S + 1  # the watch for rounds others opened only
            assert node.box.counts["get_versioned"] <= 60.0 / IDLE_S + 1  # the syncer lease only
    assert leader.box.counts["get_versioned"] <= 4 * (60.0 / IDLE_S + 1)  # the learners' leases


def test_a_dead_syncer_is_replaced_within_a_ttl_and_an_idle_interval():
    """INV-6: the other nodes read the syncer lease at the idle pace, and take over within TTL +
    idle interval + poll of the dead holder's last renewal."""
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
    assert sim.clock.now - last_renewal <= TTL_S + IDLE_S + 2 * POLL_S


def test_a_dead_learner_is_dropped_by_the_syncer_within_a_ttl_and_an_idle_interval():
    """INV-6: the elected syncer reads the learners' leases at the idle pace, and re-reads one
    when it would expire: a dead learner leaves the live set within TTL + idle interval + poll."""
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
    assert sim.clock.now - died_at <= TTL_S + IDLE_S + 2 * POLL_S
    assert leader.syncer.learner_leases_expired == 1


def test_a_contribution_from_another_process_is_committed_and_fetched_in_time():
    """A node with quorum 1 publishes after a quiet spell; the syncer sees it within its idle
    listing pace, and an idle learner elsewhere has the commit within its idle interval."""
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
    assert sim.clock.now - published_at <= IDLE_COLLECT_MAX_S + POLL_S
    third = next(node for node in sim.nodes if node not in (leader, other))
    committed_at = sim.clock.now
    sim.run_until(committed_at + 10.0, until=lambda: third.exchange.known_versions[0] == 1)
    assert third.exchange.known_versions[0] == 1
    assert sim.clock.now - committed_at <= IDLE_S + POLL_S


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
    assert leader.box.counts["list"] <= 60 / IDLE_COLLECT_MAX_S + 2 * 60 / IDLE_S + 2


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
    sim.run_until(sim.clock.now + 2.0, until=lambda: leader.syncer.commits > 0)
    assert leader.syncer.commits == 0, "a quorum-2 round closed on one contribution"
    other.store.publish_contribution(other.name, 0, 0, delta, counts)
    sim.run_until(sim.clock.now + 10.0, until=lambda: leader.syncer.commits > 0)
    assert leader.syncer.commits == 1
    record = leader.store.read_round(0, 1)
    assert sorted(p.learner for p in record.participants) == sorted([leader.name, other.name])
