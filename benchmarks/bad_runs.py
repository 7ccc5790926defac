"""The run-level half of the bad-input corpus (issue 22): one object, or a few, dropped in or
taken out of the bucket, and whether the run goes on.

    python -m benchmarks.bad_input            # prints this table after the contribution cases
    python -m benchmarks.bad_input --small    # the same with the tests' tiny model and a smaller flood

Each case builds a run in a fresh directory mailbox (``benchmarks.bad_input.create_run``), commits
``HISTORY_ROUNDS`` honest rounds of two learners (enough for the learned bounds), plants its
hostile objects (or deletes, or replays), and then lets the honest learners publish
``ROUNDS_AFTER`` more rounds through the same syncer or, where the case says so, a syncer
that takes over from the mailbox alone. A row says:

* rounds: honest rounds committed after the attack, of ``ROUNDS_AFTER`` (target: all; no
  fragment halted);
* hostile merged: participants of those rounds that are no honest learner (target: 0, except
  the two cases whose hostile contribution is within the bounds and merged *bounded*:
  ``fake_id_at_the_limit`` and ``inflated_samples_two_learners``);
* audit: what ``gradientmail audit`` says right after the attack where history was touched
  (target: FAIL), or at the end (target: ok);
* check: the case's own measurement (a weight share, a norm ratio, a record's size, warnings).

A row passes when all four meet their target; ``main`` exits 1 when one does not.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import gradientmail as gm
from gradientmail.audit import DigestLog, audit_run
from gradientmail.records import LearnerStateRecord, RoundRecord, keys
from gradientmail.records.auth import RunKey
from gradientmail.session.join import newest_readable
from gradientmail.session.queue import WorkQueue
from gradientmail.session.resume import StateInMailbox
from gradientmail.store import LearnerLease, RunStore
from gradientmail.syncer import SyncerRuntime
from gradientmail.syncer.bounds import (
    MIN_HISTORY,
    MIN_ROUNDS,
    NORM_RATIO,
    SAMPLES_PER_STEP_RATIO,
    UNSIGNED_SAMPLES_PER_STEP_RATIO,
)
from testing.mailbox_run import FRAGMENT, HONEST, LEASE_TTL_S, MALLORY, RUN_SECRET, SAMPLES, Run, create_run

__all__ = ["RUN_CASES", "RunCase", "RunRow", "bench_run_case"]

HISTORY_ROUNDS = max(MIN_ROUNDS, -(-MIN_HISTORY // 2)) + 2
"""Honest rounds before the attack: the learned bounds' history, and two rounds more so that a
takeover that ignores one forged record still finds enough."""
ROUNDS_AFTER = 3
FLOOD = 20_000
"""Contribution records of the flood case (the issue's figure); ``--small`` and the tests use
``SMALL_FLOOD``, past the 1,024 a round examines."""
SMALL_FLOOD = 1_500
FORGED_PARTICIPANTS = 30_000
"""Participants of the forged round record a takeover reads (the issue's was 36,000; this many
fit under a round record's 8 MiB limit)."""
FAKE_ROUNDS = 7


@dataclass
class Planted:
    """What a case left behind: who commits the rounds after it, what the audit said right after
    it (None: not asked), and the case's own check, run after those rounds."""

    syncer: SyncerRuntime
    audit_clean: bool | None = None
    check: Callable[[Run], tuple[bool, str]] | None = None


@dataclass(frozen=True)
class RunCase:
    id: str
    what: str
    plant: Callable[[Run], Planted]
    audit: str
    """``fail``: the audit right after the attack must fail; ``ok``: it must pass at the end."""
    signed: bool = False
    hostile_merged: bool = False
    """The hostile contribution is within the bounds and merged, bounded (the check measures it)."""


@dataclass
class RunRow:
    case: str
    rounds: int
    hostile_merged: int
    audit: str
    check: str
    passed: bool
    problems: list[str] = field(default_factory=list)


def _audit_clean(run: Run, digest_log: DigestLog | None = None) -> bool:
    return audit_run(run.store, run.spec, digest_log=digest_log).clean


def _takeover(run: Run, node: str = "successor") -> SyncerRuntime:
    """The syncer leaves (its lease released); a fresh one takes over from the mailbox alone."""
    run.syncer.election.resign()
    return run.new_syncer(node)


@contextmanager
def _warnings(logger: str) -> Iterator[list[logging.LogRecord]]:
    caught: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record)

    handler, target = Catch(logging.WARNING), logging.getLogger(logger)
    level = target.level
    target.addHandler(handler)
    target.setLevel(logging.WARNING)
    try:
        yield caught
    finally:
        target.removeHandler(handler)
        target.setLevel(level)


# -- the cases --------------------------------------------------------------------------------


def _invalid_ids(run: Run) -> Planted:
    """Contribution records whose learner id is no valid id: ``a=b``, ``..``, 65 characters."""
    prefix = keys.contributions_prefix(FRAGMENT, run.newest())
    for learner in ("a=b", "..", "x" * 65):
        run.box.put(f"{prefix}{learner}-0000000001.json", b"{}")
    return Planted(run.syncer, audit_clean=_audit_clean(run))


def _replayed_head(run: Run) -> Planted:
    """A genuine head saved three versions ago put back; the syncer leaves and another takes
    over: it must start from the newest record, not from the head (a fork)."""
    old_head = run.box.get(keys.head(FRAGMENT))
    for _ in range(3):
        run.honest_round()
    newest = run.newest()
    run.box.put(keys.head(FRAGMENT), old_head)
    clean = _audit_clean(run)
    joined = newest_readable(run.store, run.spec, FRAGMENT)[0].version

    def check(after: Run) -> tuple[bool, str]:
        return joined == newest, f"a joiner starts at {joined} (newest {newest}); the successor built on {newest}"

    return Planted(_takeover(run), audit_clean=clean, check=check)


def _flood(count: int) -> Callable[[Run], Planted]:
    def plant(run: Run) -> Planted:
        """``count`` tiny unsigned contribution records under as many ids, no blob behind any."""
        base = run.newest()
        run.publish_honest()
        body = json.dumps({"schema_version": 1, "learner": "f", "fragment": FRAGMENT}).encode()
        for i in range(count):
            run.box.create(keys.ContributionKey(FRAGMENT, base, f"flood{i:06d}", 1).record, body)

        def check(after: Run) -> tuple[bool, str]:
            size = len(after.box.get(keys.round_record(FRAGMENT, base + 1)))
            record = after.store.read_round(FRAGMENT, base + 1)
            flooded = sum(1 for r in record.rejected if r.reason == "flood") + record.rejections_omitted.get("flood", 0)
            return (
                size <= RoundRecord.max_bytes,
                f"round record {size / 1024:.0f} KiB (limit {RoundRecord.max_bytes >> 20} MiB), {flooded:,} rejected 'flood'",
            )

        return Planted(run.syncer, check=check)

    return plant


def _deleted_newest_record(run: Run) -> Planted:
    gone = run.newest()
    run.box.delete(keys.round_record(FRAGMENT, gone))
    clean = _audit_clean(run)

    def check(after: Run) -> tuple[bool, str]:
        return after.newest() == gone + ROUNDS_AFTER - 1, f"version {gone} re-committed by the successor, newest {after.newest()}"

    return Planted(_takeover(run), audit_clean=clean, check=check)


def _deleted_params_blob(run: Run) -> Planted:
    newest = run.newest()
    record = run.store.read_round(FRAGMENT, newest)
    run.box.delete(record.params.key)
    clean = _audit_clean(run)
    joined = newest_readable(run.store, run.spec, FRAGMENT)[0].version
    successor = _takeover(run)

    def check(after: Run) -> tuple[bool, str]:
        intact = after.store.blobs.intact(record.params)
        return intact and joined == newest - 1, (
            f"a joiner started from {joined}; the successor {'restored' if intact else 'did NOT restore'} the blob by replay"
        )

    return Planted(successor, audit_clean=clean, check=check)


def _squatted(signed: bool) -> Callable[[Run], Planted]:
    def plant(run: Run) -> Planted:
        """The next round record's key taken first: junk bytes (unsigned run), or the newest
        genuine signed record copied there (signed run)."""
        newest = run.newest()
        run.publish_honest()
        squat = run.box.get(keys.round_record(FRAGMENT, newest)) if signed else b"not a round record"
        run.box.create(keys.round_record(FRAGMENT, newest + 1), squat)
        with _warnings("gradientmail") as caught:
            for _ in range(20):  # twenty passes with the squatter in place before anything else
                run.syncer.run_once()
                run.clock.now += 0.05
        warned = len(caught)

        def check(after: Run) -> tuple[bool, str]:
            record = after.store.read_round(FRAGMENT, newest + 1)
            ours = {p.learner for p in record.participants} == set(HONEST)
            return (
                ours and warned <= 3,
                f"squatter deleted, version {newest + 1} committed by the syncer; {warned} warnings in 20 passes",
            )

        return Planted(run.syncer, check=check)

    return plant


def _forged_seed_record(run: Run) -> Planted:
    """An older round record rewritten with 30,000 participants of norm 1e30 (unsigned run), read
    by a syncer that takes over and seeds its bounds; then a delta 1000x the honest norm."""
    newest = run.newest()
    location = keys.round_record(FRAGMENT, newest - 1)
    record = json.loads(run.box.get(location))
    fake = dict(record["participants"][0], norm=1e30, samples=10**9)
    record["participants"] = [dict(fake, learner=f"p{i}", contribution=f"c{i}") for i in range(FORGED_PARTICIPANTS)]
    run.box.put(location, json.dumps(record).encode())
    clean = _audit_clean(run)
    successor = _takeover(run)
    run.publish_honest()
    hostile = run.publish(MALLORY, run.honest_delta(MALLORY, newest, scale=1000.0))

    def check(after: Run) -> tuple[bool, str]:
        record = after.store.read_round(FRAGMENT, newest + 1)
        reasons = [r.reason for r in record.rejected if r.contribution == hostile.record]
        return reasons == ["outlier"], f"the 1000x delta after the takeover: {reasons or 'MERGED'}"

    return Planted(successor, audit_clean=clean, check=check)


def _fake_id_at_the_limit(run: Run) -> Planted:
    """A third id publishing, every round, a delta just under NORM_RATIO x the largest norm the
    round before merged, claiming 1000x the samples per step: with per-contribution medians the
    bound climbed ~264x in 7 rounds; with the signed run's samples cap in an unsigned one the fake
    id took 64 % of each round's weight, where its fair share among two honest learners is a third."""
    honest = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in run.honest_delta("alice", 0).values()))
    largest = honest
    worst = worst_share = 0.0
    for _ in range(FAKE_ROUNDS):
        base = run.newest()
        run.publish_honest()
        run.publish(MALLORY, run.honest_delta(MALLORY, base, scale=0.99 * NORM_RATIO * largest / honest), samples=SAMPLES * 1000)
        record = run.commit_next().record
        merged = [p.norm for p in record.participants if p.norm is not None]
        largest = max(merged)
        worst = max(worst, largest / honest)
        weights = {p.learner: p.weight for p in record.participants}
        worst_share = max(worst_share, weights.get(MALLORY, 0.0) / sum(weights.values()))
    fair = 1 / (len(HONEST) + 1)

    def check(after: Run) -> tuple[bool, str]:
        ok = worst <= NORM_RATIO and worst_share <= fair + 1e-9
        return ok, (
            f"largest merged norm {worst:.1f}x honest over {FAKE_ROUNDS} rounds (bound {NORM_RATIO:g}x); "
            f"the fake id's largest share {worst_share:.1%} (fair {fair:.1%})"
        )

    return Planted(run.syncer, check=check)


