"""An in-process run a test or a benchmark drives pass by pass: a run of ``ALGORITHM`` created in
a mailbox (memory or directory, counted by ``MeteredMailbox``), honest learners that publish
through the store, and an in-process syncer on a ``ManualClock`` that ``Run.commit_next`` moves
a poll at a time. The bad-input corpus (``benchmarks/bad_input.py``, ``bad_runs.py``) and the
syncer's unit tests build on it.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

import gradientmail as gm
from gradientmail.backends import get_backend, payload
from gradientmail.digests import DEFAULT_BLOB_DIGEST, DigestName
from gradientmail.mailbox import ForwardingMailbox, Mailbox
from gradientmail.records import SavedState, keys
from gradientmail.records.auth import RunKey
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import Arrays, ContributionCounts, LearnerLease, Retention, RunSpec, RunStore, StoredRound
from gradientmail.syncer import SyncerRuntime

__all__ = [
    "ALGORITHM",
    "FRAGMENT",
    "HONEST",
    "MALLORY",
    "ManualClock",
    "MeteredMailbox",
    "Run",
    "create_run",
    "file_reads",
    "rng_for",
]

NUMPY = get_backend("numpy")
FRAGMENT = 0
HONEST = ("alice", "bob")
MALLORY = "mallory"
STEPS, SAMPLES = 10, 80
"""What every honest contribution reports: 10 local steps of 8 samples."""
SYNC_EVERY = 10
LEASE_TTL_S = 10.0
POLL_S = 0.05
MAX_PASSES = 40
ALGORITHM = gm.DiLoCo(sync_every=SYNC_EVERY, quorum_size=2)
"""Decoupled DiLoCo's defaults (RDA merge, Nesterov outer step) with quorum 2."""
RUN_SECRET = "bad-input corpus run key (a test value, not a secret)"
SMALL_MODEL: dict[str, tuple[int, ...]] = {"embed.weight": (4, 2), "mlp.weight": (3, 2), "mlp.bias": (3,)}
MiB = 1 << 20


class MovableClock(Protocol):
    """A monotonic clock moved by hand (``tests.fake_clock.FakeClock`` is one)."""

    now: float

    def __call__(self) -> float: ...


