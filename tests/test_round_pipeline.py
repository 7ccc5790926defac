"""The syncer round's pipeline (issue 13): contributions fetched ahead while the one before is
checked, payloads hashed by the store while they arrive, and the two new blobs written at once,
each hashed while it uploads. Outcomes, their order and the committed bytes must be those of
one contribution at a time; nothing unverified is decoded."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import numpy as np
import pytest

from gradientmail.backends import payload
from gradientmail.digests import DigestName, hex_digest
from gradientmail.errors import CorruptPayload, MailboxError, MailboxUnavailable
from gradientmail.mailbox import ForwardingMailbox, Mailbox, MemoryMailbox
from gradientmail.mailbox.base import HashingGet
from gradientmail.records import PayloadRef, Rejection, keys
from gradientmail.store import RunStore, VersionDraft
from gradientmail.syncer import replay_round
from gradientmail.syncer import runtime as runtime_module
from gradientmail.syncer.rounds import Fetched, check_fetched, fetch_contribution, validate
from testing.mailbox_run import FRAGMENT, Run, create_run

LEARNERS = ("alice", "bob", "carol", "dave", "erin", "frank")


@pytest.fixture(autouse=True)
def _no_run_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GRADIENTMAIL_RUN_KEY", "GRADIENTMAIL_RUN_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)


class Hashing(ForwardingMailbox):
    """A store that hands over the digest asked for with the bytes (``HashingGet``); ``lie``
    replaces it."""

    def __init__(self, inner: Mailbox, lie: str | None = None) -> None:
        super().__init__(inner)
        self.lie = lie
        self.hashed_gets = 0

    def get_hashed(self, key: str, digest: DigestName, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        self.hashed_gets += 1
        data = self.inner.get(key, max_bytes=max_bytes)
        return data, self.lie if self.lie is not None else hex_digest(digest, data)


def _round(run: Run, extra: dict[str, Any] | None = None) -> None:
    """Publish the pipeline corpus against the newest version: four honest learners, a corrupt
    payload, a non-finite delta, a second contribution of alice's (a duplicate)."""
    for learner in ("alice", "bob", "carol", "frank"):
        run.publish(learner)
    corrupt = run.publish("dave")
    data = bytearray(run.store.mailbox.get(corrupt.blob))
    data[-1] ^= 1
    run.store.mailbox.put(corrupt.blob, bytes(data))
    nan = run.honest_delta("erin", run.newest())
    next(iter(nan.values())).reshape(-1)[0] = np.nan
    run.publish("erin", nan)
    run.publish("alice", run.honest_delta("alice", run.newest(), scale=2.0))


def _outcome(run: Run) -> tuple[list[str], list[tuple[str, str]], bytes]:
    stored = run.commit_next()
    record = stored.record
    blob = run.store.blobs.read(record.params)
    return (
        [p.contribution for p in record.participants],
        [(r.contribution, r.reason) for r in record.rejected],
        blob,
    )


def test_prefetched_outcomes_order_and_bytes_are_those_of_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = []
    for prefetch in (1, runtime_module.PREFETCH, 5):
        monkeypatch.setattr(runtime_module, "PREFETCH", prefetch)
        run = create_run(MemoryMailbox())
        _round(run)
        outcomes.append(_outcome(run))
        # replay reproduces the committed bytes exactly
        replayed = replay_round(run.store, run.syncer.backend, run.spec, FRAGMENT, 1)
        committed = run.store.load_version(run.spec, FRAGMENT, 1).params
        assert replayed.keys() == committed.keys()
        for name, array in committed.items():
            assert np.asarray(replayed[name]).tobytes() == array.tobytes()
    assert outcomes[0] == outcomes[1] == outcomes[2]
    participants, rejected, _ = outcomes[0]
    assert [keys.parse_contribution_record(p).learner for p in participants] == ["alice", "bob", "carol", "frank"]
    assert [(keys.parse_contribution_record(c).learner, reason) for c, reason in rejected] == [
        ("alice", "duplicate"),
        ("dave", "corrupt"),
        ("erin", "non_finite"),
    ]


