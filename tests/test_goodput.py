"""Goodput: what the training thread pays for at a sync point, and how the loops poll around a round.

Behaviour only, no timed assertions: which thread calls what, and the pauses the loops choose.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.algorithms import align as align_module
from gradientmail.backends import get_backend
from gradientmail.backends.host import HostBuffer
from gradientmail.backends.numpy_backend import NumpyBackend
from gradientmail.polling import FAST_INTERVAL_S, PollingLoop
from gradientmail.session.exchange import Exchange
from gradientmail.session.fragment import LearnerFragment, Publication
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import ContributionCounts, LearnerLease, RunStore
from gradientmail.store import run_store as run_store_module
from gradientmail.syncer import SyncerRuntime
from tests.fake_clock import FakeClock

NUMPY = get_backend("numpy")


# -- PollingLoop ----------------------------------------------------------------------------


def test_a_hurry_tightens_the_pause_then_backs_off_to_the_interval():
    clock = FakeClock()
    loop = PollingLoop("t", lambda: None, 0.2, clock=clock)
    assert loop.next_pause() == 0.2
    loop.hurry(for_s=10.0)
    pauses = []
    while True:
        pause = loop.next_pause()
        clock.now += pause
        if pause == 0.2:
            break
        pauses.append(pause)
    assert pauses[0] == FAST_INTERVAL_S
    assert pauses == sorted(pauses) and all(p < 0.2 for p in pauses)
    assert len(pauses) <= 20  # a bounded number of extra passes per hurry
    assert not loop.hurrying
    assert loop.next_pause() == 0.2


def test_a_hurry_ends_at_its_bound_or_when_settled():
    clock = FakeClock()
    loop = PollingLoop("t", lambda: None, 10.0, clock=clock)  # a long interval: the bound ends it first
    loop.hurry(for_s=0.5)
    while loop.next_pause() < 10.0:
        clock.now += 0.1
        assert clock.now < 1.0
    assert loop.next_pause() == 10.0
    loop.hurry(for_s=60.0)
    assert loop.next_pause() == FAST_INTERVAL_S
    loop.settle()  # what it waited for happened
    assert loop.next_pause() == 10.0


def test_pause_at_most_shortens_only_the_next_pause():
    loop = PollingLoop("t", lambda: None, 0.2, clock=FakeClock())
    loop.pause_at_most(0.05)
    loop.pause_at_most(0.07)
    assert loop.next_pause() == 0.05
    assert loop.next_pause() == 0.2


def test_a_wake_up_runs_the_next_pass_without_waiting_the_interval():
    passes = threading.Semaphore(0)
    loop = PollingLoop("t", passes.release, 3600.0)
    loop.start()
    try:
        assert passes.acquire(timeout=30)  # the first pass runs at once
        loop.wake()
        assert passes.acquire(timeout=30)  # an hour's interval: only the wake-up can run it
        loop.hurry(for_s=3600.0)  # from another thread a hurry looks now, too
        assert passes.acquire(timeout=30)
    finally:
        loop.stop()


# -- the training thread ---------------------------------------------------------------------


class RecordingMailbox(gm.MemoryMailbox):
    """Records the threads that write to the mailbox."""

    def __init__(self, writers: list[str]) -> None:
        super().__init__()
        self._writers = writers

    def create(self, key, data, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._writers.append(threading.current_thread().name)
        return super().create(key, data, *args, **kwargs)

    def put(self, key, data, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._writers.append(threading.current_thread().name)
        return super().put(key, data, *args, **kwargs)


@pytest.mark.parametrize(("carry", "overlap"), [(True, None), (True, 0), (False, None)])
def test_the_training_thread_only_snapshots_and_writes(monkeypatch, carry: bool, overlap: int | None):
    """At a sync point step() copies the fragment to a host buffer and, aligning, adds a correction
    the exchange computed: the delta, encoding, sha256, the correction and uploads all happen on
    other threads."""
    calls: dict[str, list[str]] = {"delta": [], "encode": [], "sha256": [], "correction": [], "add_in_place": []}
    stepping = threading.Event()

    def recorded(name, fn):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            if stepping.is_set() and threading.current_thread() is threading.main_thread():
                calls[name].append(threading.current_thread().name)
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(align_module, "pseudo_gradient", recorded("delta", align_module.pseudo_gradient))
    monkeypatch.setattr(run_store_module.payload, "encode", recorded("encode", run_store_module.payload.encode))
    monkeypatch.setattr(run_store_module, "sha256_hex", recorded("sha256", run_store_module.sha256_hex))
    monkeypatch.setattr(align_module, "carry_correction", recorded("correction", align_module.carry_correction))
    monkeypatch.setattr(NumpyBackend, "add_in_place", recorded("add_in_place", NumpyBackend.add_in_place))
    writers: list[str] = []
    box = RecordingMailbox(writers)
    model = {"a": np.zeros((8, 4), np.float32), "b": np.zeros(6, np.float32)}
    algorithm = gm.DiLoCo(sync_every=4, fragments=2, quorum_size=1, overlap_steps=overlap, carry_unmerged=carry)
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
    with gm.Session(model, algorithm=algorithm, mailbox=box, learner_id="solo", options=options) as session:
        writers.clear()
        step = 0
        while session.stats.alignments < 6:
            assert step < 5000, "the commits never came"
            step += 1
            for value in model.values():
                value -= 0.01 * (step % 7)
            stepping.set()
            writes_before = len(writers)
            session.step(samples=2)
            stepping.clear()
            assert all(name != threading.main_thread().name for name in writers[writes_before:])
            time.sleep(0.002)  # let the background keep up (the test asserts threads, not times)
    corrected = calls.pop("add_in_place")
    assert calls == {"delta": [], "encode": [], "sha256": [], "correction": []}
    assert bool(corrected) == (carry and overlap is None)  # aligning added the exchange's correction
    assert writers  # the uploads happened, elsewhere


def test_snapshots_are_reused_once_the_exchange_lets_go():
    box = gm.MemoryMailbox()
    model = {"w": np.zeros(16, np.float32)}
    algorithm = gm.DiLoCo(sync_every=2, fragments=1, quorum_size=1, overlap_steps=0)
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
    with gm.Session(model, algorithm=algorithm, mailbox=box, learner_id="solo", options=options) as session:
        for _ in range(20):
            model["w"] -= 0.1
            session.step()
        assert session.stats.contributions >= 5
        assert len(session.fragments[0].buffers) <= 2  # not one per contribution


# -- the exchange and the syncer around a round --------------------------------------------


def make_run():
    box = gm.MemoryMailbox()
    store = RunStore(box)
    model = {"w": np.ones(4, np.float32)}
    algorithm = gm.DiLoCo(sync_every=4, fragments=1, quorum_size=1)
    spec, _ = join_run(store, NUMPY, model, RunProposal(algorithm, lease_ttl_s=10.0), "solo")
    return store, spec, model


def test_after_an_upload_the_exchange_hurries_until_the_commit_and_the_syncer_is_told():
    store, spec, _ = make_run()
    published: list[int] = []
    anchor = store.read_params(spec, store.read_round(0, 0))
    exchange = Exchange(
        store,
        spec,
        "solo",
        [LearnerFragment.joined(0, ["w"], anchor, 0)],
        lease_ttl_s=10.0,
        poll_interval_s=0.2,
        on_change=lambda: None,
        lease_info=dict,
        clock=FakeClock(),
        on_published=lambda fragment, handed: published.append(fragment),
    )
    syncer = SyncerRuntime(
        store, NUMPY, spec, "solo", poll_interval_s=0.2, on_commit=lambda c: exchange.commit_available(c.record.fragment)
    )
    snapshot = HostBuffer({"w": np.full(4, 0.5, np.float32)})
    publication = Publication(0, 0, anchor, snapshot, ContributionCounts(steps=4, samples=4))
    exchange.publish(publication)
    assert snapshot.held
    exchange.exchange_pass()
    assert published == [0]
    assert exchange.loop.hurrying and exchange.loop.next_pause() == FAST_INTERVAL_S
    syncer.contribution_published(0)
    assert syncer.loop.hurrying
    syncer.run_once()
    assert syncer.commits == 1
    exchange.exchange_pass()  # the wake-up from the syncer: probes the fragment, fetches the commit
    commit = exchange.take_ready()[0]
    assert commit.version == 1 and commit.merged is publication  # the exchange's one decision
    assert commit.carry_start is snapshot.arrays
    np.testing.assert_allclose(commit.correction["w"], commit.params["w"] - 0.5)  # type: ignore[index]
    assert not snapshot.held  # taken: the learner aligns now, the buffer is free again
    assert not exchange.loop.hurrying and exchange.loop.next_pause() == pytest.approx(10.0 / 3)  # idle: TTL/3
    assert len(exchange.publish_to_commit_s) == 1


def test_the_syncer_times_its_next_pass_for_the_end_of_a_grace_window():
    store, spec, _ = make_run()
    clock = FakeClock()
    syncer = SyncerRuntime(store, NUMPY, spec, "solo", poll_interval_s=0.2, clock=clock)
    LearnerLease(store, "b", 10.0).renew({})  # another live learner: the round waits its grace window
    syncer.run_once()
    assert not syncer.loop.hurrying and syncer.loop.next_pause() == 0.2
    anchor = store.read_params(spec, store.read_round(0, 0))
    delta = {"w": anchor["w"] - 0.5}
    store.publish_contribution("a", 0, 0, delta, ContributionCounts(steps=4, samples=4, step_time_s=10.0))
    syncer.grace_estimator(0).observe_step_times([10.0])  # a known step time: the window will be open
    syncer.loop.settle()
    clock.now += 1.0
    syncer.rounds_pass()  # a full pass: sees the contribution, quorum of one, grace pending
    assert syncer.commits == 0
    current = syncer.open_round(0)
    assert current is not None and current.quorum_at is not None and current.grace_s > 0
    pause = syncer.loop.next_pause()
    assert pause <= current.grace_s


def test_a_torch_snapshot_holds_the_parameters_at_the_publish_in_the_preallocated_buffer():
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 3)
    algorithm = gm.DiLoCo(sync_every=2, fragments=1, quorum_size=1)
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
    with gm.Session(model, algorithm=algorithm, mailbox=gm.MemoryMailbox(), learner_id="t", options=options) as session:
        preallocated = list(session.fragments[0].buffers)
        while session.stats.contributions == 0:
            with torch.no_grad():
                model.weight -= 0.1
            session.step()
        outstanding = session.fragments[0].outstanding
        assert outstanding is not None and outstanding.snapshot in preallocated
        snapshot = outstanding.snapshot
        for name, param in model.named_parameters():
            np.testing.assert_array_equal(snapshot.arrays[name], param.detach().numpy())
