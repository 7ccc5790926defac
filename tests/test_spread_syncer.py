"""The syncer's load spread over the nodes (``syncer_layout="spread"``, INV-23): the assignment
rule, and nodes of one run on a fake clock (``tests/node_sim.py``: the library's own wiring, no
threads) closing the rounds of their own fragments, with failover when a node or the coordinator
dies. Real processes and the bytes each node moves: ``benchmarks/spread.py``."""

from __future__ import annotations

import numpy as np
import pytest

from gradientmail.records import Lease
from gradientmail.store import ContributionCounts, RoundsBulletin, RunStore
from gradientmail.syncer.assignment import CLOSES, assign_fragments, closers
from tests.node_sim import IDLE_S, POLL_S, TTL_S, Node, Sim

# -- the rule ----------------------------------------------------------------------------------------


def test_equal_fragments_go_one_to_each_node_and_uneven_ones_balance_bytes() -> None:
    """INV-23: the rule is a pure function of sizes and ids, whatever their order: equal fragments
    one to each node, uneven ones largest first to the least-loaded node."""
    nodes = [f"n{i}" for i in range(8)]
    assert sorted(assign_fragments([100] * 8, nodes)) == nodes
    assert assign_fragments([100] * 8, list(reversed(nodes))) == assign_fragments([100] * 8, nodes)  # order-free
    owners = assign_fragments([50, 400, 100, 300, 200, 100], ["a", "b", "c"])
    load = {n: sum(size for size, o in zip([50, 400, 100, 300, 200, 100], owners, strict=True) if o == n) for n in "abc"}
    assert owners[1] == "a" and max(load.values()) == 400 and min(load.values()) >= 350  # LPT: 400 | 300+50 | 200+100+100
    assert sorted(assign_fragments([1] * 8, ["a", "b", "c"])).count("a") == 3
    assert assign_fragments([1, 2], []) == ()


def test_the_closers_are_the_coordinator_and_live_nodes_that_run_a_syncer() -> None:
    def lease(node: str, closes: bool) -> Lease:
        return Lease(kind="learner", holder=node, ttl_s=10.0, info={CLOSES: True} if closes else {})

    live = {"a": lease("a", True), "b": lease("b", False), "c": lease("c", True), "dead": lease("dead", True)}
    assert closers(live, "z") == ["a", "c", "dead", "z"]
    assert closers(live, "z", excluded=["dead", "z"]) == ["a", "c", "z"]  # never the coordinator itself


def test_a_garbled_assignment_in_a_bulletin_is_ignored() -> None:
    def bulletin(assign: object) -> RoundsBulletin | None:
        info = {"heads": [0, 0], "open": [], "assign": assign}
        return RoundsBulletin.from_lease(Lease(kind="syncer", holder="s", ttl_s=10.0, info=info), 2)

    assert bulletin(["a", "b"]).assign == ("a", "b")  # type: ignore[union-attr]
    assert bulletin(["a", ""]).assign == ("a", "")  # type: ignore[union-attr]
    for garbled in (["a"], ["a", 3], ["a", "no spaces"], "ab", None):
        found = bulletin(garbled)
        assert found is not None and found.assign is None


# -- nodes on a fake clock ------------------------------------------------------------------------------


def publish(sim: Sim, node: Node, fragment: int, base: int) -> None:
    name = sim.spec.fragments[fragment][0]
    delta = {name: np.full(8, 0.01, np.float32)}
    node.store.publish_contribution(node.name, fragment, base, delta, ContributionCounts(steps=4, samples=4))
    node.loops.syncer.contribution_published(fragment) if node.loops and node.loops.syncer else None  # type: ignore[func-returns-value]


def owner_of(sim: Sim, fragment: int) -> Node:
    (owner,) = [node for node in sim.nodes if node.alive and fragment in node.syncer.assigned()]
    return owner


def settled(sim: Sim) -> bool:
    """Every fragment has exactly one live node closing it."""
    return all(sum(f in n.syncer.assigned() for n in sim.nodes if n.alive) == 1 for f in range(len(sim.spec.fragments)))


@pytest.fixture
def spread() -> Sim:
    sim = Sim(8, quorum=1, fragments=8, layout="spread")
    sim.run_until(3 * TTL_S, until=lambda: settled(sim))
    assert settled(sim)
    return sim


def test_each_of_eight_nodes_closes_one_of_eight_fragments(spread: Sim) -> None:
    """INV-23: the coordinator assigns one fragment to each node; each commits its own, and the
    coordinator's bulletin shows every fragment's head to the learners."""
    sim = spread
    assert sorted(owner_of(sim, f).name for f in range(8)) == sorted(n.name for n in sim.nodes)
    publisher = sim.nodes[0]
    for fragment in range(8):
        publish(sim, publisher, fragment, 0)
    sim.run_until(sim.clock.now + 30.0, until=lambda: all(RunStore(sim.shared).newest_version(f) == 1 for f in range(8)))
    store = RunStore(sim.shared)
    for fragment in range(8):
        assert store.read_round(fragment, 1).committed_by == owner_of(sim, fragment).name
    assert sum(n.syncer.commits for n in sim.nodes) == 8 and all(n.syncer.commits == 1 for n in sim.nodes)
    assert sum(n.syncer.lost_races for n in sim.nodes) == 0
    far = next(n for n in sim.nodes if n is not sim.leader() and n is not publisher)
    sim.run_until(sim.clock.now + 3 * IDLE_S, until=lambda: all(v == 1 for v in far.exchange.known_versions))
    assert all(v == 1 for v in far.exchange.known_versions), "the learners follow the coordinator's bulletin"


