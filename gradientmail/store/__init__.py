"""The store: the only road to the mailbox. Typed records, verified blobs and leases of one run."""

from gradientmail.store.bulletin import UNKNOWN_HEAD, OpenRoundNote, RoundsBulletin
from gradientmail.store.leases import TRAINING, LearnerLease, LeaseName, LeaseObserver, live_learners, others_training, trains
from gradientmail.store.retention import Retention
from gradientmail.store.run_store import (
    Arrays,
    CommittedVersion,
    ContributionCounts,
    LeaseRead,
    PublishedContribution,
    RunStore,
    StoredRound,
    VersionDraft,
    check_tensors,
    sha256_hex,
)
from gradientmail.store.spec import RunSpec, TensorShape
from gradientmail.store.state_records import max_state_bytes, newest_resume_point
from gradientmail.store.sweep import RetentionSweep

__all__ = [
    "Arrays",
    "CommittedVersion",
    "ContributionCounts",
    "LeaseRead",
    "PublishedContribution",
    "Retention",
    "RetentionSweep",
    "StoredRound",
    "RunSpec",
    "RunStore",
    "TensorShape",
    "VersionDraft",
    "check_tensors",
    "sha256_hex",
    "LeaseName",
    "LeaseObserver",
    "LearnerLease",
    "live_learners",
    "others_training",
    "trains",
    "TRAINING",
    "OpenRoundNote",
    "RoundsBulletin",
    "UNKNOWN_HEAD",
    "max_state_bytes",
    "newest_resume_point",
]
