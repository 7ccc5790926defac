"""Counting S3 requests by kind, and what they cost at a public cloud's list prices.

A :class:`RequestCounter` hangs on a ``boto3.Session``'s event system (botocore's event hooks),
so every client made from that session is counted: ``before-send`` fires once per HTTP request
sent (retries included: what a provider bills), ``before-call`` once per API call. Give the
session to ``gm.S3Mailbox(session=...)`` and every request that mailbox makes is counted.

Each request is also counted by what it is for (:func:`purpose`): its operation and the kind of
object it names in the run's key layout (``records.keys``), or the folder a LIST reads, so a
report can say "PutObject leases/learners/{learner}.json 0.3/s" rather than "PutObject 0.6/s".
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from gradientmail.records import keys
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
    "purpose",
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


_LAYOUT_START = re.compile(r"(?:^|/)(?=(?:manifest\.json|fragments/|leases/|queues/|states/|barriers/))")
"""Where a run's key starts inside a bucket path that holds the run's prefix before it."""

_FOLDER_FORMS = (
    (re.compile(r"fragments/\d{4}/"), "fragments/{f}/"),
    (re.compile(r"(contributions|versions)/\d{10}/"), r"\1/{v}/"),
    (re.compile(r"^(queues|states|barriers)/[^/]+/"), r"\1/{id}/"),
)


def _object_form(key: str) -> str:
    """The layout's name for the kind of object ``key`` is (``leases/learners/{learner}.json``)."""
    parsed = keys.parse_key(key)
    match parsed:
        case keys.SingletonKey():
            return parsed.key
        case keys.HeadKey():
            return "fragments/{f}/head.json"
        case keys.RoundKey():
            return "fragments/{f}/rounds/{v}.json"
        case keys.VersionBlobKey():
            return f"fragments/{{f}}/versions/{{v}}/{parsed.kind}-{{writer}}.safetensors"
        case keys.ContributionKey():
            return "fragments/{f}/contributions/{v}/{learner}-{n}.json"
        case keys.ContributionBlobKey():
            return "fragments/{f}/contributions/{v}/{learner}-{n}.safetensors"
        case keys.LearnerLeaseKey():
            return "leases/learners/{learner}.json"
        case keys.QueueKey():
            return f"queues/{{q}}/{parsed.part}/{{u}}.json"
        case keys.LearnerStateKey():
            return "states/{learner}/" + ("{s}-{a}.state" if parsed.blob else "state.json")
        case keys.BarrierKey():
            return f"barriers/{{b}}/{parsed.part}/{{node}}.json"
    return "another object"


def _in_layout(path: str) -> str | None:
    """The run-relative part of a bucket path (``prefix/run/leases/syncer.json`` → ``leases/syncer.json``)."""
    found = _LAYOUT_START.search(path)
    return None if found is None else path[found.end() :]


def purpose(operation: str, url: str) -> str:
    """What a request is for: ``"{operation} {what it names}"``, where what it names is the kind of
    object in the run's key layout (its ids replaced by the layout's placeholders), the folder a
    LIST reads (``ListObjectsV2 leases/learners/``), or ``the bucket`` / ``another object``."""
    split = urlsplit(url)
    if operation.startswith("List"):
        prefix = parse_qs(split.query).get("prefix", [""])[0]
        folder = _in_layout(prefix)
        if folder is None:
            return f"{operation} {'the bucket' if not prefix else 'another folder'}"
        for pattern, form in _FOLDER_FORMS:
            folder = pattern.sub(form, folder)
        return f"{operation} {folder or '(the run)'}"
    path = unquote(split.path).lstrip("/")
    key = _in_layout(path)
    if key is None:
        return f"{operation} {'the bucket' if '/' not in path else 'another object'}"
    return f"{operation} {_object_form(key)}"


class RequestCounter:
    """Thread-safe counts of S3 requests by operation name (``GetObject``, ``PutObject``, …) and by
    what each is for (:func:`purpose`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._calls: Counter[str] = Counter()
        self._purposes: Counter[str] = Counter()

    def attach(self, events: Any) -> None:
        """Register on a botocore event emitter (``boto3.Session().events`` or ``client.meta.events``)."""
        events.register("before-send.s3", self._on_send)
        events.register("before-call.s3", self._on_call)

    def _on_send(self, event_name: str = "", request: Any = None, **_: Any) -> None:  # None: a value replaces the response
        operation = event_name.rsplit(".", 1)[-1]
        what = purpose(operation, str(getattr(request, "url", "") or ""))
        with self._lock:
            self._requests[operation] += 1
            self._purposes[what] += 1

    def _on_call(self, model: Any = None, **_: Any) -> None:
        with self._lock:
            self._calls[getattr(model, "name", "?")] += 1

    def requests(self) -> dict[str, int]:
        """HTTP requests sent so far, by operation (what is billed)."""
        with self._lock:
            return dict(self._requests)

    def purposes(self) -> dict[str, int]:
        """HTTP requests sent so far, by what each was for (:func:`purpose`)."""
        with self._lock:
            return dict(self._purposes)

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