class ManualClock:
    """The benchmark's movable clock (the syncer's and the election's)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class MeteredMailbox(ForwardingMailbox):
    """Passes every call to ``inner`` and remembers, per key, the allowance each read asked for
    (``max_bytes``) and the bytes reads handed back."""

    def __init__(self, inner: Mailbox) -> None:
        super().__init__(inner)
        self.allowances: dict[str, list[int | None]] = {}
        self.returned: Counter[str] = Counter()

    def _count(self, key: str, max_bytes: int | None, data: bytes | None) -> None:
        self.allowances.setdefault(key, []).append(max_bytes)
        if data is not None:
            self.returned[key] += len(data)

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        return self.get_versioned(key, max_bytes=max_bytes)[0]

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        try:
            data, token = self.inner.get_versioned(key, max_bytes=max_bytes)
        except BaseException:
            self._count(key, max_bytes, None)
            raise
        self._count(key, max_bytes, data)
        return data, token


def file_reads() -> int:
    """Bytes this process has read through read(2) and friends so far (Linux; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# -- a run -------------------------------------------------------------------------------------


def rng_for(*seed: str | int) -> np.random.Generator:
    return np.random.default_rng([zlib.crc32(s.encode()) if isinstance(s, str) else s for s in seed])


@dataclass
class Run:
    """One run in a mailbox, the honest side's store and an in-process syncer on a manual clock."""

    box: MeteredMailbox
    store: RunStore
    spec: RunSpec
    syncer: SyncerRuntime
    clock: MovableClock
    key: RunKey | None
    model: dict[str, tuple[int, ...]]
    leases: dict[str, LearnerLease] = field(default_factory=dict)

    @property
    def payload_bytes(self) -> int:
        """Bytes of one legitimate contribution payload (what the memory figures are divided by)."""
        return len(payload.encode(self.honest_delta("alice", 0)))

    def newest(self) -> int:
        newest = self.store.newest_version(FRAGMENT)
        assert newest is not None
        return newest

    def params(self, version: int) -> Arrays:
        return self.store.load_version(self.spec, FRAGMENT, version).params

    def honest_delta(self, learner: str, version: int, scale: float = 1.0) -> Arrays:
        """A learner's delta against ``version``: small Gaussian values, the same on every call."""
        rng = rng_for(learner, version)
        return {n: (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.01 * scale)) for n, shape in self.model.items()}

    def publish(
        self,
        learner: str,
        delta: Arrays | None = None,
        *,
        steps: int = STEPS,
        samples: int = SAMPLES,
        version: int | None = None,
        saved_state: SavedState | None = None,
    ) -> keys.ContributionKey:
        """What an honest learner does: renew its lease, publish its delta through the store
        (naming ``saved_state``, its newest state saved in the mailbox, as a session does)."""
        base = self.newest() if version is None else version
        lease = self.leases.setdefault(learner, LearnerLease(self.store, learner, LEASE_TTL_S))
        lease.renew({})
        delta = delta if delta is not None else self.honest_delta(learner, base)
        return self.store.publish_contribution(
            learner, FRAGMENT, base, delta, ContributionCounts(steps, samples, step_time_s=0.1), saved_state=saved_state
        ).key

    def publish_honest(self) -> dict[str, keys.ContributionKey]:
        return {learner: self.publish(learner) for learner in HONEST}

    def commit_next(self, syncer: SyncerRuntime | None = None, passes: int = MAX_PASSES) -> StoredRound:
        """Syncer passes (the clock moving a poll interval between them) until a version commits."""
        syncer = syncer or self.syncer
        before = self.newest()
        for _ in range(passes):
            syncer.run_once()
            newest = self.newest()
            if newest > before:
                return self.store.read_stored_round(FRAGMENT, newest)
            self.clock.now += POLL_S
        raise RuntimeError(f"no version after {before} was committed in {passes} syncer passes")

    def honest_round(self) -> StoredRound:
        self.publish_honest()
        return self.commit_next()

    def new_syncer(self, node: str) -> SyncerRuntime:
        return SyncerRuntime(self.store, NUMPY, self.spec, node, poll_interval_s=POLL_S, clock=self.clock)


def initial_params(model: dict[str, tuple[int, ...]]) -> Arrays:
    rng = rng_for("initial")
    return {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in model.items()}


def create_run(
    mailbox: Mailbox,
    *,
    model: dict[str, tuple[int, ...]] | None = None,
    key: RunKey | None = None,
    retention: Retention | None = None,
    clock: MovableClock | None = None,
    blob_digest: DigestName | None = DEFAULT_BLOB_DIGEST,
) -> Run:
    """Create a run of ``ALGORITHM`` in ``mailbox`` with version 0 committed, and an in-process
    syncer on a manual clock that has not polled yet. ``blob_digest`` None: a manifest that
    names no digest, as every run from before manifests named one (sha256)."""
    model = model or SMALL_MODEL
    box = mailbox if isinstance(mailbox, MeteredMailbox) else MeteredMailbox(mailbox)
    store = RunStore(box, key)
    proposal = RunProposal(ALGORITHM, lease_ttl_s=LEASE_TTL_S, retention=retention, blob_digest=blob_digest)
    spec, created = join_run(store, NUMPY, initial_params(model), proposal, "creator")
    assert created, f"a run exists already in {box.url}"
    clock = clock or ManualClock()
    syncer = SyncerRuntime(store, NUMPY, spec, "syncer-node", poll_interval_s=POLL_S, clock=clock)
    return Run(box, store, spec, syncer, clock, key, model)
