"""Version 0 of a new run (``session.join``): learners started together upload one model, not one
each. The manifest's creator writes version 0; the others wait for it (up to the run's lease TTL)
instead of writing their own and losing the create-once race, and a creator that died before
writing it is replaced once that wait is over."""

from __future__ import annotations

import threading

import numpy as np

import gradientmail as gm
from gradientmail.backends import get_backend
from gradientmail.mailbox import MeteredMailbox
from gradientmail.session.join import RunProposal, join_run, proposed_manifest
from gradientmail.store import RunStore

NUMPY = get_backend("numpy")


def _writes(mailbox: MeteredMailbox) -> int:
    """Puts, deletes and creates that succeeded (a lost race for the manifest is a create refused)."""
    requests = mailbox.counts.requests()
    return sum(
        n
        for (operation, outcome), n in requests.items()
        if operation in ("put", "delete") or (operation, outcome) == ("create", "ok")
    )


def test_learners_starting_together_write_version_zero_once(tmp_path):
    params = {"w": np.ones(1 << 16, np.float32), "b": np.zeros(256, np.float32)}
    proposal = RunProposal(gm.DiLoCo(fragments=2), lease_ttl_s=10.0)
    mailboxes = [MeteredMailbox(gm.FileMailbox(tmp_path / "box")) for _ in range(3)]
    start = threading.Barrier(len(mailboxes))
    created: dict[int, bool] = {}

    def join(index: int) -> None:
        start.wait()
        _, created[index] = join_run(RunStore(mailboxes[index]), NUMPY, dict(params), proposal, f"n{index}")

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(mailboxes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    (creator,) = [i for i, made in created.items() if made]
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    assert [store.read_round(f, 0).committed_by for f in range(2)] == [f"n{creator}"] * 2
    for index, mailbox in enumerate(mailboxes):
        if index != creator:
            assert _writes(mailbox) == 0  # no blob written, none deleted after a lost race


def test_a_creator_that_died_before_version_zero_is_replaced_after_the_lease_ttl(tmp_path):
    params = {"w": np.ones(1024, np.float32)}
    proposal = RunProposal(gm.DiLoCo(), lease_ttl_s=1.0)
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    assert store.create_manifest(proposed_manifest(NUMPY, params, proposal, "dead", None))  # then it died
    spec, created = join_run(store, NUMPY, dict(params), proposal, "next")
    assert not created and spec.lease_ttl_s == 1.0
    record = store.read_round(0, 0)
    assert record.committed_by == "next"
    np.testing.assert_array_equal(store.read_params(spec, record)["w"], params["w"])


def test_the_creator_restarted_under_its_id_writes_version_zero_without_waiting_for_itself(tmp_path):
    import time

    params = {"w": np.ones(1024, np.float32)}
    proposal = RunProposal(gm.DiLoCo(), lease_ttl_s=60.0)
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    assert store.create_manifest(proposed_manifest(NUMPY, params, proposal, "creator", None))  # then it was restarted
    started = time.monotonic()
    join_run(store, NUMPY, dict(params), proposal, "creator")
    assert time.monotonic() - started < 30.0  # not the run's 60 s TTL
    assert store.read_round(0, 0).committed_by == "creator"
