"""A work queue shared through the mailbox (``session.queue``, ``session/queue.py``): every unit is
trained to its end by exactly one learner, across kills and restarts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import gradientmail as gm
from gradientmail.audit import audit_run
from gradientmail.mailbox import FileMailbox
from gradientmail.records import QueueDone, keys
from gradientmail.records.auth import RunKey
from gradientmail.session.queue import WorkQueue
from gradientmail.store import LearnerLease, RunStore
from testing.mailbox_run import RUN_SECRET, Run, create_run
from tests.fake_clock import FakeClock
from tests.run_procs import ROOT, wait_until

TTL_S = 1.0


def queue_of(store: RunStore, learner: str, clock: FakeClock, units: int = 4) -> WorkQueue:
    return WorkQueue(store, learner, "shards", units, lease_ttl_s=TTL_S, poll_interval_s=0.0, clock=clock)


def test_learners_claim_disjoint_units_and_a_dead_learners_unit_is_taken_over_after_a_ttl(tmp_path):
    """Two learners take units 0-3 in turn; b dies holding unit 3. a, with nothing left to
    claim, waits: once b's lease has stood still for a TTL on a's clock it takes unit 3 over
    (claim generation 2), finishes it, and the queue is done."""
    store = RunStore(FileMailbox(tmp_path / "box"))
    clock = FakeClock()
    leases = {name: LearnerLease(store, name, TTL_S) for name in ("a", "b")}
    for lease in leases.values():
        lease.renew({})
    a, b = queue_of(store, "a", clock), queue_of(store, "b", clock)
    assert (a.claim_next(), b.claim_next(), a.claim_next(), b.claim_next()) == (0, 1, 2, 3)
    a.finish(0)
    a.finish(2)
    b.finish(1)  # and b dies holding unit 3
    waits: list[float] = []

    def wait(_: float) -> None:  # a polls while b's lease stands still; a's own is renewed
        waits.append(clock.now)
        clock.now += TTL_S / 2
        leases["a"].renew({})

    survivor = WorkQueue(store, "a", "shards", 4, lease_ttl_s=TTL_S, poll_interval_s=0.1, clock=clock, sleep=wait)
    assert survivor.claim_next() == 3 and survivor.taken_over == [3]
    assert len(waits) >= 2  # not before b's lease was a TTL old on a's clock
    survivor.finish(3)
    assert survivor.claim_next() is None  # every unit done
    done = [json.loads(store.mailbox.get(keys.queue_done("shards", u))) for u in range(4)]
    assert [d["holder"] for d in done] == ["a", "b", "a", "a"] and done[3]["generation"] == 2


def test_a_restarted_learner_takes_back_its_own_unit_and_a_unit_is_done_once(tmp_path):
    store = RunStore(FileMailbox(tmp_path / "box"))
    clock = FakeClock()
    LearnerLease(store, "a", TTL_S).renew({})
    first = queue_of(store, "a", clock)
    assert first.claim_next() == 0
    restarted = queue_of(store, "a", clock)
    assert restarted.claim_next() == 0  # rule 1: its own unfinished unit first
    restarted.finish(0)
    assert not store.queues.create_done(QueueDone(queue="shards", unit=0, holder="a", generation=1))
    assert restarted.completed == [0]


def test_learners_that_disagree_on_the_queue_size_are_refused(tmp_path):
    store = RunStore(FileMailbox(tmp_path / "box"))
    clock = FakeClock()
    LearnerLease(store, "a", TTL_S).renew({})
    queue_of(store, "a", clock, units=4).claim_next()
    with pytest.raises(gm.InvalidConfig, match="has 4 units"):
        queue_of(store, "b", clock, units=5).claim_next()
    with pytest.raises(gm.InvalidConfig, match="units"):
        queue_of(store, "b", clock, units=0)


# Longer than a learner process takes to start on a loaded machine: the survivors of the kill may
# run out of units of their own before the victim's restart is up, and must not take its unit over
# meanwhile (rule 3, tested on a fake clock above); the restart takes it back (rule 1).
RESTART_TTL_S = 20.0


def start(url: str, name: str, workdir: Path, incarnation: int) -> tuple[subprocess.Popen[str], Path]:
    log = workdir / f"{name}-{incarnation}.log"
    command = [sys.executable, "-m", "tests.queue_proc", "--mailbox", url, "--learner-id", name]
    command += ["--state-dir", str(workdir / "state"), "--lease-ttl", str(RESTART_TTL_S)]
    return subprocess.Popen(command, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True), log


def lines(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_every_unit_is_trained_to_its_end_exactly_once_across_kill_9_and_restart(tmp_path):
    """Three learner processes share 24 units; one is killed with SIGKILL in the middle of a unit
    and restarted under its id. Every unit has exactly one done record, and the units the
    processes report done are each reported once, all 24 of them. The restart goes on with the
    interrupted unit where its saved state was (``steps_into``: the steps it had trained of it,
    saved at every step), so every step of every unit is trained once, the interrupted one's
    step in flight at the kill at most redone."""
    url = f"file://{tmp_path / 'box'}"
    store = RunStore(FileMailbox(tmp_path / "box"))
    procs = {name: start(url, name, tmp_path, 0) for name in ("n0", "n1", "n2")}
    victim, victim_log = procs["n1"]

    def into_second_unit() -> bool:
        units = [e["unit"] for e in lines(victim_log) if e["event"] == "unit"]
        steps = [e for e in lines(victim_log) if e["event"] == "step"]
        return len(units) >= 2 and sum(1 for e in steps if e["unit"] == units[-1]) >= 2

    wait_until(into_second_unit, 120, "n1 two steps into its second unit")
    victim.kill()
    victim.wait()
    procs["n1"] = start(url, "n1", tmp_path, 1)
    for process, log in procs.values():
        assert process.wait(timeout=240) == 0, log.read_text()[-3000:]
    claimed, done = store.queues.units("shards")
    assert done == set(range(24)) and claimed == set(range(24))  # one done record each (create-once)
    logs = sorted(tmp_path.glob("n*-*.log"))
    started = [e["unit"] for log in logs for e in lines(log) if e["event"] == "unit"]
    assert set(started) == set(range(24))
    again = {u for u in started if started.count(u) > 1}
    assert len(again) <= 1  # only the unit n1 was training when it was killed, taken back by its restart
    completed = [u for log in logs for e in lines(log) if e["event"] == "end" for u in e["completed"]]
    assert len(completed) == len(set(completed))  # no unit reported done twice
    interrupted = [e["unit"] for e in lines(victim_log) if e["event"] == "unit"][-1]
    before = [e["step"] for e in lines(victim_log) if e["event"] == "step" and e["unit"] == interrupted]
    resumed = next(e for e in lines(tmp_path / "n1-1.log") if e["event"] == "unit")
    assert resumed["unit"] == interrupted and len(before) >= 2
    assert resumed["skip"] in (len(before), len(before) + 1)  # the last save: the last step printed, or one after
    for unit in set(range(24)) - {interrupted}:
        steps = [e["step"] for log in logs for e in lines(log) if e["event"] == "step" and e["unit"] == unit]
        assert sorted(steps) == list(range(5)), (unit, steps)  # each step of a unit trained once


# -- done markers are records, not names (issue 43, case 1; INV-24) --------------------------


def signed_run(tmp_path: Path) -> Run:
    return create_run(FileMailbox(tmp_path / "box"), key=RunKey(RUN_SECRET))


def drain(store: RunStore, learner: str, units: int) -> list[int]:
    """Train every unit ``learner`` is handed (each finished at once), in order."""
    LearnerLease(store, learner, TTL_S).renew({})
    return list(WorkQueue(store, learner, "shards", units, lease_ttl_s=TTL_S, poll_interval_s=0.0, clock=FakeClock()))


def test_eight_two_byte_done_markers_stop_no_unit_of_a_signed_run_and_fail_the_audit(tmp_path):
    """INV-24: eight ``{}`` objects at the done keys of an eight-unit queue leave every unit open
    (each was trained, 0 of 8 before); the audit fails while they are there, names the queue and
    counts them; the learner that finishes a unit writes over its marker, and once every unit is
    trained the audit is clean again."""
    run = signed_run(tmp_path)
    for unit in range(8):
        run.box.put(keys.queue_done("shards", unit), b"{}")
    report = audit_run(RunStore(run.box, run.key), run.spec)
    assert any("queue shards: 8 done markers are not valid" in line for line in report.failures), report.failures
    assert drain(run.store, "a", 8) == list(range(8))
    assert run.store.queues.invalid_done("shards") == {}
    assert audit_run(RunStore(run.box, run.key), run.spec).failures == []


def test_a_junk_claim_and_a_junk_done_marker_on_one_unit_do_not_skip_it(tmp_path):
    """INV-24: the junk claim is taken over, the junk marker written over once the unit is trained."""
    run = signed_run(tmp_path)
    run.box.put(keys.queue_claim("shards", 2), b"junk")
    run.box.put(keys.queue_done("shards", 2), b"\x00\x01")
    assert drain(run.store, "a", 4) == [0, 1, 3, 2]  # unit 2: the junk claim taken over, then trained
    done = QueueDone.model_validate_json(run.box.get(keys.queue_done("shards", 2)))
    assert done.holder == "a"


def test_a_valid_done_marker_copied_to_another_unit_is_not_believed(tmp_path):
    """INV-24: signed, the MAC binds a record to its key; unsigned, the record names its unit:
    either way a genuine marker copied to another unit's key leaves that unit open."""
    for key in (RunKey(RUN_SECRET), None):
        run = create_run(FileMailbox(tmp_path / f"box-{key is None}"), key=key)
        store = run.store
        assert store.queues.create_done(QueueDone(queue="shards", unit=0, holder="a", generation=1))
        run.box.put(keys.queue_done("shards", 1), run.box.get(keys.queue_done("shards", 0)))
        assert store.queues.units("shards") == (set(), {0})
        assert 1 in store.queues.invalid_done("shards")
        assert drain(store, "b", 2) == [1]


