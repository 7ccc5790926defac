"""Where every step a learner trained went, per fragment: merged, still pending, or dropped and why.

A learner's steps leave its hands in exactly one way each. A round merges them (the steps of
the contribution it merged); an alignment drops them (past the carry limit, or replaced by a
commit when the learner does not carry, under the reason the round gave its contribution); the
close drops what no round took; or they are still pending: carried across an alignment, or
trained since it. :class:`StepLedger` keeps the merged and dropped counts so that

    merged + Σ dropped = where the fragment's unmerged work begins (``unmerged_from``)
    merged + Σ dropped + carried + since_anchor = steps trained

holds after every alignment (``balance`` checks it): the alignment advances ``unmerged_from``
and the ledger attributes exactly that advance. Pure state, owned by the fragment's
``LearnerFragment`` and changed only by the training thread. It counts one session's steps
(``SessionStats.steps``): steps lost with a process killed between two publications are the one
thing a learner cannot write down itself; its next session starts a new ledger, and the
difference is the crash's (the chaos benchmark counts it from the worker's own step log).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["DROP_REASONS", "LedgerView", "StepLedger", "ledger_lines"]

_MAX_REASONS = 32
"""Most drop reasons a ledger read from a lease may name (what a node writes names a handful)."""
_MAX_FRAGMENTS = 4096

DROP_REASONS = ("carry_limit", "not_carried", "superseded", "at_close")
"""Why steps are dropped without a rejection to name: ``carry_limit`` (more unmerged work than
``align.plan_alignment`` carries), ``not_carried`` (``carry_unmerged=False``: a commit that merged our
contribution replaced what was trained after its snapshot), ``superseded`` (a commit without
our work replaced it, the learner not carrying, no rejection of ours in its round), ``at_close``
(no round merged it before the session closed). A round that rejected our contribution gives
its own reason instead (``stale``, ``outlier``, …: ``RejectionReason``)."""


@dataclass(frozen=True)
class LedgerView:
    """One fragment's ledger at a step (``StepLedger.view``)."""

    trained: int
    merged: int
    carried: int
    """Unmerged steps trained before the learner's current anchor, carried across an alignment."""
    since_anchor: int
    """Unmerged steps trained since the learner aligned with its current anchor."""
    dropped: Mapping[str, int]
    """Reason → steps."""

    @property
    def dropped_steps(self) -> int:
        return sum(self.dropped.values())

    @property
    def balanced(self) -> bool:
        """Every trained step in exactly one place."""
        return self.merged + self.dropped_steps + self.carried + self.since_anchor == self.trained

    @classmethod
    def from_json(cls, value: object) -> LedgerView | None:
        """A ledger as ``as_json`` wrote it, from a lease anyone with bucket access may have
        written: non-negative integers and a bounded map of short reasons, else None."""
        if not isinstance(value, dict) or set(value) != {"trained", "merged", "carried", "since_anchor", "dropped"}:
            return None
        counts = [value["trained"], value["merged"], value["carried"], value["since_anchor"]]
        dropped = value["dropped"]
        if not all(_count(c) for c in counts) or not isinstance(dropped, dict) or len(dropped) > _MAX_REASONS:
            return None
        if not all(isinstance(k, str) and 0 < len(k) <= 64 and _count(v) for k, v in dropped.items()):
            return None
        trained, merged, carried, since_anchor = counts
        return cls(trained, merged, carried, since_anchor, MappingProxyType(dict(dropped)))

    def describe(self) -> str:
        """One line: the trained steps as the sum of where they went."""
        reasons = ", ".join(f"{reason} {steps}" for reason, steps in sorted(self.dropped.items()))
        verdict = "" if self.balanced else "  (does not balance)"
        return (
            f"trained {self.trained} = merged {self.merged} + carried {self.carried} + since anchor {self.since_anchor}"
            f" + dropped {self.dropped_steps}" + (f" ({reasons})" if reasons else "") + verdict
        )

    def as_json(self) -> dict[str, object]:
        return {
            "trained": self.trained,
            "merged": self.merged,
            "carried": self.carried,
            "since_anchor": self.since_anchor,
            "dropped": dict(self.dropped),
        }


@dataclass
class StepLedger:
    """A fragment's merged and dropped steps (module docstring)."""

    merged: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def aligned(self, *, unmerged_before: int, unmerged_after: int, merged_at: int | None, reason: str) -> None:
        """An alignment moved the start of the unmerged work from ``unmerged_before`` to
        ``unmerged_after``: the steps up to ``merged_at`` (where the contribution the commit
        merged was taken; None: it merged none of ours) were merged, the rest of the advance is
        dropped for ``reason``."""
        advance = max(0, unmerged_after - unmerged_before)
        merged = 0 if merged_at is None else min(advance, max(0, merged_at - unmerged_before))
        self.merged += merged
        self.drop(advance - merged, reason)

    def drop(self, steps: int, reason: str) -> None:
        if steps > 0:
            self.dropped[reason] = self.dropped.get(reason, 0) + steps

    def view(self, *, trained: int, unmerged_from: int, anchor_step: int) -> LedgerView:
        """The ledger at ``trained`` steps, the unmerged work beginning at ``unmerged_from`` and
        the current anchor aligned with at ``anchor_step``."""
        start = max(unmerged_from, anchor_step)
        return LedgerView(
            trained=trained,
            merged=self.merged,
            carried=max(0, min(anchor_step, trained) - unmerged_from),
            since_anchor=max(0, trained - start),
            dropped=MappingProxyType(dict(self.dropped)),
        )


def ledger_lines(value: object) -> list[str]:
    """A learner's lease ``ledger`` as lines for ``gradientmail status`` (one per fragment)."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > _MAX_FRAGMENTS:
        return ["step ledger: unreadable"]
    views = [LedgerView.from_json(v) for v in value]
    return [
        f"fragment {i} steps: {view.describe()}" if view else f"fragment {i} steps: unreadable" for i, view in enumerate(views)
    ]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
