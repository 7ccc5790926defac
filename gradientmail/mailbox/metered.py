"""A mailbox that counts its requests: by operation and outcome, with the seconds they took.

Every node wraps its mailbox in one (``Session``, ``SyncerNode``), so the requests that drive a
cloud bill (S3 prices PUT, COPY, POST and LIST alike, GET and HEAD at a tenth of that) and the
errors and latency of each operation are metrics (``gradientmail_mailbox_requests_total``,
``gradientmail_mailbox_request_seconds_total``; docs/observability.md). The cost is one clock
read and one locked counter update per request. Outcomes: ``ok``, or what the store answered
instead: ``not_found``, ``exists`` (a create-once that lost), ``conflict`` (a compare-and-swap
that lost), ``too_large``, ``error`` (anything else, the error propagating as it was).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from gradientmail.digests import DigestName
from gradientmail.errors import KeyNotFound, ObjectTooLarge, RecordExists, VersionConflict
from gradientmail.mailbox.base import ForwardingMailbox, Gathered, HashingGet, HashingPut, Mailbox, ObjectInfo, StampedGet

__all__ = ["OPERATIONS", "MeteredMailbox", "RequestCounts"]

T = TypeVar("T")

OPERATIONS = ("get", "get_versioned", "head", "exists", "put", "create", "swap", "list", "delete")
"""The operations counted (``get_hashed`` counts as ``get``, ``get_stamped`` as ``get_versioned``)."""

_OUTCOMES: tuple[tuple[type[BaseException], str], ...] = (
    (KeyNotFound, "not_found"),
    (RecordExists, "exists"),
    (VersionConflict, "conflict"),
    (ObjectTooLarge, "too_large"),
)


class RequestCounts:
    """Requests and their seconds, by operation and outcome (a snapshot is a plain dict). Every
    operation starts with ``ok`` and ``error`` at 0, so an error rate reads 0 before the first
    error instead of nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str], int] = {(op, outcome): 0 for op in OPERATIONS for outcome in ("ok", "error")}
        self._seconds: dict[tuple[str, str], float] = dict.fromkeys(self._requests, 0.0)

    def add(self, operation: str, outcome: str, seconds: float) -> None:
        key = (operation, outcome)
        with self._lock:
            self._requests[key] = self._requests.get(key, 0) + 1
            self._seconds[key] = self._seconds.get(key, 0.0) + seconds

    def requests(self) -> dict[tuple[str, str], int]:
        """(operation, outcome) → requests so far."""
        with self._lock:
            return dict(self._requests)

    def seconds(self) -> dict[tuple[str, str], float]:
        """(operation, outcome) → seconds those requests took, in all."""
        with self._lock:
            return dict(self._seconds)


class MeteredMailbox(ForwardingMailbox):
    """``inner`` with every request counted in :attr:`counts` (module docstring)."""

    def __init__(self, inner: Mailbox) -> None:
        super().__init__(inner)
        self.counts = RequestCounts()
        if isinstance(inner, HashingGet):  # keep hashing while the bytes arrive, and count it as a get
            hashing = inner

            def get_hashed(key: str, digest: DigestName, *, max_bytes: int | None = None) -> tuple[bytes, str]:
                return self._metered("get", lambda: hashing.get_hashed(key, digest, max_bytes=max_bytes))

            setattr(self, "get_hashed", get_hashed)  # noqa: B010 - an instance attribute, as ForwardingMailbox sets it
        if isinstance(inner, HashingPut):  # keep the store's one pass over the bytes, and count it as a put
            putting = inner

            def put_hashed(key: str, data: bytes | Gathered, digest: DigestName) -> tuple[str, str]:
                return self._metered("put", lambda: putting.put_hashed(key, data, digest))

            setattr(self, "put_hashed", put_hashed)  # noqa: B010 - as above
        if isinstance(inner, StampedGet):  # the stamp comes with the read: count it as the read it is
            stamped = inner

            def get_stamped(key: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]:
                return self._metered("get_versioned", lambda: stamped.get_stamped(key, max_bytes=max_bytes))

            setattr(self, "get_stamped", get_stamped)  # noqa: B010 - as above

    def _metered(self, operation: str, request: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            result = request()
        except BaseException as exc:
            outcome = next((name for kind, name in _OUTCOMES if isinstance(exc, kind)), "error")
            self.counts.add(operation, outcome, time.perf_counter() - started)
            raise
        self.counts.add(operation, "ok", time.perf_counter() - started)
        return result

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        return self._metered("get", lambda: self.inner.get(key, max_bytes=max_bytes))

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        return self._metered("get_versioned", lambda: self.inner.get_versioned(key, max_bytes=max_bytes))

    def head(self, key: str) -> ObjectInfo | None:
        return self._metered("head", lambda: self.inner.head(key))

    def exists(self, key: str) -> bool:
        return self._metered("exists", lambda: self.inner.exists(key))

    def put(self, key: str, data: bytes) -> str:
        return self._metered("put", lambda: self.inner.put(key, data))

    def create(self, key: str, data: bytes) -> str:
        return self._metered("create", lambda: self.inner.create(key, data))

    def swap(self, key: str, data: bytes, expected_token: str) -> str:
        return self._metered("swap", lambda: self.inner.swap(key, data, expected_token))

    def list(self, prefix: str = "") -> list[str]:
        return self._metered("list", lambda: self.inner.list(prefix))

    def delete(self, key: str) -> None:
        self._metered("delete", lambda: self.inner.delete(key))
