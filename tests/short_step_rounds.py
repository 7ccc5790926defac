"""Two short-step rounds on a fake clock, the case the slack grace window loses (tests of the round
rules and of the work-loss check share it)."""

from __future__ import annotations

import numpy as np

import gradientmail as gm
from gradientmail.backends import get_backend
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import ContributionCounts, LearnerLease, RunStore
from gradientmail.syncer import SyncerRuntime
from tests.fake_clock import FakeClock

NUMPY = get_backend("numpy")
STEP_S = 0.013
H = 20
POLL_S = 0.2


def two_short_step_rounds(rule: str) -> RunStore:
    """Two learners, quorum 1, 13 ms steps: ``a`` (beside the syncer) publishes first, ``b``
    0.2 s later, in each of two rounds, the syncer on a fake clock. The run's store after."""
    box = gm.MemoryMailbox()
    store = RunStore(box)
    clock = FakeClock()
    algorithm = gm.DiLoCo(sync_every=H, fragments=1, quorum_size=1, grace_rule=rule, grace_periods=2.0)  # type: ignore[arg-type]
    spec, _ = join_run(store, NUMPY, {"w": np.zeros(8, np.float32)}, RunProposal(algorithm, lease_ttl_s=10.0), "a")
    syncer = SyncerRuntime(store, NUMPY, spec, "a", poll_interval_s=POLL_S, clock=clock)
    for learner in ("a", "b"):
        LearnerLease(store, learner, 10.0).renew({})
    counts = ContributionCounts(steps=H, samples=H, step_time_s=STEP_S)
    delta = {"w": np.full(8, 0.01, np.float32)}
    syncer.run_once()
    for base in (0, 1):
        started = clock.now
        store.publish_contribution("a", 0, base, delta, counts)
        syncer.run_once()  # quorum at once; the window decides whether b is waited for
        while clock.now < started + 0.3:  # the syncer passes every 50 ms; b's contribution comes at 0.2 s
            clock.now += 0.05
            if "b" not in store.contributors(0, base) and clock.now >= started + 0.2 - 1e-9:
                store.publish_contribution("b", 0, base, delta, counts)
            syncer.run_once()
        for learner in ("a", "b"):
            LearnerLease(store, learner, 10.0).renew({})
        clock.now = started + 10.0  # the next round, later
        syncer.run_once()
    return store
