"""Typed access to a run in a mailbox (records, verified blobs) and leases."""

from gradientmail.store.leases import LeaseObserver, LearnerLease, live_learners, read_lease
from gradientmail.store.run_store import RunStore, TensorShape, check_tensors, sha256_hex

__all__ = ["RunStore", "TensorShape", "check_tensors", "sha256_hex", "LeaseObserver", "LearnerLease", "live_learners", "read_lease"]
