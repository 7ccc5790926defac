"""Real learner processes sharing a mailbox: rounds, faults (kill -9), joins, mixed frameworks."""

from __future__ import annotations

import os

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.algorithms.diloco import weight
from gradientmail.backends import get_backend, payload
from gradientmail.mailbox import FileMailbox, open_mailbox
from gradientmail.store import RunStore
from gradientmail.syncer import replay_round
from tests.run_procs import check_history, rounds, start_learner, syncer_lease, unique_prefix, wait_until

FAST = ["--ttl", "1.0", "--poll", "0.05"]


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def mailbox_url(request, tmp_path):
    if request.param == "file":
        return f"file://{tmp_path / 'box'}", {}
    server = request.getfixturevalue("s3_server")
    url = f"s3://{server.bucket}/{unique_prefix()}?endpoint={server.endpoint_url}&region={server.region}&addressing=path"
    env = {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}
    return url, env


@pytest.mark.slow
def test_three_learners_commit_every_version_once(mailbox_url, tmp_path):
    """INV-1, INV-2: on every store each version is committed once and lists each participant with its exact weight."""
    url, env = mailbox_url
    args = ["--steps", "100", "--step-sleep", "0.02", "--wait-for", "3", "--end-together", "3", *FAST]
    learners = [start_learner(url, f"n{i}", tmp_path, "--seed", str(i), *args, env=env) for i in range(3)]
    for learner in learners:
        learner.wait()
    os.environ.update(env)
    box = open_mailbox(url)
    history = check_history(box, fragments=2)
    assert all(len(records) >= 4 for records in history)
    for records in history:
        for record in records[1:]:
            for participant in record.participants:
                assert participant.weight == weight(participant.steps, participant.samples)
    results = [learner.result() for learner in learners]
    newest = {str(f): len(history[f]) - 1 for f in range(2)}
    for result in results:
        assert result["versions"] == newest
        assert result["params"] == results[0]["params"]
    contributors = {p.learner for records in history for r in records for p in r.participants}
    assert contributors == {"n0", "n1", "n2"}


@pytest.mark.slow
def test_kill_9_of_the_syncer_holder(tmp_path):
    """INV-1, INV-3, INV-6: after kill -9 of the holder another node takes over within the TTL and carries on from the mailbox."""
    url = f"file://{tmp_path / 'box'}"
    box = FileMailbox(tmp_path / "box")
    args = ["--steps", "250", "--step-sleep", "0.02", "--wait-for", "3", "--end-together", "2", *FAST]
    learners = {f"n{i}": start_learner(url, f"n{i}", tmp_path, "--seed", str(i), *args) for i in range(3)}
    wait_until(lambda: len(rounds(box, 0)) >= 3, 60, "the first rounds")
    before = syncer_lease(box)
    assert before is not None
    learners[before.holder].kill()
    killed_at_version = len(rounds(box, 0)) - 1
    after = wait_until(
        lambda: (lease := syncer_lease(box)) and lease.holder != before.holder and lease,
        3 * (1.0 + 0.05) + 5,
        "another node to take over the syncer lease",
    )
    assert after.term > before.term
    survivors = [l for name, l in learners.items() if name != before.holder]
    for learner in survivors:
        learner.wait()
    history = check_history(box, fragments=2)
    later = [r for r in history[0] if r.version > killed_at_version + 1]
    assert later and all(r.committed_by != before.holder for r in later)
    assert any(r.committed_by == after.holder for r in later)
    results = [l.result() for l in survivors]
    assert results[0]["params"] == results[1]["params"]
    assert results[0]["versions"] == {str(f): len(history[f]) - 1 for f in range(2)}


@pytest.mark.slow
def test_kill_9_of_a_learner_then_a_late_joiner(tmp_path):
    """INV-1, INV-3, INV-6: a dead learner stops counting once its lease expires; a late joiner starts from the commits."""
    url = f"file://{tmp_path / 'box'}"
    box = FileMailbox(tmp_path / "box")
    args = ["--steps", "300", "--step-sleep", "0.02", "--quorum", "3", *FAST]
    learners = {f"n{i}": start_learner(url, f"n{i}", tmp_path, "--seed", str(i), *args) for i in range(3)}
    wait_until(lambda: len(rounds(box, 0)) >= 3 and syncer_lease(box), 60, "the first rounds")
    victim = next(name for name in learners if name != syncer_lease(box).holder)
    learners[victim].kill()
    dead_at = len(rounds(box, 0)) - 1
    # once its lease expires, rounds close with the two survivors
    wait_until(
        lambda: any(
            r.version > dead_at + 1 and {p.learner for p in r.participants} == set(learners) - {victim} for r in rounds(box, 0)
        ),
        30,
        "rounds without the dead learner",
    )
    late = start_learner(url, "n9", tmp_path, "--seed", "9", "--steps", "120", "--step-sleep", "0.02", "--quorum", "3", *FAST)
    late.wait()
    joined = late.result()["joined"]
    assert int(joined["0"]) > dead_at
    assert any(p.learner == "n9" for r in rounds(box, 0) for p in r.participants)
    for name, learner in learners.items():
        if name != victim:
            learner.wait()
    check_history(box, fragments=2)


