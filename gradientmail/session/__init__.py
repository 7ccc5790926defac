"""The node side: ``Session`` around the user's training loop, ``SyncerNode`` for a node that only syncs."""

from gradientmail.session.events import SessionEvent
from gradientmail.session.session import Session, SessionOptions, SessionStats
from gradientmail.session.syncer_node import SyncerNode

__all__ = ["Session", "SessionEvent", "SessionOptions", "SessionStats", "SyncerNode"]
