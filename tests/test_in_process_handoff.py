"""A node that both trains and holds the election hands its own bytes across in memory: its syncer
takes the contribution its learner just wrote (record and arrays) instead of reading it back, and
its learner takes the commit its syncer just wrote (record and parameters). The mailbox holds the
same bytes either way, so replay reproduces the commit (INV-4), and what is handed is still checked
as what is read (names, shapes and dtypes; counts and staleness)."""

from __future__ import annotations

import numpy as np

import gradientmail as gm
from gradientmail.backends import get_backend
from gradientmail.backends.host import HostBuffer
from gradientmail.mailbox import ForwardingMailbox
from gradientmail.session.fragment import LearnerFragment, Publication
from gradientmail.session.join import RunProposal, join_run
from gradientmail.session.node_loops import NodeLoops
from gradientmail.store import ContributionCounts, RunStore
from gradientmail.syncer.rounds import Handed, fetch_contribution, replay_round
from tests.fake_clock import FakeClock

NUMPY = get_backend("numpy")


class ReadsByKey(ForwardingMailbox):
    """Forwards everything, noting the key of every read of an object's bytes."""

    def __init__(self, inner: gm.MemoryMailbox) -> None:
        super().__init__(inner)
        self.read: list[str] = []

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        self.read.append(key)
        return self.inner.get(key, max_bytes=max_bytes)

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        self.read.append(key)
        return self.inner.get_versioned(key, max_bytes=max_bytes)


def one_node() -> tuple[NodeLoops, ReadsByKey, RunStore, gm.MemoryMailbox]:
    box = gm.MemoryMailbox()
    model = {"w": np.zeros(64, np.float32)}
    spec, _ = join_run(RunStore(box), NUMPY, model, RunProposal(gm.DiLoCo(sync_every=10), lease_ttl_s=10.0), "solo")
    anchor = RunStore(box).read_params(spec, RunStore(box).read_round(0, 0))
    reads = ReadsByKey(box)
    loops = NodeLoops(
        RunStore(reads),
        spec,
        "solo",
        [LearnerFragment.joined(0, ["w"], anchor, 0)],
        backend=NUMPY,
        poll_interval_s=0.2,
        idle_interval_s=None,
        on_change=lambda: None,
        lease_info=dict,
        clock=FakeClock(),
    )
    loops.start(threads=False)
    loops.passes()[3].run()  # the rounds pass: version 0 loaded
    publication = Publication(0, 0, anchor, HostBuffer({"w": np.full(64, -0.25, np.float32)}), ContributionCounts(4, 32))
    loops.exchange.publish(publication)
    return loops, reads, RunStore(box), box


def test_the_syncer_and_the_learner_of_one_node_take_each_others_bytes_unread_and_replay_agrees():
    loops, reads, store, _ = one_node()
    reads.read.clear()
    loops.exchange.exchange_pass()  # uploads, hands the contribution to the syncer
    syncer = loops.syncer
    assert syncer is not None
    syncer.rounds_pass()  # takes it, closes the round (every live learner is in), commits, hands it back
    assert syncer.commits == 1
    loops.exchange.exchange_pass()  # takes the commit
    assert loops.exchange.known_versions == (1,)
    assert not [key for key in reads.read if "/contributions/" in key or "/versions/" in key]  # no payload read back
    spec = store.read_spec()
    committed = store.read_params(spec, store.read_round(0, 1))
    np.testing.assert_array_equal(replay_round(store, NUMPY, spec, 0, 1)["w"], committed["w"])  # INV-4
    ready = loops.exchange.take_ready()[0]
    np.testing.assert_array_equal(ready.params["w"], committed["w"])
    assert ready.params["w"] is not committed["w"]


def test_a_handed_contribution_is_checked_as_a_read_one():
    """A handed payload of another shape is ``incompatible``, as the same bytes read back would be."""
    box = gm.MemoryMailbox()
    store = RunStore(box)
    spec, _ = join_run(
        store, NUMPY, {"w": np.zeros(8, np.float32)}, RunProposal(gm.DiLoCo(sync_every=10), lease_ttl_s=10.0), "solo"
    )
    published = store.publish_contribution("solo", 0, 0, {"w": np.ones(8, np.float32)}, ContributionCounts(4, 4))
    wrong = Handed(published.key, published.record, {"w": np.ones(7, np.float32)})
    outcome = fetch_contribution(store, spec, 0, published.key, wrong)
    assert outcome.reason == "incompatible"  # type: ignore[union-attr]
    right = fetch_contribution(
        store, spec, 0, published.key, Handed(published.key, published.record, {"w": np.ones(8, np.float32)})
    )
    assert not hasattr(right, "reason")