@pytest.mark.slow
def test_a_pytorch_learner_and_an_mlx_learner_train_one_run(tmp_path):
    """INV-1: a mixed PyTorch/MLX run commits every version once (check_history)."""
    url = f"file://{tmp_path / 'box'}"
    common = ["--steps", "60", "--quorum", "2", "--wait-for", "2", *FAST]
    learners = [
        start_learner(url, "torch-node", tmp_path, "--framework", "torch", "--seed", "1", *common),
        start_learner(url, "mlx-node", tmp_path, "--framework", "mlx", "--seed", "2", *common),
    ]
    for learner in learners:
        learner.wait()
    box = FileMailbox(tmp_path / "box")
    history = check_history(box, fragments=2)
    both = [r for records in history for r in records if {p.learner for p in r.participants} == {"torch-node", "mlx-node"}]
    assert len(both) >= 2, "rounds should merge a PyTorch and an MLX contribution"
    newest = {str(f): len(history[f]) - 1 for f in range(2)}
    results = [l.result() for l in learners]
    last = max(results, key=lambda r: sum(r["versions"].values()))
    assert last["versions"] == newest
    for result in results:
        if result["versions"] == newest:
            for name in result["params"]:
                np.testing.assert_allclose(result["params"][name], last["params"][name], rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_every_learner_step_is_accounted_for_with_a_slow_learner(tmp_path):
    """INV-9: with one learner at half speed (quorum 1, the default carrying of unmerged work),
    every local step of every learner on every fragment is in exactly one round record: merged
    (directly or carried), or reported re-aligned with its reason; none is thrown away."""
    url = f"file://{tmp_path / 'box'}"
    steps = 120
    common = ["--steps", str(steps), "--wait-for", "3", "--flush", "--quorum", "1", *FAST]
    speeds = {"fast-0": "0.02", "fast-1": "0.02", "slow": "0.04"}
    learners = [
        start_learner(url, name, tmp_path, "--seed", str(i), "--step-sleep", sleep, *common)
        for i, (name, sleep) in enumerate(speeds.items())
    ]
    for learner in learners:
        learner.wait()
    history = check_history(FileMailbox(tmp_path / "box"), fragments=2)
    for learner in learners:
        result = learner.result()
        assert result["stats"]["steps"] == steps
        for fragment, records in enumerate(history):
            mine = [p for record in records for p in record.participants if p.learner == learner.name]
            merged = sum(p.steps for p in mine)
            realigned = sum(r.steps for p in mine for r in p.realigned)
            dropped = result["stats"]["dropped_at_close"][fragment]
            assert merged + realigned + dropped == steps, (learner.name, fragment, merged, realigned, dropped)
            assert dropped == 0  # flush_on_close: the last steps went out as final contributions
            # the learner's own step ledger says the same, and balances to the step
            ledger = gm.LedgerView.from_json(result["ledger"][fragment])
            assert ledger is not None and ledger.balanced and ledger.trained == steps
            assert ledger.merged == merged and ledger.dropped.get("carry_limit", 0) == realigned, ledger
            assert ledger.carried == ledger.since_anchor == 0  # closed: nothing left pending
    stale = [r for records in history for record in records for r in record.rejected if r.reason == "stale"]
    carried = [p for records in history for record in records for p in record.participants if p.carried_steps]
    assert not stale or carried  # work that missed a round came back, carried
    store = RunStore(FileMailbox(tmp_path / "box"))
    for fragment, records in enumerate(history):  # carried work changes nothing for replay (INV-4)
        newest = records[-1]
        replayed = replay_round(store, get_backend("numpy"), store.read_spec(), fragment, newest.version)
        assert payload.encode(replayed) == store.blobs.read(newest.params)
