"""The syncer runtime: election through the mailbox and the rounds of every fragment."""

from gradientmail.syncer.election import Election
from gradientmail.syncer.grace import GraceEstimator
from gradientmail.syncer.rounds import RunSpec, apply_round, load_version, replay_round, validate
from gradientmail.syncer.runtime import SyncerOptions, SyncerRuntime

__all__ = ["Election", "GraceEstimator", "RunSpec", "apply_round", "load_version", "replay_round", "validate", "SyncerOptions", "SyncerRuntime"]
