"""The rounds bulletin in the syncer lease (``store/bulletin.py``): what a learner follows instead of
probing every fragment, and why following it is safe (INV-22: a hint sets when a learner looks,
never what it accepts)."""

from __future__ import annotations

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.backends import get_backend
from gradientmail.backends.host import HostBuffer
from gradientmail.records import Lease
from gradientmail.session.fragment import LearnerFragment, Publication
from gradientmail.session.join import RunProposal, join_run
from gradientmail.session.looking import BULLETIN_CHECK_TTLS, LearnerSchedule, due_lead_s
from gradientmail.session.node_loops import NodeLoops
from gradientmail.store import ContributionCounts, OpenRoundNote, RoundsBulletin, RunStore
from gradientmail.syncer import SyncerRuntime
from tests.fake_clock import FakeClock
from tests.node_sim import CountingMailbox

NUMPY = get_backend("numpy")
TTL_S = 10.0
POLL_S = 0.2


def syncer_lease(info: dict[str, object], *, released: bool = False, kind: str = "syncer") -> Lease:
    return Lease(kind=kind, holder="s", term=1, sequence=1, ttl_s=TTL_S, released=released, info=info)  # type: ignore[arg-type]


def test_a_bulletin_round_trips_through_the_lease_info():
    bulletin = RoundsBulletin((3, -1, 7), {0: OpenRoundNote(3, 2, None), 2: OpenRoundNote(7, 1, 1.25)})
    assert RoundsBulletin.from_lease(syncer_lease(bulletin.to_info()), 3) == bulletin
    assert RoundsBulletin.from_lease(syncer_lease({**bulletin.to_info(), "dedicated": True}), 3) == bulletin


@pytest.mark.parametrize(
    "info",
    [
        {},  # an older node's lease: no bulletin
        {"heads": [1, 2]},  # another fragment count
        {"heads": [-2, 0, 0]},
        {"heads": [True, 0, 0]},
        {"heads": ["1", 0, 0]},
        {"heads": [1, 0, 0], "open": [[3, 1, 1, None]]},  # no such fragment
        {"heads": [1, 0, 0], "open": [[0, 1, 1]]},  # an entry of three
        {"heads": [1, 0, 0], "open": [[0, 1, -1, None]]},
        {"heads": [1, 0, 0], "open": [[0, 1, 1, -3.0]]},
        {"heads": [1, 0, 0], "open": [[0, 1, 1, "soon"]]},
        {"heads": [1, 0, 0], "open": {"0": [1, 1, None]}},
        {"heads": [1, 0, 0], "open": [[0, 1, 1, None]] * 4},  # more rounds than fragments
    ],
)
def test_a_malformed_bulletin_is_not_followed(info):
    """INV-22: anything but a well-formed bulletin of the run's fragment count is no bulletin: the
    learner probes every fragment itself, as without one."""
    assert RoundsBulletin.from_lease(syncer_lease(info), 3) is None


def test_a_released_or_learner_lease_carries_no_bulletin():
    info = RoundsBulletin((1,)).to_info()
    assert RoundsBulletin.from_lease(syncer_lease(info, released=True), 1) is None
    assert RoundsBulletin.from_lease(syncer_lease(info, kind="learner"), 1) is None
    assert RoundsBulletin.from_lease(None, 1) is None