def closing(sim: Sim, fragment: int) -> list[Node]:
    return [node for node in sim.nodes if node.alive and fragment in node.syncer.assigned()]


def test_a_dead_nodes_fragment_is_taken_over_while_the_others_keep_committing(spread: Sim) -> None:
    """INV-23 failover: a node's learner lease stops; the coordinator drops it from the live set
    within TTL + one poll of its last renewal (INV-6, by the lease's stamp), reassigns its
    fragment and closes it itself until the new owner has surely read the assignment; meanwhile
    the other fragments commit, and then the new owner alone closes it."""
    sim = spread
    leader = sim.leader()
    assert leader is not None
    victim = next(n for n in sim.nodes if n is not leader)
    (fragment,) = victim.syncer.assigned()
    written = victim.exchange.lease
    sim.run_until(sim.clock.now + TTL_S, until=lambda: victim.exchange.lease is not written)
    victim.alive = victim.lease_alive = False
    renewed = sim.clock.now
    other_fragment = next(f for f in range(8) if f != fragment)
    publish(sim, leader, other_fragment, 0)
    sim.run_until(renewed + 4 * TTL_S, until=lambda: bool(closing(sim, fragment)))
    assert sim.clock.now - renewed <= TTL_S + POLL_S + 0.01
    assert closing(sim, fragment) == [leader], "the coordinator closes the orphan at once"
    assert RunStore(sim.shared).newest_version(other_fragment) == 1, "the others kept committing"
    sim.run_until(sim.clock.now + IDLE_S + 3 * POLL_S)
    new_owner = owner_of(sim, fragment)  # one closer again, once the handover window has passed
    assert new_owner is not victim
    publish(sim, leader, fragment, 0)
    sim.run_until(sim.clock.now + 10.0, until=lambda: RunStore(sim.shared).newest_version(fragment) == 1)
    assert RunStore(sim.shared).read_round(fragment, 1).committed_by == new_owner.name


def test_when_the_coordinator_dies_a_new_one_reassigns_its_fragments_at_once(spread: Sim) -> None:
    """INV-23: the coordinator's syncer lease expires (INV-6: within TTL + one poll of its last
    renewal); the node that takes it over excludes the dead holder from the assignment at once
    (its learner lease still looks live for a TTL) and closes the dead holder's fragment until
    its new owner has read the assignment."""
    sim = spread
    dead = sim.leader()
    assert dead is not None
    (fragment,) = dead.syncer.assigned()
    dead.alive = dead.lease_alive = False
    died_at = dead.syncer.election.renewed_at
    sim.run_until(died_at + 4 * TTL_S, until=lambda: sim.leader() is not None and bool(closing(sim, fragment)))
    successor = sim.leader()
    assert successor is not None and successor is not dead
    assert sim.clock.now - died_at <= TTL_S + POLL_S + 0.01, sim.clock.now - died_at
    assert closing(sim, fragment) == [successor]
    sim.run_until(sim.clock.now + IDLE_S + 3 * POLL_S)
    assert settled(sim) and owner_of(sim, fragment) is not dead


def test_a_node_whose_learner_lease_stops_hands_its_fragment_over_and_stops_closing_it(spread: Sim) -> None:
    """INV-23: a node whose learner lease stops renewing (its syncer still running) is dropped from
    the assignment; it reads the new one and stops closing the fragment, so the new owner alone
    commits it (create-once would settle a race anyway, INV-1)."""
    sim = spread
    leader = sim.leader()
    assert leader is not None
    victim = next(n for n in sim.nodes if n is not leader)
    (fragment,) = victim.syncer.assigned()
    victim.lease_alive = False
    sim.run_until(sim.clock.now + 4 * TTL_S, until=lambda: fragment not in victim.syncer.assigned() and settled(sim))
    assert victim.syncer.assigned() == frozenset()
    new_owner = owner_of(sim, fragment)
    publish(sim, sim.nodes[0] if sim.nodes[0] is not victim else leader, fragment, 0)
    sim.run_until(sim.clock.now + 10.0, until=lambda: RunStore(sim.shared).newest_version(fragment) == 1)
    sim.run_until(sim.clock.now + 2.0)
    assert RunStore(sim.shared).read_round(fragment, 1).committed_by == new_owner.name
    assert victim.syncer.commits == 0 and sum(n.syncer.lost_races for n in sim.nodes) == 0
