"""The exchange's parts in one process: election, leases, grace window, rounds and their verdicts."""

from __future__ import annotations

import time

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.algorithms.diloco import weight
from gradientmail.backends import get_backend, payload
from gradientmail.records import Contribution, keys
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import ContributionCounts, LearnerLease, LeaseName, LeaseObserver, LeaseRead, RunStore
from gradientmail.syncer import Election, GraceEstimator, SyncerRuntime, replay_round
from tests.fake_clock import FakeClock

NUMPY = get_backend("numpy")


def test_election_takeover_is_judged_on_the_observers_clock():
    """INV-6: a dead syncer is replaced once its lease stood still for a TTL on the observer's own clock."""
    box = gm.MemoryMailbox()
    clock_a, clock_b = FakeClock(), FakeClock()
    clock_b.now = 1e6  # wall clocks of different machines need not agree
    a = Election(RunStore(box), "node-a", ttl_s=3.0, clock=clock_a)
    b = Election(RunStore(box), "node-b", ttl_s=3.0, clock=clock_b)
    assert a.poll() and a.term == 1
    assert not b.poll() and b.holder == "node-a"
    for _ in range(5):  # a renews every ttl/3: b never sees the lease stand still for a TTL
        clock_a.now += 1.1
        clock_b.now += 1.1
        assert a.poll()
        assert not b.poll()
    clock_b.now += 2.9  # a is dead now; b has seen the same token for 2.9 s
    assert not b.poll()
    clock_b.now += 0.2
    assert b.poll() and b.term == 2 and b.takeovers == 1
    clock_a.now += 1.2  # a wakes up: its renewal fails, it steps down
    assert not a.poll()
    assert not a.is_leader


def test_resign_hands_over_without_waiting():
    box = gm.MemoryMailbox()
    a, b = Election(RunStore(box), "a", ttl_s=100.0), Election(RunStore(box), "b", ttl_s=100.0)
    assert a.poll()
    a.resign()
    assert b.poll() and b.term == 2


def test_lease_observer_needs_a_full_ttl_of_its_own_time():
    """INV-6, INV-14: a lease expires only after the run's TTL unchanged on the observer's monotonic clock
    (whatever TTL the lease claims); a renewal restarts the count; an unreadable lease is expired."""
    clock = FakeClock()
    observer = LeaseObserver(5.0, clock)
    lease = gm.records.Lease(kind="learner", holder="x", ttl_s=1e9)  # a lease cannot extend its own life

    def seen(token: str, which=lease) -> LeaseRead:
        return LeaseRead(which, token)

    x, y = LeaseName.of_learner("x"), LeaseName.of_learner("y")
    assert not observer.expired(x, seen("t1"))
    clock.now = 4.9
    assert not observer.expired(x, seen("t1"))
    assert not observer.expired(x, seen("t2"))  # renewed: the count starts again
    clock.now = 9.8
    assert not observer.expired(x, seen("t2"))
    clock.now = 9.9
    assert observer.expired(x, seen("t2"))
    assert observer.expired(y, seen("t9", lease.model_copy(update={"released": True})))
    assert observer.expired(LeaseName.SYNCER, LeaseRead(None, "t0", "not JSON"))


def test_a_lease_named_by_what_it_is_and_by_its_key_is_one_sighting():
    """The typed names and the raw keys (the form callers used before) file a lease in one place,
    so callers can move from one to the other without restarting any count."""
    clock = FakeClock()
    observer = LeaseObserver(5.0, clock)
    lease = gm.records.Lease(kind="learner", holder="x", ttl_s=5.0)
    assert not observer.expired(LeaseName.of_learner("x"), LeaseRead(lease, "t1"))
    clock.now = 3.0
    assert observer.unchanged_for("leases/learners/x.json") == observer.unchanged_for(LeaseName.of_learner("x")) == 3.0
    assert observer.age(LeaseName.SYNCER) is None and observer.unchanged_for(LeaseName.SYNCER) == 0.0
    with pytest.raises(gm.InvalidKey):
        LeaseName.of_learner("../x")


def test_the_store_reads_and_writes_leases_by_what_they_are():
    """The typed lease API of RunStore: the syncer lease and each learner's, no key in sight."""
    store = RunStore(gm.MemoryMailbox())
    assert store.leases.read_syncer() is None and store.leases.learners() == []
    syncer = gm.records.Lease(kind="syncer", holder="n1", term=1, sequence=1, ttl_s=5.0)
    token = store.leases.create_syncer(syncer)
    with pytest.raises(gm.RecordExists):
        store.leases.create_syncer(syncer)
    found = store.leases.read_syncer()
    assert found is not None and found.lease == syncer and found.token == token
    renewed = syncer.model_copy(update={"sequence": 2})
    assert store.leases.swap_syncer(renewed, token) != token
    with pytest.raises(gm.VersionConflict):
        store.leases.swap_syncer(renewed, token)
    for learner in ("b", "a"):
        store.leases.put_learner(gm.records.Lease(kind="learner", holder=learner, sequence=1, ttl_s=5.0))
    assert store.leases.learners() == ["a", "b"]
    found = store.leases.read_learner("a")
    assert found is not None and found.lease is not None and found.lease.holder == "a"
    assert store.leases.read_learner("c") is None
    with pytest.raises(ValueError, match="learner lease"):
        store.leases.put_learner(syncer)