def test_at_most_prefetch_fetches_run_at_once_and_checks_follow_the_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    run = create_run(MemoryMailbox())
    for learner in LEARNERS:
        run.publish(learner)
    lock = threading.Lock()
    in_flight = [0, 0]  # now, most
    checked: list[str] = []

    def slow_fetch(*args: Any) -> Fetched | Rejection:
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
        try:
            time.sleep(0.03)
            return fetch_contribution(*args)
        finally:
            with lock:
                in_flight[0] -= 1

    def spy_check(backend: Any, fetched: Any, norm_limit: Any = None) -> Any:
        checked.append(fetched.key.learner)
        time.sleep(0.01)
        return check_fetched(backend, fetched, norm_limit)

    monkeypatch.setattr(runtime_module, "fetch_contribution", slow_fetch)
    monkeypatch.setattr(runtime_module, "check_fetched", spy_check)
    stored = run.commit_next()
    assert checked == sorted(LEARNERS)  # the listing's order
    assert in_flight[1] == runtime_module.PREFETCH  # overlapped, and never more
    assert len(stored.record.participants) == len(LEARNERS)


def test_a_retryable_error_ends_its_fragments_pass_and_the_unread_contributions_are_read_next_pass(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """INV-20: the error ends that fragment's pass (logged, never out of the pass), what was read
    stays read, and the next pass reads the rest."""
    run = create_run(MemoryMailbox())
    for learner in LEARNERS:
        run.publish(learner)
    failed: list[str] = []

    def flaky_fetch(store: RunStore, spec: Any, base: int, key: keys.ContributionKey, handed: Any = None) -> Fetched | Rejection:
        if key.learner == "carol" and not failed:
            failed.append(key.learner)
            raise MailboxUnavailable("the store is down for a moment")
        return fetch_contribution(store, spec, base, key, handed)

    monkeypatch.setattr(runtime_module, "fetch_contribution", flaky_fetch)
    with caplog.at_level("WARNING", logger="gradientmail.syncer.runtime"):
        run.syncer.run_once()
    assert any("the store is down for a moment" in r.getMessage() for r in caplog.records)
    current = run.syncer.open_round(FRAGMENT)
    assert current is not None
    assert {keys.parse_contribution_record(k).learner for k in current.seen} == {"alice", "bob"}  # carol on are unread
    stored = run.commit_next()
    assert [p.learner for p in stored.record.participants] == sorted(LEARNERS)
    assert stored.record.rejected == ()


def test_a_hashing_store_hands_the_digest_over_and_a_wrong_one_is_a_corrupt_payload() -> None:
    inner = MemoryMailbox()
    data = payload.encode({"w": np.arange(6, dtype=np.float32)})
    inner.put("blob", data)
    ref = PayloadRef(key="blob", sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data))
    honest = Hashing(inner)
    assert isinstance(honest, HashingGet) and not isinstance(inner, HashingGet)
    assert RunStore(honest).blobs.read(ref) == data
    assert honest.hashed_gets == 1
    with pytest.raises(CorruptPayload, match="checksum mismatch"):
        RunStore(Hashing(inner, lie="0" * 64)).blobs.read(ref)
    assert RunStore(inner).blobs.read(ref) == data  # a store without the capability: hashed here


def test_validate_through_a_hashing_store_rejects_a_lying_digest_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    run = create_run(MemoryMailbox())
    key = run.publish("alice")
    decoded: list[int] = []
    decode = payload.decode
    monkeypatch.setattr(payload, "decode", lambda data: decoded.append(len(data)) or decode(data))
    lying = RunStore(Hashing(run.store.mailbox, lie="0" * 64))
    outcome = validate(lying, run.syncer.backend, run.spec, 0, key)
    assert isinstance(outcome, Rejection) and outcome.reason == "corrupt"
    assert decoded == []  # nothing unverified is decoded
    assert not isinstance(validate(RunStore(Hashing(run.store.mailbox)), run.syncer.backend, run.spec, 0, key), Rejection)


