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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from gradientmail.algorithms import schedule
from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends import Backend, backend_for, get_backend
from gradientmail.digests import DEFAULT_BLOB_DIGEST, DigestName, check_digest_name
from gradientmail.errors import InvalidConfig, InvalidKey
from gradientmail.mailbox import Mailbox, MeteredMailbox, RequestCounts, open_mailbox
from gradientmail.records import check_learner_id, default_learner_id
from gradientmail.records.auth import RunKey
from gradientmail.session.barrier import Barrier, BarrierRelease
from gradientmail.session.checks import positive_int
from gradientmail.session.events import EventKind, Listeners, ReportedScalars, SessionEvent
from gradientmail.session.fragment import LearnerFragment
from gradientmail.session.group import detect_group, unwrap_model
from gradientmail.session.join import RunProposal, join_run, newest_readable
from gradientmail.session.ledger import LedgerView
from gradientmail.session.looking import LearnerSchedule
from gradientmail.session.node_loops import NodeLoops
from gradientmail.session.progress import StepTimer, learner_schedule, lease_info
from gradientmail.session.queue import WorkQueue
from gradientmail.session.ranks import rank_hooks
from gradientmail.session.resume import LearnerState, Stateful, check_stateful, learner_state
from gradientmail.session.roles import ELECTING_ROLES, ROLES
from gradientmail.session.serving import ServingRole
from gradientmail.session.training import OpenRun, tensors
from gradientmail.session.transfer_meter import LinkReading
from gradientmail.store import Retention, RunSpec, RunStore
from gradientmail.syncer import SyncerRuntime
from gradientmail.telemetry import hooks as telemetry

__all__ = ["Session", "SessionOptions", "SessionStats"]

log = logging.getLogger(__name__)

