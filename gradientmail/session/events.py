"""What a session tells its listeners: the user's own scalars, and the exchange's milestones.

``session.report(loss=..., lr=...)`` keeps the newest value of each named scalar (exported as
``gradientmail_learner_reported``, docs/observability.md) and hands them to the listeners;
``session.add_listener(fn)`` calls ``fn(event)`` on the training thread for every
:class:`SessionEvent`: ``reported`` (the scalars just reported), ``published`` (a fragment's
contribution handed to the background), ``aligned`` (the model took a committed version of a
fragment). A tracker (TensorBoard, MLflow, W&B) is a listener of a few lines
(``examples/tensorboard_learner.py``). A listener that raises is logged (once, then once a minute
while it keeps failing) and training goes on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gradientmail.errors import InvalidConfig
from gradientmail.polling import RepeatedFailures

__all__ = ["REPORTED_NAMES_LIMIT", "EventKind", "Listeners", "ReportedScalars", "SessionEvent"]

log = logging.getLogger(__name__)

EventKind = Literal["reported", "published", "aligned"]
REPORTED_NAMES_LIMIT = 32
"""Distinct scalar names one session may report: each is a series of the metrics endpoint."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class SessionEvent:
    """One thing that happened in a session, as listeners see it."""

    kind: EventKind
    step: int
    """The session's step count (``session.stats.steps``) when it happened."""
    total_steps: int
    """Steps in the run across resumed restarts (``session.total_steps``): what to plot against."""
    fragment: int | None = None
    """``published`` and ``aligned``: the fragment."""
    version: int | None = None
    """``published``: the version the contribution is based on; ``aligned``: the version taken."""
    scalars: Mapping[str, float] = field(default_factory=dict)
    """``reported``: the scalars of this report."""


class ReportedScalars:
    """The newest value of each scalar a session reported (at most ``REPORTED_NAMES_LIMIT`` names)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def update(self, scalars: Mapping[str, object]) -> dict[str, float]:
        """Check and keep ``scalars``; what was kept, as floats. ``InvalidConfig`` names the bad one."""
        kept: dict[str, float] = {}
        for name, value in scalars.items():
            if not _NAME.fullmatch(name):
                raise InvalidConfig("report", f"scalar name {name!r}: letters, digits and _, not starting with a digit, ≤ 64")
            if isinstance(value, bool) or not isinstance(value, int | float):
                try:
                    value = float(value)  # type: ignore[arg-type] # a 0-d tensor or NumPy scalar
                except (TypeError, ValueError):
                    raise InvalidConfig("report", f"{name}: a number, got {type(value).__name__}") from None
            if name not in self.values and len(self.values) >= REPORTED_NAMES_LIMIT:
                raise InvalidConfig("report", f"{name}: at most {REPORTED_NAMES_LIMIT} scalar names per session")
            kept[name] = float(value)
        self.values.update(kept)
        return kept


class Listeners:
    """The callbacks of one session; each call is guarded (module docstring)."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[SessionEvent], object]] = []
        self._failures = RepeatedFailures(log, "a session listener")

    def add(self, callback: Callable[[SessionEvent], object]) -> None:
        if not callable(callback):
            raise InvalidConfig("add_listener", f"expected a callable, got {type(callback).__name__}")
        self._callbacks.append(callback)

    def __bool__(self) -> bool:
        return bool(self._callbacks)

    def emit(self, event: SessionEvent) -> None:
        for callback in self._callbacks:
            try:
                callback(event)
            except Exception as exc:
                self._failures.failed(f"{getattr(callback, '__qualname__', callback)!s} raised {exc!r}")