def _inflated_samples_two_learners(run: Run) -> Planted:
    base = run.newest()
    run.publish("alice")
    run.publish(MALLORY, run.honest_delta(MALLORY, base), samples=SAMPLES * 1000)
    record = run.commit_next().record
    weights = {p.learner: p.weight for p in record.participants}
    share = weights.get(MALLORY, 0.0) / sum(weights.values())
    ratio = SAMPLES_PER_STEP_RATIO if run.store.key is not None else UNSIGNED_SAMPLES_PER_STEP_RATIO
    bound = ratio**2 / (ratio**2 + 1)  # unsigned: a fake id's fair share, half of a round of two

    def check(after: Run) -> tuple[bool, str]:
        return share <= bound + 1e-9, f"1000x samples carry {share:.1%} of a round of two (bound {bound:.0%})"

    return Planted(run.syncer, check=check)


def _duplicate_learner_id(run: Run) -> Planted:
    """A second process starts with alice's id while alice runs: its lease is newer (INV-19), so
    alice watches it, and once the twin renews again alice stops; the newcomer goes on (and
    publishes alice's contributions from then on)."""
    twin = LearnerLease(run.store, "alice", 10.0)
    twin.renew({})
    try:
        run.publish("alice")  # a newer lease of its id: watched
        twin.renew({})
        run.publish("alice")  # it changed: another process renews it
        outcome = "no error"
    except gm.DuplicateLearner as exc:
        outcome = f"DuplicateLearner: {exc}"
    run.leases["alice"] = twin

    def check(after: Run) -> tuple[bool, str]:
        return outcome.startswith("DuplicateLearner"), outcome[:100] + "..."

    return Planted(run.syncer, check=check)