Batch = TypeVar("Batch")
"""What ``Session.run`` hands the caller's ``step``: one item of its data."""


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
    """Seconds between the passes that only look for news while nothing is expected, and the
    slowest look of a training learner: the reads of leases (the syncer lease by the nodes
    watching it, which carries the bulletin learners follow; the learners' by the elected
    syncer). None: a third of the lease TTL, how often leases are renewed. A training learner
    looks a tenth of its sync period apart between ``poll_interval_s`` and this; see
    docs/session.md, "Polling"."""
    role: str = "both"
    """``"both"`` (the default): train and take part in the syncer election; ``"learner"``: only
    train, never close a round (no delete permission needed, docs/security.md); ``"either"``:
    stand like ``"both"``, but stop training while elected and another node trains
    (``session/roles.py``). A node that only syncs is a :class:`~gradientmail.SyncerNode`
    (``GRADIENTMAIL_ROLE=syncer``)."""
    run_syncer: bool = True
    """False is the same as ``role="learner"`` (kept from before roles)."""
    commit_timeout_s: float = 600.0
    """Longest ``step()`` waits for a commit under ``overlap_steps``, and ``close()`` for each."""
    state_dir: str | None = None
    """Save what a restart needs (registered optimizers and schedulers, ``total_steps``, random
    generators, work-queue positions) to ``{state_dir}/{learner_id}.state``, or with
    ``"mailbox"`` to the learner's own prefix in the run's mailbox, and resume from it
    (docs/session.md, "Resuming"). None: a restarted learner starts over."""
    save_state_every: int = 100
    """Steps between two saves of the learner state (and one at a clean close): at most this
    many steps are redone after a crash."""
    step_time_smoothing: float = 0.1
    """EMA weight of the newest step time reported for the grace window."""

    @property
    def elects(self) -> bool:
        """Whether this node takes part in the syncer election."""
        return self.role in ELECTING_ROLES and self.run_syncer

    def __post_init__(self) -> None:
        if self.role == "syncer":
            raise InvalidConfig(
                "role", "a node that only syncs trains no model: use gm.SyncerNode(mailbox=...) (GRADIENTMAIL_ROLE=syncer)"
            )
        if self.role not in ROLES:
            raise InvalidConfig(
                "role", f"must be one of {', '.join(map(repr, ROLES))} (or 'syncer' for gm.SyncerNode), got {self.role!r}"
            )
        for name in ("lease_ttl_s", "poll_interval_s", "commit_timeout_s"):
            if not getattr(self, name) > 0:
                raise InvalidConfig(name, f"must be positive, got {getattr(self, name)!r}")
        if self.idle_poll_interval_s is not None and not self.idle_poll_interval_s >= self.poll_interval_s:
            raise InvalidConfig("idle_poll_interval_s", f"must be at least poll_interval_s ({self.poll_interval_s})")
        if not 0 < self.step_time_smoothing <= 1:
            raise InvalidConfig("step_time_smoothing", "must be in (0, 1]")
        positive_int("save_state_every", self.save_state_every)
        if self.lease_ttl_s < 2 * self.poll_interval_s:
            raise InvalidConfig("lease_ttl_s", f"must be at least twice poll_interval_s ({self.poll_interval_s})")


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
    serving_pauses: int = 0
    """Times an ``"either"`` node stopped training to serve as the syncer."""
    serving_s: float = 0.0
    """Seconds it spent so (the training thread waiting in ``step()`` or the queue)."""


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
    every record (docs/security.md); every node of a run needs the same one. Without it the
    session reads ``GRADIENTMAIL_RUN_KEY`` or ``GRADIENTMAIL_RUN_KEY_FILE``, as every other way
    to start a node does (``RunKey.from_env``); an explicit ``run_key`` wins. ``retention`` is
    the storage policy a new run is created with, and ``blob_digest`` what its blobs are pinned
    by (``"blake3"``, or ``"sha256"``); a joiner uses the run's.
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
        blob_digest: str = DEFAULT_BLOB_DIGEST,
        group: Any = "auto",
    ) -> None:
        model = unwrap_model(model)
        self.algorithm = algorithm if algorithm is not None else DiLoCo()
        if not isinstance(self.algorithm, DiLoCo):
            raise InvalidConfig("algorithm", f"expected gm.DiLoCo, got {type(self.algorithm).__name__}")
        try:
            self.learner_id = check_learner_id(learner_id if learner_id is not None else default_learner_id())
        except InvalidKey as exc:
            raise InvalidConfig("learner_id", str(exc)) from None
        self.backend: Backend = get_backend(backend) if isinstance(backend, str) else backend or backend_for(model)
        self.options = options or SessionOptions()
        self.group = detect_group(group, self.backend.name, model)
        """This rank's link to the other ranks of its learner under torchrun (``session/group.py``); None alone."""
        self.model, self._ranks, self._follower = rank_hooks(self.group, model, self.options.role)
        """What the session reads and writes (the model, or on rank 0 of an FSDP group its full
        view); the ranks' hooks; on a rank other than 0, the follower it is instead."""
        self._run_id: str | None = None
        """The run's id once open (a follower rank's from rank 0): what its state file belongs to."""
        if retention is not None and not isinstance(retention, Retention):
            raise InvalidConfig("retention", f"expected gm.Retention, got {type(retention).__name__}")
        self.retention = retention or Retention()
        try:
            self.blob_digest: DigestName = check_digest_name(blob_digest)
        except ValueError as exc:
            raise InvalidConfig("blob_digest", str(exc)) from None
        self.stats = SessionStats()
        self._owns_mailbox = isinstance(mailbox, str)
        self._mailbox = MeteredMailbox(open_mailbox(mailbox) if isinstance(mailbox, str) else mailbox)
        """Every request this node makes, counted (``mailbox/metered.py``: the request metrics)."""
        self._store = RunStore(self._mailbox, RunKey.given(run_key))
        self._clock: Callable[[], float] = time.monotonic
        """The clock every wait and the step time are measured on."""
        self._changed = threading.Condition()
        self._attention = False
        self._timer = StepTimer(self.options.step_time_smoothing)
        self._serving = ServingRole(
            self.options.role,
            self.learner_id,
            poll_interval_s=self.options.poll_interval_s,
            changed=self._changed,
            clock=self._clock,
        )
        self._run: OpenRun | None = None
        suffix = f".rank{self._follower.rank}" if self._follower is not None else ""
        self._state = learner_state(self.options.state_dir, self._store, self.learner_id + suffix, lambda: self.spec)
        self._checkpointed: list[Stateful] = []
        self._saved: dict[str, Any] | None = None
        self._queue_marks: dict[str, dict[int, int]] = {}
        """Per work queue, unit → ``total_steps`` when this learner got it (saved with the state)."""
        self._queues: list[WorkQueue] = []
        self._listeners = Listeners()
        self.reported = ReportedScalars()
        """The newest value of each scalar ``report()`` was given (the ``gradientmail_learner_reported`` gauges)."""
        self.steps_before = 0
        """Steps this learner trained in the run before this session (restored from ``state_dir``)."""

    # -- context manager -----------------------------------------------------------
    def __enter__(self) -> Session:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close(wait=exc is None)

    def open(self) -> None:
        """Join the run, load its newest committed parameters, start the background work. A
        follower rank of a group only receives the parameters from rank 0."""
        if self._follower is not None:
            self._run_id = self._follower.open()  # the leader's run: to resume this rank's own state
            self._resume()
            return
        self._ranks.joining()  # FSDP: a new run starts from the full model
        proposal = RunProposal(
            self.algorithm, lease_ttl_s=self.options.lease_ttl_s, retention=self.retention, blob_digest=self.blob_digest
        )
        spec, created = join_run(self._store, self.backend, self.model, proposal, self.learner_id)
        log.info("%s %s the run (%d fragments)", self.learner_id, "created" if created else "joined", len(spec.fragments))
        fragments = []
        for fragment, names in enumerate(spec.fragments):
            record, committed = newest_readable(self._store, spec, fragment)
            self.backend.write_parameters(self.model, tensors(self.backend, committed))
            fragments.append(LearnerFragment.joined(fragment, names, committed, record.version))
        self.stats.versions = [f.anchor_version for f in fragments]
        self._run_id = spec.manifest.run_id
        self._resume()
        self._ranks.joined(spec.manifest.run_id)
        self.stats.dropped_at_close = [0] * len(fragments)
        loops = NodeLoops(
            self._store,
            spec,
            self.learner_id,
            fragments,
            backend=self.backend,
            poll_interval_s=self.options.poll_interval_s,
            idle_interval_s=self.options.idle_poll_interval_s,
            on_change=self._notify,
            lease_info=self.lease_info,
            clock=self._clock,
            algorithm=self.algorithm,
            run_syncer=self.options.elects,
            schedule=self.learner_schedule,
            saved_state=lambda: self._state.newest if self._state is not None else None,
        )
        live = dict(self.backend.named_parameters(self.model))
        for state in fragments:
            state.due_step = schedule.first_due_step(state.index, len(fragments), self.algorithm.sync_every)
            if self.backend.reuses_host_buffers:  # allocated (and paged in) now, not at the first publish
                state.buffers.append(self.backend.new_host_buffer(live, state.names))
        self._run = OpenRun(
            spec, fragments, loops, self.backend, self.model, self.algorithm, self.stats, self._timer, self.learner_id,
            self.options, self._changed, self._clock, fresh=self._ranks.fresh, emit=self._emit, store=self._store,
        )  # fmt: skip
        loops.start()
        telemetry.attach_session(self)  # observable instruments read self.stats; step() does nothing more

    # -- the hot path --------------------------------------------------------------
    def step(self, samples: int = 1) -> None:
        """Count one local step of ``samples`` examples (or tokens); exchange if due.

        Cheap unless a fragment is due or a commit is ready; blocks only as far as
        ``overlap_steps`` asks, or while a commit is longer in coming than the next
        contribution's room (``schedule.overlap_bound``). Raises ``DuplicateLearner`` once
        another process is seen writing this learner's lease (two processes with one id).
        """
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise InvalidConfig("samples", f"must be a non-negative integer, got {samples!r}")
        if self._follower is not None:
            self._count(samples)
            self._follower.step()
            self._save_state_if_due()
            return
        run = self._running("Session.step()")
        self._timer.stepped(self._clock())
        self._count(samples * self._ranks.world_size)  # the group's batch: DDP's ranks train equal ones
        changed: list[str] = []
        if self._attention or self.stats.steps >= run.next_check:
            versions_before = list(self.stats.versions)
            self._attention = False
            if run.between_steps():  # where alignments happen
                self._attention = True  # a count of steps decides something: check at every step
            if self._ranks.tracks_changes:
                changed = run.changed_since(versions_before)
        self._ranks.end_step(changed)
        self._save_state_if_due()
        if self.options.role == "either" and not any(queue.holding for queue in self._queues):
            self._serve_while_elected(run)  # between units when a queue deals the data

    def _count(self, samples: int) -> None:
        self.stats.steps += 1
        self.stats.samples += samples

    def _running(self, caller: str) -> OpenRun:
        """The open run, or an error naming ``caller`` used outside the session."""
        run = self._run
        if run is None or not run.open:
            raise RuntimeError(f"{caller} outside the session: use it inside `with gm.Session(...)`")
        return run

    def report(self, **scalars: float) -> None:
        """Report scalars of the user's own (``loss=…``, ``lr=…``, ``tokens_per_s=…``): kept as the
        newest value of each (exported as ``gradientmail_learner_reported{name=…}``) and handed to
        the listeners (``session/events.py``). Any thread; cheap (no I/O)."""
        kept = self.reported.update(scalars)
        self._emit("reported", scalars=kept)

    def add_listener(self, callback: Callable[[SessionEvent], object]) -> None:
        """Call ``callback(event)`` for every :class:`~gradientmail.session.events.SessionEvent`
        (reported scalars, published contributions, alignments), on the thread that caused it."""
        self._listeners.add(callback)

    def _emit(self, kind: EventKind, **fields: Any) -> None:
        if self._listeners:
            self._listeners.emit(SessionEvent(kind, self.stats.steps, self.total_steps, **fields))

    def _save_state_if_due(self) -> None:
        if self._state is not None and self.total_steps % self.options.save_state_every == 0:
            self._save_state()

    def _save_state(self) -> None:
        if self._state is not None and self._run_id is not None:
            self._state.save(self._run_id, self.total_steps, self._checkpointed, self._queue_marks)

    @property
    def batch_size(self) -> int | None:
        """This learner's part of ``DiLoCo.global_batch_size``: ⌈global ÷ training learners⌉,
        the count the elected syncer last announced in its bulletin (this learner alone until one
        is read), so the parts follow learners as they join and leave (docs/session.md, "A global
        batch"). Read it where a batch is drawn. None when the run sets no global batch, and on
        the follower ranks of a torchrun learner (rank 0's is the learner's part, theirs to split)."""
        total = self.algorithm.global_batch_size
        if total is None or self._follower is not None:
            return None
        run = self._run
        live = run.loops.exchange.live_learners() if run is not None and run.open else None
        return -(-total // max(1, live or 1))

    @property
    def ledger(self) -> tuple[LedgerView, ...]:
        """Per fragment, where this session's trained steps went: merged, carried, trained since
        the current anchor, dropped by reason (``session/ledger.py``); empty before ``open()``.
        Each step trains every fragment, so each fragment's ledger counts every step once."""
        run = self._run
        if run is None:
            return ()
        return tuple(state.ledger_view(self.stats.steps) for state in run.fragments)

    @property
    def total_steps(self) -> int:
        """Steps this learner trained in the run, across restarts that resumed (``state_dir``):
        what to index data and schedules by."""
        return self.steps_before + self.stats.steps

    def run(
        self,
        step: Callable[[Batch], int | None],
        data: Iterable[Batch] | Callable[[Session], Iterable[Batch]],
    ) -> SessionStats:
        """Train ``step`` over ``data`` inside this session, then close it: the loop of the ``with``
        form, for a loop that is a ``step(batch) -> samples`` callable (docs/session.md, "The
        session owns the loop").

        Opens the session if it is not open. ``step`` trains the model on one batch, optimizer
        step included, and returns the samples (or tokens) it trained on; ``None`` counts as 1,
        as ``step()`` does. ``data`` is an iterable of batches, or a callable given the open
        session that returns one (to read a work queue: ``lambda s: (b for unit in
        s.queue("shards", 64) for b in load(unit))``). At the end of the data the session
        closes as a ``with`` block does (rounds in flight committed, the model at the newest
        commit); when ``step``, the data or the exchange raises, it closes without waiting and
        the exception propagates. Returns the session's counters. A session runs once.
        """
        if self._run is not None and not self._run.open:
            raise RuntimeError("Session.run(): this session has closed; a session runs once")
        if self._run is None and not (self._follower is not None and self._follower.following):
            self.open()
        try:
            batches = data(self) if callable(data) else data
            for batch in batches:
                samples = step(batch)
                self.step(1 if samples is None else samples)
        except BaseException:
            self.close(wait=False)
            raise
        self.close()
        return self.stats

    def queue(self, name: str, units: int) -> WorkQueue:
        """Work units ``0 … units-1`` shared by the run's learners, each trained to its end by
        exactly one of them (``session/queue.py``; docs/session.md, "Data each learner owns")."""
        run = self._running("Session.queue()")
        queue = WorkQueue(
            self._store,
            self.learner_id,
            name,
            units,
            lease_ttl_s=run.spec.lease_ttl_s,
            poll_interval_s=self.options.poll_interval_s,
            steps=lambda: self.total_steps,
            marks=self._queue_marks.setdefault(name, {}),
            before_claim=(lambda: self._serve_while_elected(run)) if self.options.role == "either" else None,
        )
        self._queues.append(queue)
        return queue

    def barrier(self, name: str, parties: int, *, timeout_s: float | None = None, **options: Any) -> BarrierRelease:
        """Wait at barrier ``name`` until ``parties`` nodes have arrived, and return with them at
        one instant of the store's clock (``session/barrier.py``; docs/session.md, "Barriers").
        The session's leases and syncer keep running meanwhile. ``options``: ``gm.Barrier``'s
        (``margin_s``, ``poll_interval_s``, ...)."""
        self._running("Session.barrier()")
        return Barrier(name, parties, store=self._store, node_id=self.learner_id, **options).wait(timeout_s)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save these (each with ``state_dict()``/``load_state_dict()``: optimizers, schedulers,
        a sampler) with the learner state, and restore them on resuming. Register them in the
        same order every time; registered after the session opened, they are restored at once."""
        found = check_stateful(objects)
        first = len(self._checkpointed)
        self._checkpointed.extend(found)
        if self._saved is not None:
            LearnerState.restore(self._saved, found, first)

    def _resume(self) -> None:
        """Load this learner's saved state of this run, if any, as the session opens."""
        saved = self._state.load(self._run_id) if self._state is not None and self._run_id is not None else None
        if self._state is None or saved is None:
            return
        self._saved = saved
        self.steps_before = int(saved["total_steps"])
        for name, marks in saved.get("queues", {}).items():
            self._queue_marks[name] = {int(unit): int(mark) for unit, mark in marks.items()}
        LearnerState.restore(saved, self._checkpointed)
        LearnerState.restore_rng(saved)
        log.info("%s resumes at step %d from %s", self.learner_id, self.steps_before, self._state.where)

    def lease_info(self) -> dict[str, object]:
        """Progress shown in this learner's lease (``progress.lease_info``)."""
        run = self._run
        return lease_info(
            steps=self.stats.steps,
            step_time_s=self._timer.step_time_s,
            versions=self.stats.versions,
            elects=self.options.elects,
            serving=self._serving.active,
            next_due=run.next_due if run is not None and run.open else None,
            ledger=self.ledger,
            link=self.link_reading,
        )

    @property
    def link_reading(self) -> LinkReading | None:
        """What share of a sync period this learner's transfers need, and at what rates
        (``session.transfer_meter``); None before the first transfer or the step time."""
        run, step_time_s = self._run, self._timer.step_time_s
        if run is None or step_time_s is None:
            return None
        return run.loops.exchange.transfers.reading(self.algorithm.sync_every * step_time_s)

    def learner_schedule(self) -> LearnerSchedule:
        """Where this learner's schedule is, for the exchange's pace (``progress.learner_schedule``).
        Read from the exchange's thread; no I/O."""
        run = self._run
        if run is None or not run.open or self._serving.active:
            return LearnerSchedule()
        return learner_schedule(list(run.fragments), self.stats.steps, self._timer.step_time_s, self.algorithm.sync_every)

    def _serve_while_elected(self, run: OpenRun) -> None:
        """An ``"either"`` node serving as the syncer while another node trains
        (``session/serving.py``): its work handed over, it only closes rounds until it loses the
        role or nobody else trains; then it aligns with the newest commits."""
        exchange = run.loops.exchange
        served = self._serving.serve(
            run.loops.syncer, hand_over=run.hand_over, running=lambda: run.open, failure=lambda: exchange.failure
        )
        self.stats.serving_pauses, self.stats.serving_s = self._serving.pauses, self._serving.serving_s
        if served:
            run.align_ready()

    def _notify(self) -> None:
        self._attention = True
        with self._changed:
            self._changed.notify_all()

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
        if self._follower is not None:
            self._follower.close(wait)
            return
        run = self._run
        if run is None or not run.open:
            return
        run.open = False
        try:
            if wait:
                run.align_ready()
                run.finish_rounds(self._store)
                run.waits.for_open_rounds(self._store, run.fragments, run.spec.lease_ttl_s)
                run.load_newest(self._store)
                self._save_state()
                self._ranks.closed()
        finally:
            run.loops.stop(release=True)
            if self._owns_mailbox:
                self._mailbox.close()

    def wait_published(self, timeout_s: float | None = None) -> bool:
        """Block until every contribution handed to the background is in the mailbox."""
        run = self._run
        if run is None or not run.open:
            return True
        return run.waits.until(run.loops.exchange.idle, self.options.commit_timeout_s if timeout_s is None else timeout_s)

    # -- what callers may read -----------------------------------------------------
    @property
    def spec(self) -> RunSpec | None:
        """The run's view of itself while the session is open."""
        return self._run.spec if self._run is not None else None

    @property
    def syncer(self) -> SyncerRuntime | None:
        """This node's syncer runtime while the session is open (None with ``run_syncer=False``)."""
        return self._run.loops.syncer if self._run is not None else None

    @property
    def request_counts(self) -> RequestCounts:
        """This node's mailbox requests so far, by operation and outcome (the request metrics)."""
        return self._mailbox.counts

    @property
    def bytes_published(self) -> int:
        """Contribution payload bytes this learner has put in the mailbox."""
        return self._run.loops.exchange.bytes_published if self._run is not None else 0

    @property
    def bytes_fetched(self) -> int:
        """Committed parameter bytes this learner has fetched from the mailbox."""
        return self._run.loops.exchange.commits.bytes_fetched if self._run is not None else 0

    @property
    def rebuilt_commits(self) -> int:
        """Commits rebuilt from their compact update (``update_quantization``) instead of fetched whole."""
        return self._run.loops.exchange.commits.compact_fetches if self._run is not None else 0

    @property
    def rebuild_fallbacks(self) -> int:
        """Compact updates that did not rebuild the committed bytes (the full parameters were read)."""
        return self._run.loops.exchange.commits.compact_fallbacks if self._run is not None else 0

    @property
    def versions(self) -> Mapping[int, int]:
        """The committed version each fragment is aligned with."""
        return dict(enumerate(self.stats.versions))

    @property
    def fragments(self) -> Sequence[LearnerFragment]:
        """Each fragment's learner state (what it is aligned with, its host buffers, what is in
        flight) since ``open()``, for inspection: the session and its exchange own them."""
        return tuple(self._run.fragments) if self._run is not None else ()

    @property
    def publish_to_commit_s(self) -> list[float]:
        """Seconds from handing a contribution over to the commit that merged it being ready,
        oldest first (the newest 1000)."""
        return list(self._run.loops.exchange.publish_to_commit_s) if self._run is not None else []
