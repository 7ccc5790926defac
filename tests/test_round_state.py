"""The syncer's per-fragment rules (``syncer.round_state.FragmentRounds``) and a spread run's
layout (``syncer.spread.SpreadLayout``) on times the test gives.

Each test drives the pure core the way ``SyncerRuntime`` does on a pass and checks the decision
it returns: which contributions a pass examines, what is stale and when, when a round closes,
which fragments a node closes. The views come from a real run in a memory mailbox; the rules
make no request of their own (a reader stands in for the round records)."""

from __future__ import annotations

from types import SimpleNamespace

from gradientmail.backends import get_backend
from gradientmail.mailbox import MemoryMailbox
from gradientmail.polling import RepeatedFailures
from gradientmail.records import Lease, RoundRecord, keys
from gradientmail.store import OpenRoundNote, RoundsBulletin
from gradientmail.syncer.assignment import CLOSES
from gradientmail.syncer.bounds import ROUND_CONTRIBUTION_LIMIT
from gradientmail.syncer.round_state import STRANGERS_PER_PASS, FragmentRounds, FragmentView, OpenRound, RoundStep
from gradientmail.syncer.rounds import load_base
from gradientmail.syncer.spread import ASSIGNMENT_KEPT_TTLS, SpreadLayout
from testing.mailbox_run import ALGORITHM, FRAGMENT, HONEST, create_run

TTL_S = 3.0
MAX_STALENESS = ALGORITHM.max_staleness


def _rounds_on_version_one() -> tuple[FragmentRounds, dict[int, RoundRecord]]:
    """Fresh rules for the fragment of a real run whose version 1 merged the honest learners."""
    run = create_run(MemoryMailbox())
    run.honest_round()
    stored = run.store.read_stored_round(FRAGMENT, 1)
    committed = run.store.load_version(run.spec, FRAGMENT, 1)
    backend = get_backend("numpy")
    rounds = FragmentRounds(FRAGMENT, run.spec.algorithm, margin_s=0.1, failures=RepeatedFailures(None, "f", lambda: 0.0))
    view = FragmentView(1, stored.record, load_base(backend, committed), OpenRound(1, opened_at=0.0), stored.sha256)
    rounds.open(view, backend)
    return rounds, {1: stored.record}


def _key(learner: str, base: int = 1, sequence: int = 1) -> keys.ContributionKey:
    return keys.ContributionKey(FRAGMENT, base, learner, sequence)


def test_a_pass_examines_the_regulars_then_the_live_then_a_bounded_number_of_strangers() -> None:
    rounds, _ = _rounds_on_version_one()
    regular = HONEST[0]
    strangers = [_key(f"stranger{i:03d}") for i in range(STRANGERS_PER_PASS + 5)]
    listed = [*strangers, _key("newcomer"), _key(regular)]
    chosen = rounds.within_budget(listed, live={"newcomer"})
    assert [k.learner for k in chosen[:2]] == [regular, "newcomer"]
    assert chosen[2:] == strangers[:STRANGERS_PER_PASS], "the rest wait for a later pass, unread"
    assert rounds.view is not None and rounds.view.round.rejected == []


def test_past_the_rounds_limit_contributions_are_rejected_flood_without_a_read() -> None:
    rounds, _ = _rounds_on_version_one()
    live = {f"l{i:04d}" for i in range(ROUND_CONTRIBUTION_LIMIT + 3)}
    listed = [_key(learner) for learner in sorted(live)]
    chosen = rounds.within_budget(listed, live=live)
    assert len(chosen) == ROUND_CONTRIBUTION_LIMIT
    assert rounds.view is not None
    assert [r.reason for r in rounds.view.round.rejected] == ["flood"] * 3
    assert rounds.within_budget([_key("late")], live={"late"}) == [], "the round's budget is spent"


