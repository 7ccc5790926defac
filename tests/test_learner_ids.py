"""One learner id, one process: a second process with the same id is found out by its lease and
stopped with an error naming the id; a restart or a forged lease is not mistaken for one."""

from __future__ import annotations

import time

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.records import Lease
from gradientmail.store import LearnerLease, RunStore

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