class Run:
    """One run on a memory mailbox: a syncer node ``s`` (its runtime only) and a learner-only
    node ``a`` (its exchange, passes run by hand on a fake clock)."""

    def __init__(self, schedule: LearnerSchedule | None = None) -> None:
        self.clock = FakeClock()
        self.box = gm.MemoryMailbox()
        self.store = RunStore(self.box)
        algorithm = gm.DiLoCo(sync_every=100, fragments=1)
        self.spec, _ = join_run(self.store, NUMPY, {"w": np.zeros(8, np.float32)}, RunProposal(algorithm, lease_ttl_s=TTL_S), "s")
        anchor = self.store.read_params(self.spec, self.store.read_round(0, 0))
        self.syncer = SyncerRuntime(self.store, NUMPY, self.spec, "s", poll_interval_s=POLL_S, clock=self.clock)
        self.syncer.run_once()  # elected, version 0 loaded
        self.clock.now += 2 * POLL_S
        self.syncer.election_pass()  # the announcement's renewal: the bulletin shows head 0
        self.schedule = schedule or LearnerSchedule()
        self.counted = CountingMailbox(self.box)
        self.learner = NodeLoops(
            RunStore(self.counted),  # type: ignore[arg-type]
            self.spec,
            "a",
            [LearnerFragment.joined(0, ["w"], anchor, 0)],
            backend=NUMPY,
            poll_interval_s=POLL_S,
            idle_interval_s=None,
            on_change=lambda: None,
            lease_info=dict,
            clock=self.clock,
            run_syncer=False,
            schedule=lambda: self.schedule,
        )
        self.learner.start(threads=False)

    def commit_one(self) -> None:
        """``s`` merges a contribution of its own into version 1 and renews its lease (bulletin: head 1)."""
        delta = {"w": np.full(8, 0.5, np.float32)}
        self.store.publish_contribution("s", 0, 0, delta, ContributionCounts(steps=4, samples=4))
        self.syncer.run_once()
        assert self.syncer.commits == 1
        self.clock.now += 2 * POLL_S
        self.syncer.election_pass()  # the announcement's renewal

    def write_bulletin(self, bulletin: RoundsBulletin) -> None:
        """Overwrite the syncer lease's bulletin (what a lagging or lying holder would write)."""
        found = self.store.leases.read_syncer()
        assert found is not None and found.lease is not None
        lease = found.lease.model_copy(update={"info": bulletin.to_info(), "sequence": found.lease.sequence + 1})
        self.store.leases.swap_syncer(lease, found.token)

    def known(self) -> int:
        return self.learner.exchange.known_versions[0]

    def run_for(self, seconds: float, max_passes: int = 100_000) -> int:
        """The learner's exchange passes, at the pauses its loop asks for, for ``seconds`` (or
        ``max_passes``, where a loop that asks for no pause would never end): how many ran."""
        loop = self.learner.exchange.loop
        end = self.clock.now + seconds
        passes = 0
        while self.clock.now < end and passes < max_passes:
            self.learner.exchange.exchange_pass()
            self.clock.now += max(loop.next_pause(), 1e-3)
            passes += 1
        return passes

    def publish(self) -> None:
        """``a`` hands over a contribution on version 0 and its exchange uploads it."""
        anchor = self.store.read_params(self.spec, self.store.read_round(0, 0))
        snapshot = HostBuffer({"w": np.full(8, 0.5, np.float32)})
        self.learner.exchange.publish(Publication(0, 0, anchor, snapshot, ContributionCounts(steps=4, samples=4)))
        self.learner.exchange.exchange_pass()


def test_a_learner_follows_the_bulletin_to_a_new_version_with_one_read_per_look():
    """Idle, a learner-only node reads the syncer lease once per look (the idle interval) and
    nothing else while nothing moves; when the bulletin shows a new version it fetches that."""
    run = Run()
    run.counted.counts.clear()
    run.run_for(3 * TTL_S)
    assert dict(run.counted.counts) == {"get_versioned": pytest.approx(9, abs=1)}  # one per TTL/3
    run.commit_one()
    run.run_for(TTL_S / 3 + POLL_S)
    assert run.known() == 1


def test_a_bulletin_naming_versions_that_do_not_exist_costs_a_probe_and_nothing_else():
    """INV-22: a learner that follows a bulletin still reads the round record and its verified
    blobs; a head that is not there moves nothing."""
    run = Run()
    run.write_bulletin(RoundsBulletin((50,)))
    run.run_for(TTL_S)
    assert run.known() == 0
    run.commit_one()  # the honest holder's next renewal puts the truth back
    run.run_for(TTL_S / 3 + POLL_S)
    assert run.known() == 1