def test_reported_step_times_are_clamped_before_the_grace_window():
    """INV-12: a learner reporting an absurd step time cannot pin the grace window at its cap: the
    first estimate is at most grace_max_s / τ, later ones grow at most 2× per round."""
    grace = GraceEstimator(gamma=0.5, tau=4.0, max_s=60.0, smoothing=1.0)
    grace.observe_step_times([1e308])
    assert grace.step_time_s == 15.0  # 60 s / τ
    grace = GraceEstimator(gamma=0.5, tau=4.0, max_s=60.0, smoothing=1.0)
    grace.observe_step_times([0.5])
    for _ in range(3):
        grace.observe_step_times([1e308, float("inf"), float("nan")])
    assert grace.step_time_s == 4.0  # 0.5 → 1 → 2 → 4: bounded growth, never 15 at once
    assert grace.window(0.0) == pytest.approx(0.5 * 4.0 * 4.0)


def test_grace_window_spends_only_existing_slack():
    grace = GraceEstimator(gamma=0.2, tau=2.0, max_s=60.0)
    assert grace.window(0.0) == 0.0  # no step time known yet
    grace.observe_step_times([1.0, 3.0, 2.0])
    assert grace.step_time_s == 2.0
    assert grace.window(0.5) == pytest.approx(0.2 * (4.0 - 0.5))
    grace.observe_sync(1.0)
    assert grace.window(0.5) == pytest.approx(0.2 * (4.0 - 1.5))
    assert grace.window(10.0) == 0.0
    assert GraceEstimator(max_s=0.1, step_time_s=100.0).window(0.0) == 0.1


# -- rounds in one process -------------------------------------------------------------------


def numpy_model(value: float = 0.0) -> dict[str, np.ndarray]:
    return {"tok_embed.weight": np.full((4, 2), value, np.float32), "mlp.weight": np.full((3, 2), value, np.float32)}


