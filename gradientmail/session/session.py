"""``gm.Session``: the learner's side of the exchange, one ``with`` around the training loop.

Failure behaviour first: constructing a Session validates its settings (``InvalidConfig``);
entering it joins the run and raises ``RunConfigMismatch`` if this node differs from the
run, or a ``MailboxError`` if the mailbox is unusable. Once running, store hiccups are
retried in the background and never raise from ``step()``; ``step()`` blocks only where
``overlap_steps`` asks it to wait for a commit. Exceptions from the training loop
propagate after the session shuts its threads down.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends import Backend, Tensor, backend_for, get_backend
from gradientmail.errors import InvalidConfig
from gradientmail.mailbox import Mailbox, open_mailbox
from gradientmail.records import check_learner_id, keys
from gradientmail.session.exchange import Commit, Exchange, Publication
from gradientmail.session.join import join_run
from gradientmail.store.run_store import RunStore
from gradientmail.syncer.rounds import RunSpec, load_version
from gradientmail.syncer.runtime import SyncerOptions, SyncerRuntime
from gradientmail.telemetry import hooks as telemetry
from gradientmail.telemetry import setup as telemetry_setup

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionOptions:
    """How one node talks to the mailbox. Defaults suit a run over S3 with steps of ~1 s."""

    lease_ttl_s: float = 10.0
    """Seconds without renewal after which this learner, or the syncer on it, counts as dead.
    Size it at several times ``poll_interval_s`` plus the store's worst latency."""
    poll_interval_s: float = 0.2
    """Seconds between two passes of the background exchange and of the syncer."""
    run_syncer: bool = True
    """Take part in the syncer election (every node does by default)."""
    commit_timeout_s: float = 600.0
    """Longest ``step()`` waits for a commit under ``overlap_steps``, and ``close()`` for each."""
    step_time_smoothing: float = 0.1
    """EMA weight of the newest step time reported for the grace window."""

    def __post_init__(self) -> None:
        for name in ("lease_ttl_s", "poll_interval_s", "commit_timeout_s"):
            if not getattr(self, name) > 0:
                raise InvalidConfig(name, f"must be positive, got {getattr(self, name)!r}")
        if not 0 < self.step_time_smoothing <= 1:
            raise InvalidConfig("step_time_smoothing", "must be in (0, 1]")
        if self.lease_ttl_s < 2 * self.poll_interval_s:
            raise InvalidConfig("lease_ttl_s", f"must be at least twice poll_interval_s ({self.poll_interval_s})")


def default_learner_id() -> str:
    """``GRADIENTMAIL_LEARNER_ID`` or the host name made id-safe: stable across restarts of a node."""
    configured = os.environ.get("GRADIENTMAIL_LEARNER_ID")
    if configured:
        return configured
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip(".-_") or "learner"
    return name[:64]


@dataclass
class _Fragment:
    """The learner's bookkeeping for one fragment."""

    names: tuple[str, ...]
    anchor: dict[str, Tensor]
    anchor_version: int
    align_step: int = 0
    align_samples: int = 0
    published_step: int | None = None
    """Local step at which our contribution against ``anchor_version`` went out, if any."""
    deferred: bool = False
    """Due while ``in_flight`` was exhausted: publish as soon as a slot frees."""
    half_period_pending: bool = False
    """Due with less than half a period trained (quorum of one): publish once it has that much."""


@dataclass
class SessionStats:
    steps: int = 0
    samples: int = 0
    contributions: int = 0
    alignments: int = 0
    blocked_s: float = 0.0
    versions: list[int] = field(default_factory=list)


