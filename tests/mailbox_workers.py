"""Code run in child processes by the mailbox tests (spawned, so it must be importable)."""

from __future__ import annotations

from typing import Any

from gradientmail.errors import RecordExists
from gradientmail.mailbox import open_mailbox


def race_create(url: str, key: str, writer: str, barrier: Any, results: Any) -> None:
    """Open the mailbox by URL, warm it up, then create ``key`` once the others are ready."""
    mailbox = open_mailbox(url)
    try:
        mailbox.create(f"warm-up/{writer}", b"")  # connect (and check conditional writes) first
        barrier.wait(timeout=60)
        mailbox.create(key, f"written by {writer}".encode())
        results.put((writer, "won", ""))
    except RecordExists:
        results.put((writer, "lost", ""))
    except Exception as exc:  # reported to the parent, which fails the test
        results.put((writer, "error", repr(exc)))
    finally:
        mailbox.close()
