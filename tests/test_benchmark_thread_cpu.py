"""``benchmarks.cpu.ThreadCpu``: a span's CPU seconds split by thread family, counting a thread
that ended inside the span, and the family rule the step-overhead benchmark groups by."""

from __future__ import annotations

import threading
import time

import pytest

from benchmarks.cpu import ThreadCpu, thread_group


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_thread_families_drop_their_node_and_pool_suffixes() -> None:
    assert thread_group("gm-fetch-learner-a_0") == thread_group("gm-fetch-learner-b_3") == "gm-fetch"
    assert thread_group("gm-kernel_1") == "gm-kernel" and thread_group("gm-exchange-learner-a") == "gm-exchange"
    assert thread_group("MainThread") == "MainThread"


def test_each_family_gets_its_own_seconds_and_an_ended_thread_still_counts() -> None:
    started = threading.Event()

    def worker(seconds: float) -> None:
        started.wait()
        _spin(seconds)

    long = threading.Thread(target=worker, args=(1.0,), name="gm-busy-a_0")
    short = threading.Thread(target=worker, args=(0.5,), name="gm-brief-a_0")
    with ThreadCpu(interval_s=0.02) as threads:
        long.start()
        short.start()
        started.set()
        short.join()
        long.join()  # both have ended before the span does
        _spin(0.2)
    groups = threads.by_group()
    assert groups["gm-busy"] == pytest.approx(1.0, abs=0.25)
    assert groups["gm-brief"] == pytest.approx(0.5, abs=0.25)
    assert groups["MainThread"] >= 0.15
    system = threads.system_by_group()
    assert all(0.0 <= system[name] <= groups[name] + 0.02 for name in groups if name in system)
    # /proc's per-thread ticks undercount a little against the process clock, and each ended
    # thread's last interval is lost: a small share, not zero
    assert threads.missed_s < 0.2 * sum(groups.values())