class FailingPut(ForwardingMailbox):
    def __init__(self, inner: Mailbox, part: str) -> None:
        super().__init__(inner)
        self.part = part
        self.puts: list[str] = []

    def put(self, key: str, data: bytes) -> str:
        self.puts.append(key)
        if self.part in key:
            raise MailboxUnavailable(f"cannot write {key}")
        return self.inner.put(key, data)


@pytest.mark.parametrize("part", ["params-", "outer-"])
def test_a_failed_blob_write_fails_the_commit_and_leaves_no_record(part: str) -> None:
    run = create_run(MemoryMailbox())
    box = FailingPut(run.store.mailbox, part)
    store = RunStore(box)
    store.read_spec()  # a syncer joins the run first: its blobs go under the run's digest
    params = run.params(0)
    with pytest.raises(MailboxError):
        store.commit_version(VersionDraft.of(run.spec.algorithm, FRAGMENT, 1, params, {}), committed_by="node", term=1)
    assert len(box.puts) == (1 if part == "params-" else 2)  # the state after the parameters, never alongside
    assert not box.inner.exists(keys.round_record(FRAGMENT, 1))


def test_committed_blobs_carry_the_digests_of_their_bytes() -> None:
    run = create_run(MemoryMailbox())
    params = run.params(0)
    state = {f"momentum/{name}": np.ones_like(array) for name, array in params.items()}
    stored = run.store.commit_version(
        VersionDraft.of(run.spec.algorithm, FRAGMENT, 1, params, state), committed_by="node", term=1
    )
    assert stored is not None
    for ref in (stored.record.params, stored.record.outer_state):
        data = run.store.mailbox.get(ref.key)
        assert (hex_digest(run.spec.blob_digest, data), len(data)) == (ref.hexdigest, ref.size_bytes)
        assert ref.digest_name == run.spec.blob_digest == "blake3"  # a new run's


def test_a_merge_that_overflows_is_retried_without_the_largest_delta():
    """INV-12: deltas that pass validation but whose merge or outer step is not finite (here
    3e38 per element at 100 × an honest weight: the Nesterov step overflows fp32) are never
    committed: ``close_round`` drops the largest and merges the rest, recording ``non_finite``."""
    import types

    from gradientmail.algorithms.outer import OuterState
    from gradientmail.backends import get_backend
    from gradientmail.syncer.rounds import Accepted, Base, RoundDraft, close_round

    numpy = get_backend("numpy")
    run = create_run(MemoryMailbox())
    version = run.store.load_version(run.spec, FRAGMENT, 0)
    base = Base(dict(version.params), OuterState.zeros(numpy, version.params))
    honest = {n: np.full_like(v, 0.01) for n, v in version.params.items()}
    huge = {n: np.full_like(v, 3e38) for n, v in version.params.items()}

    def accepted(learner: str, delta: dict[str, np.ndarray], weight: float, norm: float) -> Accepted:
        contribution = types.SimpleNamespace(learner=learner, final=False, steps=10, samples=80, carried_steps=0)
        key = keys.ContributionKey(FRAGMENT, 0, learner, 1)
        return Accepted(key, contribution, delta, weight, norm=norm)  # type: ignore[arg-type]

    draft = close_round(numpy, run.spec, base, [accepted("honest", honest, 1.0, 0.1), accepted("mallory", huge, 100.0, 3e38)])
    assert isinstance(draft, RoundDraft)
    assert [a.key.learner for a in draft.participants] == ["honest"]
    assert [(r.learner, r.reason) for r in draft.non_finite] == [("mallory", "non_finite")]
    assert all(np.isfinite(numpy.to_numpy(t)).all() for t in draft.params.values())
