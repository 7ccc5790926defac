"""Counting S3 requests by kind, and what they cost at a public cloud's list prices.

A :class:`RequestCounter` hangs on a ``boto3.Session``'s event system (botocore's event hooks),
so every client made from that session is counted: ``before-send`` fires once per HTTP request
sent (retries included: what a provider bills), ``before-call`` once per API call. Give the
session to ``gm.S3Mailbox(session=...)`` and every request that mailbox makes is counted.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from gradientmail.simulate.model import PRICES, PRICES_AS_OF

__all__ = [
    "PRICES",
    "PRICES_AS_OF",
    "RequestCounter",
    "add",
    "by_class",
    "counting_session",
    "daily_cost",
    "diff",
    "price_class",
]


_PUT_CLASS = {
    "PutObject",
    "CopyObject",
    "CreateMultipartUpload",
    "UploadPart",
    "UploadPartCopy",
    "CompleteMultipartUpload",
    "ListObjectsV2",
    "ListObjects",
    "ListObjectVersions",
    "ListMultipartUploads",
    "ListParts",
    "ListBuckets",
    "CreateBucket",
    "PostObject",
}
_FREE = {"DeleteObject", "DeleteObjects", "AbortMultipartUpload", "DeleteBucket"}


def price_class(operation: str) -> str:
    """``put`` (PUT/COPY/POST/LIST), ``delete`` (free) or ``get`` (GET/HEAD and the rest)."""
    if operation in _PUT_CLASS:
        return "put"
    if operation in _FREE:
        return "delete"
    return "get"


class RequestCounter:
    """Thread-safe counts of S3 requests by operation name (``GetObject``, ``PutObject``, …)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._calls: Counter[str] = Counter()

    def attach(self, events: Any) -> None:
        """Register on a botocore event emitter (``boto3.Session().events`` or ``client.meta.events``)."""
        events.register("before-send.s3", self._on_send)
        events.register("before-call.s3", self._on_call)

    def _on_send(self, event_name: str = "", **_: Any) -> None:  # must return None: a value would replace the response
        operation = event_name.rsplit(".", 1)[-1]
        with self._lock:
            self._requests[operation] += 1

    def _on_call(self, model: Any = None, **_: Any) -> None:
        with self._lock:
            self._calls[getattr(model, "name", "?")] += 1

    def requests(self) -> dict[str, int]:
        """HTTP requests sent so far, by operation (what is billed)."""
        with self._lock:
            return dict(self._requests)

    def calls(self) -> dict[str, int]:
        """API calls made so far, by operation (retries not counted again)."""
        with self._lock:
            return dict(self._calls)


def counting_session(access_key: str, secret_key: str, region: str, counter: RequestCounter) -> Any:
    """A ``boto3.Session`` whose every client reports its requests to ``counter``."""
    import boto3

    session = boto3.Session(aws_access_key_id=access_key, aws_secret_access_key=secret_key, region_name=region)
    counter.attach(session.events)
    return session


def diff(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """``after − before`` by operation, dropping zeros."""
    out = {op: after.get(op, 0) - before.get(op, 0) for op in set(after) | set(before)}
    return {op: n for op, n in sorted(out.items()) if n}


def add(*counts: Mapping[str, float], scale: float = 1.0) -> dict[str, float]:
    """The sum of several per-operation counts, times ``scale``."""
    total: Counter[str] = Counter()
    for count in counts:
        for op, n in count.items():
            total[op] += n * scale
    return dict(sorted(total.items()))


def by_class(counts: Mapping[str, float]) -> dict[str, float]:
    """Per-operation counts summed into price classes."""
    out = {"put": 0.0, "get": 0.0, "delete": 0.0}
    for op, n in counts.items():
        out[price_class(op)] += n
    return out


def daily_cost(per_day: Mapping[str, float]) -> dict[str, float]:
    """USD for a day of these requests (per-operation counts per day), by class and in total."""
    classes = by_class(per_day)
    cost = {f"{name}_usd": classes[name] * PRICES[name] for name in classes}
    cost["total_usd"] = sum(cost.values())
    return {**{f"{name}_requests": classes[name] for name in classes}, **cost}