def _replayed_own_lease(run: Run) -> Planted:
    """Alice's own older signed lease put back with one plain PUT (issue 43, case 2): older by
    sequence than her last write, so her next renewal writes over it instead of stopping."""
    key = keys.learner_lease("alice")
    old = run.box.get(key)
    run.publish("alice")  # a renewal later
    run.box.put(key, old)
    try:
        run.publish("alice")
        outcome = "renewed over it"
    except gm.DuplicateLearner as exc:
        outcome = f"DuplicateLearner: {exc}"

    def check(after: Run) -> tuple[bool, str]:
        return outcome == "renewed over it", outcome[:100]

    return Planted(run.syncer, check=check)


QUEUE_UNITS = 8


def _junk_done_markers(run: Run) -> Planted:
    """Eight 2-byte ``{}`` objects at the done keys of an eight-unit work queue (issue 43, case 1:
    they once stopped every unit of a signed run). Alice drains the queue after the attack: every
    unit must be handed to her, and each junk marker written over."""
    for unit in range(QUEUE_UNITS):
        run.box.put(keys.queue_done("shards", unit), b"{}")
    clean = _audit_clean(run)
    queue = WorkQueue(run.store, "alice", "shards", QUEUE_UNITS, lease_ttl_s=LEASE_TTL_S, poll_interval_s=0.0)
    trained = list(queue)

    def check(after: Run) -> tuple[bool, str]:
        left = after.store.queues.invalid_done("shards")
        return trained == list(
            range(QUEUE_UNITS)
        ) and not left, f"{len(trained)}/{QUEUE_UNITS} units trained, {len(left)} junk left"

    return Planted(run.syncer, audit_clean=clean, check=check)


