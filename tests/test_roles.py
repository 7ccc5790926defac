"""Roles (issue 23): a node that trains and syncs (``both``), one that only trains
(``learner``), and the run's dedicated syncer (``gm.SyncerNode``, ``GRADIENTMAIL_ROLE=syncer``),
which trains nothing, outranks training nodes in the election and is replaced by one when it
dies. Real processes on a directory mailbox; the dedicated syncer started as a user would,
``gradientmail node`` with only ``GRADIENTMAIL_*`` variables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import gradientmail as gm
from gradientmail.mailbox import FileMailbox
from gradientmail.records import Lease
from gradientmail.session.roles import serves_instead_of_training
from gradientmail.store import TRAINING, RunStore, others_training, trains
from gradientmail.syncer.election import Election
from tests.fake_clock import FakeClock
from tests.run_procs import ROOT, check_history, rounds, start_learner, syncer_lease, wait_until

TTL_S, POLL_S = 1.0, 0.05
FAST = ["--ttl", str(TTL_S), "--poll", str(POLL_S)]


def start_syncer_node(url: str, node_id: str, workdir: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "GRADIENTMAIL_MAILBOX": url,
        "GRADIENTMAIL_ROLE": "syncer",
        "GRADIENTMAIL_LEARNER_ID": node_id,
        "GRADIENTMAIL_POLL_INTERVAL_S": str(POLL_S),
    }
    log = (workdir / f"{node_id}.log").open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "gradientmail.cli", "node"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
    )


def test_a_dedicated_syncer_takes_the_lease_from_a_training_node_but_not_from_another_dedicated_one(tmp_path):
    """INV-6: the dedicated syncer takes a training holder's live lease at once (term + 1); a
    training node leaves a dedicated holder's lease alone until it expires; two dedicated syncers
    elect one as usual."""
    store = RunStore(FileMailbox(tmp_path / "box"))
    clock = FakeClock()
    trainer = Election(store, "gpu-0", TTL_S, clock)
    assert trainer.poll() and trainer.term == 1
    dedicated = Election(store, "cpu-sync", TTL_S, clock, dedicated=True)
    assert dedicated.poll() and dedicated.term == 2
    clock.now += TTL_S / 3
    assert not trainer.poll()  # its renewal finds the lease taken: deposed
    assert not trainer.poll() and trainer.holder == "cpu-sync"  # and it watches a live dedicated holder
    other = Election(store, "cpu-sync-2", TTL_S, clock, dedicated=True)
    assert not other.poll()
    clock.now += TTL_S / 3
    assert dedicated.poll() and not other.poll()
    assert not trainer.poll()  # the renewed token, first seen: its TTL starts on the watcher's clock
    clock.now += TTL_S + 0.01  # the dedicated holder is gone (no renewal): its lease expires
    assert trainer.poll() and trainer.term == 3


def test_a_syncer_role_in_session_options_points_at_the_syncer_node():
    with pytest.raises(gm.InvalidConfig, match="gm.SyncerNode"):
        gm.SessionOptions(role="syncer")
    with pytest.raises(gm.InvalidConfig, match="role"):
        gm.SessionOptions(role="neither")
    assert not gm.SessionOptions(role="learner").elects and gm.SessionOptions().elects
    assert gm.SessionOptions(role="either").elects
    assert not gm.SessionOptions(run_syncer=False).elects


def test_an_either_node_serves_instead_of_training_only_while_elected_and_someone_else_trains():
    """The one rule of the either role (``session/roles.py``), and the lease field it is read from."""
    assert serves_instead_of_training("either", holds_syncer_role=True, others_training=1)
    assert not serves_instead_of_training("either", holds_syncer_role=True, others_training=0)  # alone: it trains
    assert not serves_instead_of_training("either", holds_syncer_role=False, others_training=3)
    for role in ("both", "learner"):
        assert not serves_instead_of_training(role, holds_syncer_role=True, others_training=3)
    lease = Lease(kind="learner", holder="a", ttl_s=1.0)
    paused = Lease(kind="learner", holder="b", ttl_s=1.0, info={TRAINING: False})
    assert trains(lease) and not trains(paused)
    assert others_training({"a": lease, "b": paused, "me": lease}, "me") == 1


@pytest.mark.slow
def test_an_either_node_only_syncs_while_another_node_trains_and_trains_again_when_alone(tmp_path):
    """INV-6: an ``either`` node and a ``learner`` node. The either node is elected (the only
    candidate) and, once the learner trains, stops training: it publishes its work, then closes
    the learner's rounds without waiting for itself (its lease says it does not train). When
    the learner leaves it trains again, alone, and finishes its steps."""
    url = f"file://{tmp_path / 'box'}"
    box = FileMailbox(tmp_path / "box")
    either = start_learner(
        url, "e0", tmp_path, "--steps", "60", "--step-sleep", "0.02", "--wait-for", "2", "--role", "either", *FAST
    )
    learner = start_learner(
        url, "l0", tmp_path, "--steps", "150", "--step-sleep", "0.02", "--wait-for", "2", "--role", "learner", *FAST
    )
    for process in (learner, either):
        process.wait()
    done = either.result()
    assert done["stats"]["steps"] == 60 and done["stats"]["serving_pauses"] >= 1 and done["stats"]["serving_s"] > 0
    history = check_history(box, fragments=2)
    committed = [r for fragment in history for r in fragment[1:]]
    assert committed and {r.committed_by for r in committed} == {"e0"}
    alone = [r for r in committed if {p.learner for p in r.participants} == {"l0"}]
    assert alone  # rounds of the learner only, closed while the either node served
    last = max(r.version for r in alone if r.fragment == 0)
    assert any("e0" in {p.learner for p in r.participants} for r in history[0][1:] if r.version > last)  # it trained again


@pytest.mark.slow
def test_a_dedicated_syncer_closes_every_round_of_learner_only_nodes_and_stops_on_sigterm(tmp_path):
    """INV-1, INV-6: two ``learner`` nodes and a ``gradientmail node`` with GRADIENTMAIL_ROLE=syncer:
    every version is committed once, by the syncer node, from both learners' work; SIGTERM ends
    it with 143 and releases its lease."""
    url = f"file://{tmp_path / 'box'}"
    box = FileMailbox(tmp_path / "box")
    syncer = start_syncer_node(url, "cpu-sync", tmp_path)  # before the run exists: it waits for the manifest
    args = ["--steps", "120", "--step-sleep", "0.02", "--wait-for", "2", "--end-together", "2", "--role", "learner", *FAST]
    learners = [start_learner(url, f"n{i}", tmp_path, "--seed", str(i), *args) for i in range(2)]
    try:
        for learner in learners:
            learner.wait()
        history = check_history(box, fragments=2)
        committed = [r for fragment in history for r in fragment[1:]]
        assert committed and {r.committed_by for r in committed} == {"cpu-sync"}
        assert {p.learner for r in committed for p in r.participants} == {"n0", "n1"}
        syncer.send_signal(signal.SIGTERM)
        assert syncer.wait(timeout=30) == 143
        lease = syncer_lease(box)
        assert lease is not None and lease.holder == "cpu-sync" and lease.released
    finally:
        if syncer.poll() is None:
            syncer.kill()
            syncer.wait()


@pytest.mark.slow
def test_kill_9_of_the_dedicated_syncer_hands_the_rounds_to_a_training_node(tmp_path):
    """INV-6: with a dedicated syncer and two ``both`` nodes the syncer node holds the lease and
    commits; after its kill -9 a training node takes the lease over, and the rounds go on to
    the end without a gap in the chain."""
    url = f"file://{tmp_path / 'box'}"
    box = FileMailbox(tmp_path / "box")
    args = ["--steps", "300", "--step-sleep", "0.02", "--wait-for", "2", "--end-together", "2", *FAST]
    learners = [start_learner(url, f"n{i}", tmp_path, "--seed", str(i), *args) for i in range(2)]
    syncer = start_syncer_node(url, "cpu-sync", tmp_path)
    try:
        wait_until(
            lambda: (lease := syncer_lease(box)) and lease.holder == "cpu-sync", 60, "the dedicated syncer to take the lease"
        )
        wait_until(lambda: any(r.committed_by == "cpu-sync" for r in rounds(box, 0)), 60, "a commit by the dedicated syncer")
        before = syncer_lease(box)
        syncer.kill()
        syncer.wait()
        after = wait_until(  # the bound (TTL + idle interval + poll) is measured by benchmarks.chaos, not here
            lambda: (lease := syncer_lease(box)) and lease.holder != "cpu-sync" and lease, 3 * TTL_S + 5, "a takeover"
        )
        assert after.term > before.term and after.holder in {"n0", "n1"}
        for learner in learners:
            learner.wait()
        history = check_history(box, fragments=2)
        assert any(r.committed_by == after.holder for r in history[0])
    finally:
        if syncer.poll() is None:
            syncer.kill()
            syncer.wait()
