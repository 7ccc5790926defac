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
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from gradientmail.algorithms import schedule
from gradientmail.algorithms.align import aligned_parameters, carried_parameters
from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends import Backend, Tensor, backend_for, get_backend
from gradientmail.errors import GradientMailError, InvalidConfig, InvalidKey
from gradientmail.mailbox import Mailbox, open_mailbox
from gradientmail.records import Realignment, check_learner_id, default_learner_id, keys
from gradientmail.records.auth import RunKey
from gradientmail.session.exchange import Commit, Exchange, HostBuffer, Publication
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import ContributionCounts, LeaseObserver, Retention, RunSpec, RunStore
from gradientmail.syncer import SyncerRuntime
from gradientmail.telemetry import hooks as telemetry

__all__ = ["Session", "SessionOptions", "SessionStats"]

log = logging.getLogger(__name__)

_REUSABLE = ("torch", "numpy")
"""Backends whose snapshots go into preallocated host buffers, reused from publish to publish."""
_FLUSH_ATTEMPTS = 3
"""Final contributions published at close when a round closes without the previous ones."""


@dataclass(frozen=True)
class SessionOptions:
    """How one node talks to the mailbox. Defaults suit a run over S3 with steps of ~1 s."""

    lease_ttl_s: float = 10.0
    """Seconds without renewal after which a learner, or the syncer, counts as dead. A run's
    first learner records it in the manifest; every node then uses the run's value. Size it at
    several times ``poll_interval_s`` plus the store's worst latency."""
    poll_interval_s: float = 0.2
    """Seconds between two passes of the background exchange and of the syncer while something
    is expected: a commit of a fragment this learner published, a round with contributions."""
    idle_poll_interval_s: float | None = None
    """Seconds between the passes that only look for news while nothing is expected: the
    learner's check for commits and rounds others opened, the reads of leases (the syncer
    lease by the nodes watching it, the learners' by the elected syncer). None: the same as
    ``poll_interval_s``. ``lease_ttl_s / 3`` cuts an idle learner's S3 requests about tenfold
    (docs/benchmarks.md) but, measured, let a half-speed learner's work reach fewer commits
    (82 % of its steps merged against 97 %); see docs/session.md, "Polling"."""
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
        if self.idle_poll_interval_s is not None and not self.idle_poll_interval_s >= self.poll_interval_s:
            raise InvalidConfig("idle_poll_interval_s", f"must be at least poll_interval_s ({self.poll_interval_s})")
        if not 0 < self.step_time_smoothing <= 1:
            raise InvalidConfig("step_time_smoothing", "must be in (0, 1]")
        if self.lease_ttl_s < 2 * self.poll_interval_s:
            raise InvalidConfig("lease_ttl_s", f"must be at least twice poll_interval_s ({self.poll_interval_s})")


class SyncerWatch:
    """Whether any node still holds a live syncer lease: what a closing learner waits on.

    ``gone()`` is True once the lease has been absent, unreadable, released or expired (the
    run's TTL on this clock) for one more TTL — time for a new syncer to take over. Reads the
    lease at most once per poll interval."""

    def __init__(self, store: RunStore, ttl_s: float, poll_interval_s: float) -> None:
        self._store = store
        self._observer = LeaseObserver(ttl_s)
        self._ttl_s = ttl_s
        self._poll_interval_s = poll_interval_s
        self._checked_at = float("-inf")
        self._gone_since: float | None = None

    def gone(self) -> bool:
        now = time.monotonic()
        if now - self._checked_at >= self._poll_interval_s:
            self._checked_at = now
            try:
                found = self._store.read_lease(keys.SYNCER_LEASE)
            except GradientMailError:
                return False  # the store hiccuped: no evidence either way
            dead = found is None or self._observer.expired(keys.SYNCER_LEASE, found)
            self._gone_since = (self._gone_since or now) if dead else None
        return self._gone_since is not None and now - self._gone_since >= self._ttl_s


