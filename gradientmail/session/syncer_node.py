"""A node that only closes rounds: the ``"syncer"`` role.

The syncer downloads every learner's contributions and uploads every commit, about three times a
learner's bytes each way, on whichever node is elected. A run can put that work on a machine
that trains nothing (a CPU box, a laptop, a small Kubernetes Deployment)::

    with gm.SyncerNode(mailbox="s3://my-training/runs/example") as node:
        node.wait()  # until SIGTERM / Ctrl-C, or wait(timeout=...)

It needs no model code: the run's manifest says what the fragments hold, and merges run on
NumPy (or ``backend="torch"``). It waits for the first learner to create the run, then takes
part in the election as a *dedicated* syncer, which outranks every node that also trains
(``syncer.election``): it takes the lease over from a training holder at once, and when it
dies a training node (role ``"both"``) takes over within the lease TTL plus one idle interval
and a poll, as from any holder (INV-6). Two dedicated syncers elect one of them as usual.
"""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType

from gradientmail.backends import Backend, get_backend
from gradientmail.errors import InvalidConfig, InvalidKey
from gradientmail.mailbox import Mailbox, MeteredMailbox, RequestCounts, open_mailbox
from gradientmail.records import check_learner_id, default_learner_id
from gradientmail.records.auth import RunKey
from gradientmail.session.join import checked_manifest
from gradientmail.store import RunSpec, RunStore
from gradientmail.store.store_clock import StoreClock
from gradientmail.syncer import SyncerRuntime

__all__ = ["SyncerNode"]

log = logging.getLogger(__name__)

WAIT_FOR_RUN_S = 600.0
"""How long ``open()`` waits for a learner to create the run before giving up."""


class SyncerNode:
    """This process as the run's dedicated syncer (module docstring).

    ``mailbox``, ``run_key`` and ``node_id`` as for :class:`~gradientmail.Session` (the run key
    from ``GRADIENTMAIL_RUN_KEY``/``_FILE`` when not given; the node id defaults to the host
    name). ``poll_interval_s`` and ``idle_poll_interval_s`` pace its passes as a session's do;
    the lease TTL is the run's.
    """

    def __init__(
        self,
        *,
        mailbox: Mailbox | str,
        node_id: str | None = None,
        run_key: str | RunKey | None = None,
        backend: str | Backend = "numpy",
        poll_interval_s: float = 0.2,
        idle_poll_interval_s: float | None = None,
        wait_for_run_s: float = WAIT_FOR_RUN_S,
    ) -> None:
        try:
            self.node_id = check_learner_id(node_id if node_id is not None else default_learner_id())
        except InvalidKey as exc:
            raise InvalidConfig("node_id", str(exc)) from None
        if not poll_interval_s > 0:
            raise InvalidConfig("poll_interval_s", f"must be positive, got {poll_interval_s!r}")
        if idle_poll_interval_s is not None and not idle_poll_interval_s >= poll_interval_s:
            raise InvalidConfig("idle_poll_interval_s", f"must be at least poll_interval_s ({poll_interval_s})")
        self.backend: Backend = get_backend(backend) if isinstance(backend, str) else backend
        self.poll_interval_s = poll_interval_s
        self.idle_poll_interval_s = idle_poll_interval_s
        self.wait_for_run_s = wait_for_run_s
        key = RunKey.given(run_key)
        self._owns_mailbox = isinstance(mailbox, str)
        self._mailbox = MeteredMailbox(open_mailbox(mailbox) if isinstance(mailbox, str) else mailbox)
        """Every request this node makes, counted (``mailbox/metered.py``: the request metrics)."""
        self.store = RunStore(self._mailbox, key)
        self.syncer: SyncerRuntime | None = None
        self._closed = threading.Event()

    def __enter__(self) -> SyncerNode:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def request_counts(self) -> RequestCounts:
        """This node's mailbox requests so far, by operation and outcome (the request metrics)."""
        return self._mailbox.counts

    @property
    def commits(self) -> int:
        """Versions this node committed so far."""
        return self.syncer.commits if self.syncer is not None else 0

    @property
    def is_elected(self) -> bool:
        return self.syncer is not None and self.syncer.election.is_leader

    def open(self) -> None:
        """Wait for the run's manifest, then start the election and rounds threads."""
        spec = self._wait_for_run()
        self.syncer = SyncerRuntime(
            self.store,
            self.backend,
            spec,
            self.node_id,
            poll_interval_s=self.poll_interval_s,
            idle_interval_s=self.idle_poll_interval_s,
            dedicated=True,
            store_clock=StoreClock(),  # sampled by its syncer lease writes while it holds the lease
        )
        self.syncer.start()
        log.info(
            "%s syncs run %s (%d fragments) as its dedicated syncer", self.node_id, spec.manifest.run_id, len(spec.fragments)
        )

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`close` (from another thread or a signal handler) or ``timeout``
        seconds; True once closed."""
        return self._closed.wait(timeout)

    def close(self) -> None:
        """Stop the threads and release the syncer lease (a training node takes over at once)."""
        if self.syncer is not None:
            self.syncer.stop(resign=True)
        self._closed.set()
        if self._owns_mailbox:
            self._mailbox.close()

    def _wait_for_run(self) -> RunSpec:
        deadline = time.monotonic() + self.wait_for_run_s
        while True:
            manifest = checked_manifest(self.store)  # RunConfigMismatch when the run key differs
            if manifest is not None:
                return RunSpec.from_manifest(manifest)
            if time.monotonic() >= deadline:
                raise InvalidConfig(
                    "mailbox", f"no run at {self.store.url} after {self.wait_for_run_s:g} s: a learner creates it on joining"
                )
            time.sleep(self.poll_interval_s)
