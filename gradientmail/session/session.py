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

from gradientmail.algorithms import align, schedule
from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends import Backend, Tensor, backend_for, get_backend
from gradientmail.errors import GradientMailError, InvalidConfig, InvalidKey
from gradientmail.mailbox import Mailbox, MeteredMailbox, RequestCounts, open_mailbox
from gradientmail.records import Realignment, check_learner_id, default_learner_id
from gradientmail.records.auth import RunKey
from gradientmail.session.barrier import Barrier, BarrierRelease
from gradientmail.session.checks import positive_int
from gradientmail.session.events import Listeners, ReportedScalars, SessionEvent
from gradientmail.session.fragment import Commit, LearnerFragment, Publication
from gradientmail.session.group import detect_group, unwrap_model
from gradientmail.session.join import RunProposal, join_run, newest_readable
from gradientmail.session.looking import LearnerSchedule
from gradientmail.session.node_loops import NodeLoops
from gradientmail.session.queue import WorkQueue
from gradientmail.session.resume import MAILBOX, LearnerState, StateFile, Stateful, StateInMailbox, check_stateful
from gradientmail.session.roles import ELECTING_ROLES, ROLES, serves_instead_of_training
from gradientmail.store import (
    TRAINING,
    ContributionCounts,
    LeaseName,
    LeaseObserver,
    Retention,
    RunSpec,
    RunStore,
    others_training,
)
from gradientmail.syncer import SyncerRuntime
from gradientmail.syncer.assignment import CLOSES
from gradientmail.telemetry import hooks as telemetry

__all__ = ["Session", "SessionOptions", "SessionStats"]

log = logging.getLogger(__name__)

Batch = TypeVar("Batch")
"""What ``Session.run`` hands the caller's ``step``: one item of its data."""

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
                found = self._store.read_syncer_lease()
            except GradientMailError:
                return False  # the store hiccuped: no evidence either way
            dead = found is None or self._observer.expired(LeaseName.SYNCER, found)
            self._gone_since = (self._gone_since or now) if dead else None
        return self._gone_since is not None and now - self._gone_since >= self._ttl_s