class Session:
    """A learner in a GradientMail run; also hosts this node's syncer runtime.

    ::

        with gm.Session(model, algorithm=gm.DiLoCo(sync_every=100, fragments=8),
                        mailbox=gm.S3Mailbox(bucket="my-training", prefix="runs/example")) as session:
            for batch in loader:
                loss = train_step(model, optimizer, batch)
                session.step(samples=len(batch))

    ``model`` is a ``torch.nn.Module``, an ``mlx.nn.Module`` or a mapping of NumPy arrays;
    ``backend`` overrides the framework guess. ``mailbox`` is a mailbox or its URL.
    """

    def __init__(
        self,
        model: Any,
        *,
        algorithm: DiLoCo | None = None,
        mailbox: Mailbox | str,
        learner_id: str | None = None,
        backend: str | Backend | None = None,
        options: SessionOptions | None = None,
    ) -> None:
        self.model = model
        self.algorithm = algorithm if algorithm is not None else DiLoCo()
        if not isinstance(self.algorithm, DiLoCo):
            raise InvalidConfig("algorithm", f"expected gm.DiLoCo, got {type(self.algorithm).__name__}")
        self.mailbox = open_mailbox(mailbox) if isinstance(mailbox, str) else mailbox
        learner = learner_id if learner_id is not None else default_learner_id()
        try:
            self.learner_id = check_learner_id(learner)
        except ValueError as exc:
            raise InvalidConfig("learner_id", str(exc)) from None
        if isinstance(backend, str):
            backend = get_backend(backend)
        self.backend: Backend = backend or backend_for(model)
        self.options = options or SessionOptions()
        self.stats = SessionStats()
        self._store = RunStore(self.mailbox, self.backend)
        self._fragments: list[_Fragment] = []
        self._due_at: dict[int, list[int]] = {}
        self._attention = False
        self._changed = threading.Condition()
        self._last_step_at: float | None = None
        self._step_time_s: float | None = None
        self._exchange: Exchange | None = None
        self.syncer: SyncerRuntime | None = None
        self.spec: RunSpec | None = None
        self._open = False

    @classmethod
    def from_env(cls, model: Any, **overrides: Any) -> Session:
        """A session configured by ``GRADIENTMAIL_*`` variables (see ``gradientmail.settings``).

        ``overrides`` replace individual settings, e.g. ``learner_id="gpu-3"``.
        """
        from gradientmail.settings import NodeSettings  # settings imports this module

        settings = NodeSettings.from_env(**overrides)
        if telemetry_setup.active() is None:  # GRADIENTMAIL_METRICS_PORT or OTEL_EXPORTER_OTLP_* turn it on
            settings.telemetry()
        return cls(
            model,
            algorithm=settings.algorithm(),
            mailbox=settings.open_mailbox(),
            learner_id=settings.learner_id,
            backend=settings.backend,
            options=settings.session_options(),
        )

    # -- context manager -----------------------------------------------------------
    def __enter__(self) -> Session:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close(wait=exc is None)

    def open(self) -> None:
        """Join the run, load its newest committed parameters, start the background work."""
        manifest, created = join_run(self._store, self.model, self.algorithm, self.learner_id)
        self.spec = RunSpec.from_manifest(manifest)
        log.info("%s %s the run (%d fragments)", self.learner_id, "created" if created else "joined", len(manifest.plan))
        self._fragments = []
        for fragment, names in enumerate(manifest.plan):
            record, params, _ = load_version(self._store, self.spec, fragment, self._store.newest_version(fragment))
            self.backend.write_parameters(self.model, params)
            self._fragments.append(_Fragment(names, self.backend.read_parameters(self.model, names), record.version))
        self.stats.versions = [f.anchor_version for f in self._fragments]
        every = self.algorithm.sync_every
        for fragment in range(len(self._fragments)):
            offset = ((fragment + 1) * every // len(self._fragments)) % every
            self._due_at.setdefault(offset, []).append(fragment)
        self._exchange = Exchange(
            self._store, self.spec, self.learner_id, [f.anchor_version for f in self._fragments],
            self.options.lease_ttl_s, self.options.poll_interval_s, self._notify,
        )
        self._exchange.lease_info = self._lease_info
        self._exchange.start()
        if self.options.run_syncer:
            syncer_backend = self.backend if self.backend.name != "mlx" else get_backend("numpy")
            self.syncer = SyncerRuntime(
                RunStore(self.mailbox, syncer_backend), self.spec, self.learner_id,
                SyncerOptions(lease_ttl_s=self.options.lease_ttl_s, poll_interval_s=self.options.poll_interval_s),
            )
            self.syncer.start()
        self._open = True
        telemetry.attach_session(self)  # observable instruments read self.stats; step() does nothing more

    # -- the hot path --------------------------------------------------------------
    def step(self, samples: int = 1) -> None:
        """Count one local step of ``samples`` examples (or tokens); exchange if due.

        Cheap unless a fragment is due or a commit is ready; blocks only as far as
        ``overlap_steps`` asks.
        """
        if not self._open:
            raise RuntimeError("Session.step() outside the session: use it inside `with gm.Session(...)`")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise InvalidConfig("samples", f"must be a non-negative integer, got {samples!r}")
        now = time.perf_counter()
        if self._last_step_at is not None:
            elapsed = now - self._last_step_at
            a = self.options.step_time_smoothing
            self._step_time_s = elapsed if self._step_time_s is None else (1 - a) * self._step_time_s + a * elapsed
        self._last_step_at = now
        stats = self.stats
        stats.steps += 1
        stats.samples += samples
        if self._attention or (stats.steps % self.algorithm.sync_every) in self._due_at:
            self._exchange_between_steps()

    def _lease_info(self) -> dict[str, object]:
        """Progress shown in this learner's lease (read by the CLI and telemetry)."""
        return {"step": self.stats.steps, "step_time_s": round(self._step_time_s or 0.0, 6),
                "versions": ",".join(str(f.anchor_version) for f in self._fragments)}

    def _notify(self) -> None:
        self._attention = True
        with self._changed:
            self._changed.notify_all()

    def _exchange_between_steps(self) -> None:
        self._attention = False
        self._align_ready()
        due = self._scheduled_now()
        assert self._exchange is not None
        due |= self._exchange.others_publishing
        due |= {i for i, f in enumerate(self._fragments) if f.deferred}
        for fragment in sorted(due):
            self._publish(fragment, final=False)
        self._wait_for_overlap()
        if any(f.published_step is not None or f.deferred or f.half_period_pending for f in self._fragments):
            self._attention = True  # keep checking while contributions are in flight or deferred

    def _scheduled_now(self) -> set[int]:
        """Fragments whose scheduled exchange is now, with at least half a period trained.

        Every round applies a full outer momentum step, so a learner whose schedule falls just
        after a commit must not open a round of a few steps. With ``quorum_size ≥ 2`` it skips
        that exchange: the next round will pull it in early. With a quorum of one nothing
        would, so it publishes once the half period is reached instead.
        """
        minimum = (self.algorithm.sync_every + 1) // 2
        steps = self.stats.steps
        due: set[int] = set()
        for fragment in self._due_at.get(steps % self.algorithm.sync_every, ()):
            state = self._fragments[fragment]
            if steps - state.align_step >= minimum:
                due.add(fragment)
            elif self.algorithm.quorum_size == 1:
                state.half_period_pending = True
        for fragment, state in enumerate(self._fragments):
            if state.half_period_pending and steps - state.align_step >= minimum:
                due.add(fragment)
        return due

    def _align_ready(self) -> None:
        assert self._exchange is not None
        for commit in self._exchange.take_ready().values():
            self._align(commit)

    def _align(self, commit: Commit) -> None:
        state = self._fragments[commit.fragment]
        if commit.version <= state.anchor_version:
            return
        committed = {name: self.backend.from_numpy(array) for name, array in commit.params.items()}
        mixing = self.algorithm.mixing
        if mixing > 0:
            local = self.backend.read_parameters(self.model, state.names)
            blended = {
                n: self.backend.add(self.backend.scale(local[n], mixing), self.backend.scale(committed[n], 1 - mixing))
                for n in state.names
            }
            self.backend.write_parameters(self.model, blended)
        else:
            self.backend.write_parameters(self.model, committed)
        state.anchor = self.backend.read_parameters(self.model, state.names) if mixing == 0 else {
            n: self.backend.cast(committed[n], self.spec.dtypes[n]) for n in state.names  # type: ignore[union-attr]
        }
        state.anchor_version = commit.version
        state.align_step, state.align_samples = self.stats.steps, self.stats.samples
        state.published_step = None
        self.stats.alignments += 1
        self.stats.versions[commit.fragment] = commit.version

    def _publish(self, fragment: int, *, final: bool) -> bool:
        state = self._fragments[fragment]
        steps = self.stats.steps - state.align_step
        if steps == 0 or state.published_step is not None:
            state.deferred = False
            return False
        in_flight = self.algorithm.in_flight
        if in_flight is not None and not final:
            busy = sum(1 for f in self._fragments if f.published_step is not None)
            if busy >= in_flight:
                state.deferred = True
                return False
        state.deferred = False
        local = self.backend.read_parameters(self.model, state.names)
        dtype = self.algorithm.delta_dtype
        delta = {}
        for name in state.names:
            difference = self.backend.sub(state.anchor[name], local[name])
            delta[name] = self.backend.to_numpy(self.backend.cast(difference, dtype or self.spec.dtypes[name]))  # type: ignore[union-attr]
        assert self._exchange is not None
        self._exchange.publish(
            Publication(fragment, state.anchor_version, steps, self.stats.samples - state.align_samples, delta, final, self._step_time_s)
        )
        state.published_step = self.stats.steps
        state.half_period_pending = False
        self.stats.contributions += 1
        return True

    def _wait_for_overlap(self) -> None:
        bound = self.algorithm.overlap_steps
        if bound is None:
            return
        for fragment, state in enumerate(self._fragments):
            if state.published_step is not None and self.stats.steps - state.published_step >= bound:
                self._wait_for_commit(fragment, state.anchor_version)

    def _wait_for_commit(self, fragment: int, base_version: int) -> bool:
        """Block until a version newer than ``base_version`` is aligned; False on timeout."""
        started = time.perf_counter()
        deadline = time.monotonic() + self.options.commit_timeout_s
        state = self._fragments[fragment]
        with self._changed:
            while state.anchor_version <= base_version:
                self._align_ready()
                if state.anchor_version > base_version:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning("%s: no commit of fragment %d after version %d within %.0f s; continuing",
                                self.learner_id, fragment, base_version, self.options.commit_timeout_s)
                    state.published_step = None
                    break
                self._changed.wait(min(remaining, self.options.poll_interval_s))
        self.stats.blocked_s += time.perf_counter() - started
        return state.anchor_version > base_version

    # -- closing -------------------------------------------------------------------
    def close(self, wait: bool = True) -> None:
        """Finish: wait for rounds in flight, optionally flush, set the model to the newest commit.

        Waits for this learner's own rounds (up to ``commit_timeout_s`` each) and, up to
        ``lease_ttl_s``, for rounds other learners have open on the same versions.
        With ``wait=False`` (an exception left the ``with`` block) only the threads stop.
        """
        if not self._open:
            return
        self._open = False
        exchange = self._exchange
        assert exchange is not None
        try:
            if wait:
                self._align_ready()
                if self.algorithm.flush_on_close:
                    for fragment in range(len(self._fragments)):
                        self._publish(fragment, final=True)
                for fragment, state in enumerate(self._fragments):
                    if state.published_step is not None:
                        self._wait_for_commit(fragment, state.anchor_version)
                self._wait_for_open_rounds()
                self._load_newest()
        finally:
            exchange.stop(release_lease=True)
            if self.syncer is not None:
                self.syncer.stop(resign=True)

    def wait_published(self, timeout_s: float | None = None) -> bool:
        """Block until every contribution handed to the background is in the mailbox."""
        assert self._exchange is not None
        deadline = time.monotonic() + (self.options.commit_timeout_s if timeout_s is None else timeout_s)
        while not self._exchange.idle():
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.01, self.options.poll_interval_s))
        return True

    def _wait_for_open_rounds(self) -> None:
        """Give rounds other learners have open on our newest versions a lease TTL to commit,
        so learners that stop together end on the same newest version."""
        deadline = time.monotonic() + self.options.lease_ttl_s
        for fragment, state in enumerate(self._fragments):
            while time.monotonic() < deadline:
                newest = self._store.newest_version(fragment, known=state.anchor_version) or 0
                if not self.mailbox.list(keys.contributions_prefix(fragment, newest)):
                    break
                time.sleep(self.options.poll_interval_s)

    def _load_newest(self) -> None:
        assert self.spec is not None
        for fragment, state in enumerate(self._fragments):
            newest = self._store.newest_version(fragment, known=state.anchor_version)
            if newest is not None and newest > state.anchor_version:
                _, params, _ = load_version(self._store, self.spec, fragment, newest)
                self.backend.write_parameters(self.model, params)
                state.anchor = self.backend.read_parameters(self.model, state.names)
                state.anchor_version = newest
                self.stats.versions[fragment] = newest
            else:  # drop the steps since the last contribution: back to the committed anchor
                self.backend.write_parameters(self.model, state.anchor)

    @property
    def bytes_published(self) -> int:
        """Contribution payload bytes this learner has put in the mailbox."""
        return self._exchange.bytes_published if self._exchange is not None else 0

    @property
    def bytes_fetched(self) -> int:
        """Committed parameter bytes this learner has fetched from the mailbox."""
        return self._exchange.bytes_fetched if self._exchange is not None else 0

    @property
    def versions(self) -> Mapping[int, int]:
        """The committed version each fragment is aligned with."""
        return {i: f.anchor_version for i, f in enumerate(self._fragments)}
