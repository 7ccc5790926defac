"""Which node closes each fragment's rounds, in runs with ``syncer_layout="spread"``.

The elected node (the coordinator: it holds ``leases/syncer.json``, as in a run of one syncer)
computes the assignment from the live set it reads anyway and announces it in its bulletin
(``store.bulletin``); every node that runs a syncer closes the rounds of the fragments assigned
to it while the assignment it read is fresh (docs/protocol.md, "The syncer's load spread over
the nodes", and INV-23). Safety never rests on it: commits are create-once, so two nodes that
briefly both close a fragment (an assignment changing hands) commit one version, and the loser
reloads.

The rule is one pure function of the fragments' sizes and the closers' ids, so every reader
and every test computes the same assignment, and it balances bytes, not fragment counts: the
largest fragment goes to the least-loaded closer (ties: fewer fragments, then the smaller id),
a longest-processing-time schedule, within 4/3 of the best possible busiest node.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from gradientmail.records import Lease

__all__ = ["CLOSES", "assign_fragments", "closers", "orphaned"]

CLOSES = "closes"
"""The key of a learner lease's ``info`` that is true when the node runs a syncer (roles
``both`` and ``either``): in a spread run it may be assigned fragments to close."""


def closers(live: Mapping[str, Lease], coordinator: str, excluded: Iterable[str] = ()) -> list[str]:
    """The nodes a coordinator assigns fragments to: itself, and every live node whose lease says
    it runs a syncer, but those ``excluded`` (a holder whose syncer lease expired: dead as far as
    the election tells, before its learner lease has stood still a TTL), sorted."""
    out = set(excluded)
    found = {coordinator} | {node for node, lease in live.items() if lease.info.get(CLOSES) is True}
    return sorted(found - (out - {coordinator}))


def assign_fragments(fragment_bytes: Sequence[int], nodes: Sequence[str]) -> tuple[str, ...]:
    """The node that closes each fragment: fragments largest first (ties: the lower index), each
    to the node with the fewest bytes so far (ties: the fewest fragments, then the smaller id).
    ``()`` for no nodes."""
    if not nodes:
        return ()
    ordered = sorted(set(nodes))
    load = {node: (0, 0) for node in ordered}
    owner = [""] * len(fragment_bytes)
    for fragment in sorted(range(len(fragment_bytes)), key=lambda f: (-fragment_bytes[f], f)):
        node = min(ordered, key=lambda n: (load[n], n))
        owner[fragment] = node
        size, count = load[node]
        load[node] = (size + fragment_bytes[fragment], count + 1)
    return tuple(owner)


def orphaned(previous: Sequence[str], current: Sequence[str], closing: Collection[str]) -> set[int]:
    """The fragments that ``current`` gives a new owner because their owner in ``previous`` is no
    longer among the ``closing`` nodes (dead, or stopped closing): nobody closes them until the
    new owner reads the assignment, at its watch pace, so the coordinator closes them meanwhile.
    Empty when ``previous`` is no assignment of as many fragments."""
    if len(previous) != len(current):
        return set()
    return {f for f, (old, new) in enumerate(zip(previous, current, strict=True)) if old and old not in closing and new != old}