@dataclass
class _Running:
    """Everything that exists only between ``open()`` and ``close()``."""

    spec: RunSpec
    fragments: list[LearnerFragment]
    next_due: int
    """The earliest ``due_step`` of any fragment: what ``step()`` compares against."""
    loops: NodeLoops
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
        group: Any = "auto",
    ) -> None:
        model = unwrap_model(model)
        self.model = model
        """What the session reads and writes: the model, or on rank 0 of an FSDP group its full view."""
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
        if self.group is not None:
            self.model = self.group.view
            if self.options.role == "either":
                raise InvalidConfig("role", "a torchrun group cannot be an 'either' node: its ranks would wait in a collective")
        self._serving = False
        """An ``"either"`` node serving as the syncer instead of training (its lease says so)."""
        self._following = False
        self._run_id: str | None = None
        """The run's id once open (a follower rank's from rank 0): what its state file belongs to."""
        if retention is not None and not isinstance(retention, Retention):
            raise InvalidConfig("retention", f"expected gm.Retention, got {type(retention).__name__}")
        self.retention = retention or Retention()
        key = RunKey.given(run_key)
        self.stats = SessionStats()
        self._owns_mailbox = isinstance(mailbox, str)
        self._mailbox = MeteredMailbox(open_mailbox(mailbox) if isinstance(mailbox, str) else mailbox)
        """Every request this node makes, counted (``mailbox/metered.py``: the request metrics)."""
        self._store = RunStore(self._mailbox, key)
        self._changed = threading.Condition()
        self._attention = False
        self._last_step_at: float | None = None
        self._step_time_s: float | None = None
        self._run: _Running | None = None
        rank_suffix = f".rank{self.group.rank}" if self.group is not None and not self.group.is_leader else ""
        self._state = self._learner_state(self.learner_id + rank_suffix)
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

    def _learner_state(self, name: str) -> LearnerState | None:
        """Where this learner's state is saved: ``state_dir``, or its prefix in the mailbox."""
        directory = self.options.state_dir
        if not directory:
            return None
        if directory != MAILBOX:
            return LearnerState(StateFile(directory, name), name)

        def compress() -> bool:  # the run's setting, known once joined (a save comes after)
            return self.spec is not None and self.spec.algorithm.payload_compression == "zstd"

        where = StateInMailbox(self._store, name, compress)
        return LearnerState(where, name)

    # -- context manager -----------------------------------------------------------
    def __enter__(self) -> Session:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close(wait=exc is None)

    def open(self) -> None:
        """Join the run, load its newest committed parameters, start the background work. A
        follower rank of a group only receives the parameters from rank 0."""
        if self.group is not None:
            self.group.gather(self.group.names, command=False)  # FSDP: a new run starts from the full model
        if self.group is not None and not self.group.is_leader:
            self.group.scatter(self.group.names, command=False)
            self._run_id = self.group.share_object(None)  # the leader's run: to resume this rank's own state
            self._following = True
            self._resume()
            return
        proposal = RunProposal(self.algorithm, lease_ttl_s=self.options.lease_ttl_s, retention=self.retention)
        spec, created = join_run(self._store, self.backend, self.model, proposal, self.learner_id)
        log.info("%s %s the run (%d fragments)", self.learner_id, "created" if created else "joined", len(spec.fragments))
        fragments = []
        for fragment, names in enumerate(spec.fragments):
            record, committed = newest_readable(self._store, spec, fragment)
            self.backend.write_parameters(self.model, self._tensors(committed))
            fragments.append(LearnerFragment.joined(fragment, names, committed, record.version))
        self.stats.versions = [f.anchor_version for f in fragments]
        self._run_id = spec.manifest.run_id
        self._resume()
        if self.group is not None:
            self.group.scatter(self.group.names, command=False)  # every rank starts from the committed parameters
            self.group.share_object(spec.manifest.run_id)
        self.stats.dropped_at_close = [0] * len(fragments)
        loops = NodeLoops(
            self._store,
            spec,
            self.learner_id,
            fragments,
            backend=self.backend,
            poll_interval_s=self.options.poll_interval_s,
            idle_interval_s=self._idle_interval_s(),
            on_change=self._notify,
            lease_info=self.lease_info,
            clock=time.monotonic,
            algorithm=self.algorithm,
            run_syncer=self.options.elects,
            schedule=self.learner_schedule,
        )
        live = dict(self.backend.named_parameters(self.model))
        for state in fragments:
            state.due_step = schedule.first_due_step(state.index, len(fragments), self.algorithm.sync_every)
            if self.backend.reuses_host_buffers:  # allocated (and paged in) now, not at the first publish
                state.buffers.append(self.backend.new_host_buffer(live, state.names))
        self._run = _Running(spec, fragments, min(f.due_step for f in fragments), loops)
        loops.start()
        telemetry.attach_session(self)  # observable instruments read self.stats; step() does nothing more

    # -- the hot path --------------------------------------------------------------
    def step(self, samples: int = 1) -> None:
        """Count one local step of ``samples`` examples (or tokens); exchange if due.

        Cheap unless a fragment is due or a commit is ready; blocks only as far as
        ``overlap_steps`` asks. Raises ``DuplicateLearner`` once another process is seen writing
        this learner's lease (two processes with one id).
        """
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise InvalidConfig("samples", f"must be a non-negative integer, got {samples!r}")
        if self._following:
            self.stats.steps += 1
            self.stats.samples += samples
            assert self.group is not None
            self.group.follow_step()
            self._save_state_if_due()
            return
        run = self._run
        if run is None or not run.open:
            raise RuntimeError("Session.step() outside the session: use it inside `with gm.Session(...)`")
        if self.group is not None:
            samples *= self.group.world_size  # the group's batch: DDP's ranks train equal ones
        now = time.perf_counter()
        if self._last_step_at is not None:
            elapsed = now - self._last_step_at
            a = self.options.step_time_smoothing
            self._step_time_s = elapsed if self._step_time_s is None else (1 - a) * self._step_time_s + a * elapsed
        self._last_step_at = now
        stats = self.stats
        stats.steps += 1
        stats.samples += samples
        changed: list[str] = []
        if self._attention or stats.steps >= run.next_due:
            versions_before = list(stats.versions) if self.group is not None else None
            self._exchange_between_steps(run)  # where alignments happen
            if versions_before is not None:
                changed = self._names_of(run, versions_before)
        if self.group is not None:
            self.group.end_step(changed)
        self._save_state_if_due()
        if self.options.role == "either" and not any(queue.holding for queue in self._queues):
            self._serve_while_elected(run)  # between units when a queue deals the data

    def _names_of(self, run: _Running, versions_before: Sequence[int]) -> list[str]:
        """The parameters of the fragments aligned since ``versions_before``, sorted."""
        changed = [i for i, version in enumerate(self.stats.versions) if version != versions_before[i]]
        return sorted(name for i in changed for name in run.fragments[i].names)

    def _fresh(self, names: Sequence[str]) -> None:
        """Before reading a fragment of the model: on rank 0 of an FSDP group, gather it."""
        if self.group is not None:
            self.group.gather(sorted(names))

    def report(self, **scalars: float) -> None:
        """Report scalars of the user's own (``loss=…``, ``lr=…``, ``tokens_per_s=…``): kept as the
        newest value of each (exported as ``gradientmail_learner_reported{name=…}``) and handed to
        the listeners (``session/events.py``). Any thread; cheap (no I/O)."""
        kept = self.reported.update(scalars)
        if self._listeners:
            self._listeners.emit(SessionEvent("reported", self.stats.steps, self.total_steps, scalars=kept))

    def add_listener(self, callback: Callable[[SessionEvent], object]) -> None:
        """Call ``callback(event)`` for every :class:`~gradientmail.session.events.SessionEvent`
        (reported scalars, published contributions, alignments), on the thread that caused it."""
        self._listeners.add(callback)

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
        if total is None or self._following:
            return None
        run = self._run
        live = run.loops.exchange.live_learners() if run is not None and run.open else None
        return -(-total // max(1, live or 1))

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
        if self._run is None and not self._following:
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
        run = self._run
        if run is None or not run.open:
            raise RuntimeError("Session.queue() outside the session: use it inside `with gm.Session(...)`")
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
        run = self._run
        if run is None or not run.open:
            raise RuntimeError("Session.barrier() outside the session: use it inside `with gm.Session(...)`")
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
        if self._state is None or self._run_id is None:
            return
        saved = self._state.load(self._run_id)
        if saved is None:
            return
        self._saved = saved
        self.steps_before = int(saved["total_steps"])
        for name, marks in saved.get("queues", {}).items():
            self._queue_marks[name] = {int(unit): int(mark) for unit, mark in marks.items()}
        LearnerState.restore(saved, self._checkpointed)
        LearnerState.restore_rng(saved)
        log.info("%s resumes at step %d from %s", self.learner_id, self.steps_before, self._state.where)

    def _idle_interval_s(self) -> float | None:
        """The idle pace handed to the exchange and the syncer (None: a third of the lease TTL)."""
        return self.options.idle_poll_interval_s

    def lease_info(self) -> dict[str, object]:
        """Progress shown in this learner's lease (read by the CLI and telemetry), and when its
        next contribution is due: ``due_in_s``, seconds from the renewal at its current step
        time (the elected syncer lists contributions at the regular pace around then; a hint
        only, absent before the step time is known and once the contribution is due)."""
        info: dict[str, object] = {
            "step": self.stats.steps,
            "step_time_s": round(self._step_time_s or 0.0, 6),
            "versions": ",".join(str(v) for v in self.stats.versions),
        }
        if self.options.elects:
            info[CLOSES] = True  # it runs a syncer: a spread run may give it fragments to close
        if self._serving:
            info[TRAINING] = False
            return info
        run = self._run
        if run is not None and run.open and self._step_time_s and run.next_due > self.stats.steps:
            # absent once due: the contribution is on its way (the window of an earlier renewal
            # covers its upload) or waits for a slot; the syncer keeps no fast pace for it
            info["due_in_s"] = round((run.next_due - self.stats.steps) * self._step_time_s, 3)
        return info

    def learner_schedule(self) -> LearnerSchedule:
        """Where this learner's schedule is, for the exchange's pace (``session.looking``): its
        sync period and each fragment's next scheduled publish at the current step time. Read
        from the exchange's thread; no I/O."""
        run, step_time_s = self._run, self._step_time_s
        if run is None or not run.open or not step_time_s or self._serving:
            return LearnerSchedule()
        steps = self.stats.steps
        fragments = list(run.fragments)
        return LearnerSchedule(
            period_s=self.algorithm.sync_every * step_time_s,
            due_in_s=tuple(
                None if f.outstanding is not None else max(0.0, (f.due_step - steps) * step_time_s) for f in fragments
            ),
            due_steps=tuple(f.due_step for f in fragments),
        )

    def _serve_while_elected(self, run: _Running) -> None:
        """An ``"either"`` node that holds the syncer role while another node trains stops
        training here (``roles.serves_instead_of_training``): it publishes its unmerged work and
        waits for those rounds, then only closes rounds, its lease saying it does not train,
        until it loses the role or nobody else trains; then it aligns with the newest commits
        and returns to the training loop."""
        if not self._should_serve(run):
            return
        log.info("%s is the run's syncer while others train: training paused", self.learner_id)
        started = time.monotonic()
        self.stats.serving_pauses += 1
        deadline = started + self.options.commit_timeout_s
        for fragment in range(len(run.fragments)):
            self._publish(run, fragment, final=False, flush=True)
        for fragment, state in enumerate(run.fragments):
            if state.outstanding is not None:
                self._wait_for_commit(run, fragment, state.anchor_version, deadline)
        self._serving = True
        try:
            while run.open and self._should_serve(run):
                if run.loops.exchange.failure is not None:
                    raise run.loops.exchange.failure
                with self._changed:
                    self._changed.wait(self.options.poll_interval_s)
        finally:
            self._serving = False
            self.stats.serving_s += time.monotonic() - started
        self._align_ready(run)
        log.info("%s trains again after %.1f s as the syncer", self.learner_id, time.monotonic() - started)

    def _should_serve(self, run: _Running) -> bool:
        syncer = run.loops.syncer
        if syncer is None:
            return False
        holds = syncer.election.is_leader
        return serves_instead_of_training(self.options.role, holds, others_training(syncer.live, self.learner_id) if holds else 0)

    def _notify(self) -> None:
        self._attention = True
        with self._changed:
            self._changed.notify_all()

    def _exchange_between_steps(self, run: _Running) -> None:
        self._attention = False
        if run.loops.exchange.failure is not None:
            raise run.loops.exchange.failure
        self._align_ready(run)
        due = self._scheduled_now(run) | self._joining(run) | {i for i, f in enumerate(run.fragments) if f.deferred}
        for fragment in sorted(due):
            self._publish(run, fragment, final=False)
        for fragment, state in enumerate(run.fragments):
            if state.outstanding is not None and schedule.must_wait_for_commit(
                self.stats.steps - state.outstanding.taken_at.steps, self.algorithm.overlap_steps
            ):
                self._wait_for_commit(run, fragment, state.anchor_version)
        waits = self.algorithm.overlap_steps is not None
        if run.loops.exchange.looking.open_rounds or any(
            (waits and f.outstanding is not None) or f.deferred or f.half_period_pending for f in run.fragments
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
            action = schedule.on_schedule(steps - state.unmerged_from.steps, every, self.algorithm.quorum_size)
            if action is schedule.OnSchedule.PUBLISH:
                due.add(fragment)
            elif action is schedule.OnSchedule.PUBLISH_AT_HALF_PERIOD:
                state.half_period_pending = True
        run.next_due = min(f.due_step for f in run.fragments)
        half = schedule.half_period(every)
        due.update(i for i, f in enumerate(run.fragments) if f.half_period_pending and steps - f.unmerged_from.steps >= half)
        return due

    def _joining(self, run: _Running) -> set[int]:
        """Fragments to publish early into rounds other learners have opened on our anchor."""
        every, quorum = self.algorithm.sync_every, self.algorithm.quorum_size
        return {
            fragment
            for fragment, version in run.loops.exchange.looking.open_rounds.items()
            if version == run.fragments[fragment].anchor_version
            and schedule.joins_open_round(self.stats.steps - run.fragments[fragment].unmerged_from.steps, every, quorum)
        }

    def _align_ready(self, run: _Running) -> None:
        for commit in run.loops.exchange.take_ready().values():
            self._align(run, commit)

    def _align(self, run: _Running, commit: Commit) -> None:
        """Align a fragment with a commit, by the plan of ``align.plan_alignment`` on the
        exchange's decision of whether the commit merged our contribution (``commit.merged``)."""
        state = run.fragments[commit.fragment]
        if commit.version <= state.anchor_version:
            return
        merged = commit.merged
        now = align.WorkMark(self.stats.steps, self.stats.samples)
        plan = align.plan_alignment(
            carry=self.algorithm.carry_unmerged,
            merged_at=merged.taken_at if merged is not None else None,
            unmerged_from=state.unmerged_from,
            now=now,
            carry_limit_steps=self.algorithm.carry_limit_steps,
        )
        if merged is not None:
            state.realigned.clear()  # the merged contribution reported them
        if plan.dropped is not None:
            state.realigned.append(
                Realignment(
                    steps=plan.dropped.steps, samples=plan.dropped.samples, reason="carry_limit", at_version=commit.version
                )
            )
        self._apply(state, commit, plan.action)
        state.unmerged_from = plan.unmerged_from
        state.anchor, state.anchor_version, state.anchor_step = commit.params, commit.version, self.stats.steps
        state.outstanding = None
        state.due_step = schedule.next_due(
            self.stats.steps, merged.taken_at.steps if merged is not None else None, self.algorithm.sync_every
        )
        state.half_period_pending = False
        run.next_due = min(f.due_step for f in run.fragments)
        self.stats.alignments += 1
        self.stats.versions[commit.fragment] = commit.version
        if self._listeners:
            self._listeners.emit(
                SessionEvent("aligned", self.stats.steps, self.total_steps, fragment=commit.fragment, version=commit.version)
            )

    def _apply(self, state: LearnerFragment, commit: Commit, action: align.AlignAction) -> None:
        """Write the model's side of an alignment: the commit (blended under ``mixing`` when not
        carrying), or the commit with the unmerged work carried onto it, θ ← θ + (θ_commit − θ_start),
        adding the correction the exchange computed (or computing it here when it has none)."""
        if action is align.AlignAction.CARRY or not (self.algorithm.carry_unmerged or self.algorithm.mixing == 0):
            self._fresh(state.names)  # the local work is read
        if action is align.AlignAction.CARRY:
            correction = commit.correction
            if correction is None:
                start = commit.carry_start if commit.carry_start is not None else state.anchor
                correction = align.carry_correction(commit.params, start)
            self.backend.add_in_place(self.model, correction)
        elif self.algorithm.carry_unmerged or self.algorithm.mixing == 0:
            self.backend.write_parameters(self.model, self._tensors(commit.params))
        else:  # the guide's behaviour with mixing: the commit blends with the local work
            local = self.backend.read_parameters(self.model, state.names)
            aligned = align.aligned_parameters(self.backend, local, self._tensors(commit.params), self.algorithm.mixing)
            self.backend.write_parameters(self.model, aligned)

    def _publish(self, run: _Running, fragment: int, *, final: bool, flush: bool = False) -> None:
        state = run.fragments[fragment]
        now = align.WorkMark(self.stats.steps, self.stats.samples)
        work = now.since(state.unmerged_from)
        if work.steps == 0 or state.outstanding is not None:
            state.deferred = False
            return
        busy = sum(1 for f in run.fragments if f.outstanding is not None)
        if not (final or flush) and not schedule.slot_free(busy, self.algorithm.in_flight):
            state.deferred = True
            return
        state.deferred = False
        self._fresh(state.names)
        snapshot = state.snapshot(self.backend, dict(self.backend.named_parameters(self.model)))
        counts = ContributionCounts(
            steps=work.steps,
            samples=work.samples,
            final=final,
            step_time_s=self._step_time_s,
            carried_steps=max(0, state.anchor_step - state.unmerged_from.steps),
            realigned=tuple(state.realigned),
        )
        state.outstanding = Publication(fragment, state.anchor_version, state.anchor, snapshot, counts, now)
        run.loops.exchange.publish(state.outstanding)
        state.half_period_pending = False
        self.stats.contributions += 1
        if self._listeners:
            self._listeners.emit(
                SessionEvent("published", self.stats.steps, self.total_steps, fragment=fragment, version=state.anchor_version)
            )

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
                    state.outstanding = None
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
        if self._following:
            self._following = False
            if wait:
                assert self.group is not None
                self.group.follow_step()  # rank 0's close: its gathers (a final publish), the newest commit
            return
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
                self._save_state()
                if self.group is not None:
                    self.group.end_step(self.group.names)
        finally:
            run.loops.stop(release=True)
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
                if state.outstanding is not None:
                    self._wait_for_commit(run, fragment, state.anchor_version, deadline, watch)
            if all(state.unmerged_from.steps == self.stats.steps for state in run.fragments):
                return

    def wait_published(self, timeout_s: float | None = None) -> bool:
        """Block until every contribution handed to the background is in the mailbox."""
        run = self._run
        if run is None or not run.open:
            return True
        deadline = time.monotonic() + (self.options.commit_timeout_s if timeout_s is None else timeout_s)
        while not run.loops.exchange.idle():
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
            self.stats.dropped_at_close[fragment] = self.stats.steps - state.unmerged_from.steps
            newest = self._store.newest_version(fragment, known=state.anchor_version)
            if newest is not None and newest > state.anchor_version:
                record, params = newest_readable(self._store, run.spec, fragment)  # a deleted blob: one back (INV-21)
                newest = record.version
            if newest is not None and newest > state.anchor_version:
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
