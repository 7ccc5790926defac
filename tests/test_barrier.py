"""Barriers through the mailbox (``session/barrier.py``): the store-clock bounds on a fake clock,
the release rule, nodes on every store meeting at one store-clock instant, and what a dropped
object, a late node and a missing one do. Real processes on the S3 server: test_barrier_processes.py."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import pytest

import gradientmail as gm
from gradientmail.mailbox import Mailbox
from gradientmail.records import BarrierArrival, keys
from gradientmail.records.auth import RunKey
from gradientmail.session.barrier import release_instant
from gradientmail.store import RunStore
from gradientmail.store.store_clock import ClockSample, StoreClock

# -- the store's clock, on a fake one --------------------------------------------------------------


class FakeStore:
    """A store whose clock runs ``offset`` ahead of the local one and stamps writes truncated to
    ``resolution`` seconds; a write takes ``round_trip`` local seconds and lands halfway."""

    def __init__(self, offset: float, resolution: float = 1.0, round_trip: float = 0.004) -> None:
        self.offset, self.resolution, self.round_trip = offset, resolution, round_trip

    def write(self, sent_at: float) -> ClockSample:
        landed = sent_at + self.round_trip / 2 + self.offset
        stamp = math.floor(landed / self.resolution) * self.resolution if self.resolution else landed
        return ClockSample(sent_at, sent_at + self.round_trip, stamp, self.resolution)


@pytest.mark.parametrize("offset", [1_796_000_000.123, 1_796_000_000.999, 1_796_000_000.5004, -3.25])
def test_probes_timed_by_the_bounds_narrow_one_second_stamps_to_a_round_trip(offset: float) -> None:
    store, clock = FakeStore(offset), StoreClock()
    now = 100.0
    clock.add(store.write(now))
    assert clock.low <= offset <= clock.high and clock.high - clock.low <= 1.0 + store.round_trip + 1e-9
    probes, started = 0, now
    while clock.worth_probing(0.005):
        now = clock.next_probe_at(now + store.round_trip)
        clock.add(store.write(now))
        probes += 1
        assert clock.low <= offset <= clock.high, "the bounds always hold the true offset"
    assert clock.uncertainty_s <= 0.005 and clock.restarts == 0
    assert probes <= 24 and now - started <= 5.0, (probes, now - started)


def test_exact_stamps_need_no_probe_and_a_contradicting_sample_restarts_the_bounds() -> None:
    store, clock = FakeStore(5.0, resolution=0.0), StoreClock()
    clock.add(store.write(1.0))
    assert clock.uncertainty_s == pytest.approx(store.round_trip / 2) and not clock.worth_probing(0.005)
    assert clock.next_probe_at(7.0) == 7.0
    assert clock.store_time(2.0) == pytest.approx(7.0, abs=store.round_trip)
    stepped = FakeStore(9.0, resolution=0.0).write(3.0)  # the local clock was stepped by 4 s
    assert not clock.add(stepped)
    assert clock.restarts == 1 and clock.low <= 9.0 <= clock.high


def test_the_release_is_the_parties_th_earliest_arrival_plus_the_margin() -> None:
    assert release_instant([5.0, 1.0, 3.0], 2, 3.0) == 6.0
    assert release_instant([5.0, 1.0, 3.0], 3, 3.0) == 8.0
    assert release_instant([5.0, 1.0], 3, 3.0) is None
    assert release_instant([7.0, 7.0, 9.0], 2, 0.5) == 7.5


# -- nodes meeting on each store -------------------------------------------------------------------


def meet(
    make: Callable[[], Mailbox], delays: list[float], parties: int, **options: object
) -> list[tuple[gm.BarrierRelease, float]]:
    """Nodes in threads, each arriving after its delay; what each wait returned and when (monotonic)."""
    results: list[tuple[gm.BarrierRelease, float] | BaseException] = [RuntimeError("did not return")] * len(delays)

    def node(index: int, delay: float) -> None:
        time.sleep(delay)
        try:
            barrier = gm.Barrier("epoch-1", parties, mailbox=make(), node_id=f"node-{index}", **options)  # type: ignore[arg-type]
            release = barrier.wait(timeout_s=30)
            results[index] = (release, time.monotonic())
        except BaseException as exc:
            results[index] = exc

    threads = [threading.Thread(target=node, args=(i, d)) for i, d in enumerate(delays)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


def check_released_together(results: list[tuple[gm.BarrierRelease, float]], slack_s: float = 0.03) -> None:
    releases = [release for release, _ in results if not release.late]
    assert len({r.release_at for r in releases}) == 1 and len({r.arrived for r in releases}) == 1
    returned = [at for (release, at) in results if not release.late]
    doubt = 2 * max(r.uncertainty_s for r in releases)
    assert max(returned) - min(returned) <= doubt + slack_s, (returned, doubt)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["memory", "directory", "s3"])
def test_nodes_arriving_apart_are_released_at_one_store_instant(store, tmp_path, make_s3_mailbox) -> None:  # type: ignore[no-untyped-def]
    if store == "memory":
        box = gm.MemoryMailbox()
        make: Callable[[], Mailbox] = lambda: box  # noqa: E731
    elif store == "directory":
        make = lambda: gm.FileMailbox(tmp_path / "box")  # noqa: E731
    else:
        prefix = f"barrier-{time.time_ns()}"
        make = lambda: make_s3_mailbox(prefix)  # noqa: E731
    started = time.monotonic()
    results = meet(make, [0.0, 0.4, 0.8], parties=3, margin_s=2.5, settle_s=0.5, poll_interval_s=0.2)
    check_released_together(results)
    release = results[0][0]
    assert release.arrived == ("node-0", "node-1", "node-2")
    assert release.release_at == pytest.approx(release.opened_at + 2.5)
    assert not any(r.late for r, _ in results)
    if store == "s3":  # 1 s stamps: the probes narrowed them (4-fold a second of waiting)
        assert max(r.uncertainty_s for r, _ in results) < 0.1
    assert time.monotonic() - started < 10


def test_a_node_arriving_after_the_release_returns_at_once_and_says_so() -> None:
    box = gm.MemoryMailbox()
    results = meet(lambda: box, [0.0, 0.1], parties=2, margin_s=1.0, settle_s=0.2, poll_interval_s=0.1)
    check_released_together(results)
    late = gm.Barrier("epoch-1", 2, mailbox=box, node_id="node-late", margin_s=1.0, settle_s=0.2).wait(timeout_s=5)
    assert late.late and late.release_at == results[0][0].release_at and late.waited_s < 1.0
    assert late.arrived == results[0][0].arrived


def test_too_few_nodes_time_out_naming_who_arrived_and_waiting_again_resumes() -> None:
    box = gm.MemoryMailbox()
    alone = gm.Barrier("eval-3", 2, mailbox=box, node_id="alpha", poll_interval_s=0.05, settle_s=0.1, margin_s=0.5)
    with pytest.raises(TimeoutError, match=r"barrier 'eval-3': 1 of 2 nodes arrived within 0.3 s \(alpha\)"):
        alone.wait(timeout_s=0.3)
    threading.Timer(0.2, lambda: gm.Barrier("eval-3", 2, mailbox=box, node_id="beta", settle_s=0.1, margin_s=0.5).wait(5)).start()
    assert alone.wait(timeout_s=5).arrived == ("alpha", "beta")


def test_dropped_objects_are_never_parties_and_a_squatted_arrival_key_is_written_over() -> None:
    key = RunKey(b"k" * 32)
    box = gm.MemoryMailbox()
    box.put(keys.barrier_arrival("epoch-1", "ghost"), b"garbage")
    unsigned = BarrierArrival(barrier="epoch-1", node="forger", parties=2)
    box.put(keys.barrier_arrival("epoch-1", "forger"), unsigned.to_json())  # not signed with the run key
    box.put("barriers/epoch-1/arrivals/Not=A.Node.txt", b"{}")  # no name of the layout
    box.put(keys.barrier_arrival("epoch-1", "node-1"), b"squatted")  # node-1's own key
    results = meet(lambda: box, [0.0, 0.3], parties=2, run_key=key, margin_s=1.0, settle_s=0.2, poll_interval_s=0.1)
    check_released_together(results)
    assert results[0][0].arrived == ("node-0", "node-1")
    store = RunStore(box, key)
    assert store.barriers.read_arrival("epoch-1", "node-1") is not None
    assert store.barriers.read_arrival("epoch-1", "forger") is None


def test_arrivals_expecting_another_count_are_not_parties() -> None:
    box = gm.MemoryMailbox()
    RunStore(box).barriers.arrive(BarrierArrival(barrier="epoch-1", node="other", parties=5), time.monotonic)
    with pytest.raises(TimeoutError, match="2 of 2 nodes arrived"):
        gm.Barrier("epoch-1", 2, mailbox=box, node_id="me", poll_interval_s=0.05, settle_s=0.1, margin_s=0.5).wait(timeout_s=0.5)


def test_bad_settings_are_refused_with_the_field() -> None:
    box = gm.MemoryMailbox()
    for options, field in [
        ({"name": "bad name"}, "barrier"),
        ({"parties": 0}, "parties"),
        ({"margin_s": 0.5, "settle_s": 1.0}, "margin_s"),
        ({"poll_interval_s": 0.0}, "poll_interval_s"),
    ]:
        settings = {"name": "epoch-1", "parties": 2, **options}
        with pytest.raises(gm.InvalidConfig) as caught:
            gm.Barrier(settings.pop("name"), settings.pop("parties"), mailbox=box, node_id="n", **settings)  # type: ignore[arg-type]
        assert caught.value.field == field


@pytest.mark.slow
def test_sessions_meet_at_a_barrier_while_their_leases_keep_running() -> None:
    box = gm.MemoryMailbox()
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
    algorithm = gm.DiLoCo(sync_every=5)
    releases: dict[str, gm.BarrierRelease] = {}

    def learner(name: str, delay: float) -> None:
        params = {"w": __import__("numpy").zeros(8, "float32")}
        with gm.Session(params, algorithm=algorithm, mailbox=box, learner_id=name, options=options) as session:
            for _ in range(5):
                session.step(samples=1)
            time.sleep(delay)
            releases[name] = session.barrier("eval-1", 2, timeout_s=20, margin_s=1.0, settle_s=0.2, poll_interval_s=0.1)

    threads = [threading.Thread(target=learner, args=(n, d)) for n, d in (("a", 0.0), ("b", 1.5))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert set(releases) == {"a", "b"} and releases["a"].release_at == releases["b"].release_at
    assert releases["a"].waited_s > 1.0  # "a" waited for "b", longer than a lease TTL
    assert not any(r.late for r in releases.values())
