"""What the elected syncer's lease says about the rounds: the bulletin learners poll.

The elected syncer writes, in its lease's ``info``, the newest version of every fragment it has
committed or loaded (``heads``) and the rounds collecting contributions (``open``: base version,
how many are accepted and, once quorum is reached, how soon the round closes). It renews the
lease every TTL/3 anyway, and at once after a commit, a round's first accepted contribution (and
the one that leaves it one short of quorum) or its quorum. A
learner then learns in one read of one small object (a GET that every node makes to watch the
election anyway) which fragments have a newer version, which rounds it could join and when the
round it waits for closes, instead of a HEAD and a LIST per fragment (docs/session.md, "Polling").

A bulletin is a hint: it sets when a learner looks, never what it accepts. A learner that follows
it still reads the round record and the verified blobs of a new version, and one that cannot read
a bulletin (no syncer yet, a lease that does not parse or verify, a released one) probes every
fragment itself, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from gradientmail.errors import InvalidKey
from gradientmail.records import Lease, check_learner_id

__all__ = ["UNKNOWN_HEAD", "OpenRoundNote", "RoundsBulletin"]

UNKNOWN_HEAD = -1
"""A fragment whose newest version the syncer has not loaded yet: learners probe it themselves."""

_HEADS = "heads"
_OPEN = "open"
_LIVE = "live"
_ASSIGN = "assign"
_MAX_FRAGMENTS = 4096
"""More fragments than a bulletin carries (a run's plan has far fewer): such a bulletin is ignored."""


@dataclass(frozen=True)
class OpenRoundNote:
    """A round collecting contributions: its base version, how many it has accepted and, once
    it reached quorum, the seconds left of its grace window as the lease was written (None
    before quorum: it waits for more contributions)."""

    base_version: int
    accepted: int
    closes_in_s: float | None = None


@dataclass(frozen=True)
class RoundsBulletin:
    """The elected syncer's view of every fragment, as its lease carries it."""

    heads: tuple[int, ...]
    """The newest version of each fragment, ``UNKNOWN_HEAD`` where not loaded yet."""
    open: Mapping[int, OpenRoundNote] = field(default_factory=dict)
    """Fragment → the round open on it with at least one accepted contribution."""
    live: int | None = None
    """The learners training, as the syncer counts their leases (None: not said): what
    ``DiLoCo.global_batch_size`` is shared among."""
    assign: tuple[str, ...] | None = None
    """In a spread run (``syncer_layout="spread"``): the node that closes each fragment's rounds
    (``syncer.assignment``; "" for none yet). None: the elected node closes every fragment."""

    def to_info(self) -> dict[str, Any]:
        """The lease ``info`` entries that carry this bulletin."""
        return {
            _HEADS: list(self.heads),
            _OPEN: [
                [fragment, note.base_version, note.accepted, None if note.closes_in_s is None else round(note.closes_in_s, 3)]
                for fragment, note in sorted(self.open.items())
            ],
            **({_LIVE: self.live} if self.live is not None else {}),
            **({_ASSIGN: list(self.assign)} if self.assign is not None else {}),
        }

    @classmethod
    def from_lease(cls, lease: Lease | None, fragments: int) -> RoundsBulletin | None:
        """The bulletin in ``lease`` for a run of ``fragments`` fragments; None when there is none
        to follow: no lease, a released one, or ``info`` without a well-formed bulletin of that
        many fragments (an older node's lease, or garbage)."""
        if lease is None or lease.kind != "syncer" or lease.released:
            return None
        heads = lease.info.get(_HEADS)
        if not _ints(heads, minimum=UNKNOWN_HEAD) or len(heads) != fragments or fragments > _MAX_FRAGMENTS:
            return None
        opened: dict[int, OpenRoundNote] = {}
        entries = lease.info.get(_OPEN, [])
        if not isinstance(entries, list) or len(entries) > fragments:
            return None
        for entry in entries:
            if not isinstance(entry, list) or len(entry) != 4 or not _ints(entry[:3], minimum=0) or entry[0] >= fragments:
                return None
            fragment, base, accepted, closes_in = entry
            if closes_in is not None and not _seconds(closes_in):
                return None
            opened[fragment] = OpenRoundNote(base, accepted, None if closes_in is None else float(closes_in))
        live = lease.info.get(_LIVE)
        assign = _assignment(lease.info.get(_ASSIGN), fragments)
        return cls(tuple(heads), opened, live if _ints([live], minimum=0) else None, assign)


def _assignment(value: object, fragments: int) -> tuple[str, ...] | None:
    """A well-formed assignment of ``fragments`` (node ids or ""), else None: ignored, so a
    garbled one makes nobody close a fragment it was not given."""
    if not isinstance(value, list) or len(value) != fragments:
        return None
    for node in value:
        if not isinstance(node, str):
            return None
        if node:
            try:
                check_learner_id(node)
            except InvalidKey:
                return None
    return tuple(value)


def _ints(value: object, *, minimum: int) -> TypeGuard[list[int]]:
    """Whether ``value`` is a list of plain ints, each at least ``minimum``."""
    return isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) and item >= minimum for item in value
    )


def _seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e9
