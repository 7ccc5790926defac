"""Typed records and the key layout of a run."""

from gradientmail.records import keys
from gradientmail.records.models import (
    SCHEMA_VERSION,
    Contribution,
    Lease,
    Manifest,
    ParameterSpec,
    Participant,
    PayloadRef,
    Record,
    Rejection,
    RoundRecord,
    RoundTiming,
    TensorSpec,
    check_learner_id,
)

__all__ = [
    "keys",
    "SCHEMA_VERSION",
    "Record",
    "Manifest",
    "ParameterSpec",
    "Contribution",
    "PayloadRef",
    "TensorSpec",
    "RoundRecord",
    "Participant",
    "Rejection",
    "RoundTiming",
    "Lease",
    "check_learner_id",
]
