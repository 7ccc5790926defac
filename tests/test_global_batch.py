"""A global batch the live learners share (``DiLoCo.global_batch_size``): real learner processes
join and one is killed with -9, and every learner's ``Session.batch_size`` follows the count of
training learners the elected syncer announces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import gradientmail as gm
from tests.run_procs import Learner, start_learner, wait_until

GLOBAL = 24
ARGS = ["--steps", "100000", "--step-sleep", "0.02", "--sync-every", "10", "--ttl", "1.0", "--poll", "0.05"]


def _batch(learner: Learner) -> int | None:
    """The last batch size the learner reported (its log's newest ``batch`` event)."""
    if not learner.log.exists():
        return None
    sizes = [
        event["batch"]
        for line in learner.log.read_text().splitlines()
        if line.startswith("{") and (event := json.loads(line)).get("event") == "batch"
    ]
    return sizes[-1] if sizes else None


@pytest.mark.slow
def test_learners_share_the_global_batch_as_they_join_and_die(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'box'}"
    flags = [*ARGS, "--global-batch", str(GLOBAL)]
    learners = {"a": start_learner(url, "a", tmp_path, "--seed", "0", *flags)}
    try:
        wait_until(lambda: _batch(learners["a"]) == GLOBAL, 60, "the first learner alone: the whole batch")
        for seed, name in enumerate(("b", "c"), start=1):
            learners[name] = start_learner(url, name, tmp_path, "--seed", str(seed), *flags)
        wait_until(lambda: all(_batch(p) == GLOBAL // 3 for p in learners.values()), 60, "three learners: a third each")
        learners["c"].kill()
        survivors = [learners["a"], learners["b"]]
        wait_until(lambda: all(_batch(p) == GLOBAL // 2 for p in survivors), 60, "after the kill: half each")
        for learner in learners.values():
            assert learner.process.poll() is None or learner is learners["c"], learner.log.read_text()[-2000:]
    finally:
        for learner in learners.values():
            if learner.process.poll() is None:
                learner.kill()


def test_without_a_global_batch_there_is_none_and_a_learner_alone_takes_it_all(tmp_path: Path) -> None:
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.02)
    model = {"w": np.zeros(16, np.float32)}
    with gm.Session(model, mailbox=gm.FileMailbox(tmp_path / "a"), learner_id="x", options=options) as session:
        assert session.batch_size is None
    shared = gm.DiLoCo(sync_every=5, global_batch_size=10)
    with gm.Session(model, algorithm=shared, mailbox=gm.FileMailbox(tmp_path / "b"), learner_id="x", options=options) as session:
        assert session.batch_size == 10
        session.step(samples=10)
    with pytest.raises(gm.InvalidConfig, match="global_batch_size"):
        gm.DiLoCo(global_batch_size=0)