def test_a_bulletin_that_hides_a_version_delays_an_idle_learner_at_most_its_check_interval():
    """INV-22: a learner that is not training checks one fragment in turn from its head pointer once
    per BULLETIN_CHECK_TTLS TTLs, whatever the bulletin says."""
    run = Run()
    run.commit_one()
    run.write_bulletin(RoundsBulletin((0,)))  # lags: says version 0
    run.run_for(BULLETIN_CHECK_TTLS * TTL_S + TTL_S)
    assert run.known() == 1


def test_a_training_learner_probes_a_fragment_before_its_publish_whatever_the_bulletin_says():
    """INV-22: the probe ``due_lead_s`` before a scheduled publish reads the fragment itself, so a
    contribution goes out on the newest version even when the bulletin lags."""
    run = Run()
    run.commit_one()
    run.write_bulletin(RoundsBulletin((0,)))
    run.run_for(TTL_S)  # looks follow the lagging bulletin; no check is due yet
    assert run.known() == 0
    run.schedule = LearnerSchedule(period_s=60.0, due_in_s=(due_lead_s(POLL_S) / 2,), due_steps=(100,))
    run.run_for(POLL_S)
    assert run.known() == 1


def test_the_syncer_announces_an_open_round_and_a_learner_sees_it_to_join():
    """The holder renews its lease once a contribution is accepted; a learner that follows the
    bulletin learns of the round open on its version (``open_rounds``, what the session joins)
    without listing contributions."""
    run = Run()
    delta = {"w": np.full(8, 0.5, np.float32)}
    run.store.publish_contribution("b", 0, 0, delta, ContributionCounts(steps=60, samples=60, step_time_s=0.5))
    run.syncer.run_once()
    assert run.syncer.commits == 0  # the round waits for the live learner "a"
    note = run.syncer.bulletin().open[0]
    assert (note.base_version, note.accepted) == (0, 1)
    run.clock.now += 2 * POLL_S
    run.syncer.election_pass()
    run.counted.counts.clear()
    run.run_for(TTL_S / 3 + POLL_S)
    assert run.learner.exchange.looking.open_rounds == {0: 0}
    assert run.counted.counts["list"] == 0


def test_an_announced_close_that_has_passed_never_holds_the_exchange_at_a_zero_pause():
    """INV-22: the close a bulletin announced for the round our contribution is in is a deadline
    the exchange wakes for once; after it has passed (here the commit came first, so nothing is
    awaited any more) the exchange keeps its regular pace. A passed close kept as the next
    deadline made the pause zero: a thread polling without pause, taking the training
    thread's GIL (found as a 6x slower lone learner in the quality benchmark's half mix)."""
    run = Run()
    delta = {"w": np.full(8, 0.5, np.float32)}
    run.store.publish_contribution("b", 0, 0, delta, ContributionCounts(steps=60, samples=60, step_time_s=0.5))
    run.syncer.run_once()  # quorum reached; the grace window waits for the live learner "a"
    run.clock.now += 2 * POLL_S
    run.syncer.election_pass()
    closes_in_s = run.syncer.bulletin().open[0].closes_in_s
    assert closes_in_s is not None and closes_in_s > 0
    run.publish()
    run.run_for(TTL_S / 3 + POLL_S)  # a look reads the announcement
    run.syncer.run_once()  # every live learner is in: the round closes before the announced time
    assert run.syncer.commits == 1
    run.clock.now += 2 * POLL_S
    run.syncer.election_pass()
    seconds = closes_in_s + TTL_S
    passes = run.run_for(seconds)
    assert run.known() == 1
    assert passes <= seconds / POLL_S  # at most the regular pace (a pause of zero: 1,000 a second)
