"""The syncer spread's layout (``syncer_layout="spread"``): which node closes which fragment.

:class:`SpreadLayout` holds what a node of a spread run knows of the assignment — the one it
computed and announces while elected (the coordinator), the newest it read in a live syncer
lease otherwise, the fragments it closes in the interim while their new owner learns of them,
and the fragments others close that the coordinator follows for its bulletin — and the rules
over it (``syncer.assignment`` computes the assignment itself). It makes no request
(``follow_others`` makes the coordinator's, beside it); the runtime holds one only in a
spread run, so a run with one syncer reads none of it (docs/protocol.md, INV-23).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gradientmail.errors import GradientMailError
from gradientmail.polling import RepeatedFailures
from gradientmail.records import Lease
from gradientmail.store import OpenRoundNote, RoundsBulletin, RunStore
from gradientmail.syncer.assignment import assign_fragments, closers, orphaned

__all__ = ["ASSIGNMENT_KEPT_TTLS", "Reassigned", "SpreadLayout", "WatchedFragment", "follow_others"]

ASSIGNMENT_KEPT_TTLS = 3
"""In a spread run, a node keeps closing the fragments the newest assignment it read gave it for
this many lease TTLs without reading a newer one (a coordinator being replaced); past that it
stops (it is cut off from the store, or the run has no coordinator)."""


@dataclass
class WatchedFragment:
    """A fragment another node closes, as the coordinator of a spread run follows it for its
    bulletin: the newest version it found, and the contributions listed on it."""

    version: int
    listed: int = 0


@dataclass(frozen=True)
class Reassigned:
    """The coordinator's assignment changed: announce it (``at_once``: a term's first, or one
    that orphaned fragments, which the other nodes wait on)."""

    assign: tuple[str, ...]
    at_once: bool


class SpreadLayout:
    """A spread run's assignment as one node knows it, on the clock it is given."""

    def __init__(self, fragment_bytes: Sequence[int], node_id: str, ttl_s: float) -> None:
        self.fragment_bytes = tuple(fragment_bytes)
        self.node_id = node_id
        self.ttl_s = ttl_s
        self.assign: tuple[str, ...] = ()
        """While elected: the assignment this node computed and announces."""
        self.pending = False
        """The live syncer lease read last has no assignment yet (a new coordinator): watch it at poll pace."""
        self._read: tuple[tuple[str, ...], float] | None = None
        """Not elected: the newest assignment read in a live syncer lease, and when."""
        self._interim: dict[int, float] = {}
        """While elected: fragments whose owner left, which this node closes until their new owner
        has surely read the assignment (fragment → until)."""
        self._watched: dict[int, WatchedFragment] = {}
        """While elected: the fragments other nodes close, followed for the bulletin."""

    def mine(self, now: float, *, leader: bool) -> frozenset[int]:
        """The fragments this node closes: its own in its assignment (and the interim ones) while
        elected, else its own in the newest one read within ``ASSIGNMENT_KEPT_TTLS`` TTLs."""
        if leader:
            interim = {f for f, until in self._interim.items() if until > now}
            return frozenset(f for f, node in enumerate(self.assign) if node == self.node_id) | interim
        found = self._read
        if found is None or now - found[1] > ASSIGNMENT_KEPT_TTLS * self.ttl_s:
            return frozenset()
        return frozenset(f for f, node in enumerate(found[0]) if node == self.node_id)

    def stand_down(self) -> None:
        """Not elected: nothing announced, followed or held in the interim."""
        self.assign, self._watched, self._interim = (), {}, {}

    def lease_read(self, lease: Lease, fragments: int, now: float) -> bool:
        """The election watch read a live syncer lease: note its assignment. True: it gives this
        node fragments (its rounds start now)."""
        bulletin = RoundsBulletin.from_lease(lease, fragments)
        assign = bulletin.assign if bulletin is not None else None
        # a coordinator that has not assigned yet (just elected): its assignment follows within a
        # poll or two (it announces at once), so the watch runs at poll pace until it shows
        self.pending = assign is None and lease.holder != self.node_id
        if assign is None:
            return False
        self._read = (assign, now)
        return self.node_id in assign

    def reassign(self, live: Mapping[str, Lease], dead: Iterable[str], now: float, *, handover_s: float) -> Reassigned | None:
        """The coordinator read the learners' leases: assign the fragments over the nodes that
        close rounds (less ``dead`` ones). A fragment whose owner left is closed here for
        ``handover_s`` (until its new owner has read the assignment). None: unchanged."""
        nodes = closers(live, self.node_id, dead)
        assign = assign_fragments(self.fragment_bytes, nodes)
        if assign == self.assign:
            return None
        before = self.assign or (self._read[0] if self._read is not None else ())
        orphans = {f for f in orphaned(before, assign, nodes) if assign[f] != self.node_id}
        self._interim.update(dict.fromkeys(orphans, now + handover_s))
        first, self.assign = not self.assign, assign
        return Reassigned(assign, at_once=first or bool(orphans))

    def follow(self, fragment: int, newest: int, listed: int) -> bool:
        """The coordinator found ``fragment`` (closed by another node) at ``newest`` with
        ``listed`` contributions. True: news for the bulletin (renew the lease soon)."""
        watched = self._watched.get(fragment)
        self._watched[fragment] = WatchedFragment(newest, listed)
        return watched is None or (newest, bool(listed)) != (watched.version, bool(watched.listed))

    def unwatch(self, fragment: int) -> None:
        self._watched.pop(fragment, None)

    def watched_version(self, fragment: int) -> int | None:
        watched = self._watched.get(fragment)
        return watched.version if watched is not None else None

    def bulletin(self, heads: Sequence[int], opened: Mapping[int, OpenRoundNote], live: int) -> RoundsBulletin:
        """The coordinator's bulletin: its own fragments' heads and rounds, the followed ones', and
        the assignment."""
        watched = dict(self._watched)
        all_heads = tuple(watched[f].version if f in watched else head for f, head in enumerate(heads))
        notes = dict(opened)
        for fragment, follow in watched.items():
            if follow.listed:
                notes[fragment] = OpenRoundNote(follow.version, follow.listed, None)
        return RoundsBulletin(all_heads, notes, live=live, assign=self.assign or None)


def follow_others(spread: SpreadLayout, store: RunStore, mine: frozenset[int], failures: Sequence[RepeatedFailures]) -> bool:
    """The coordinator follows the fragments others close, for its bulletin: each full pass, a
    forward HEAD probe for a newer version and one LIST of the contributions on the newest (what
    learners join and wait for). True: news (renew the lease soon). A fragment that cannot be
    read is told to its ``failures`` and holds up no other."""
    news = False
    for fragment, failed in enumerate(failures):
        if fragment in mine:
            spread.unwatch(fragment)
            continue
        try:
            newest = store.newest_version(fragment, known=spread.watched_version(fragment))
            if newest is None:
                continue
            listed = len(store.contributors(fragment, newest))
        except GradientMailError as exc:
            failed.failed(str(exc))
            continue
        news = spread.follow(fragment, newest, listed) or news
    return news
