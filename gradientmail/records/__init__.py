"""Typed records, the key layout of a run, and the learner ids both check."""

from gradientmail.records import keys
from gradientmail.records.ids import check_learner_id, default_learner_id
from gradientmail.records.models import (
    REJECTION_REASONS,
    SCHEMA_VERSION,
    Contribution,
    Head,
    Lease,
    Manifest,
    ParameterSpec,
    Participant,
    PayloadRef,
    QueueClaim,
    QueueDone,
    Realignment,
    RealignReason,
    Record,
    Rejection,
    RejectionReason,
    RoundRecord,
    RoundTiming,
)

__all__ = [
    "keys",
    "SCHEMA_VERSION",
    "Record",
    "Manifest",
    "ParameterSpec",
    "Contribution",
    "PayloadRef",
    "RoundRecord",
    "Participant",
    "Rejection",
    "RejectionReason",
    "REJECTION_REASONS",
    "RoundTiming",
    "Realignment",
    "RealignReason",
    "Lease",
    "Head",
    "QueueClaim",
    "QueueDone",
    "check_learner_id",
    "default_learner_id",
]