@dataclass
class _Fragment:
    """The learner's bookkeeping for one fragment."""

    names: tuple[str, ...]
    anchor: Mapping[str, np.ndarray]
    """The committed parameters the learner is aligned with, as host arrays (never written)."""
    anchor_version: int
    anchor_step: int = 0
    """Local step at which the learner aligned with ``anchor_version``."""
    align_step: int = 0
    """Local step where the fragment's unmerged work begins (before ``anchor_step`` when work
    was carried across the alignment)."""
    align_samples: int = 0
    published_step: int | None = None
    """Local step at which our contribution against ``anchor_version`` went out, if any."""
    published_samples: int = 0
    published_params: HostBuffer | None = None
    """The parameters the published delta ended at: where work after it begins."""
    published_serial: int = 0
    buffers: list[HostBuffer] = field(default_factory=list)
    """Host snapshots of this fragment, reused from publish to publish."""
    realigned: list[Realignment] = field(default_factory=list)
    """Work dropped since the last merged contribution, reported with the next one."""
    deferred: bool = False
    """Due while ``in_flight`` was exhausted: publish as soon as a slot frees."""
    half_period_pending: bool = False
    due_step: int = 0
    """The local step at which the schedule next asks for this fragment: the staircase at first,
    then ``sync_every`` steps after each alignment (the learner follows the run's rounds)."""
    """Due with less than half a period trained (quorum of one): publish once it has that much."""


@dataclass
class _Running:
    """Everything that exists only between ``open()`` and ``close()``."""

    spec: RunSpec
    fragments: list[_Fragment]
    next_due: int
    """The earliest ``due_step`` of any fragment: what ``step()`` compares against."""
    exchange: Exchange
    syncer: SyncerRuntime | None
    open: bool = True
    """False once closed; the rest stays readable (byte counts, the spec)."""


@dataclass
class SessionStats:
    steps: int = 0
    samples: int = 0
    contributions: int = 0
    alignments: int = 0
    blocked_s: float = 0.0
    versions: list[int] = field(default_factory=list)
    dropped_at_close: list[int] = field(default_factory=list)
    """Per fragment: unmerged steps the model left behind at close (set to the newest commit)."""


