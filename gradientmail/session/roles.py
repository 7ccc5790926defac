"""The roles of a training node and the one rule of the ``"either"`` role.

``"both"`` trains and stands for the syncer election; ``"learner"`` only trains; ``"either"``
stands like ``"both"`` but, while it holds the syncer role and another node trains, it stops
training and only closes rounds: the node that would otherwise train *and* carry every
learner's bytes gives its cores and NIC to the rounds. A node that only syncs from the start is
``gm.SyncerNode`` (``GRADIENTMAIL_ROLE=syncer``). docs/session.md, "Roles".
"""

from __future__ import annotations

__all__ = ["ELECTING_ROLES", "ROLES", "serves_instead_of_training"]

ROLES = ("both", "learner", "either")
"""The roles of a training node (``SessionOptions.role``); ``"syncer"`` is ``gm.SyncerNode``."""
ELECTING_ROLES = ("both", "either")
"""The training roles that stand for the syncer election."""


def serves_instead_of_training(role: str, holds_syncer_role: bool, others_training: int) -> bool:
    """The ``"either"`` rule: pause training while elected, unless nobody else would train (a
    node alone never stops). Other roles never pause."""
    return role == "either" and holds_syncer_role and others_training > 0
