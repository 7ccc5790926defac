"""The step ledger (``session/ledger.py``): every trained step of a fragment in exactly one of
merged, carried, trained since the anchor, dropped with its reason (issue 43, item 5)."""

from __future__ import annotations

from gradientmail.algorithms.align import AlignAction, WorkMark, plan_alignment
from gradientmail.session.ledger import LedgerView, StepLedger, ledger_lines

LIMIT = 80


def align(ledger: StepLedger, unmerged_from: int, now: int, *, merged_at: int | None, carry: bool = True, rejected=None):
    """One alignment as ``LearnerFragment.aligned`` makes it: the plan, then the ledger's share."""
    plan = plan_alignment(
        carry=carry,
        merged_at=WorkMark(merged_at) if merged_at is not None else None,
        unmerged_from=WorkMark(unmerged_from),
        now=WorkMark(now),
        anchor_step=unmerged_from,
        versions_ahead=2,
        carry_limit_steps=LIMIT,
        room_steps=2 * LIMIT,
    )
    reason = "carry_limit" if plan.dropped is not None else "not_carried" if merged_at is not None else rejected or "superseded"
    ledger.aligned(unmerged_before=unmerged_from, unmerged_after=plan.unmerged_from.steps, merged_at=merged_at, reason=reason)
    return plan


def test_merged_then_carried_work_balances_at_every_step():
    ledger = StepLedger()
    plan = align(ledger, 0, 25, merged_at=20)  # the round merged the snapshot taken at 20; 5 steps carried
    assert plan.action is AlignAction.CARRY
    view = ledger.view(trained=30, unmerged_from=plan.unmerged_from.steps, anchor_step=25)
    assert (view.merged, view.carried, view.since_anchor, view.dropped_steps) == (20, 5, 5, 0)
    assert view.balanced


def test_work_past_the_carry_limit_is_dropped_with_that_reason():
    """No commit merged ours for 100 steps while commits went by (a learner away): the alignment drops them all."""
    ledger = StepLedger()
    plan = align(ledger, 0, 100, merged_at=None)
    assert plan.action is AlignAction.DROP
    view = ledger.view(trained=100, unmerged_from=plan.unmerged_from.steps, anchor_step=100)
    assert view.dropped == {"carry_limit": 100} and view.merged == 0 and view.balanced


def test_a_learner_that_does_not_carry_drops_under_the_rounds_reason():
    """carry_unmerged=False: a commit that merged our snapshot at 20 replaces steps 20-25
    (``not_carried``); one whose round rejected ours ``stale`` replaces them under that reason."""
    ledger = StepLedger()
    plan = align(ledger, 0, 25, merged_at=20, carry=False)
    plan = align(ledger, plan.unmerged_from.steps, 40, merged_at=None, carry=False, rejected="stale")
    view = ledger.view(trained=40, unmerged_from=plan.unmerged_from.steps, anchor_step=40)
    assert view.merged == 20 and view.dropped == {"not_carried": 5, "stale": 15} and view.balanced


def test_a_ledger_read_from_a_lease_is_parsed_strictly():
    """``gradientmail status`` prints what a learner's lease says; anyone with bucket access can
    write a lease: anything but non-negative counts and a small map of short reasons is unreadable."""
    good = LedgerView(10, 6, 2, 1, {"carry_limit": 1}).as_json()
    assert LedgerView.from_json(good) == LedgerView(10, 6, 2, 1, {"carry_limit": 1})
    assert ledger_lines([good]) == [
        "fragment 0 steps: trained 10 = merged 6 + carried 2 + since anchor 1 + dropped 1 (carry_limit 1)"
    ]
    for bad in ({**good, "merged": -1}, {**good, "merged": True}, {**good, "dropped": {"x" * 65: 1}},
                {**good, "dropped": {str(i): 1 for i in range(33)}}, {**good, "extra": 1}, [], "x"):  # fmt: skip
        assert LedgerView.from_json(bad) is None
    assert ledger_lines({"not": "a list"}) == ["step ledger: unreadable"]
    assert ledger_lines([{**good, "merged": 99}]) == [
        "fragment 0 steps: trained 10 = merged 99 + carried 2 + since anchor 1 + dropped 1 (carry_limit 1)  (does not balance)"
    ]
