"""Fetching a round's contributions ahead of the one being checked, in the order listed.

The syncer checks contributions one at a time (finite, norm, duplicates: the outcomes, and
their order, are those of one at a time), but a contribution's fetch (record, payload, digest,
decode) is mostly waiting on the mailbox. ``fetched_in_order`` keeps ``depth`` fetches running
on threads of their own while the caller checks the one before, and never more: the syncer
holds at most ``depth`` payloads beyond the ones it accepted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["fetched_in_order"]

Key = TypeVar("Key")
Result = TypeVar("Result")


def fetched_in_order(
    steps: Sequence[Key], fetch: Callable[[Key], Result], *, depth: int, thread_name: str
) -> Generator[tuple[Key, Result], None, None]:
    """Each of ``steps`` with what ``fetch`` returned for it, in order, up to ``depth`` fetched
    ahead. Close it (``contextlib.closing``) when the caller stops early: a retryable mailbox
    error that escapes leaves the fetches not started cancelled, for the next pass."""
    pending: deque[Future[Result]] = deque()
    ahead = iter(steps)
    with ThreadPoolExecutor(max_workers=depth, thread_name_prefix=thread_name) as pool:
        try:
            for key in steps:
                while len(pending) < depth:  # keep the next ones coming while this one is checked
                    upcoming = next(ahead, None)
                    if upcoming is None:
                        break
                    pending.append(pool.submit(fetch, upcoming))
                yield key, pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