def _replayed_learner_state(run: Run) -> Planted:
    """Alice's signed state record and blob of step 10 kept, and put back after she saved step 20
    and published a contribution naming it (issue 43, case 3): her restart must resume from
    step 20, not be rolled back to 10."""
    state = StateInMailbox(run.store, "alice", lambda: run.spec)
    state.write(run.spec.manifest.run_id, 10, b"alice's state at step 10")
    record_key = keys.learner_state_record("alice")
    old_record = run.box.get(record_key)
    old_blob_key = LearnerStateRecord.model_validate_json(old_record).state.key
    old_blob = run.box.get(old_blob_key)
    state.write(run.spec.manifest.run_id, 20, b"alice's state at step 20")
    run.publish("alice", saved_state=state.newest)
    run.box.put(record_key, old_record)
    run.box.put(old_blob_key, old_blob)
    found = StateInMailbox(RunStore(run.box, run.key), "alice", lambda: run.spec).read()
    outcome = {b"alice's state at step 20": "resumed at step 20", b"alice's state at step 10": "rolled back to 10"}.get(
        found or b"", f"read {found!r:.60}"
    )

    def check(after: Run) -> tuple[bool, str]:
        return outcome == "resumed at step 20", outcome

    return Planted(run.syncer, check=check)


def _stray_name_skipped_before(run: Run) -> Planted:
    """A stray name under ``queues/`` that the node's own store has already skipped and counted
    (issue 43, case 9): the audit run on that same store must still fail."""
    run.box.put("queues/shards/done/7.json", b"x")
    run.store.listed("queues/shards/done/")
    return Planted(run.syncer, audit_clean=_audit_clean(run))


def _rollback_after_collection(run: Run) -> Planted:
    """The newest record deleted and re-committed by a successor (a rollback of one version), then
    enough rounds for retention to collect the evidence: the plain audit passes, one with the
    digest log kept since before the attack fails."""
    log_path = Path(run.box.url.removeprefix("file://")).parent / "digests.jsonl"
    digest_log = DigestLog(log_path, run.spec.manifest.run_id)
    assert _audit_clean(run, digest_log)
    gone = run.newest()
    run.box.delete(keys.round_record(FRAGMENT, gone))
    successor = _takeover(run)
    for _ in range(run.spec.retention.keep_versions + 1):
        run.publish_honest()
        run.commit_next(successor)
    plain = _audit_clean(run)
    logged = _audit_clean(run, DigestLog(log_path, run.spec.manifest.run_id))

    def check(after: Run) -> tuple[bool, str]:
        return (
            plain and not logged,
            f"after retention: plain audit {'ok' if plain else 'FAIL'}, with the digest log {'ok' if logged else 'FAIL'}",
        )

    return Planted(successor, audit_clean=logged, check=check)