class Session:
    """A learner in a GradientMail run; also hosts this node's syncer runtime.

    ::

        with gm.Session(
            model,
            algorithm=gm.DiLoCo(sync_every=100, fragments=8),
            mailbox=gm.S3Mailbox(bucket="my-training", prefix="runs/example"),
        ) as session:
            for batch in loader:
                loss = train_step(model, optimizer, batch)
                session.step(samples=len(batch))

    ``model`` is a ``torch.nn.Module``, an ``mlx.nn.Module`` or a mapping of NumPy arrays;
    ``backend`` overrides the framework guess. ``mailbox`` is a mailbox or its URL; a mailbox
    opened here from a URL is closed when the session closes, one passed in stays the caller's.
    ``run_key`` (a secret string or :class:`~gradientmail.records.auth.RunKey`) signs and checks
    every record (docs/security.md); every node of a run needs the same one. ``retention`` is
    the storage policy a new run is created with (a joiner uses the run's).
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
        run_key: str | RunKey | None = None,
        retention: Retention | None = None,
    ) -> None:
        self.model = model
        self.algorithm = algorithm if algorithm is not None else DiLoCo()
        if not isinstance(self.algorithm, DiLoCo):
            raise InvalidConfig("algorithm", f"expected gm.DiLoCo, got {type(self.algorithm).__name__}")
        try:
            self.learner_id = check_learner_id(learner_id if learner_id is not None else default_learner_id())
        except InvalidKey as exc:
            raise InvalidConfig("learner_id", str(exc)) from None
        self.backend: Backend = get_backend(backend) if isinstance(backend, str) else backend or backend_for(model)
        self.options = options or SessionOptions()
        if retention is not None and not isinstance(retention, Retention):
            raise InvalidConfig("retention", f"expected gm.Retention, got {type(retention).__name__}")
        self.retention = retention or Retention()
        key = run_key if isinstance(run_key, RunKey) or run_key is None else RunKey(run_key)
        self.stats = SessionStats()
        self._owns_mailbox = isinstance(mailbox, str)
        self._mailbox = open_mailbox(mailbox) if isinstance(mailbox, str) else mailbox
        self._store = RunStore(self._mailbox, key)
        self._changed = threading.Condition()
        self._attention = False
        self._last_step_at: float | None = None
        self._step_time_s: float | None = None
        self._run: _Running | None = None
        self._serial = 0

    # -- context manager -----------------------------------------------------------
    def __enter__(self) -> Session:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close(wait=exc is None)

    def open(self) -> None:
        """Join the run, load its newest committed parameters, start the background work."""
        proposal = RunProposal(self.algorithm, lease_ttl_s=self.options.lease_ttl_s, retention=self.retention)
        spec, created = join_run(self._store, self.backend, self.model, proposal, self.learner_id)
        log.info("%s %s the run (%d fragments)", self.learner_id, "created" if created else "joined", len(spec.fragments))
        fragments = []
        for fragment, names in enumerate(spec.fragments):
            newest = self._store.newest_version(fragment)
            assert newest is not None  # join_run committed version 0 of every fragment
            record = self._store.read_round(fragment, newest)
            committed = self._store.read_params(spec, record)
            self.backend.write_parameters(self.model, self._tensors(committed))
            fragments.append(_Fragment(names, committed, record.version))
        self.stats.versions = [f.anchor_version for f in fragments]
        self.stats.dropped_at_close = [0] * len(fragments)
        exchange = Exchange(
            self._store,
            spec,
            self.learner_id,
            list(self.stats.versions),
            lease_ttl_s=spec.lease_ttl_s,
            poll_interval_s=self.options.poll_interval_s,
            idle_interval_s=self._idle_interval_s(),
            on_change=self._notify,
            lease_info=self._lease_info,
            clock=time.monotonic,
            anchors=[f.anchor for f in fragments],
            on_published=self._contribution_published,
            algorithm=self.algorithm,
        )
        syncer = None
        if self.options.run_syncer:
            # MLX is only touched by the training thread: an MLX node's syncer merges in NumPy
            syncer_backend = self.backend if self.backend.name != "mlx" else get_backend("numpy")
            syncer = SyncerRuntime(
                self._store,
                syncer_backend,
                spec,
                self.learner_id,
                poll_interval_s=self.options.poll_interval_s,
                idle_interval_s=self._idle_interval_s(),
                on_commit=lambda fragment, version: exchange.commit_available(fragment),
            )
        live = dict(self.backend.named_parameters(self.model))
        for index, state in enumerate(fragments):
            state.due_step = schedule.first_due_step(index, len(fragments), self.algorithm.sync_every)
            if self.backend.name in _REUSABLE:  # allocated (and paged in) now, not at the first publish
                state.buffers.append(new_buffer(self.backend, live, state.names))
        self._run = _Running(spec, fragments, min(f.due_step for f in fragments), exchange, syncer)
        exchange.start()
        if syncer is not None:
            syncer.start()
        telemetry.attach_session(self)  # observable instruments read self.stats; step() does nothing more

    # -- the hot path --------------------------------------------------------------
    def step(self, samples: int = 1) -> None:
        """Count one local step of ``samples`` examples (or tokens); exchange if due.

        Cheap unless a fragment is due or a commit is ready; blocks only as far as
        ``overlap_steps`` asks.
        """
        run = self._run
        if run is None or not run.open:
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
        if self._attention or stats.steps >= run.next_due:
            self._exchange_between_steps(run)

    def _idle_interval_s(self) -> float:
        """The idle pace handed to the exchange and the syncer (``poll_interval_s`` unless set)."""
        idle = self.options.idle_poll_interval_s
        return self.options.poll_interval_s if idle is None else idle

    def _lease_info(self) -> dict[str, object]:
        """Progress shown in this learner's lease (read by the CLI and telemetry), and when its
        next contribution is due: ``due_in_s``, seconds from the renewal at its current step
        time (the elected syncer lists contributions at the regular pace around then; a hint
        only, absent before the step time is known and once the contribution is due)."""
        info: dict[str, object] = {
            "step": self.stats.steps,
            "step_time_s": round(self._step_time_s or 0.0, 6),
            "versions": ",".join(str(v) for v in self.stats.versions),
        }
        run = self._run
        if run is not None and run.open and self._step_time_s and run.next_due > self.stats.steps:
            # absent once due: the contribution is on its way (the window of an earlier renewal
            # covers its upload) or waits for a slot; the syncer keeps no fast pace for it
            info["due_in_s"] = round((run.next_due - self.stats.steps) * self._step_time_s, 3)
        return info

    def _contribution_published(self, fragment: int) -> None:
        """On the exchange thread, after an upload: the syncer in this process looks now."""
        run = self._run
        if run is not None and run.syncer is not None:
            run.syncer.contribution_published(fragment)

    def _notify(self) -> None:
        self._attention = True
        with self._changed:
            self._changed.notify_all()

    def _exchange_between_steps(self, run: _Running) -> None:
        self._attention = False
        self._align_ready(run)
        due = self._scheduled_now(run) | self._joining(run) | {i for i, f in enumerate(run.fragments) if f.deferred}
        for fragment in sorted(due):
            self._publish(run, fragment, final=False)
        for fragment, state in enumerate(run.fragments):
            if state.published_step is not None and schedule.must_wait_for_commit(
                self.stats.steps - state.published_step, self.algorithm.overlap_steps
            ):
                self._wait_for_commit(run, fragment, state.anchor_version)
        waits = self.algorithm.overlap_steps is not None
        if run.exchange.open_rounds or any(
            (waits and f.published_step is not None) or f.deferred or f.half_period_pending for f in run.fragments
        ):
            # keep checking every step while a count of steps decides something: a wait under
            # overlap_steps, a deferred or half-period publish, joining an open round (a commit
            # arriving notifies by itself)
            self._attention = True

    def _scheduled_now(self, run: _Running) -> set[int]:
        """Fragments to publish by the schedule now (see :mod:`gradientmail.algorithms.schedule`)."""
        steps, every = self.stats.steps, self.algorithm.sync_every
        due: set[int] = set()
        for fragment, state in enumerate(run.fragments):
            if state.due_step > steps:
                continue
            state.due_step += every * (1 + (steps - state.due_step) // every)  # the same step of the next period
            action = schedule.on_schedule(steps - state.align_step, every, self.algorithm.quorum_size)
            if action is schedule.OnSchedule.PUBLISH:
                due.add(fragment)
            elif action is schedule.OnSchedule.PUBLISH_AT_HALF_PERIOD:
                state.half_period_pending = True
        run.next_due = min(f.due_step for f in run.fragments)
        half = schedule.half_period(every)
        due.update(i for i, f in enumerate(run.fragments) if f.half_period_pending and steps - f.align_step >= half)
        return due

    def _joining(self, run: _Running) -> set[int]:
        """Fragments to publish early into rounds other learners have opened on our anchor."""
        every, quorum = self.algorithm.sync_every, self.algorithm.quorum_size
        return {
            fragment
            for fragment, version in run.exchange.open_rounds.items()
            if version == run.fragments[fragment].anchor_version
            and schedule.joins_open_round(self.stats.steps - run.fragments[fragment].align_step, every, quorum)
        }

    def _align_ready(self, run: _Running) -> None:
        for commit in run.exchange.take_ready().values():
            self._align(run, commit)

    def _align(self, run: _Running, commit: Commit) -> None:
        state = run.fragments[commit.fragment]
        if commit.version <= state.anchor_version:
            return
        merged = commit.ours_merged and state.published_step is not None and commit.base_version == state.anchor_version
        published_step = state.published_step
        if self.algorithm.carry_unmerged:
            self._carry(state, merged, commit)
        else:  # the guide's behaviour: the commit replaces (or, with mixing, blends with) the local work
            local = self.backend.read_parameters(self.model, state.names) if self.algorithm.mixing > 0 else {}
            aligned = aligned_parameters(self.backend, local, self._tensors(commit.params), self.algorithm.mixing)
            self.backend.write_parameters(self.model, aligned)
            state.align_step, state.align_samples = self.stats.steps, self.stats.samples
        state.anchor, state.anchor_version, state.anchor_step = commit.params, commit.version, self.stats.steps
        state.published_step, state.published_params = None, None
        state.due_step = schedule.next_due(self.stats.steps, published_step if merged else None, self.algorithm.sync_every)
        state.half_period_pending = False
        run.next_due = min(f.due_step for f in run.fragments)
        self.stats.alignments += 1
        self.stats.versions[commit.fragment] = commit.version

    def _carry(self, state: _Fragment, merged: bool, commit: Commit) -> None:
        """Align with a commit while carrying the work it did not merge: θ ← θ_commit − (θ_start − θ).

        If the commit merged our contribution, the unmerged work is what we trained since
        publishing it (θ_start: the published snapshot); otherwise all we trained since our work
        was last merged (θ_start: the anchor). Work spanning more than ``max_carried_steps`` is
        dropped instead and reported with the next contribution. The exchange thread has
        usually computed θ_commit − θ_start already; then this adds it to θ in place.
        """
        if merged:
            assert state.published_params is not None and state.published_step is not None
            start: Mapping[str, np.ndarray] = state.published_params.arrays
            source = ("published", state.published_serial)
            state.align_step, state.align_samples = state.published_step, state.published_samples
            state.realigned.clear()  # the merged contribution reported them
        else:
            start, source = state.anchor, ("anchor", state.anchor_version)
        span = self.stats.steps - state.align_step
        if span > self.algorithm.carry_limit_steps:
            state.realigned.append(
                Realignment(
                    steps=span,
                    samples=self.stats.samples - state.align_samples,
                    reason="carry_limit",
                    at_version=commit.version,
                )
            )
            state.align_step, state.align_samples = self.stats.steps, self.stats.samples
            self.backend.write_parameters(self.model, self._tensors(commit.params))
            return
        if span == 0:
            self.backend.write_parameters(self.model, self._tensors(commit.params))
            return
        if commit.correction is not None and commit.correction_from == source:
            add_in_place(self.backend, self.model, commit.correction)
            return
        # the exchange guessed another start (a race with this thread): compute it here
        local = self.backend.read_parameters(self.model, state.names)
        aligned = carried_parameters(self.backend, self._tensors(commit.params), self._tensors(start), local)
        self.backend.write_parameters(self.model, aligned)

    def _snapshot(self, state: _Fragment) -> HostBuffer:
        """The fragment's parameters copied to host memory, into a buffer the exchange no longer
        reads (one device→host copy; the only work a contribution costs this thread)."""
        live = dict(self.backend.named_parameters(self.model))
        for buffer in state.buffers:
            if not buffer.held and buffer is not state.published_params:
                fill_buffer(self.backend, buffer, live, state.names)
                return buffer
        buffer = new_buffer(self.backend, live, state.names)
        if self.backend.name in _REUSABLE:
            state.buffers.append(buffer)  # others (MLX) are fresh arrays each time
        return buffer

    def _publish(self, run: _Running, fragment: int, *, final: bool) -> None:
        state = run.fragments[fragment]
        steps = self.stats.steps - state.align_step
        if steps == 0 or state.published_step is not None:
            state.deferred = False
            return
        busy = sum(1 for f in run.fragments if f.published_step is not None)
        if not final and not schedule.slot_free(busy, self.algorithm.in_flight):
            state.deferred = True
            return
        state.deferred = False
        snapshot = self._snapshot(state)
        counts = ContributionCounts(
            steps=steps,
            samples=self.stats.samples - state.align_samples,
            final=final,
            step_time_s=self._step_time_s,
            carried_steps=max(0, state.anchor_step - state.align_step),
            realigned=tuple(state.realigned),
        )
        self._serial += 1
        run.exchange.publish(Publication(fragment, state.anchor_version, state.anchor, snapshot, counts, self._serial))
        state.published_step, state.published_samples = self.stats.steps, self.stats.samples
        state.published_params = snapshot if self.algorithm.carry_unmerged else None
        state.published_serial = self._serial
        state.half_period_pending = False
        self.stats.contributions += 1

    def _wait_for_commit(
        self, run: _Running, fragment: int, base_version: int, deadline: float | None = None, watch: SyncerWatch | None = None
    ) -> bool:
        """Block until a version newer than ``base_version`` is aligned; False on timeout, or
        when ``watch`` finds no live syncer to commit it."""
        started = time.perf_counter()
        deadline = time.monotonic() + self.options.commit_timeout_s if deadline is None else deadline
        state = run.fragments[fragment]
        with self._changed:
            while state.anchor_version <= base_version:
                self._align_ready(run)
                if state.anchor_version > base_version:
                    break
                remaining = deadline - time.monotonic()
                gone = watch is not None and watch.gone()
                if remaining <= 0 or gone:
                    log.warning(
                        "%s: no commit of fragment %d after version %d %s; continuing",
                        self.learner_id,
                        fragment,
                        base_version,
                        "and no live syncer to make it" if gone else f"within {self.options.commit_timeout_s:.0f} s",
                    )
                    state.published_step = None
                    break
                self._changed.wait(min(remaining, self.options.poll_interval_s))
        self.stats.blocked_s += time.perf_counter() - started
        return state.anchor_version > base_version

    # -- closing -------------------------------------------------------------------
    def close(self, wait: bool = True) -> None:
        """Finish: wait for rounds in flight, optionally flush, set the model to the newest commit.

        Waits for this learner's own rounds (up to ``commit_timeout_s`` in all, and no longer
        than a live syncer exists to commit them: a syncer lease absent, unreadable or expired
        for a further TTL ends the wait) and, up to the run's lease TTL, for rounds other
        learners have open on the same versions.
        With ``wait=False`` (an exception left the ``with`` block) only the threads stop.
        A mailbox the session opened from a URL is closed.
        """
        run = self._run
        if run is None or not run.open:
            return
        run.open = False
        try:
            if wait:
                self._align_ready(run)
                self._finish_rounds(run)
                self._wait_for_open_rounds(run)
                self._load_newest(run)
        finally:
            run.exchange.stop(release_lease=True)
            if run.syncer is not None:
                run.syncer.stop(resign=True)
            if self._owns_mailbox:
                self._mailbox.close()

    def _finish_rounds(self, run: _Running) -> None:
        """Wait for the rounds our contributions are in; with ``flush_on_close`` publish the
        unmerged work first, and while carrying, again if a round closed without it."""
        attempts = _FLUSH_ATTEMPTS if self.algorithm.flush_on_close and self.algorithm.carry_unmerged else 1
        deadline = time.monotonic() + self.options.commit_timeout_s
        watch = SyncerWatch(self._store, run.spec.lease_ttl_s, self.options.poll_interval_s)
        for _ in range(attempts):
            if self.algorithm.flush_on_close:
                for fragment in range(len(run.fragments)):
                    self._publish(run, fragment, final=True)
            for fragment, state in enumerate(run.fragments):
                if state.published_step is not None:
                    self._wait_for_commit(run, fragment, state.anchor_version, deadline, watch)
            if all(state.align_step == self.stats.steps for state in run.fragments):
                return

    def wait_published(self, timeout_s: float | None = None) -> bool:
        """Block until every contribution handed to the background is in the mailbox."""
        run = self._run
        if run is None or not run.open:
            return True
        deadline = time.monotonic() + (self.options.commit_timeout_s if timeout_s is None else timeout_s)
        while not run.exchange.idle():
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.01, self.options.poll_interval_s))
        return True

    def _wait_for_open_rounds(self, run: _Running) -> None:
        """Give rounds other learners have open on our newest versions a lease TTL to commit,
        so learners that stop together end on the same newest version."""
        deadline = time.monotonic() + run.spec.lease_ttl_s
        for fragment, state in enumerate(run.fragments):
            while time.monotonic() < deadline:
                newest = self._store.newest_version(fragment, known=state.anchor_version) or 0
                if not self._store.contributors(fragment, newest):
                    break
                time.sleep(self.options.poll_interval_s)

    def _load_newest(self, run: _Running) -> None:
        for fragment, state in enumerate(run.fragments):
            self.stats.dropped_at_close[fragment] = self.stats.steps - state.align_step
            newest = self._store.newest_version(fragment, known=state.anchor_version)
            if newest is not None and newest > state.anchor_version:
                params = self._store.read_params(run.spec, self._store.read_round(fragment, newest))
                self.backend.write_parameters(self.model, self._tensors(params))
                state.anchor, state.anchor_version = params, newest
                self.stats.versions[fragment] = newest
            else:  # drop the steps since the last contribution: back to the committed anchor
                self.backend.write_parameters(self.model, self._tensors(state.anchor))

    def _tensors(self, arrays: Mapping[str, Any]) -> dict[str, Tensor]:
        return {name: self.backend.from_numpy(array) for name, array in arrays.items()}

    # -- what callers may read -----------------------------------------------------
    @property
    def spec(self) -> RunSpec | None:
        """The run's view of itself while the session is open."""
        return self._run.spec if self._run is not None else None

    @property
    def syncer(self) -> SyncerRuntime | None:
        """This node's syncer runtime while the session is open (None with ``run_syncer=False``)."""
        return self._run.syncer if self._run is not None else None

    @property
    def bytes_published(self) -> int:
        """Contribution payload bytes this learner has put in the mailbox."""
        return self._run.exchange.bytes_published if self._run is not None else 0

    @property
    def bytes_fetched(self) -> int:
        """Committed parameter bytes this learner has fetched from the mailbox."""
        return self._run.exchange.bytes_fetched if self._run is not None else 0

    @property
    def rebuilt_commits(self) -> int:
        """Commits rebuilt from their compact update (``update_quantization``) instead of fetched whole."""
        return self._run.exchange.compact_fetches if self._run is not None else 0

    @property
    def rebuild_fallbacks(self) -> int:
        """Compact updates that did not rebuild the committed bytes (the full parameters were read)."""
        return self._run.exchange.compact_fallbacks if self._run is not None else 0

    @property
    def versions(self) -> Mapping[int, int]:
        """The committed version each fragment is aligned with."""
        return dict(enumerate(self.stats.versions))


