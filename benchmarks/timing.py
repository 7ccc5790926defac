"""Timing helpers the benchmarks share."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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


def copy_threads() -> int:
    """One copying thread per core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threaded_copy(target: np.ndarray, source: np.ndarray, pool: ThreadPoolExecutor, threads: int) -> None:
    """``np.copyto`` split into ``threads`` contiguous runs, one per thread (NumPy releases the
    GIL while it copies): the machine's copy rate when every core copies."""
    flat_target, flat_source = target.reshape(-1), source.reshape(-1)
    bounds = [flat_source.size * i // threads for i in range(threads + 1)]
    futures = [
        pool.submit(np.copyto, flat_target[bounds[i] : bounds[i + 1]], flat_source[bounds[i] : bounds[i + 1]])
        for i in range(threads)
    ]
    for future in futures:
        future.result()


@dataclass
class AgainstCopy:
    """Every timed run of one action, each with the copies of ``source`` timed right before it:
    one thread (``np.copyto``) and one thread per core. The reference of a run is the faster of
    the two, so an action that uses every core is not compared with a copy that uses one."""

    seconds: list[float] = field(default_factory=list)
    single_copy: list[float] = field(default_factory=list)
    threaded_copy: list[float] = field(default_factory=list)

    def copies(self, reference: str = "best") -> list[float]:
        """Each run's copy seconds: ``best`` (the faster copy of that run), ``single`` or ``threaded``."""
        if reference == "single":
            return self.single_copy
        if reference == "threaded":
            return self.threaded_copy
        return [min(a, b) for a, b in zip(self.single_copy, self.threaded_copy, strict=True)]

    def ratios(self, action_bytes: float, copy_bytes: float, reference: str = "best") -> list[float]:
        """Action bytes per second over copy bytes per second, one per run (``copies``' reference)."""
        return [(action_bytes / s) / (copy_bytes / c) for s, c in zip(self.seconds, self.copies(reference), strict=True)]

    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    def copy_rate(self, copy_bytes: float, reference: str = "best") -> float:
        """Copy bytes per second, the median over this action's runs."""
        return copy_bytes / statistics.median(self.copies(reference))


def against_copy(actions: Sequence[Callable[[], Any]], source: np.ndarray, repeat: int) -> list[AgainstCopy]:
    """Time every action ``repeat`` times, interleaved, each run right after a single-thread and
    a threaded copy of ``source`` into a reused buffer (a busy spell weighs on both sides alike).
    Each action runs once first (thread pools, pages); verdicts take the median of the runs."""
    target = np.empty_like(source)
    threads = copy_threads()
    timed = [AgainstCopy() for _ in actions]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="copy") as pool:
        threaded_copy(target, source, pool, threads)
        for action in actions:
            action()
        for _ in range(repeat):
            for index, action in enumerate(actions):
                timed[index].single_copy.append(best_of(1, lambda: np.copyto(target, source)))
                timed[index].threaded_copy.append(best_of(1, lambda: threaded_copy(target, source, pool, threads)))
                timed[index].seconds.append(best_of(1, action))
    return timed


def save_result(benchmark: str, path: Path | None, kernel_threads: int, fields: dict[str, Any]) -> Path:
    """Write ``{"benchmark", "utc", "machine", **fields}`` as JSON to ``path`` (default
    ``runs/<benchmark>-<UTC time>/result.json``); returns where it went."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = path or ROOT / "runs" / f"{benchmark}-{stamp}" / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    machine = {"platform": platform.platform(), "processor": platform.processor(), "kernel_threads": kernel_threads}
    path.write_text(json.dumps({"benchmark": benchmark, "utc": stamp, "machine": machine, **fields}, indent=2) + "\n")
    return path