RUN_CASES: tuple[RunCase, ...] = (
    RunCase("invalid_learner_ids", "contribution names with ids a=b, .., 65 chars", _invalid_ids, "fail"),
    RunCase("invalid_learner_ids_signed", "the same in a signed run", _invalid_ids, "fail", signed=True),
    RunCase(
        "replayed_head_takeover", "a genuine head from 3 versions back, then a takeover", _replayed_head, "fail", signed=True
    ),
    RunCase("flood", "thousands of tiny unsigned contribution records", _flood(FLOOD), "ok"),
    RunCase("deleted_newest_record", "the newest round record deleted, then a takeover", _deleted_newest_record, "fail"),
    RunCase("deleted_params_blob", "the newest version's parameters deleted, then a takeover", _deleted_params_blob, "fail"),
    RunCase("squatted_next_record", "junk at the next round record's key", _squatted(signed=False), "ok"),
    RunCase("squatted_next_record_signed", "a genuine record copied to the next key", _squatted(signed=True), "ok", signed=True),
    RunCase("forged_seed_record", "a 30,000-participant record a takeover seeds from", _forged_seed_record, "fail"),
    RunCase(
        "fake_id_at_the_limit",
        "a fake id at the norm bound with 1000x samples, 7 rounds",
        _fake_id_at_the_limit,
        "ok",
        hostile_merged=True,
    ),
    RunCase(
        "inflated_samples_two_learners",
        "1000x samples in a round of two",
        _inflated_samples_two_learners,
        "ok",
        hostile_merged=True,
    ),
    RunCase("duplicate_learner_id", "two processes with one learner id", _duplicate_learner_id, "ok"),
    RunCase("replayed_own_lease", "a learner's own older signed lease put back", _replayed_own_lease, "ok", signed=True),
    RunCase("junk_done_markers", "eight 2-byte objects at a work queue's done keys", _junk_done_markers, "fail", signed=True),
    RunCase(
        "replayed_learner_state", "a learner's older state record and blob put back", _replayed_learner_state, "ok", signed=True
    ),
    RunCase("stray_name_skipped_before", "a stray name the node's store already skipped", _stray_name_skipped_before, "fail"),
    RunCase("rollback_after_collection", "a one-version rollback, retention collects it", _rollback_after_collection, "fail"),
)


def with_flood(cases: tuple[RunCase, ...], count: int) -> tuple[RunCase, ...]:
    """``cases`` with the flood case's count replaced (the tests' and ``--small``'s)."""
    return tuple(RunCase(c.id, c.what, _flood(count), c.audit) if c.id == "flood" else c for c in cases)


def bench_run_case(case: RunCase, workdir: Path, model: dict[str, tuple[int, ...]] | None = None) -> RunRow:
    """Run one case (module docstring) and judge it."""
    run = create_run(
        gm.FileMailbox(workdir, fsync=False),
        model=model,
        key=RunKey(RUN_SECRET) if case.signed else None,
    )
    for _ in range(HISTORY_ROUNDS):
        run.honest_round()
    planted = case.plant(run)
    start = run.newest()
    rounds, problems = 0, []
    for _ in range(ROUNDS_AFTER):
        run.publish_honest()
        try:
            run.commit_next(planted.syncer)
            rounds += 1
        except Exception as exc:
            problems.append(f"{type(exc).__name__}: {exc}")
    hostile = [
        p.learner
        for v in range(start + 1, run.newest() + 1)
        for p in run.store.read_round(FRAGMENT, v).participants
        if p.learner not in HONEST
    ]
    final_params = run.params(run.newest())
    if not all(np.all(np.isfinite(v)) for v in final_params.values()):
        problems.append("the newest parameters are not finite")
    ok, detail = planted.check(run) if planted.check is not None else (True, "")
    if case.audit == "fail":
        audit_ok = planted.audit_clean is False
        audit = "FAIL (expected)" if planted.audit_clean is False else "ok (expected FAIL)"
    else:
        end_clean = _audit_clean(run)
        audit_ok = end_clean or case.id in {"invalid_learner_ids", "invalid_learner_ids_signed"}
        audit = "ok" if end_clean else "FAIL"
    passed = not problems and rounds == ROUNDS_AFTER and (case.hostile_merged or not hostile) and ok and audit_ok
    return RunRow(case.id, rounds, len(hostile), audit, detail, passed, problems)


def table(rows: list[RunRow]) -> str:
    header = ("case", "rounds", "hostile merged", "audit", "check", "pass")
    lines = [header] + [
        (
            r.case,
            f"{r.rounds}/{ROUNDS_AFTER}",
            str(r.hostile_merged),
            r.audit,
            r.check + ("; " + "; ".join(r.problems) if r.problems else ""),
            "yes" if r.passed else "NO",
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def run_all(
    workdirs: Iterator[Path], model: dict[str, tuple[int, ...]] | None, *, flood: int, wanted: set[str] | None
) -> list[RunRow]:
    return [
        bench_run_case(case, next(workdirs), model)
        for case in with_flood(RUN_CASES, flood)
        if wanted is None or case.id in wanted
    ]
