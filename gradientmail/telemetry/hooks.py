"""The few calls the session and the syncer make into telemetry, all off the training hot path.

This module imports no OpenTelemetry, so the library works without the ``telemetry`` extra.
Sessions and syncer runtimes register here when they start (a weak reference, nothing else);
observable instruments read their counters at collection time, so ``session.step()`` does no
telemetry work at all. Round events go to the active recorder, or nowhere when telemetry is off.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Protocol

from gradientmail.telemetry.catalogue import PHASES

if TYPE_CHECKING:
    from gradientmail.records import RoundRecord


@dataclass(frozen=True)
class RoundPhases:
    """When each phase of a committed round ended, on the syncer's monotonic clock."""

    opened_at: float
    """The round opened: the previous commit was seen (or the view loaded after a takeover)."""
    first_seen_at: float
    """First contribution accepted: collect ends, quorum wait begins."""
    quorum_at: float
    closing_at: float
    """Grace ended; merging starts."""
    merged_at: float
    stepped_at: float
    """Outer step done; commit starts."""
    committed_at: float
    now: float
    """The syncer clock when this was reported, to place the times on the wall clock."""
    grace_window_s: float
    grace_contributions: int
    fetch_s: float
    fetched_bytes: int

    def durations(self) -> dict[str, float]:
        """Seconds per phase, in order."""
        edges = (
            self.opened_at,
            self.first_seen_at,
            self.quorum_at,
            self.closing_at,
            self.merged_at,
            self.stepped_at,
            self.committed_at,
        )
        return {name: max(0.0, end - start) for name, (start, end) in zip(PHASES, pairwise(edges), strict=True)}


class Recorder(Protocol):
    def syncer_attached(self, runtime: Any) -> None: ...

    def round_committed(self, runtime: Any, fragment: int, record: RoundRecord, phases: RoundPhases) -> None: ...


_lock = threading.Lock()
_sessions: weakref.WeakSet[Any] = weakref.WeakSet()
_syncers: weakref.WeakSet[Any] = weakref.WeakSet()
_recorder: Recorder | None = None


def attach_session(session: Any) -> None:
    """Make a session's stats visible to the learner instruments (once, when it opens)."""
    with _lock:
        _sessions.add(session)


def attach_syncer(runtime: Any) -> None:
    """Make a syncer runtime visible to the syncer instruments (once, when it starts)."""
    with _lock:
        _syncers.add(runtime)
    recorder = _recorder
    if recorder is not None:
        recorder.syncer_attached(runtime)


def round_committed(runtime: Any, fragment: int, record: RoundRecord, phases: RoundPhases) -> None:
    """A round was committed by ``runtime``: count it and trace its phases, if telemetry is on."""
    recorder = _recorder
    if recorder is not None:
        recorder.round_committed(runtime, fragment, record, phases)


def sessions() -> list[Any]:
    with _lock:
        return list(_sessions)


def syncers() -> list[Any]:
    with _lock:
        return list(_syncers)


def set_recorder(recorder: Recorder | None) -> None:
    global _recorder
    _recorder = recorder
