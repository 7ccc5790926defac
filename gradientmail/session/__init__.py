"""The node side: ``Session`` around the user's training loop, ``SyncerNode`` for a node that only
syncs, ``align`` for a job that only reads the newest committed model, ``Barrier`` for nodes
that should pause together."""

from gradientmail.session.barrier import Barrier, BarrierRelease
from gradientmail.session.evaluation import align
from gradientmail.session.events import SessionEvent
from gradientmail.session.ledger import LedgerView
from gradientmail.session.session import Session, SessionOptions, SessionStats
from gradientmail.session.syncer_node import SyncerNode

__all__ = [
    "align",
    "Barrier",
    "BarrierRelease",
    "LedgerView",
    "Session",
    "SessionEvent",
    "SessionOptions",
    "SessionStats",
    "SyncerNode",
]
