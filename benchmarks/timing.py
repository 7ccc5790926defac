"""Timing helpers the benchmarks share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_of(repeat: int, action: Callable[[], Any]) -> float:
    """The fastest of ``repeat`` runs of ``action``, in seconds: the run the machine disturbed least."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times)