# -- the training thread's host copies -------------------------------------------------------


def new_buffer(backend: Backend, live: Mapping[str, Tensor], names: Sequence[str]) -> HostBuffer:
    """A host snapshot of ``names``, filled: preallocated once for PyTorch (pinned memory for
    accelerator parameters) and NumPy, a fresh copy for other frameworks."""
    if backend.name == "torch":
        import torch

        targets: dict[str, object] = {}
        arrays: dict[str, np.ndarray] = {}
        for name in names:
            param = live[name]
            pinned = param.device.type == "cuda"
            target = torch.empty(param.shape, dtype=param.dtype, device="cpu", pin_memory=pinned)
            targets[name], arrays[name] = target, backend.to_numpy(target)  # shares the memory
        buffer = HostBuffer(arrays, targets)
        fill_buffer(backend, buffer, live, names)
        return buffer
    if backend.name == "numpy":
        return HostBuffer({name: np.array(live[name], copy=True) for name in names})
    return HostBuffer({name: backend.to_numpy(backend.copy(live[name])) for name in names})


def fill_buffer(backend: Backend, buffer: HostBuffer, live: Mapping[str, Tensor], names: Sequence[str]) -> None:
    """Copy the live parameters into a reusable buffer (no allocation)."""
    if buffer.targets:
        import torch

        with torch.no_grad():
            for name in names:
                target = buffer.targets[name]
                assert isinstance(target, torch.Tensor)
                target.copy_(live[name].detach())
        return
    for name in names:
        np.copyto(buffer.arrays[name], np.asarray(live[name]))


def add_in_place(backend: Backend, model: Any, corrections: Mapping[str, np.ndarray]) -> None:
    """θ += correction for each named parameter (fp32 arithmetic, the parameter's dtype)."""
    live = dict(backend.named_parameters(model))
    if backend.name == "torch":
        import torch

        with torch.no_grad():
            for name, correction in corrections.items():
                param = live[name]
                param.add_(torch.from_numpy(correction).to(param.device))
        return
    if backend.name == "numpy":
        for name, correction in corrections.items():
            target = live[name]
            if target.dtype == np.float32:
                np.add(target, correction, out=target)
            else:
                target[...] = (target.astype(np.float32) + correction).astype(target.dtype)
        return
    backend.write_parameters(model, {name: backend.add(live[name], backend.from_numpy(c)) for name, c in corrections.items()})
