"""How much of each sync period a learner's transfers need: the back-pressure a thin link puts
on the exchange, measured where it happens (issue 45, docs/operations.md "A thin link").

One thread of the exchange uploads the learner's contributions and fetches its commits, one after
another, and the schedule wants every fragment exchanged once per sync period. When a period's
transfers (one contribution and one commit per fragment) take longer than most of the period, a
contribution waits behind the one before it, rounds close without it and commits reach the
learner late, whatever the training thread does: the link (or the CPU encoding and hashing for
it) is the bottleneck. :class:`TransferMeter` times the newest transfers and
:meth:`TransferMeter.reading` says what share of a period they need; the learner's lease shows it
(:data:`LINK`) and ``regime.link_hint`` turns it into the setting that would fit.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["LINK", "LinkReading", "TransferMeter"]

LINK = "link"
"""The lease info key of the learner's :meth:`LinkReading.as_info`."""
_RECENT_PER_FRAGMENT = 2
"""Transfers of each direction averaged, per fragment: the newest two periods' worth."""
_MAX_SHARE = 1e6
"""A share above which a lease's figure is not believed."""
_MAX_RATE = 1e13
"""Bytes per second above which a lease's figure is not believed (10 TB/s)."""

Direction = Literal["up", "down"]


@dataclass(frozen=True)
class LinkReading:
    """What a sync period's transfers need, from the newest ones: each fragment's contribution
    (delta, encoding, hashing, upload) and its commit (read whole or as its compact change)."""

    up_share: float
    """Seconds the uploads of one period need (one per fragment) ÷ the period; over 1: they cannot keep up."""
    down_share: float
    """Seconds the commit reads of one period need ÷ the period."""
    up_bytes_per_s: float | None
    """Bytes of the newest finished contributions ÷ the seconds they took; None without one."""
    down_bytes_per_s: float | None
    period_s: float
    """The sync period the shares are of (``sync_every`` × the step time)."""

    @property
    def busy_share(self) -> float:
        """Share of a period the transfer thread needs (uploads and fetches share one thread)."""
        return self.up_share + self.down_share

    def as_info(self) -> dict[str, float]:
        """The lease info form (rounded: a lease is read by humans and renewed every TTL/3)."""
        info = {"up": round(self.up_share, 3), "down": round(self.down_share, 3), "period_s": round(self.period_s, 4)}
        if self.up_bytes_per_s is not None:
            info["up_Bps"] = round(self.up_bytes_per_s)
        if self.down_bytes_per_s is not None:
            info["down_Bps"] = round(self.down_bytes_per_s)
        return info

    @classmethod
    def from_info(cls, value: object) -> LinkReading | None:
        """The inverse of :meth:`as_info`, strict: another node wrote it, so anything but finite,
        non-negative, bounded numbers reads as None (shown as unreadable)."""
        if not isinstance(value, Mapping) or set(value) - {"up", "down", "period_s", "up_Bps", "down_Bps"}:
            return None
        up, down = (_number(value.get(k), _MAX_SHARE) for k in ("up", "down"))
        period = _number(value.get("period_s"), math.inf)
        if up is None or down is None or period is None or period <= 0:
            return None
        rates = [_number(value[k], _MAX_RATE) if k in value else None for k in ("up_Bps", "down_Bps")]
        if any(k in value and rate is None for k, rate in zip(("up_Bps", "down_Bps"), rates, strict=True)):
            return None
        return cls(up, down, rates[0], rates[1], period)

    def describe(self) -> str:
        """One line for ``gradientmail status``."""
        named = (("uploads", self.up_bytes_per_s), ("fetches", self.down_bytes_per_s))
        rates = ", ".join(f"{name} at {rate / 1e6:.3g} MB/s" for name, rate in named if rate is not None)
        return (
            f"link: a sync period's transfers need {100 * self.busy_share:.0f} % of its {self.period_s:.3g} s "
            f"({100 * self.up_share:.0f} % uploading, {100 * self.down_share:.0f} % fetching){'; ' + rates if rates else ''}"
        )


def _number(value: object, at_most: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and 0 <= number <= at_most else None


class TransferMeter:
    """The exchange's transfers for ``fragments`` fragments on ``clock``: :meth:`begin` and
    :meth:`end` around each (on the transfer thread), :meth:`reading` from any thread (the
    lease's renewal). A transfer still running counts for as long as it has run, so an upload
    that never ends shows as soon as it outlasts the period."""

    def __init__(self, clock: Callable[[], float], fragments: int) -> None:
        self._clock = clock
        self._fragments = fragments
        self._lock = threading.Lock()
        kept = _RECENT_PER_FRAGMENT * fragments
        self._done: dict[Direction, collections.deque[tuple[float, int]]] = {
            "up": collections.deque(maxlen=kept),
            "down": collections.deque(maxlen=kept),
        }
        """(seconds, bytes) of the newest finished transfers of each direction."""
        self._running: dict[int, tuple[Direction, float]] = {}
        self._next_token = 0

    def begin(self, direction: Direction) -> int:
        """A transfer starts; the token goes to :meth:`end`."""
        now = self._clock()
        with self._lock:
            token, self._next_token = self._next_token, self._next_token + 1
            self._running[token] = (direction, now)
        return token

    def end(self, token: int, size_bytes: int) -> None:
        """The transfer of ``token`` moved ``size_bytes`` (0 for one that failed)."""
        now = self._clock()
        with self._lock:
            direction, started = self._running.pop(token)
            self._done[direction].append((now - started, size_bytes))

    def reading(self, period_s: float | None) -> LinkReading | None:
        """What one period of ``period_s`` seconds needs, from the newest transfers; None
        before the first, or without a period (the step time not known yet)."""
        if not period_s or period_s <= 0:
            return None
        now = self._clock()
        with self._lock:
            done = {d: list(spans) for d, spans in self._done.items()}
            running = list(self._running.values())
        if not any(done.values()) and not running:
            return None
        shares: dict[Direction, float] = {}
        rates: dict[Direction, float | None] = {}
        for direction in ("up", "down"):
            seconds = [s for s, _ in done[direction]] + [now - began for d, began in running if d == direction]
            shares[direction] = self._fragments * (sum(seconds) / len(seconds)) / period_s if seconds else 0.0
            took = sum(s for s, _ in done[direction])
            rates[direction] = sum(b for _, b in done[direction]) / took if took > 0 else None
        return LinkReading(shares["up"], shares["down"], rates["up"], rates["down"], period_s)