def test_a_done_marker_another_learner_wrote_first_still_wins(tmp_path):
    """Create-once holds for valid markers: the second learner to finish a unit writes nothing."""
    run = signed_run(tmp_path)
    first = QueueDone(queue="shards", unit=0, holder="a", generation=1)
    assert run.store.queues.create_done(first)
    assert not RunStore(run.box, run.key).queues.create_done(QueueDone(queue="shards", unit=0, holder="b", generation=2))
    assert QueueDone.model_validate_json(run.box.get(keys.queue_done("shards", 0))).holder == "a"


def test_a_junk_claim_or_barrier_arrival_fails_the_audit(tmp_path):
    """INV-24: nodes take a junk claim over and count a junk arrival as no party; the audit says
    the bucket was written outside the protocol."""
    run = signed_run(tmp_path)
    run.box.put(keys.queue_claim("shards", 1), b"{}")
    run.box.put(keys.barrier_arrival("start", "n1"), b"{}")
    failures = audit_run(RunStore(run.box, run.key), run.spec).failures
    assert any("queue shards: 1 claims are not valid" in line for line in failures), failures
    assert any("barrier start: 1 arrivals are not valid" in line for line in failures), failures
    assert drain(run.store, "a", 2) == [0, 1]  # the junk claim taken over
    run.box.delete(keys.barrier_arrival("start", "n1"))
    assert audit_run(RunStore(run.box, run.key), run.spec).failures == []


def test_the_audit_lists_names_itself_so_a_name_a_node_skipped_before_still_fails_it(tmp_path):
    """Issue 43, case 9: the store a node keeps counts each stray name once; the audit run on that
    same store still finds it, wherever it lies in the run (queues/, states/ or barriers/ too)."""
    run = signed_run(tmp_path)
    assert audit_run(run.store, run.spec).failures == []
    for stray in ("fragments/0000/rounds/stray.json", "queues/shards/done/7.json", "states/a/notes.txt"):
        run.box.put(stray, b"x")
    run.store.listed("fragments/0000/rounds/")  # the node's own listing skips and counts it first
    assert run.store.unparsable_keys >= 1
    failures = audit_run(run.store, run.spec).failures
    assert any(line.startswith("3 objects in the mailbox are no key") for line in failures), failures
