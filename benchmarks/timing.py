"""Timing helpers the benchmarks share."""

from __future__ import annotations

import datetime
import json
import math
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def best_of(repeat: int, action: Callable[[], Any]) -> float:
    """The fastest of ``repeat`` runs of ``action``, in seconds: the run the machine disturbed least."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times)


def best_against_copy(actions: Sequence[Callable[[], Any]], source: np.ndarray, repeat: int) -> list[tuple[float, float]]:
    """(best seconds of the action, best seconds of an ``np.copyto`` of ``source`` into a reused
    buffer) for each action: a copy is timed right before every run of an action, so a busy
    machine weighs on both sides alike. Each action runs once first (thread pools, pages)."""
    target = np.empty_like(source)
    best = [math.inf] * len(actions)
    copies = [math.inf] * len(actions)
    for action in actions:
        action()
    for _ in range(repeat):
        for index, action in enumerate(actions):
            copies[index] = min(copies[index], best_of(1, lambda: np.copyto(target, source)))
            best[index] = min(best[index], best_of(1, action))
    return list(zip(best, copies, strict=True))


def save_result(benchmark: str, path: Path | None, kernel_threads: int, fields: dict[str, Any]) -> Path:
    """Write ``{"benchmark", "utc", "machine", **fields}`` as JSON to ``path`` (default
    ``runs/<benchmark>-<UTC time>/result.json``); returns where it went."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = path or ROOT / "runs" / f"{benchmark}-{stamp}" / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    machine = {"platform": platform.platform(), "processor": platform.processor(), "kernel_threads": kernel_threads}
    path.write_text(json.dumps({"benchmark": benchmark, "utc": stamp, "machine": machine, **fields}, indent=2) + "\n")
    return path
