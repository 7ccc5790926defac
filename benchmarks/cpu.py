"""CPU seconds of this process and of a server process over a span of a benchmark (Linux /proc).

On a machine whose cores the client and a loopback server share, wall time hides who spent
what: a round can be slower than its floor because the client hashes, because the server
works harder for ranged requests, or because fresh memory is expensive to touch (a VM that
gives idle pages back to its host pays a host fault on the next touch). A :class:`CpuSpan`
splits the span into the client's user and system seconds, its minor page faults, and the
server's seconds, so each phase can be set against the same split of its floor.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["CpuSpan", "ThreadCpu", "add_memory_option", "apply_memory_option", "cpu_span", "process_cpu_s", "thread_group"]


def process_cpu_s(pid: int) -> float:
    """utime + stime of a live process (every thread), 0.0 where unavailable."""
    return _cpu_s(pid)[0]


def _cpu_s(task: int | str) -> tuple[float, float]:
    """(utime + stime, stime) in seconds of ``/proc/<task>/stat``; zeros where it is gone."""
    fields = _stat(task)
    if not fields:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, int(fields[12]) / tick


def _stat(pid: int | str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _minor_faults() -> int:
    fields = _stat("self")
    return int(fields[7]) if fields else 0


@dataclass
class CpuSpan:
    """What one span cost: wall seconds; the client's user and system CPU seconds (every
    thread of this process) and minor page faults; the server's CPU seconds (None: no server)."""

    wall_s: float = 0.0
    user_s: float = 0.0
    system_s: float = 0.0
    minor_faults: int = 0
    server_s: float | None = None

    @property
    def client_s(self) -> float:
        return self.user_s + self.system_s

    @property
    def total_s(self) -> float:
        return self.client_s + (self.server_s or 0.0)

    def __add__(self, other: CpuSpan) -> CpuSpan:
        server = None if self.server_s is None and other.server_s is None else (self.server_s or 0.0) + (other.server_s or 0.0)
        return CpuSpan(
            self.wall_s + other.wall_s,
            self.user_s + other.user_s,
            self.system_s + other.system_s,
            self.minor_faults + other.minor_faults,
            server,
        )

    def line(self) -> str:
        server = "" if self.server_s is None else f", server {self.server_s:.2f}"
        return (
            f"wall {self.wall_s:.2f} s; CPU-s client {self.client_s:.2f} (user {self.user_s:.2f} + system "
            f"{self.system_s:.2f}, {self.minor_faults} minor faults){server}"
        )

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "client_s": self.client_s, "total_s": self.total_s}

    @classmethod
    def from_json(cls, recorded: dict[str, Any]) -> CpuSpan:
        """The span :meth:`as_json` wrote (its derived sums left out)."""
        return cls(**{name: recorded[name] for name in ("wall_s", "user_s", "system_s", "minor_faults", "server_s")})

    def against(self, reference: CpuSpan) -> dict[str, float]:
        """CPU seconds of this span ÷ those of ``reference``: client, server and both."""
        return {
            "client": self.client_s / max(reference.client_s, 1e-9),
            "server": (self.server_s or 0.0) / max(reference.server_s or 0.0, 1e-9),
            "both": self.total_s / max(reference.total_s, 1e-9),
        }


@contextmanager
def cpu_span(server_pid: int | None = None) -> Iterator[CpuSpan]:
    """Measure the ``with`` block; the span's figures are filled in when it ends."""
    span = CpuSpan()
    started, times, faults = time.monotonic(), os.times(), _minor_faults()
    server = process_cpu_s(server_pid) if server_pid else None
    try:
        yield span
    finally:
        ended = os.times()
        span.wall_s = time.monotonic() - started
        span.user_s = ended.user - times.user
        span.system_s = ended.system - times.system
        span.minor_faults = _minor_faults() - faults
        if server_pid and server is not None:
            span.server_s = process_cpu_s(server_pid) - server


