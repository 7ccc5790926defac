"""The learner's background exchange: publish contributions, fetch commits, renew the lease.

It runs in one thread and touches only NumPy arrays and the mailbox, never the model:
the training thread hands it deltas already copied to host memory and takes back
fetched commits as host arrays, converting them between steps.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gradientmail.backends import get_backend
from gradientmail.errors import GradientMailError, RecordExists
from gradientmail.records import Contribution, PayloadRef, TensorSpec, keys
from gradientmail.store.leases import LearnerLease
from gradientmail.store.run_store import RunStore, sha256_hex
from gradientmail.syncer.rounds import RunSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Publication:
    """A delta ready to go, as host arrays, with the counts it reports."""

    fragment: int
    anchor_version: int
    steps: int
    samples: int
    delta: dict[str, np.ndarray]
    final: bool
    step_time_s: float | None


@dataclass(frozen=True)
class Commit:
    """A committed version fetched for alignment, as host arrays."""

    fragment: int
    version: int
    params: dict[str, np.ndarray]


class Exchange:
    """Background worker for one learner. ``on_change`` is called when a commit is ready."""

    def __init__(
        self,
        store: RunStore,
        spec: RunSpec,
        learner_id: str,
        known_versions: list[int],
        lease_ttl_s: float,
        poll_interval_s: float,
        on_change: Callable[[], None],
    ) -> None:
        self._store = RunStore(store.mailbox, get_backend("numpy"))
        self._spec = spec
        self._learner = learner_id
        self._known = list(known_versions)
        self._poll_interval_s = poll_interval_s
        self._lease = LearnerLease(store.mailbox, learner_id, lease_ttl_s)
        self._lease_every_s = lease_ttl_s / 3
        self._lease_renewed_at = float("-inf")
        self._on_change = on_change
        self._outbox: queue.Queue[Publication] = queue.Queue()
        self._ready: dict[int, Commit] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sequence = 0
        self.lease_info: Callable[[], dict[str, object]] = dict
        """What the lease tells observers; called at each renewal (on this thread), never per step."""
        self.others_publishing: set[int] = set()
        """Fragments whose current round another learner has opened (quorum ≥ 2 only)."""
        self.published: list[str] = []
        self.bytes_published = 0
        self.bytes_fetched = 0
        self.last_error: BaseException | None = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._lease.renew(**self.lease_info())
        self._lease_renewed_at = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name=f"gm-exchange-{self._learner}", daemon=True)
        self._thread.start()

    def stop(self, release_lease: bool = True) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._drain_outbox()
        if release_lease:
            try:
                self._lease.release()
            except GradientMailError as exc:
                log.warning("could not release the lease of %s: %s", self._learner, exc)

    # -- the training thread's side -----------------------------------------------
    def publish(self, publication: Publication) -> None:
        self._outbox.put(publication)
        self._wake.set()

    def take_ready(self) -> dict[int, Commit]:
        with self._lock:
            ready, self._ready = self._ready, {}
        return ready

    def idle(self) -> bool:
        """True when nothing waits to be published."""
        return self._outbox.unfinished_tasks == 0

    # -- the background side -------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain_outbox()
                self._fetch_commits()
                self._watch_rounds()
                self._renew_lease()
            except GradientMailError as exc:
                self.last_error = exc
                log.warning("exchange of %s failed, retrying: %s", self._learner, exc)
            except Exception as exc:
                self.last_error = exc
                log.exception("exchange of %s crashed a pass", self._learner)
            self._wake.wait(self._poll_interval_s)
            self._wake.clear()

    def _drain_outbox(self) -> None:
        while True:
            try:
                publication = self._outbox.get_nowait()
            except queue.Empty:
                return
            try:
                self._send(publication)
            finally:
                self._outbox.task_done()

    def _send(self, publication: Publication) -> None:
        fragment, base = publication.fragment, publication.anchor_version
        data = self._store.backend.encode(publication.delta)
        while True:
            self._sequence += 1
            record_key = keys.contribution_record(fragment, base, self._learner, self._sequence)
            if not self._store.mailbox.exists(record_key):
                break
        blob_key = keys.contribution_blob(fragment, base, self._learner, self._sequence)
        self._store.mailbox.put(blob_key, data)
        dtypes = {self._store.backend.dtype_name(a) for a in publication.delta.values()}
        contribution = Contribution(
            learner=self._learner,
            fragment=fragment,
            anchor_version=base,
            steps=publication.steps,
            samples=publication.samples,
            payload=PayloadRef(key=blob_key, sha256=sha256_hex(data), size_bytes=len(data)),
            dtype=dtypes.pop() if len(dtypes) == 1 else "mixed",
            tensors=tuple(TensorSpec(name=n, shape=a.shape, dtype=self._store.backend.dtype_name(a)) for n, a in publication.delta.items()),
            final=publication.final,
            step_time_s=publication.step_time_s,
        )
        try:
            self._store.mailbox.create(record_key, contribution.to_json())
        except RecordExists:  # another process uses our learner id: refuse to guess
            raise GradientMailError(f"contribution {record_key} already exists: is learner id {self._learner!r} used twice?") from None
        self.published.append(record_key)
        self.bytes_published += len(data)

    def _fetch_commits(self) -> None:
        for fragment, known in enumerate(self._known):
            newest = self._store.newest_version(fragment, known=known)
            if newest is None or newest <= known:
                continue
            record = self._store.read_round(fragment, newest)
            params = self._store.read_tensors(record.params, self._spec.param_specs(fragment))
            self.bytes_fetched += record.params.size_bytes
            self._known[fragment] = newest
            with self._lock:
                self._ready[fragment] = Commit(fragment, newest, params)
            self._on_change()

    def _watch_rounds(self) -> None:
        """With quorum ≥ 2, notice rounds one short of quorum so we can publish early."""
        quorum = self._spec.algorithm.quorum_size
        if quorum < 2:
            return
        opened: set[int] = set()
        for fragment, known in enumerate(self._known):
            others = {
                parsed.learner
                for key in self._store.mailbox.list(keys.contributions_prefix(fragment, known))
                if (parsed := keys.parse_contribution_record(key)) is not None and parsed.learner != self._learner
            }
            if len(others) >= quorum - 1:
                opened.add(fragment)
        if opened != self.others_publishing:
            self.others_publishing = opened
            if opened:
                self._on_change()

    def _renew_lease(self) -> None:
        if time.monotonic() - self._lease_renewed_at >= self._lease_every_s:
            self._lease.renew(**self.lease_info())
            self._lease_renewed_at = time.monotonic()