def test_an_old_contribution_is_stale_unless_a_round_lists_it_and_a_late_one_merges_within_the_bound() -> None:
    rounds, records = _rounds_on_version_one()
    listed_in_one = records[1].participants[0].contribution
    assert rounds.view is not None
    old_listed = keys.parse_contribution_record(listed_in_one)
    assert old_listed is not None
    rounds.old_contribution(old_listed, records.get, now=5.0)
    assert rounds.view.round.rejected == [], "kept for audit: version 1 merged it"
    unlisted = _key("straggler", base=0)
    assert rounds.mergeable_late(unlisted, records.get) == (MAX_STALENESS >= 1), "in no record, within the bound"
    assert not rounds.mergeable_late(old_listed, records.get), "version 1 listed it already"
    rounds.old_contribution(unlisted, records.get, now=5.0)
    assert [r.reason for r in rounds.view.round.rejected] == ["stale"]
    assert unlisted.record in rounds.view.round.seen


def test_a_round_waits_for_quorum_then_its_grace_window_and_closes_at_once_when_everyone_is_in() -> None:
    rounds, _ = _rounds_on_version_one()
    assert rounds.view is not None
    current = rounds.view.round
    arrival = SimpleNamespace(contribution=SimpleNamespace(learner="a", anchor_version=1, step_time_s=1.0, steps=1, samples=1))
    current.accepted.append(arrival)  # type: ignore[arg-type]
    current.first_seen_at = 10.0
    assert ALGORITHM.quorum_size > 1
    assert rounds.step(10.0, everyone=False) == RoundStep(close=False), "one accepted is below quorum"
    everyone = rounds.step(10.0, everyone=True)
    assert everyone.close and everyone.announce and current.grace_s == 0.0, "every live learner is in: no grace"


def test_a_spread_coordinator_closes_an_orphaned_fragment_until_its_new_owner_has_read_the_assignment() -> None:
    layout = SpreadLayout([100, 100, 100], "a", TTL_S)
    live = {n: Lease(kind="learner", holder=n, ttl_s=TTL_S, info={CLOSES: True}) for n in ("a", "b", "c", "d")}
    first = layout.reassign(live, [], 0.0, handover_s=1.5)
    assert first is not None and first.at_once and first.assign == ("a", "b", "c"), "a term's first: at once"
    assert layout.mine(0.0, leader=True) == {first.assign.index("a")}
    gone = first.assign.index("c")
    del live["c"]
    second = layout.reassign(live, [], 10.0, handover_s=1.5)
    assert second is not None and second.at_once, "an orphan is announced at once"
    assert second.assign[gone] == "d", "to the least-loaded closer"
    assert gone in layout.mine(11.0, leader=True), "closed here in the interim"
    assert gone not in layout.mine(11.6, leader=True), "its new owner has surely read it by then"
    assert layout.reassign(live, [], 12.0, handover_s=1.5) is None, "unchanged: nothing to announce"


def test_a_node_closes_what_the_newest_assignment_it_read_gives_it_for_a_few_ttls() -> None:
    layout = SpreadLayout([10, 10], "b", TTL_S)
    bulletin = RoundsBulletin((0, 0), {}, live=2, assign=("a", "b"))
    coordinator = Lease(kind="syncer", holder="a", ttl_s=TTL_S, info=bulletin.to_info())
    assert layout.lease_read(coordinator, 2, 0.0), "it gives this node a fragment: wake the rounds"
    assert layout.mine(ASSIGNMENT_KEPT_TTLS * TTL_S, leader=False) == {1}
    assert layout.mine(ASSIGNMENT_KEPT_TTLS * TTL_S + 0.1, leader=False) == frozenset(), "cut off: stop closing"
    unassigned = Lease(kind="syncer", holder="a", ttl_s=TTL_S, info=RoundsBulletin((0, 0), {}, live=2).to_info())
    assert not layout.lease_read(unassigned, 2, 1.0) and layout.pending, "a new coordinator: watch at poll pace"


def test_the_coordinators_bulletin_shows_the_fragments_others_close_as_it_follows_them() -> None:
    layout = SpreadLayout([10, 10], "a", TTL_S)
    assert layout.follow(1, 4, 2), "news: renew the lease soon"
    assert not layout.follow(1, 4, 3), "the same version, still contributions: no news"
    bulletin = layout.bulletin((7, -1), {0: OpenRoundNote(7, 1, None)}, live=2)
    assert bulletin.heads == (7, 4)
    assert bulletin.open[1] == OpenRoundNote(4, 3, None)
