"""One node's background loops, wired once: the learner's exchange and its syncer runtime.

``gm.Session`` builds a :class:`NodeLoops` and starts its threads; tests build the same object
and run its :meth:`NodeLoops.passes` one at a time on a fake clock, so what they measure (the
requests an idle node makes, how soon a dead syncer is replaced) is the wiring the library runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends import Backend, get_backend
from gradientmail.polling import PollingLoop
from gradientmail.records import SavedState
from gradientmail.session.exchange import Exchange
from gradientmail.session.fragment import LearnerFragment
from gradientmail.session.looking import LearnerSchedule
from gradientmail.store import CommittedVersion, RoundsBulletin, RunSpec, RunStore
from gradientmail.store.store_clock import StoreClock
from gradientmail.syncer import SyncerRuntime
from gradientmail.syncer.rounds import Handed

__all__ = ["LoopPass", "NodeLoops"]


@dataclass(frozen=True)
class LoopPass:
    """One background loop: the pass its thread runs, and the loop that paces it."""

    name: str
    run: Callable[[], None]
    loop: PollingLoop


class NodeLoops:
    """The exchange (transfers and lease) of the learner ``learner_id`` over ``fragments`` and,
    with ``run_syncer``, this node's syncer runtime (election and rounds), wired together: an
    upload here tells the syncer to look now, and a commit made here tells the exchange to
    fetch it now; the syncer's bulletin reaches the exchange without a read of the lease it
    wrote (elected) or a second read of the one its election watch read (not elected).
    ``schedule`` is the training thread's (``session.looking.LearnerSchedule``). The syncer
    computes with ``backend``, or NumPy for a framework whose tensors only the training thread
    may touch (``Backend.training_thread_only``: MLX)."""

    def __init__(
        self,
        store: RunStore,
        spec: RunSpec,
        learner_id: str,
        fragments: Sequence[LearnerFragment],
        *,
        backend: Backend,
        poll_interval_s: float,
        idle_interval_s: float | None,
        on_change: Callable[[], None],
        lease_info: Callable[[], dict[str, object]],
        clock: Callable[[], float],
        algorithm: DiLoCo | None = None,
        run_syncer: bool = True,
        schedule: Callable[[], LearnerSchedule] | None = None,
        saved_state: Callable[[], SavedState | None] | None = None,
    ) -> None:
        self.store_clock = StoreClock()
        """The store's clock as this node knows it: sampled by its lease writes, read by its lease
        observers (``store.leases``)."""
        self.exchange = Exchange(
            store,
            spec,
            learner_id,
            fragments,
            lease_ttl_s=spec.lease_ttl_s,
            poll_interval_s=poll_interval_s,
            idle_interval_s=idle_interval_s,
            on_change=on_change,
            lease_info=lease_info,
            clock=clock,
            on_published=self._published,
            algorithm=algorithm,
            schedule=schedule,
            own_bulletin=self._own_bulletin,
            store_clock=self.store_clock,
            saved_state=saved_state,
        )
        self.syncer: SyncerRuntime | None = None
        if run_syncer:
            self.syncer = SyncerRuntime(
                store,
                get_backend("numpy") if backend.training_thread_only else backend,
                spec,
                learner_id,
                poll_interval_s=poll_interval_s,
                idle_interval_s=idle_interval_s,
                clock=clock,
                on_commit=self._committed,
                on_syncer_lease=self.exchange.note_syncer_lease,
                own_lease=lambda: self.exchange.lease,
                watch_every=self.exchange.watch_interval_s,
                store_clock=self.store_clock,
            )

    def passes(self) -> list[LoopPass]:
        """Every background loop of the node, in the order :meth:`start` starts them."""
        found = [
            LoopPass("exchange", self.exchange.exchange_pass, self.exchange.loop),
            LoopPass("lease", self.exchange.renew_lease, self.exchange.lease_loop),
        ]
        if self.syncer is not None:
            found.append(LoopPass("election", self.syncer.election_pass, self.syncer.election_loop))
            found.append(LoopPass("rounds", self.syncer.rounds_pass, self.syncer.loop))
        return found

    def start(self, *, threads: bool = True) -> None:
        """Renew the lease and hold the first election pass, then start the loops' threads
        (``threads=False``: only the first passes, for a caller that runs :meth:`passes` itself)."""
        if threads:
            self.exchange.start()
            if self.syncer is not None:
                self.syncer.start()
            return
        self.exchange.renew_lease()
        if self.syncer is not None:
            self.syncer.election_pass()

    def stop(self, *, release: bool = True) -> None:
        """Stop the threads; ``release``: give up the learner's lease and resign the syncer's."""
        self.exchange.stop(release_lease=release)
        if self.syncer is not None:
            self.syncer.stop(resign=release)

    def _published(self, fragment: int, handed: Handed | None) -> None:
        """On the exchange thread, after an upload: the syncer in this process looks now, and
        takes what the learner wrote as it is."""
        if self.syncer is not None:
            self.syncer.contribution_published(fragment, handed)

    def _own_bulletin(self) -> RoundsBulletin | None:
        """This node's syncer bulletin while it holds the election: the exchange follows it
        without reading the lease it writes."""
        if self.syncer is not None and self.syncer.election.is_leader:
            return self.syncer.bulletin()
        return None

    def _committed(self, committed: CommittedVersion) -> None:
        self.exchange.commit_available(committed.record.fragment, committed)
