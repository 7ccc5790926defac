"""Seeded, replayable faults for real S3 requests, injected through botocore's events.

Register them on a ``boto3.Session``'s events *before* the mailbox makes its client (a
client copies the session's handlers when it is created), then hand the session to
``S3Mailbox(session=...)``. Nothing here mocks S3: every request that is not failed goes
to the real server, and a "lost response" really reaches it first. ``GetObjectWire``
records instead of failing: what each GetObject asked for and got (size before bytes).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectionClosedError
from botocore.httpsession import URLLib3Session

__all__ = ["FaultInjector", "GetObjectWire", "LoseRequests", "operation_of"]

_CODES = {500: "InternalError", 503: "ServiceUnavailable"}


def operation_of(event_name: str) -> str:
    """``"before-send.s3.PutObject"`` → ``"PutObject"``."""
    return event_name.rsplit(".", 1)[-1]


class _RawBody:
    """The minimal raw-response object botocore reads a body from."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Any:
        yield self._body


@dataclass
class FaultInjector:
    """Answers chosen requests with a 5xx instead of sending them.

    Which request fails is drawn from ``random.Random(seed)`` in request order, so a
    sequential run with the same seed fails the same requests: ``fired`` of two runs
    compare equal, and a failing chaos run can be replayed exactly.
    """

    seed: int
    operations: frozenset[str]
    probability: float = 0.5
    max_faults: int = 4
    statuses: tuple[int, ...] = (500, 503)
    fired: list[tuple[int, str, int]] = field(default_factory=list)
    """(request number, operation, status) of every injected fault."""
    requests: int = 0

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()

    def install(self, events: Any) -> FaultInjector:
        events.register("before-send.s3", self._before_send)
        return self

    def _before_send(self, request: Any, event_name: str, **_: Any) -> AWSResponse | None:
        operation = operation_of(event_name)
        with self._lock:
            self.requests += 1
            if operation not in self.operations or len(self.fired) >= self.max_faults:
                return None
            draw, status = self._random.random(), self._random.choice(self.statuses)
            if draw >= self.probability:
                return None
            self.fired.append((self.requests, operation, status))
        body = f"<Error><Code>{_CODES[status]}</Code><Message>injected</Message></Error>".encode()
        return AWSResponse(request.url, status, {"Content-Type": "application/xml"}, _RawBody(body))


@dataclass
class LoseRequests:
    """Makes the next ``times`` requests of ``operation`` look like a dropped connection.

    With ``deliver=True`` the request is first sent to the server for real and only its
    response is thrown away (a lost response); with ``deliver=False`` it never leaves.
    ``meanwhile`` runs right after, before botocore retries (e.g. a rival's write).
    Starts disarmed, so setup traffic passes; call :meth:`arm`.
    """

    operation: str
    times: int = 1
    deliver: bool = True
    meanwhile: Callable[[], object] | None = None
    delivered_statuses: list[int] = field(default_factory=list)
    dropped: int = 0
    armed: bool = False

    def __post_init__(self) -> None:
        self._http = URLLib3Session(timeout=30)
        self._lock = threading.Lock()

    def install(self, events: Any) -> LoseRequests:
        events.register(f"before-send.s3.{self.operation}", self._before_send)
        return self

    def arm(self) -> None:
        self.armed = True

    def _before_send(self, request: Any, **_: Any) -> None:
        with self._lock:
            if not self.armed or self.dropped >= self.times:
                return
            self.dropped += 1
        if self.deliver:
            response = self._http.send(request)
            self.delivered_statuses.append(response.status_code)
        if self.meanwhile is not None:
            self.meanwhile()
        raise ConnectionClosedError(endpoint_url=request.url)


class GetObjectWire:
    """What the S3 client asked for and got on every GetObject: the Range header it sent,
    the Content-Length the server answered with, and the body bytes read from it."""

    def __init__(self, events: Any) -> None:
        self.ranges: list[str | None] = []
        self.content_lengths: list[int] = []
        self.body_bytes = 0
        self._lock = threading.Lock()
        events.register("before-send.s3.GetObject", self._sent)
        events.register("after-call.s3.GetObject", self._received)

    def _sent(self, request: Any, **_: Any) -> None:
        sent = request.headers.get("Range")  # bytes once the request is signed
        with self._lock:
            self.ranges.append(sent.decode() if isinstance(sent, bytes) else sent)

    def _received(self, http_response: Any, parsed: dict[str, Any], **_: Any) -> None:
        with self._lock:
            self.content_lengths.append(int(http_response.headers.get("Content-Length", 0)))
        body = parsed.get("Body")
        if body is None:  # an error answer (e.g. 416 for a range of an empty object)
            return
        read = body.read

        def counting_read(amt: int | None = None) -> bytes:
            chunk: bytes = read(amt)
            with self._lock:
                self.body_bytes += len(chunk)
            return chunk

        body.read = counting_read
