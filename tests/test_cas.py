"""The one compare-and-swap record under every mutable coordination object (``store.cas``), on
a memory and a directory mailbox: create once, swap on the token read, and whatever someone
drops at the key (too large, garbage, unsigned in a signed run) reads as no record with a
token it can be replaced on, never as an error that stops the reader."""

from __future__ import annotations

import pytest

from gradientmail.errors import RecordExists, VersionConflict
from gradientmail.mailbox import FileMailbox, Mailbox, MemoryMailbox
from gradientmail.records import Lease, QueueClaim, keys
from gradientmail.records.auth import RunKey
from gradientmail.store import RunStore
from gradientmail.store.cas import CasRecords
from gradientmail.store.record_io import RecordIO

SECRET = "a run key for the compare-and-swap tests, 32+ bytes"


@pytest.fixture(params=["memory", "directory"])
def mailbox(request: pytest.FixtureRequest, tmp_path) -> Mailbox:
    return MemoryMailbox() if request.param == "memory" else FileMailbox(tmp_path / "box")


def lease(holder: str = "a", sequence: int = 0) -> Lease:
    return Lease(kind="syncer", holder=holder, ttl_s=3.0, sequence=sequence, renewed_at="2026-12-04T00:00:00+00:00")


def test_a_record_is_created_once_and_replaced_only_on_the_token_read(mailbox: Mailbox) -> None:
    cas = CasRecords(RecordIO(mailbox))
    token = cas.create(keys.SYNCER_LEASE, lease())
    with pytest.raises(RecordExists):
        cas.create(keys.SYNCER_LEASE, lease("b"))
    found = cas.read(Lease, keys.SYNCER_LEASE)
    assert found is not None and found.record == lease() and found.token == token
    renewed = cas.swap(keys.SYNCER_LEASE, lease(sequence=1), token)
    with pytest.raises(VersionConflict):
        cas.swap(keys.SYNCER_LEASE, lease("b"), token)  # a stale token: someone else wrote since
    again = cas.read(Lease, keys.SYNCER_LEASE)
    assert again is not None and again.token == renewed and again.record is not None and again.record.sequence == 1
    assert cas.read(Lease, keys.learner_lease("nobody")) is None


@pytest.mark.parametrize("dropped", [b"\x00\xff", b"{}", b"x" * (Lease.max_bytes + 1)], ids=["garbage", "empty", "oversized"])
def test_what_someone_drops_at_the_key_reads_as_no_record_and_is_replaced_on_its_token(mailbox: Mailbox, dropped: bytes) -> None:
    mailbox.put(keys.SYNCER_LEASE, dropped)
    cas = CasRecords(RecordIO(mailbox))
    found = cas.read(Lease, keys.SYNCER_LEASE)
    assert found is not None and found.record is None and found.token and found.problem
    cas.swap(keys.SYNCER_LEASE, lease(), found.token)
    replaced = cas.read(Lease, keys.SYNCER_LEASE)
    assert replaced is not None and replaced.record == lease()


def test_in_a_signed_run_an_unsigned_record_is_no_record(mailbox: Mailbox) -> None:
    CasRecords(RecordIO(mailbox)).create(keys.SYNCER_LEASE, lease("forger"))
    signed = RunStore(mailbox, RunKey(SECRET))
    found = signed.leases.read_syncer()
    assert found is not None and found.lease is None and found.problem, "it counts as expired: taken over on its token"


def test_every_family_writes_through_it_and_checks_what_the_record_says_of_itself(mailbox: Mailbox) -> None:
    store = RunStore(mailbox)
    claim = QueueClaim(queue="shards", unit=3, units=8, holder="alice")
    token = store.queues.create_claim(claim)
    assert store.queues.read_claim("shards", 3) == (claim, token)
    mailbox.put(keys.queue_claim("shards", 4), mailbox.get(keys.queue_claim("shards", 3)))  # a copy under another unit
    copied = store.queues.read_claim("shards", 4)
    assert copied is not None and copied[0] is None, "a claim is believed only at its own key"
    store.leases.put_learner(Lease(kind="learner", holder="alice", ttl_s=3.0))
    assert store.leases.learners() == ["alice"]
