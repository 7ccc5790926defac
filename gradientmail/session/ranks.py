"""How a learner's processes take part in its session: one process, or the ranks of a torchrun
group (``session/group.py``; docs/session.md, "A learner of several GPUs").

The session calls the same hooks either way; alone they do nothing. Rank 0 of a group is the
learner (``LeaderRank``: it gathers a sharded fragment before reading it and sends what an
alignment changed to the other ranks at the end of each step); every other rank follows it
(``session.follower.FollowerRank``) and never reaches these hooks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gradientmail.errors import InvalidConfig
from gradientmail.session.follower import FollowerRank
from gradientmail.session.group import GroupLink

__all__ = ["LeaderRank", "RankHooks", "rank_hooks"]


class RankHooks:
    """A learner of one process: every hook is a no-op."""

    world_size = 1
    """How many ranks train the learner's batch (its samples count that many times)."""
    tracks_changes = False
    """Whether ``end_step`` needs the names an alignment changed."""

    def joining(self) -> None:
        """Before the run is joined (every rank): FSDP's ranks gather the full model once."""

    def joined(self, run_id: str) -> None:
        """The run is joined, the model at its newest commit: hand it and the run to the ranks."""

    def fresh(self, names: Sequence[str]) -> None:
        """Before the session reads these parameters of the model."""

    def end_step(self, changed: list[str]) -> None:
        """The end of a training step: what an alignment in it ``changed``."""

    def closed(self) -> None:
        """The session closed with the model at the newest commit."""


class LeaderRank(RankHooks):
    """Rank 0 of a torchrun group: the learner its ranks follow."""

    tracks_changes = True

    def __init__(self, link: GroupLink) -> None:
        self._link = link
        self.world_size = link.world_size

    def joining(self) -> None:
        self._link.gather(self._link.names, command=False)

    def joined(self, run_id: str) -> None:
        self._link.scatter(self._link.names, command=False)  # every rank starts from the committed parameters
        self._link.share_object(run_id)

    def fresh(self, names: Sequence[str]) -> None:
        self._link.gather(sorted(names))

    def end_step(self, changed: list[str]) -> None:
        self._link.end_step(changed)

    def closed(self) -> None:
        self._link.end_step(self._link.names)


def rank_hooks(link: GroupLink | None, model: Any, role: str) -> tuple[Any, RankHooks, FollowerRank | None]:
    """What the session works on (the model, or rank 0's full view under FSDP), its hooks, and
    on a rank other than 0 the follower it is instead of a learner."""
    if link is None:
        return model, RankHooks(), None
    if role == "either":
        raise InvalidConfig("role", "a torchrun group cannot be an 'either' node: its ranks would wait in a collective")
    if not link.is_leader:
        return link.view, RankHooks(), FollowerRank(link)
    return link.view, LeaderRank(link), None
