"""The syncer runtime: election through the mailbox and the rounds of every fragment."""

from gradientmail.syncer.election import Election
from gradientmail.syncer.grace import GraceEstimator
from gradientmail.syncer.rounds import Accepted, Base, RoundDraft, close_round, load_base, replay_round, validate
from gradientmail.syncer.runtime import SyncerRuntime

__all__ = [
    "Accepted",
    "Base",
    "Election",
    "GraceEstimator",
    "RoundDraft",
    "SyncerRuntime",
    "close_round",
    "load_base",
    "replay_round",
    "validate",
]