def thread_group(name: str) -> str:
    """The family a thread's name belongs to: ``gm-fetch-learner-a_0`` and ``gm-fetch-learner-b_1``
    are both ``gm-fetch``, ``gm-kernel_0`` is ``gm-kernel``; other names stay as they are."""
    stem = name.split("_", 1)[0]
    return "-".join(stem.split("-")[:2]) if stem.startswith("gm-") else name


class ThreadCpu:
    """CPU seconds of each thread of this process over a ``with`` block, summed by
    :func:`thread_group` of its Python name (Linux ``/proc/self/task``). Sampled every
    ``interval_s`` and once at the end, so a pool thread that ends inside the block counts up
    to its last sample; ``missed_s`` is the process's CPU seconds that no sample saw (threads
    shorter than an interval, the tails of ended ones), the sampler's own left out."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self._start: dict[tuple[int, int], tuple[float, float]] = {}
        """(CPU, system) seconds of each thread when the block began, by key (see :meth:`_threads`)."""
        self._last: dict[tuple[int, int], tuple[str, tuple[float, float]]] = {}
        """Name and (CPU, system) seconds of each thread at its last sample."""
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._run, name="benchmark-thread-cpu", daemon=True)
        self._sampler_cpu_s = 0.0
        self._process_started = 0.0
        self.missed_s = 0.0

    def __enter__(self) -> ThreadCpu:
        self._process_started = time.process_time()
        for key, _, seconds in self._threads():
            self._start[key] = seconds
        self._sample()
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join()
        self._sample()
        seen = sum(self.by_group().values())
        self.missed_s = max(0.0, time.process_time() - self._process_started - seen - self._sampler_cpu_s)

    def by_group(self) -> dict[str, float]:
        """CPU seconds (user + system) per thread family, largest first."""
        return self._summed(0)

    def system_by_group(self) -> dict[str, float]:
        """The kernel's share of :meth:`by_group` (system seconds: page faults, file writes)."""
        return self._summed(1)

    def _summed(self, field: int) -> dict[str, float]:
        groups: dict[str, float] = {}
        for key, (name, seconds) in self._last.items():
            family = thread_group(name)
            groups[family] = groups.get(family, 0.0) + seconds[field] - self._start.get(key, (0.0, 0.0))[field]
        return dict(sorted(groups.items(), key=lambda item: -item[1]))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()
        self._sampler_cpu_s = time.thread_time()

    def _threads(self) -> list[tuple[tuple[int, int], str, tuple[float, float]]]:
        """(key, name, (CPU, system) seconds) of every live thread but the sampler; the key pairs
        the OS thread id with the thread object, so a reused id is a new thread."""
        return [
            ((thread.native_id, id(thread)), thread.name, _cpu_s(f"self/task/{thread.native_id}"))
            for thread in threading.enumerate()
            if thread.native_id is not None and thread is not self._sampler
        ]

    def _sample(self) -> None:
        for key, name, seconds in self._threads():
            if seconds[0] or key not in self._last:  # zeros: it ended between the listing and the read
                self._last[key] = (name, seconds)


MEMORY_SETTINGS = ("retained", "returned")


def add_memory_option(parser: argparse.ArgumentParser, default: str) -> None:
    """``--memory retained|returned``: whether the benchmark's process keeps what it frees
    (``gm.retain_freed_memory``). Process-wide and not undoable, so a comparison runs one process
    per setting."""
    parser.add_argument(
        "--memory",
        choices=MEMORY_SETTINGS,
        default=default,
        help="retained: the process keeps what it frees (gm.retain_freed_memory), as a gradientmail node does; "
        f"returned: glibc's defaults, every large buffer mapped afresh (default {default}; one process per setting)",
    )


def apply_memory_option(setting: str) -> bool:
    """Apply ``--memory`` (before the benchmark starts threads) and print which setting runs;
    returns whether freed memory is retained."""
    import gradientmail as gm

    if setting == "retained":
        applied = gm.retain_freed_memory()
        print(f"memory: retained (gm.retain_freed_memory applied: {applied})")
        return applied
    print("memory: returned (the allocator's defaults)")
    return False
