"""Where the chaos run's trained steps went: the learners' own step ledgers against the round records.

Each worker (``benchmarks.chaos_worker``) logs every step it trains and, whenever its session's
step ledger moves, that ledger (``session.ledger``: merged, carried, since anchor, dropped by
reason, per fragment). A process killed with ``kill -9`` leaves its last ledger line; one that
closed leaves its final ledger. Per fragment, over every incarnation of every learner:

    trained = merged by the rounds + dropped (the ledgers' reasons) + lost with a killed process

where *merged* comes from the round records (so a contribution merged after its learner died
counts as merged), *dropped* sums each incarnation's last ledger, and *lost with a killed process*
is what remains: the work a process held unmerged when it died, less what rounds merged of it
later. Each ledger line must balance on its own (``LedgerView.balanced``); a learner's ledgers
must never claim more merged steps than the rounds show; and *lost* cannot be negative. The
share the issue's target is about is merged ÷ (trained − lost): of the work that survived its
process, how much reached a commit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradientmail import LedgerView
from gradientmail.records import RoundRecord

__all__ = ["Incarnation", "LedgerAccount", "account", "read_progress"]


@dataclass
class Incarnation:
    """One process of a learner id, as its progress file tells it."""

    steps: int = 0
    """Steps it trained (its last step line; a line cut by kill -9 is skipped)."""
    closed: dict[str, Any] | None = None
    """Its ``closed`` line, when it closed rather than being killed."""
    ledger: tuple[LedgerView, ...] = ()
    """Its newest ledger, per fragment (from the ``closed`` line, else the last ``ledger`` line)."""
    blocked_s: float = 0.0
    """Seconds its training thread had waited for commits, at its last ``ledger`` line."""
    trained_s: float = 0.0
    """Seconds since the process started, at its last ``ledger`` line."""


def read_progress(path: Path) -> dict[int, Incarnation]:
    """Per incarnation number, what the worker wrote to its progress file."""
    found: dict[int, Incarnation] = {}
    if not path.exists():
        return found
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut by kill -9
        slot = found.setdefault(int(entry["incarnation"]), Incarnation())
        slot.steps = max(slot.steps, int(entry.get("steps", 0)))
        if entry.get("event") == "ledger":
            slot.blocked_s = float(entry.get("blocked_s", slot.blocked_s))
            slot.trained_s = float(entry.get("trained_s", slot.trained_s))
        if "ledger" in entry:
            views = tuple(LedgerView.from_json(v) for v in entry["ledger"])
            if all(v is not None for v in views):
                slot.ledger = tuple(v for v in views if v is not None)
        if entry.get("event") == "closed":
            slot.closed = entry
    return found


@dataclass
class LedgerAccount:
    """One fragment's steps, over every learner and incarnation of the run."""

    trained: int = 0
    merged: int = 0
    """Steps of the learners' contributions the round records merged."""
    ledger_merged: int = 0
    """Steps the learners' own ledgers saw merged (a killed process misses later merges)."""
    dropped: dict[str, int] = field(default_factory=dict)
    pending_at_close: int = 0
    """Carried or since-anchor steps in a closed session's final ledger (0: close settles all)."""
    unbalanced: int = 0
    """Incarnations whose last ledger does not balance."""
    over_claimed: list[str] = field(default_factory=list)
    """Learners whose ledgers claim more merged steps than the rounds merged of theirs."""

    @property
    def dropped_steps(self) -> int:
        return sum(self.dropped.values())

    @property
    def lost_to_crash(self) -> int:
        return self.trained - self.merged - self.dropped_steps

    @property
    def survived(self) -> int:
        """Steps that did not die with their process."""
        return self.trained - self.lost_to_crash

    @property
    def merged_share_of_survived(self) -> float:
        return self.merged / self.survived if self.survived > 0 else 0.0

    @property
    def consistent(self) -> bool:
        """Each ledger balanced, no learner over-claimed, nothing lost below zero, close settled."""
        return not self.unbalanced and not self.over_claimed and self.lost_to_crash >= 0 and not self.pending_at_close

    def as_json(self) -> dict[str, Any]:
        return {
            "trained": self.trained,
            "merged": self.merged,
            "ledger_merged": self.ledger_merged,
            "merged_after_the_learner_saw": self.merged - self.ledger_merged,
            "dropped": dict(sorted(self.dropped.items())),
            "lost_to_crash": self.lost_to_crash,
            "pending_at_close": self.pending_at_close,
            "unbalanced": self.unbalanced,
            "over_claimed": self.over_claimed,
            "merged_share_of_survived": round(self.merged_share_of_survived, 4),
            "consistent": self.consistent,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> LedgerAccount:
        """An account as ``as_json`` wrote it (result.json)."""
        return cls(
            trained=value["trained"],
            merged=value["merged"],
            ledger_merged=value["ledger_merged"],
            dropped=dict(value["dropped"]),
            pending_at_close=value["pending_at_close"],
            unbalanced=value["unbalanced"],
            over_claimed=list(value["over_claimed"]),
        )

    def describe(self) -> str:
        reasons = ", ".join(f"{reason} {steps}" for reason, steps in sorted(self.dropped.items())) or "none"
        return (
            f"trained {self.trained} = merged {self.merged} + dropped {self.dropped_steps} ({reasons})"
            f" + lost with a killed process {self.lost_to_crash}; merged ÷ survived {self.merged_share_of_survived:.3f}"
            + ("" if self.consistent else f"  (inconsistent: {self.as_json()})")
        )


def account(
    learners: Mapping[str, Mapping[int, Incarnation]], records: Iterable[RoundRecord], fragments: int
) -> list[LedgerAccount]:
    """Per fragment, the run's steps accounted for (module docstring)."""
    merged_by: dict[tuple[str, int], int] = {}
    for record in records:
        if record.version < 1:
            continue
        for participant in record.participants:
            key = (participant.learner, record.fragment)
            merged_by[key] = merged_by.get(key, 0) + participant.steps
    accounts = [LedgerAccount() for _ in range(fragments)]
    for learner, incarnations in learners.items():
        for fragment, acc in enumerate(accounts):
            seen_merged = 0
            for incarnation in incarnations.values():
                acc.trained += incarnation.steps
                view = incarnation.ledger[fragment] if fragment < len(incarnation.ledger) else None
                if view is None:
                    continue
                seen_merged += view.merged
                for reason, steps in view.dropped.items():
                    acc.dropped[reason] = acc.dropped.get(reason, 0) + steps
                acc.unbalanced += 0 if view.balanced else 1
                if incarnation.closed is not None:
                    acc.pending_at_close += view.carried + view.since_anchor
            merged = merged_by.get((learner, fragment), 0)
            acc.merged += merged
            acc.ledger_merged += seen_merged
            if seen_merged > merged:
                acc.over_claimed.append(f"{learner}: ledgers {seen_merged} > rounds {merged}")
    return accounts
