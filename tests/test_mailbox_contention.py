"""Create-once under contention: many writers race on one key, exactly one wins."""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gradientmail.errors import RecordExists
from gradientmail.mailbox import FileMailbox, Mailbox
from tests.mailbox_workers import race_create

THREADS = 16
PROCESSES = 4


def _check_one_winner(mailbox: Mailbox, key: str, outcomes: dict[str, str]) -> None:
    winners = [writer for writer, outcome in outcomes.items() if outcome == "won"]
    errors = {writer: outcome for writer, outcome in outcomes.items() if outcome not in ("won", "lost")}
    assert not errors, errors
    assert len(winners) == 1, outcomes
    assert mailbox.get(key) == f"written by {winners[0]}".encode()


def _race_threads(mailbox: Mailbox, key: str) -> dict[str, str]:
    barrier = threading.Barrier(THREADS)

    def writer(name: str) -> tuple[str, str]:
        barrier.wait(timeout=30)
        try:
            mailbox.create(key, f"written by {name}".encode())
            return name, "won"
        except RecordExists:
            return name, "lost"
        except Exception as exc:  # reported by _check_one_winner
            return name, f"error: {exc!r}"

    with ThreadPoolExecutor(THREADS) as pool:
        return dict(pool.map(writer, [f"thread-{index}" for index in range(THREADS)]))


@pytest.mark.slow
def test_threads_race_on_create(mailbox: Mailbox, store: str) -> None:
    """INV-1: of threads racing to create one key exactly one wins and its bytes stay."""
    rounds = 1 if store == "s3" else 5  # SeaweedFS makes contended conditional writes wait ~1 s
    mailbox.create("warm-up", b"")  # connect (and check conditional writes) before racing
    for round_index in range(rounds):
        key = f"rounds/{round_index:04d}.json"
        _check_one_winner(mailbox, key, _race_threads(mailbox, key))


def _race_processes(url: str, key: str) -> dict[str, str]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    processes = [
        context.Process(target=race_create, args=(url, key, f"process-{index}", barrier, results)) for index in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    outcomes: dict[str, str] = {}
    try:
        for _ in processes:
            writer, outcome, detail = results.get(timeout=120)
            outcomes[writer] = outcome if not detail else f"{outcome}: {detail}"
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    return outcomes


@pytest.mark.slow
def test_processes_race_on_create_in_a_directory(tmp_path: Path) -> None:
    """INV-1: of processes racing to create one file exactly one wins and its bytes stay."""
    mailbox = FileMailbox(tmp_path / "mailbox")
    outcomes = _race_processes(mailbox.url, "rounds/0001.json")
    _check_one_winner(mailbox, "rounds/0001.json", outcomes)


@pytest.mark.slow
@pytest.mark.s3
def test_processes_race_on_create_in_s3(make_s3_mailbox, s3_server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Children open the mailbox from its URL; credentials reach them the standard way.
    """INV-1: of processes racing to create one S3 object exactly one wins and its bytes stay."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    mailbox = make_s3_mailbox()
    outcomes = _race_processes(mailbox.url, "rounds/0001.json")
    _check_one_winner(mailbox, "rounds/0001.json", outcomes)


def test_compare_and_swap_counter_loses_no_update(mailbox: Mailbox, store: str) -> None:
    """Writers increment one counter with get_versioned + swap, retrying on conflict: the
    final value counts every increment, which only holds if swap is atomic."""
    from gradientmail.errors import VersionConflict

    writers, increments = (4, 3) if store == "s3" else (8, 25)
    mailbox.put("counter", b"0")
    mailbox.swap("counter", b"0", mailbox.get_versioned("counter")[1])  # warm up

    def increment(_: int) -> int:
        conflicts = 0
        for _ in range(increments):
            while True:
                data, token = mailbox.get_versioned("counter")
                try:
                    mailbox.swap("counter", str(int(data) + 1).encode(), token)
                    break
                except VersionConflict:
                    conflicts += 1
        return conflicts

    with ThreadPoolExecutor(writers) as pool:
        sum(pool.map(increment, range(writers)))
    assert int(mailbox.get("counter")) == writers * increments
