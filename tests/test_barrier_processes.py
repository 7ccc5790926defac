"""Barriers across real learner processes on the loopback S3 server (1 s stamps): released at one
instant of the store's clock, as far as each process's bounds say, and an arrival still counts
when its process is killed with -9 before the release. The rules: test_barrier.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCHEDULING_SLACK_S = 0.05
"""How late a process may wake on a loaded two-core machine beyond what its clock bounds allow."""


def start(url: str, env: dict[str, str], learner: str, parties: int, steps: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.barrier_proc", "--mailbox", url, "--learner-id", learner,
               "--parties", str(parties), "--steps", str(steps)]  # fmt: skip
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines(process: subprocess.Popen[str]) -> list[dict]:  # type: ignore[type-arg]
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_learner_processes_are_released_together_even_with_one_killed_after_arriving(s3_server) -> None:  # type: ignore[no-untyped-def]
    url = s3_server.url(f"barrier-procs-{time.time_ns()}")
    env = {**os.environ, **s3_server.env, "PYTHONPATH": str(ROOT)}
    steps = {"l1": 2, "l2": 12, "l3": 22}  # they arrive about half a second apart
    processes = {name: start(url, env, name, 4, n) for name, n in steps.items()}
    victim = start(url, env, "victim", 4, 2)
    assert json.loads(victim.stdout.readline())["event"] == "arriving"  # type: ignore[union-attr]
    time.sleep(1.0)  # its arrival is written well before the last learner arrives
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(30)
    released = {name: next(e for e in lines(p) if e["event"] == "released") for name, p in processes.items()}
    assert len({e["release_at"] for e in released.values()}) == 1
    assert all(set(e["arrived"]) == {"l1", "l2", "l3", "victim"} for e in released.values())
    assert not any(e["late"] for e in released.values())
    walls = [e["wall"] for e in released.values()]
    doubt = 2 * max(e["uncertainty_s"] for e in released.values())
    print(f"spread {max(walls) - min(walls):.4f} s, uncertainties {[round(e['uncertainty_s'], 4) for e in released.values()]}")
    assert max(walls) - min(walls) <= doubt + SCHEDULING_SLACK_S, (walls, doubt)
    # the machine's clock is the store's here: each returned at the release as far as its bounds say
    for e in released.values():
        assert abs(e["wall"] - e["release_at"]) <= e["uncertainty_s"] + SCHEDULING_SLACK_S, e
