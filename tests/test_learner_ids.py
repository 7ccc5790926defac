"""One learner id, one process: a second process with the same id is found out by its lease and
stopped with an error naming the id; a restart or a forged lease is not mistaken for one."""

from __future__ import annotations

import time

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.records import Lease
from gradientmail.store import LearnerLease, RunStore
from gradientmail.store.leases import first_sequence, judge_found

KEY = "k" * 40


def _session(box: gm.Mailbox, learner: str, key: str | None = None) -> gm.Session:
    return gm.Session(
        {"w": np.zeros(4, np.float32)},
        algorithm=gm.DiLoCo(sync_every=1000),
        mailbox=box,
        learner_id=learner,
        run_key=key,
        options=gm.SessionOptions(lease_ttl_s=0.6, poll_interval_s=0.05),
    )


def test_two_processes_with_one_learner_id_stop_with_an_error_naming_it(tmp_path):
    """INV-19: each renewal swaps against the token of our last write; a lease changed under us
    means another process writes it, and ``step()`` raises ``DuplicateLearner`` naming the id."""
    box = gm.FileMailbox(tmp_path / "box")
    first, second = _session(box, "gpu-host"), _session(box, "gpu-host")
    with first, pytest.raises(gm.DuplicateLearner, match="'gpu-host' is used by another process") as raised, second:
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            first.step()
            second.step()
            time.sleep(0.02)
    assert "GRADIENTMAIL_LEARNER_ID" in str(raised.value)


def test_a_restarted_learner_takes_over_its_predecessors_lease(tmp_path):
    """INV-19: the first write is a plain put, so a learner restarted under its id (its
    predecessor dead, its lease still there) trains on."""
    box = gm.FileMailbox(tmp_path / "box")
    store = RunStore(box)
    LearnerLease(store, "gpu-host", 0.6).renew({})  # what a killed predecessor left behind
    with _session(box, "gpu-host") as session:
        for _ in range(60):
            session.step()
            time.sleep(0.02)
    assert session.stats.steps == 60


def test_in_a_signed_run_a_forged_learner_lease_is_overwritten_not_taken_for_a_twin(tmp_path):
    """INV-19: a lease written without the key does not stop the learner: it is written again."""
    box = gm.FileMailbox(tmp_path / "box")
    with _session(box, "gpu-host", KEY) as session:
        session.step()
        time.sleep(0.3)
        forged = Lease(kind="learner", holder="gpu-host", sequence=10**6, ttl_s=1e6)
        box.put("leases/learners/gpu-host.json", forged.to_json())
        for _ in range(50):
            session.step()
            time.sleep(0.02)
    lease = RunStore(box, gm.RunKey(KEY)).leases.read_learner("gpu-host")
    assert lease is not None and lease.lease is not None and lease.lease.released  # ours again, released on close


def test_a_replay_of_the_learners_own_older_signed_lease_is_overwritten_not_a_twin(tmp_path):
    """INV-19, issue 43 case 2: the learner's own older signed lease put back with one plain PUT is
    judged by its sequence, older than ours, and written over; the learner trains on."""
    box = gm.FileMailbox(tmp_path / "box")
    key = "leases/learners/gpu-host.json"
    with _session(box, "gpu-host", KEY) as session:
        session.step()
        old = box.get(key)
        time.sleep(0.5)  # a few renewals later
        box.put(key, old)
        for _ in range(60):
            session.step()
            time.sleep(0.02)
    assert session.stats.steps == 61
    found = RunStore(box, gm.RunKey(KEY)).leases.read_learner("gpu-host")
    replayed = Lease.from_json(old)
    assert found is not None and found.lease is not None and found.lease.sequence > replayed.sequence


def test_a_newer_lease_that_stands_still_is_a_dropped_object_written_over_after_a_ttl():
    """INV-19, issue 43 case 2: a newer lease of our id that nobody renews (an unsigned run's forged
    one) is watched for a TTL, then written over above its sequence: it does not stop the
    learner."""
    box = gm.MemoryMailbox()
    store = RunStore(box)
    now = [0.0]
    lease = LearnerLease(store, "l0", 10.0, clock=lambda: now[0], wall=lambda: 1000.0)
    lease.renew({})
    assert lease.written is not None and lease.written.sequence == 1_000_000  # the wall clock, in ms
    forged = Lease(kind="learner", holder="l0", sequence=10**13, ttl_s=1e6)
    store.leases.put_learner(forged)
    for t in (3.0, 6.0, 9.0, 12.0):  # first seen at 3.0
        now[0] = t
        lease.renew({})  # watched, not written over
        found = store.leases.read_learner("l0")
        assert found is not None and found.lease is not None and found.lease.sequence == 10**13
    now[0] = 13.0
    lease.renew({})
    found = store.leases.read_learner("l0")
    assert found is not None and found.lease == lease.written and lease.written.sequence == 10**13 + 1
    assert lease.overwritten == 1


def test_a_newer_lease_that_changes_is_another_process_and_the_learner_is_told():
    """Issue 43, case 2: a newer lease of our id that changes again is renewed by another
    process: ``DuplicateLearner`` for the older process, while the newer one trains on."""
    store = RunStore(gm.MemoryMailbox())
    now = [0.0]
    older = LearnerLease(store, "l0", 10.0, clock=lambda: now[0], wall=lambda: 1000.0)
    older.renew({})
    newer = LearnerLease(store, "l0", 10.0, clock=lambda: now[0], wall=lambda: 999.0)  # a clock behind
    newer.renew({})
    assert newer.written is not None and older.written is not None
    assert newer.written.sequence == older.written.sequence + 1  # above the lease it found
    now[0] = 3.0
    older.renew({})  # a newer lease: watched
    newer.renew({})
    now[0] = 6.0
    with pytest.raises(gm.DuplicateLearner, match="'l0' is used by another process"):
        older.renew({})
    newer.renew({})  # the newer process is not stopped


@pytest.mark.parametrize(
    ("there", "judged"),
    [
        (None, "foreign"),
        (Lease(kind="learner", holder="other", sequence=5, ttl_s=1.0), "foreign"),
        (Lease(kind="syncer", holder="l0", sequence=5, ttl_s=1.0), "foreign"),
        (Lease(kind="learner", holder="l0", sequence=4, ttl_s=1.0), "older"),
        (Lease(kind="learner", holder="l0", sequence=5, ttl_s=1.0), "newer"),
        (Lease(kind="learner", holder="l0", sequence=9, ttl_s=1.0), "newer"),
    ],
)
def test_what_a_learner_finds_at_its_key_is_judged_by_holder_and_sequence(there, judged):
    assert judge_found(there, "l0", 5) == judged


def test_a_learners_first_sequence_is_above_every_earlier_write_of_its_id():
    ahead = Lease(kind="learner", holder="l0", sequence=5_000_000, ttl_s=1.0)
    assert first_sequence(None, "l0", 1000.0) == 1_000_000
    assert first_sequence(ahead, "l0", 1000.0) == 5_000_001  # a predecessor whose clock ran ahead
    assert first_sequence(ahead, "l1", 1000.0) == 1_000_000  # another id's lease says nothing
