"""An ``"either"`` node serving as the run's syncer instead of training (docs/session.md, "Roles").

While it holds the syncer role and another node trains (``roles.serves_instead_of_training``),
such a node hands its unmerged work over (publishes it and waits for those rounds), then only
closes rounds, its lease saying it does not train, until it loses the role or nobody else
trains; then it aligns with the newest commits and returns to the training loop.
``ServingRole`` holds the rule and the spell's state; the session calls ``serve`` between steps
(and before a work queue's claim) with what the hand-over does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gradientmail.session.roles import serves_instead_of_training
from gradientmail.store import others_training
from gradientmail.syncer import SyncerRuntime

__all__ = ["ServingRole"]

log = logging.getLogger(__name__)


class ServingRole:
    """One node's spells as the syncer, on the clock it is given."""

    def __init__(
        self,
        role: str,
        learner_id: str,
        *,
        poll_interval_s: float,
        changed: threading.Condition,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.role = role
        self.learner_id = learner_id
        self.poll_interval_s = poll_interval_s
        self._changed = changed
        self._clock = clock
        self.active = False
        """Serving now: the learner's lease says it does not train."""
        self.pauses = 0
        """Times it stopped training to serve."""
        self.serving_s = 0.0
        """Seconds it spent so (the training thread waiting in ``step()`` or the queue)."""

    def due(self, syncer: SyncerRuntime | None) -> bool:
        """Whether this node should serve now instead of training."""
        if syncer is None:
            return False
        holds = syncer.election.is_leader
        return serves_instead_of_training(self.role, holds, others_training(syncer.live, self.learner_id) if holds else 0)

    def serve(
        self,
        syncer: SyncerRuntime | None,
        *,
        hand_over: Callable[[], None],
        running: Callable[[], bool],
        failure: Callable[[], BaseException | None],
    ) -> bool:
        """Serve while due: ``hand_over`` first (publish the unmerged work, wait for its rounds),
        then wait while ``running``, raising the exchange's ``failure``. True: it served (align
        with the newest commits now)."""
        if not self.due(syncer):
            return False
        log.info("%s is the run's syncer while others train: training paused", self.learner_id)
        started = self._clock()
        self.pauses += 1
        hand_over()
        self.active = True
        try:
            while running() and self.due(syncer):
                error = failure()
                if error is not None:
                    raise error
                with self._changed:
                    self._changed.wait(self.poll_interval_s)
        finally:
            self.active = False
            self.serving_s += self._clock() - started
        log.info("%s trains again after %.1f s as the syncer", self.learner_id, self._clock() - started)
        return True
