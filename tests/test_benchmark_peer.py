"""benchmarks/peer_torchft.py without torchft: the bare and directory-mailbox arms in quick mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.peer_worker import CountingMailbox, build_model, make_batches
from gradientmail import MemoryMailbox

ROOT = Path(__file__).resolve().parent.parent


def test_arms_share_model_and_data() -> None:
    first, second = build_model(64), build_model(64)
    for a, b in zip(first.parameters(), second.parameters()):
        assert a.equal(b)
    (x0, y0), (x1, y1) = make_batches(1, 1, 8)[0], make_batches(1, 1, 8)[0]
    assert x0.equal(x1) and y0.equal(y1)
    assert not make_batches(2, 1, 8)[0][0].equal(x0)  # each learner rank its own stream
    assert sum(p.numel() for p in build_model().parameters()) == 1_640_512


def test_counting_mailbox_counts_payloads() -> None:
    box = CountingMailbox(MemoryMailbox())
    box.put("a/b", b"12345")
    box.create("a/c", b"12")
    _, token = box.get_versioned("a/b")
    box.swap("a/b", b"123", token)
    assert box.get("a/c") == b"12"
    assert (box.up, box.down) == (5 + 2 + 3, 5 + 2)
    assert box.list("a/") == ["a/b", "a/c"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_quick_run_without_torchft(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "benchmarks.peer_torchft", "--quick", "--no-torchft", "--arms", "gm-directory"]
    done = subprocess.run([*command, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[information: not applicable]" in done.stdout  # no torchft, no S3: no target is judged
    result = json.loads(out.read_text())
    assert set(result["arms"]) == {"bare", "gm-directory"}
    arm = result["arms"]["gm-directory"]
    assert arm["throughput_ratio"] > 0 and arm["eval_loss"] > 0
    learners = arm["trials"][0]["learners"]
    assert all(learner["bytes_up"] >= learner["bytes_published"] > 0 for learner in learners)
    assert all(learner["contributions"] > 0 for learner in learners)
    assert len(arm["bytes_up_per_sync"]) == 2 and arm["bytes_up_per_sync"][0] >= arm["bytes_up_per_sync"][1]
    assert len(result["targets"]) == 3 and all(t["met"] is None for t in result["targets"])
    assert not (tmp_path / "work").exists()  # removed without --keep


def test_the_server_gets_a_core_of_its_own_only_where_the_machine_has_one_to_spare() -> None:
    from benchmarks.peer_torchft import core_plan

    assert core_plan({0, 1}, 2) is None  # this machine: nothing pinned
    assert core_plan({0, 1, 2}, 2) == ({2}, {0, 1})
    assert core_plan({0, 1, 2, 3, 4, 5, 6, 7}, 2) == ({7}, {0, 1, 2, 3, 4, 5, 6})
    assert core_plan({4, 9, 12}, 2) == ({12}, {4, 9})  # the cores this process may use, whatever their numbers


def test_pinning_moves_every_thread_of_a_running_process() -> None:
    import os
    import threading

    from benchmarks.peer_torchft import pin_process

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading, time; [threading.Thread(target=time.sleep, args=(30,)).start() for _ in range(3)]; time.sleep(30)",
        ]
    )
    try:
        threads = Path(f"/proc/{child.pid}/task")
        for _ in range(200):  # at most 10 s for its threads to start
            if len(list(threads.iterdir())) >= 4:
                break
            threading.Event().wait(0.05)
        core = min(os.sched_getaffinity(0))
        pin_process(child.pid, {core})
        assert {frozenset(os.sched_getaffinity(int(task.name))) for task in threads.iterdir()} == {frozenset({core})}
    finally:
        child.kill()
        child.wait()