@pytest.fixture
def run(tmp_path):
    box = gm.FileMailbox(tmp_path / "box")
    store = RunStore(box)
    algorithm = gm.DiLoCo.local_sgd(sync_every=10)
    spec, created = join_run(store, NUMPY, numpy_model(1.0), RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    assert created
    return box, store, spec, syncer_on(store, spec, "syncer-node")


def syncer_on(store: RunStore, spec, node: str) -> SyncerRuntime:
    return SyncerRuntime(store, NUMPY, spec, node, lease_ttl_s=10.0, poll_interval_s=0.2)


def committed_params(store: RunStore, version: int, fragment: int = 0) -> dict[str, np.ndarray]:
    return store.load_version(store.read_spec(), fragment, version).params


def contribute(
    store: RunStore,
    learner: str,
    base: int,
    params: dict[str, np.ndarray],
    steps: int,
    samples: int,
    sequence: int = 1,
    anchor: dict[str, np.ndarray] | None = None,
    fragment: int = 0,
) -> keys.ContributionKey:
    """Publish what a learner at ``params`` that started from ``anchor`` (default: version ``base``) would."""
    anchor = anchor if anchor is not None else committed_params(store, base, fragment)
    delta = {n: (anchor[n].astype(np.float32) - params[n].astype(np.float32)) for n in params}
    return store.publish_contribution(
        learner, fragment, base, delta, ContributionCounts(steps, samples), first_sequence=sequence
    ).key


def test_local_sgd_commit_is_the_weighted_average_and_replays_to_the_same_bytes(run):
    """INV-2, INV-4: the round lists every participant with its weight, and replaying it gives the committed bytes."""
    box, store, spec, syncer = run
    rng = np.random.default_rng(0)
    learners = {f"l{i}": {n: rng.standard_normal(v.shape).astype(np.float32) for n, v in numpy_model().items()} for i in range(3)}
    counts = {"l0": (12, 3072), "l1": (6, 1536), "l2": (12, 1536)}
    for name, params in learners.items():
        contribute(store, name, 0, params, *counts[name])
    syncer.run_once()
    record = store.read_round(0, 1)
    assert [(p.learner, p.weight) for p in record.participants] == [(n, weight(*counts[n])) for n in ("l0", "l1", "l2")]
    committed = store.blobs.read_tensors(record.params)
    weights = [weight(*counts[n]) for n in learners]
    for name in committed:
        expected = sum(w * learners[l][name].astype(np.float64) for l, w in zip(learners, weights)) / sum(weights)
        np.testing.assert_allclose(committed[name], expected, rtol=1e-6, atol=1e-6)
    replayed = replay_round(store, NUMPY, spec, 0, 1)
    assert payload.encode(replayed) == box.get(record.params.key)


def test_bad_contributions_are_rejected_with_their_reasons_and_the_run_goes_on(run):
    """INV-2, INV-7: stale, duplicate, zero-step, non-finite, corrupt, mis-shaped and malformed snapshots
    are listed with their reasons and never merged."""
    box, store, spec, syncer = run
    good = {n: v + 0.5 for n, v in numpy_model(1.0).items()}
    contribute(store, "good", 0, good, 10, 80)
    syncer.run_once()
    assert store.newest_version(0) == 1
    v1 = committed_params(store, 1)

    LearnerLease(store, "late", 10.0).renew({})  # a live learner: its stale snapshot is deleted at once
    contribute(store, "late", 0, good, 10, 80, anchor=numpy_model(1.0))  # against version 0: stale
    contribute(store, "lazy", 1, good, 0, 0, anchor=v1)  # zero steps
    contribute(store, "nan", 1, {n: np.full_like(v, np.nan) for n, v in good.items()}, 5, 40, anchor=v1)
    corrupt = contribute(store, "flip", 1, good, 5, 40, anchor=v1)
    data = bytearray(box.get(corrupt.blob))
    data[-1] ^= 0xFF
    box.put(corrupt.blob, bytes(data))
    contribute(
        store,
        "shape",
        1,
        {"tok_embed.weight": np.zeros((4, 3), np.float32), "mlp.weight": np.zeros((3, 2), np.float32)},
        5,
        40,
        anchor={"tok_embed.weight": np.zeros((4, 3), np.float32), "mlp.weight": v1["mlp.weight"]},
    )
    contribute(store, "twice", 1, good, 5, 40, anchor=v1, sequence=1)
    contribute(store, "twice", 1, good, 6, 48, anchor=v1, sequence=2)
    box.create(keys.contribution_record(0, 1, "junk", 1), b"{this is not json")
    contribute(store, "ok", 1, {n: v - 0.25 for n, v in good.items()}, 5, 40, anchor=v1)
    syncer.run_once()

    record = store.read_round(0, 2)
    assert sorted(p.learner for p in record.participants) == ["ok", "twice"]
    reasons = {r.learner: r.reason for r in record.rejected}
    assert reasons == {
        "late": "stale",
        "lazy": "zero_steps",
        "nan": "non_finite",
        "flip": "corrupt",
        "shape": "incompatible",
        "twice": "duplicate",
        "junk": "malformed",
    }
    assert all(np.isfinite(v).all() for v in store.blobs.read_tensors(record.params).values())
    # the live learner's stale snapshot was listed once and then removed (a stranger's: retention's)
    assert not box.exists(keys.contribution_record(0, 0, "late", 1))
    contribute(store, "ok", 2, good, 5, 40, anchor=committed_params(store, 2))
    syncer.run_once()
    assert store.newest_version(0) == 3


def test_max_staleness_merges_late_deltas_with_a_discount_and_replays(tmp_path):
    """INV-2, INV-4: with max_staleness 1 a delta one version late is merged once, its weight halved
    and its staleness recorded; two versions late it is stale; the round replays to its bytes."""
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    algorithm = gm.DiLoCo.local_sgd(sync_every=10, max_staleness=1, carry_unmerged=False)
    spec, _ = join_run(store, NUMPY, numpy_model(1.0), RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    syncer = syncer_on(store, spec, "syncer-node")
    contribute(store, "a", 0, numpy_model(2.0), 10, 80)
    syncer.run_once()
    contribute(store, "late", 0, numpy_model(3.0), 10, 80, anchor=numpy_model(1.0))  # based on v0, the round's base is v1
    contribute(store, "a", 1, numpy_model(2.5), 10, 80)
    syncer.run_once()
    record = store.read_round(0, 2)
    by_learner = {p.learner: p for p in record.participants}
    assert by_learner["late"].staleness == 1 and by_learner["a"].staleness == 0
    assert by_learner["late"].weight == weight(10, 80) / 2 == by_learner["a"].weight / 2
    replayed = replay_round(store, NUMPY, spec, 0, 2)
    assert payload.encode({n: NUMPY.to_numpy(t) for n, t in replayed.items()}) == store.blobs.read(record.params)
    contribute(store, "older", 0, numpy_model(3.0), 10, 80, anchor=numpy_model(1.0))  # two versions late
    contribute(store, "a", 2, numpy_model(2.7), 10, 80)
    syncer.run_once()
    assert {r.learner: r.reason for r in store.read_round(0, 3).rejected} == {"older": "stale"}
    with pytest.raises(gm.InvalidConfig, match="merged twice"):
        gm.DiLoCo(max_staleness=1)  # carrying learners would have their work merged twice


def test_a_syncer_that_loses_the_race_discards_its_work(run):
    """INV-1: a syncer that loses the create-once race discards its blobs; one record per version."""
    box, store, spec, syncer = run
    contribute(store, "a", 0, numpy_model(2.0), 10, 80)
    other = syncer_on(store, spec, "other-node")
    # both think they lead (as across a partition); only one record can be created
    other.election.poll()
    other.advance(0)
    syncer.advance(0)
    assert store.committed_versions(0) == [0, 1]
    assert syncer.lost_races + other.lost_races <= 1
    versions = box.list(f"{keys.fragment_root(0)}versions/0000000001/")
    record = store.read_round(0, 1)
    assert sorted(versions) == sorted([record.params.key, record.outer_state.key])  # the loser's blobs are gone


def test_second_node_with_a_different_merge_or_model_gets_run_config_mismatch(run):
    """INV-8: a node whose run fields or model differ gets RunConfigMismatch; learner-local knobs may differ."""
    box, store, spec, syncer = run
    with pytest.raises(gm.RunConfigMismatch, match="merge") as caught:
        gm.Session(numpy_model(), algorithm=gm.DiLoCo(sync_every=10), mailbox=box, learner_id="other").open()
    assert any("merge" in d for d in caught.value.differences)
    wrong = numpy_model()
    wrong["mlp.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(gm.RunConfigMismatch, match=r"mlp.weight: the run has shape \(3, 2\)"):
        gm.Session(wrong, algorithm=gm.DiLoCo.local_sgd(sync_every=10), mailbox=box, learner_id="other").open()
    # learner-local knobs may differ
    session = gm.Session(
        numpy_model(),
        algorithm=gm.DiLoCo.local_sgd(sync_every=10, overlap_steps=0),
        mailbox=box,
        learner_id="other",
        options=gm.SessionOptions(run_syncer=False),
    )
    session.open()
    session.close()


def test_session_rejects_bad_settings():
    """INV-7: a path-like learner id (and other bad settings) is refused before the session writes anything."""
    with pytest.raises(gm.InvalidConfig, match="learner_id"):
        gm.Session(numpy_model(), mailbox=gm.MemoryMailbox(), learner_id="../etc")
    with pytest.raises(gm.InvalidConfig, match="lease_ttl_s"):
        gm.SessionOptions(lease_ttl_s=0.1, poll_interval_s=0.2)
    session = gm.Session(numpy_model(), mailbox=gm.MemoryMailbox(), learner_id="a")
    with pytest.raises(RuntimeError, match="inside"):
        session.step(samples=1)


def test_joining_learner_loads_the_committed_weights(run):
    """INV-3: a new learner joins from the mailbox alone and gets the committed weights."""
    box, store, spec, syncer = run
    contribute(store, "a", 0, numpy_model(3.0), 10, 80)
    syncer.run_once()
    committed = store.blobs.read_tensors(store.read_round(0, 1).params)
    joiner = numpy_model(-7.0)
    with gm.Session(
        joiner,
        algorithm=gm.DiLoCo.local_sgd(sync_every=10),
        mailbox=box,
        learner_id="late",
        options=gm.SessionOptions(run_syncer=False),
    ) as session:
        assert session.versions == {0: 1}
        for name in committed:
            np.testing.assert_array_equal(joiner[name], committed[name])


def test_in_process_learners_align_and_close_on_the_newest_version():
    """INV-5: commits arrive in the background and step() aligns between steps; learners close on the newest version."""
    box = gm.MemoryMailbox()
    models = [numpy_model(0.0) for _ in range(2)]
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
    # closed one after the other: with flush_on_close the later closer's final round would come after
    # the first one left, so this test of alignment keeps the guide's close
    algorithm = gm.DiLoCo(sync_every=5, fragments=2, overlap_steps=0, flush_on_close=False)
    sessions = [
        gm.Session(m, algorithm=algorithm, mailbox=box, learner_id=f"n{i}", options=options) for i, m in enumerate(models)
    ]
    for s in sessions:
        s.open()
    for _ in range(20):
        # overlap_steps=0: a learner waits for the commit of what it published, so they step in turn
        for i, (model, session) in enumerate(zip(models, sessions)):
            for value in model.values():
                value += 0.1 * (i + 1)
            session.step(samples=4)
    for s in sessions:
        s.close()
    newest = [RunStore(box).newest_version(f) for f in range(2)]
    assert all(v >= 3 for v in newest)
    for session in sessions:
        assert session.versions == dict(enumerate(newest))
    for name in models[0]:
        np.testing.assert_array_equal(models[0][name], models[1][name])


# -- the learner's knobs ---------------------------------------------------------------------


def published(box, learner: str) -> list[Contribution]:
    return [
        Contribution.from_json(box.get(k))
        for k in box.list("fragments/")
        if k.endswith(".json") and "/contributions/" in k and keys.parse_contribution_record(k).learner == learner
    ]


def wait_for(condition, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize(("carry", "expected"), [(False, 5.0), (True, 7.0)])
def test_overlap_steps_bounds_training_past_a_publish(carry: bool, expected: float):
    """INV-5: training runs on for overlap_steps past a publish and only then waits for the commit.

    INV-9: with ``carry_unmerged`` the two steps trained while the round was in flight are carried
    onto the commit (5 + 2); the guide's behaviour (False) replaces them with it.
    """
    box = gm.MemoryMailbox()
    model = numpy_model(0.0)
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
    algorithm = gm.DiLoCo.local_sgd(sync_every=5, overlap_steps=2, carry_unmerged=carry)
    with gm.Session(model, algorithm=algorithm, mailbox=box, learner_id="solo", options=options) as session:
        for _ in range(7):  # publish at 5, train 6 and 7, then wait for the commit before going on
            for value in model.values():
                value += 1.0
            session.step(samples=2)
        assert session.versions == {0: 1}
        assert session.stats.blocked_s >= 0.0
        np.testing.assert_array_equal(model["mlp.weight"], np.full((3, 2), expected, np.float32))
    record = RunStore(box).read_round(0, 1)
    assert [(p.steps, p.samples, p.carried_steps) for p in record.participants] == [(5, 10, 0)]


def test_mixing_blends_local_training_with_the_commit():
    box = gm.MemoryMailbox()
    model = numpy_model(0.0)
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
    algorithm = gm.DiLoCo.local_sgd(sync_every=4, overlap_steps=1, mixing=0.5, carry_unmerged=False)
    with gm.Session(model, algorithm=algorithm, mailbox=box, learner_id="solo", options=options) as session:
        for _ in range(5):  # publish at 4 (params = 4), step 5 (params = 5) waits and aligns
            for value in model.values():
                value += 1.0
            session.step(samples=1)
        # θ ← 0.5·θ_local + 0.5·θ_commit = 0.5·5 + 0.5·4
        np.testing.assert_allclose(model["mlp.weight"], np.full((3, 2), 4.5, np.float32))


def test_in_flight_bounds_fragments_awaiting_a_commit():
    box = gm.MemoryMailbox()
    model = numpy_model(0.0)
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01, run_syncer=False, commit_timeout_s=0.5)
    algorithm = gm.DiLoCo(sync_every=4, fragments=2, in_flight=1)
    session = gm.Session(model, algorithm=algorithm, mailbox=box, learner_id="solo", options=options)
    session.open()
    for _ in range(8):  # fragment 0 due at 2 and 6, fragment 1 at 4 and 8; nobody commits
        session.step(samples=1)
    session.wait_published()
    assert [c.fragment for c in published(box, "solo")] == [0]
    session.close(wait=False)


def test_flush_on_close_commits_final_contributions_without_momentum():
    box = gm.MemoryMailbox()
    model = numpy_model(1.0)
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
    algorithm = gm.DiLoCo(sync_every=100, flush_on_close=True)
    with gm.Session(model, algorithm=algorithm, mailbox=box, learner_id="solo", options=options) as session:
        for _ in range(3):
            for value in model.values():
                value -= 0.5
            session.step(samples=4)
    store = RunStore(box)
    record = store.read_round(0, 1)
    assert record.final and record.participants[0].steps == 3
    committed = store.blobs.read_tensors(record.params)
    # a lone final contribution: Θ − Δ = the learner's own parameters, no 1.33× momentum step
    np.testing.assert_array_equal(committed["mlp.weight"], np.full((3, 2), -0.5, np.float32))
    np.testing.assert_array_equal(model["mlp.weight"], committed["mlp.weight"])


def test_without_flush_close_drops_steps_since_the_last_contribution():
    box = gm.MemoryMailbox()
    model = numpy_model(1.0)
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
    algorithm = gm.DiLoCo(sync_every=100, flush_on_close=False)  # the guide's close
    with gm.Session(model, algorithm=algorithm, mailbox=box, learner_id="solo", options=options) as session:
        for _ in range(3):
            for value in model.values():
                value -= 0.5
            session.step(samples=4)
    assert RunStore(box).committed_versions(0) == [0]
    np.testing.assert_array_equal(model["mlp.weight"], np.full((3, 2), 1.0, np.float32))


def test_a_learner_publishes_early_when_the_round_is_one_short_of_quorum():
    box = gm.MemoryMailbox()
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01, run_syncer=False)
    algorithm = gm.DiLoCo(sync_every=50, quorum_size=2)
    model = numpy_model(0.0)
    with gm.Session(model, algorithm=algorithm, mailbox=box, learner_id="me", options=options) as session:
        session.step(samples=3)
        assert published(box, "me") == []
        store = RunStore(box)
        contribute(store, "other", 0, numpy_model(0.5), 7, 21)  # the round now lacks one snapshot

        def stepped_until_published() -> bool:
            session.step(samples=3)
            session.wait_published()
            return bool(published(box, "me"))

        wait_for(stepped_until_published)
        (early,) = published(box, "me")
        assert early.anchor_version == 0 and early.steps < 50 and early.samples == 3 * early.steps
        session.close(wait=False)


@pytest.mark.slow
def test_after_aligning_a_fragment_is_next_due_a_period_later():
    """The schedule follows the run's rounds: aligned with a commit at step 7, the learner's next
    exchange is at 17, not at its own step 10 (the guide's behaviour: aligning replaced its work)."""
    box = gm.MemoryMailbox()
    algorithm = gm.DiLoCo(sync_every=10, carry_unmerged=False)
    model = numpy_model(0.0)
    with gm.Session(model, algorithm=algorithm, mailbox=box, learner_id="me", options=QUIET) as session:
        aligned_at = train_until_a_commit_of_another_learner(session, box)
        while session.stats.steps < 16:  # its own step 10 passes by
            session.step(samples=1)
        session.wait_published()
        assert published(box, "me") == []
        session.step(samples=1)
        session.wait_published()
        assert [(c.anchor_version, c.steps) for c in published(box, "me")] == [(1, 17 - aligned_at)]
        session.close(wait=False)


@pytest.mark.slow
def test_work_a_commit_did_not_merge_is_carried_into_the_next_contribution():
    """INV-9: a commit that merged nothing of ours does not reset our work: at its next exchange
    (a period after aligning, step 17) the learner publishes all 17 steps against the new
    version, the 7 before it as carried."""
    box = gm.MemoryMailbox()
    model = numpy_model(0.0)
    with gm.Session(model, algorithm=gm.DiLoCo(sync_every=10), mailbox=box, learner_id="me", options=QUIET) as session:
        aligned_at = train_until_a_commit_of_another_learner(session, box, move_by=1.0)
        # the learner's own 6+ steps of +1 were re-expressed on the commit, not replaced by it
        committed = committed_params(RunStore(box), 1)
        np.testing.assert_allclose(model["mlp.weight"], committed["mlp.weight"] + aligned_at, rtol=1e-6)
        while session.stats.steps < aligned_at + 10:
            move(model, 1.0)
            session.step(samples=1)
        session.wait_published()
        (contribution,) = published(box, "me")
        assert (contribution.anchor_version, contribution.steps, contribution.carried_steps) == (1, 17, aligned_at)
        delta = payload.decode(box.get(contribution.payload.key))[0]
        np.testing.assert_allclose(delta["mlp.weight"], np.full((3, 2), -17.0), rtol=1e-6)  # every step, none lost
        store = RunStore(box)
        syncer_on(store, store.read_spec(), "test-syncer").run_once()  # the round merging it, then its replay (INV-4)
        record = store.read_round(0, 2)
        assert [(p.learner, p.steps, p.carried_steps) for p in record.participants] == [("me", 17, aligned_at)]
        replayed = replay_round(store, NUMPY, store.read_spec(), 0, 2)
        assert payload.encode({n: NUMPY.to_numpy(t) for n, t in replayed.items()}) == store.blobs.read(record.params)
        session.close(wait=False)


@pytest.mark.slow
def test_work_past_the_carry_limit_is_dropped_and_reported_with_its_reason():
    """INV-9: unmerged work a commit passed by before, spanning more than max_carried_steps, is
    re-aligned, not carried, and the next merged contribution reports it; the round record lists
    it with reason carry_limit. (Passed by once, it is carried: the steps were trained on the
    anchor the commit follows.)"""
    box = gm.MemoryMailbox()
    model = numpy_model(0.0)
    algorithm = gm.DiLoCo(sync_every=10, max_carried_steps=3)
    with gm.Session(model, algorithm=algorithm, mailbox=box, learner_id="me", options=QUIET) as session:
        train_until_a_commit_of_another_learner(session, box, move_by=1.0)
        (view, *_) = session.ledger
        assert (view.carried, view.dropped_steps) == (7, 0), view.describe()  # one version behind: carried
        store = RunStore(box)
        contribute(store, "other", 1, numpy_model(0.7), 4, 4, sequence=2)
        syncer_on(store, store.read_spec(), "test-syncer").run_once()
        assert store.newest_version(0) == 2
        time.sleep(1.5 * QUIET.poll_interval_s)
        move(model, 1.0)
        session.step(samples=1)  # aligns with version 2: the 7 carried steps are passed by again
        assert session.versions[0] == 2 and session.stats.steps == 8
        np.testing.assert_array_equal(model["mlp.weight"], committed_params(store, 2)["mlp.weight"])  # dropped
        while session.stats.steps < 8 + 10:  # next due a period after aligning
            session.step(samples=1)
        session.wait_published()
        (contribution,) = published(box, "me")
        assert contribution.carried_steps == 0 and contribution.steps == 10
        assert [(r.steps, r.samples, r.reason, r.at_version) for r in contribution.realigned] == [(8, 8, "carry_limit", 2)]
        store = RunStore(box)
        syncer_on(store, store.read_spec(), "test-syncer").run_once()
        (participant,) = store.read_round(0, 3).participants
        assert participant.realigned == contribution.realigned
        session.close(wait=False)


@pytest.mark.slow
def test_work_since_a_merged_contribution_is_carried_past_the_carry_limit_when_the_commit_is_slow():
    """INV-9: a commit that merges our contribution long after it was published (a takeover, a
    slow round) finds the work since its snapshot one version behind, not stale: it is carried
    past max_carried_steps, up to what the next contribution may hold, and nothing is dropped."""
    box = gm.MemoryMailbox()
    model = numpy_model(0.0)
    algorithm = gm.DiLoCo(sync_every=10, max_carried_steps=3)
    with gm.Session(model, algorithm=algorithm, mailbox=box, learner_id="me", options=QUIET) as session:
        for _ in range(10):
            move(model, 1.0)
            session.step(samples=1)
        session.wait_published()
        (first,) = published(box, "me")
        assert first.steps == 10
        for _ in range(12):  # the commit is slow: 12 steps, four times the carry limit
            move(model, 1.0)
            session.step(samples=1)
        store = RunStore(box)
        syncer_on(store, store.read_spec(), "test-syncer").run_once()
        assert store.newest_version(0) == 1
        time.sleep(1.5 * QUIET.poll_interval_s)  # the exchange's next look fetches the commit
        move(model, 1.0)
        session.step(samples=1)  # the step aligns with it: 13 steps since the merged snapshot
        assert session.versions[0] == 1
        (view, *_) = session.ledger
        assert (view.merged, view.carried, view.dropped_steps) == (10, 13, 0), view.describe()
        assert view.balanced
        session.close(wait=False)


@pytest.mark.slow
def test_a_learner_waits_for_a_commit_rather_than_train_more_than_its_next_contribution_holds():
    """A commit long in coming (a syncer takeover): once the steps since its publish fill what the
    next contribution can hold (RunSpec.carry_room_steps), the learner waits for the commit
    instead of training work the alignment would drop; then nothing is dropped."""
    import threading

    box = gm.MemoryMailbox()
    model = numpy_model(0.0)
    options = gm.SessionOptions(lease_ttl_s=10.0, poll_interval_s=0.2, run_syncer=False, commit_timeout_s=20.0)
    with gm.Session(model, algorithm=gm.DiLoCo(sync_every=10), mailbox=box, learner_id="me", options=options) as session:
        store = RunStore(box)
        room = store.read_spec().carry_room_steps
        assert room == 70  # 8·H the syncer accepts, less the period the next contribution adds
        for _ in range(10):
            move(model, 1.0)
            session.step(samples=1)
        session.wait_published()

        def commit_later() -> None:
            time.sleep(1.0)
            syncer_on(store, store.read_spec(), "test-syncer").run_once()

        committer = threading.Thread(target=commit_later)
        committer.start()
        started = time.monotonic()
        for _ in range(room):
            move(model, 1.0)
            session.step(samples=1)  # the last of them waits for the commit
        waited = time.monotonic() - started
        committer.join()
        assert session.versions[0] == 1 and waited >= 0.9 and session.stats.blocked_s >= 0.5
        (view, *_) = session.ledger
        assert (view.merged, view.carried, view.dropped_steps) == (10, room, 0), view.describe()
        session.close(wait=False)


def move(model: dict[str, np.ndarray], by: float) -> None:
    for value in model.values():
        value += by


QUIET = gm.SessionOptions(lease_ttl_s=2.0, poll_interval_s=1.0, run_syncer=False, commit_timeout_s=1.0)
"""A learner whose exchange looks at the mailbox once a second and that never closes rounds,
so a test can commit a round between two of its looks (it never sees that round open)."""


def train_until_a_commit_of_another_learner(session: gm.Session, box: gm.Mailbox, move_by: float = 0.0) -> int:
    """Train 6 steps, commit another learner's contribution as version 1, align with it; the step it aligned at."""
    for _ in range(6):
        move(session.model, move_by)
        session.step(samples=1)
    store = RunStore(box)
    contribute(store, "other", 0, numpy_model(0.5), 4, 4)
    syncer_on(store, store.read_spec(), "test-syncer").run_once()
    assert store.newest_version(0) == 1
    time.sleep(1.5 * QUIET.poll_interval_s)  # the exchange's next look fetches the commit
    move(session.model, move_by)
    session.step(samples=1)  # the step aligns with it
    assert session.versions[0] == 1 and session.stats.steps == 7
    return 7


def test_names_that_are_no_key_of_the_layout_are_skipped_counted_and_logged_once(run, caplog):
    """INV-7: objects whose names hold an invalid learner id (``a=b``, ``..``, 65 characters) or
    match no key at all, dropped among the contributions, rounds, versions and leases, never stop
    a pass: the round commits the real contribution, each name is counted once and logged once."""
    box, store, spec, syncer = run
    junk = [
        keys.contributions_prefix(0, 0) + "a=b-0000000001.json",
        keys.contributions_prefix(0, 0) + "..-0000000001.json",
        keys.contributions_prefix(0, 0) + "x" * 65 + "-0000000001.json",
        keys.contributions_prefix(0, 0) + "stray.txt",
        keys.rounds_prefix(0) + "0000000009.json.bak",
        keys.versions_prefix(0) + "0000000001/params-a=b.ff.safetensors",
        keys.LEARNER_LEASES + "a=b.json",
    ]
    for name in junk:
        box.put(name, b"{}")
    contribute(store, "good", 0, numpy_model(2.0), 10, 80)
    with caplog.at_level("WARNING", logger="gradientmail.store.run_store"):
        for _ in range(3):
            syncer.run_once()
    assert store.newest_version(0) == 1
    assert [p.learner for p in store.read_round(0, 1).participants] == ["good"]
    with caplog.at_level("WARNING", logger="gradientmail.store.run_store"):  # every listing a name sits in
        assert {c.learner for c in store.contributions(0)} == {"good"} and 1 in store.committed_versions(0)
        assert "a=b" not in store.leases.learners() and 1 in store.version_blobs(0)
    assert store.unparsable_keys == len(junk)
    skipped = [r.getMessage() for r in caplog.records if "not a name of the run's key layout" in r.getMessage()]
    assert [sum(repr(name) in message for message in skipped) for name in junk] == [1] * len(junk)  # once each
    contribute(store, "good", 1, numpy_model(2.5), 10, 80)
    syncer.run_once()
    assert store.newest_version(0) == 2


@pytest.mark.slow
def test_a_flood_of_records_cannot_crowd_out_a_live_learner_or_oversize_the_round_record(run):
    """INV-7, INV-12: 1,100 junk contribution records under leased ids, listed before the
    contribution of the learner that was in the round before: the round examines at most
    ROUND_CONTRIBUTION_LIMIT, that learner's first, rejects the rest ``flood`` unread, lists 256
    rejections and counts the rest by reason, and commits."""
    from gradientmail.records.models import MAX_LISTED_REJECTIONS
    from gradientmail.store import LearnerLease
    from gradientmail.syncer.bounds import ROUND_CONTRIBUTION_LIMIT

    box, store, spec, _ = run
    clock = FakeClock()
    syncer = SyncerRuntime(store, NUMPY, spec, "syncer-node", lease_ttl_s=10.0, poll_interval_s=0.2, clock=clock)
    LearnerLease(store, "zz-real", 10.0).renew({})
    contribute(store, "zz-real", 0, numpy_model(2.0), 10, 80)
    syncer.run_once()
    assert store.round_exists(0, 1)
    junk = 1100
    for i in range(junk):  # ids that sort before the real one, as a listing returns them, each with a lease
        LearnerLease(store, f"a{i:05d}", 10.0).renew({})
        box.put(keys.contribution_record(0, 1, f"a{i:05d}", 1), b"{}")
    contribute(store, "zz-real", 1, numpy_model(3.0), 10, 80)
    for _ in range(100):  # the junk ids count as live until their leases expire: the round waits its grace window
        syncer.run_once()
        if store.round_exists(0, 2):
            break
        clock.now += 0.5
    record = store.read_round(0, 2)
    assert [p.learner for p in record.participants] == ["zz-real"]
    assert len(record.rejected) == MAX_LISTED_REJECTIONS
    assert len(record.rejected) + sum(record.rejections_omitted.values()) == junk
    flooded = junk - (ROUND_CONTRIBUTION_LIMIT - 1)
    listed_flood = sum(r.reason == "flood" for r in record.rejected)
    assert record.rejections_omitted.get("flood", 0) + listed_flood == flooded
    assert record.rejections_omitted.get("malformed", 0) + sum(r.reason == "malformed" for r in record.rejected) == junk - flooded


def test_records_under_made_up_ids_cost_a_pass_a_few_reads_and_never_hold_a_round_up(run):
    """INV-7: 1,100 junk records under ids that are neither live nor in the round before: a pass
    reads at most STRANGERS_PER_PASS of them, the live learner's round commits in that pass,
    and the rest are judged stale by name in the next round (no read)."""
    from gradientmail.store import LearnerLease
    from gradientmail.syncer.round_state import STRANGERS_PER_PASS

    box, store, spec, syncer = run
    LearnerLease(store, "zz-real", 10.0).renew({})
    junk = 1100
    for i in range(junk):
        box.put(keys.contribution_record(0, 0, f"a{i:05d}", 1), b"{}")
    contribute(store, "zz-real", 0, numpy_model(2.0), 10, 80)
    syncer.run_once()
    record = store.read_round(0, 1)
    assert [p.learner for p in record.participants] == ["zz-real"]
    assert [r.reason for r in record.rejected] == ["malformed"] * STRANGERS_PER_PASS
    contribute(store, "zz-real", 1, numpy_model(3.0), 10, 80)
    syncer.run_once()
    after = store.read_round(0, 2)
    assert [p.learner for p in after.participants] == ["zz-real"]
    stale = sum(r.reason == "stale" for r in after.rejected) + after.rejections_omitted.get("stale", 0)
    assert stale == junk - STRANGERS_PER_PASS


def test_a_replayed_head_cannot_point_a_joiner_or_a_new_syncer_back(run, caplog):
    """INV-15: the head saved when version 1 was newest, put back after versions 2 and 3 (the
    record of 2 collected, as retention does): finding the newest without a known version takes
    the newer of the head and the listing, and logs the head it ignored."""
    box, store, spec, syncer = run
    contribute(store, "a", 0, numpy_model(2.0), 10, 80)
    syncer.run_once()
    old_head = box.get(keys.head(0))
    for base in (1, 2):
        contribute(store, "a", base, numpy_model(2.0 + base), 10, 80)
        syncer.run_once()
    assert store.newest_version(0) == 3
    box.delete(keys.round_record(0, 2))
    box.put(keys.head(0), old_head)
    with caplog.at_level("WARNING", logger="gradientmail.store.run_store"):
        assert store.newest_version(0) == 3
    assert any("names version 1, behind version 3" in r.getMessage() for r in caplog.records)


def test_a_huge_finite_delta_is_an_outlier_from_the_first_round(run):
    """INV-12: before any history, a delta of 1e4 per element (finite, and 10⁵ × the parameters'
    norm) is rejected as ``outlier``; an honest one in the same round is merged."""
    box, store, spec, syncer = run
    contribute(store, "mallory", 0, numpy_model(1.0 - 1e4), 10, 80)  # Δ = anchor − local = 1e4 per element
    contribute(store, "honest", 0, numpy_model(1.5), 10, 80)
    syncer.run_once()
    record = store.read_round(0, 1)
    assert [p.learner for p in record.participants] == ["honest"]
    assert {r.learner: r.reason for r in record.rejected} == {"mallory": "outlier"}
    assert np.abs(committed_params(store, 1)["mlp.weight"]).max() < 10


def test_an_insiders_x1000_delta_in_the_first_round_is_an_outlier_by_the_rounds_majority(run):
    """INV-12, issue 43 case 6: before any history, a delta 1000x the honest ones but within the
    parameters' bound (10 per element against parameters of 1) is rejected ``outlier`` at close by
    the round's own lower median; the two honest deltas are merged and move the parameters as
    they would alone."""
    box, store, spec, syncer = run
    contribute(store, "alice", 0, numpy_model(1.0 - 0.01), 10, 80)
    contribute(store, "bob", 0, numpy_model(1.0 - 0.012), 10, 80)
    contribute(store, "mallory", 0, numpy_model(1.0 - 10.0), 10, 80)
    syncer.run_once()
    record = store.read_round(0, 1)
    assert sorted(p.learner for p in record.participants) == ["alice", "bob"]
    assert {r.learner: r.reason for r in record.rejected} == {"mallory": "outlier"}
    assert "round's typical" in record.rejected[0].detail
    assert np.abs(committed_params(store, 1)["mlp.weight"] - 1.0).max() < 0.1
