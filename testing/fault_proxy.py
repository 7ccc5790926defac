"""A fault-injecting HTTP reverse proxy for an S3 endpoint on loopback (standard library only).

    proxy = FaultProxy("http://127.0.0.1:8333", rate=0.05, seed=7).start()
    ...  # point S3 clients at proxy.endpoint_url
    proxy.counts()  # {"requests": …, "forwarded": …, "503": …, "500_after": …, …}
    proxy.stop()

Clients talk to the proxy as their endpoint, so the ``Host`` header they sign (SigV4) is the
proxy's address; the proxy forwards the request line, every header (``Host`` included) and
the body byte for byte over a persistent upstream connection, so signatures, chunked and
streaming uploads, ``Range`` and conditional requests pass through untouched. Responses
come back byte for byte too. ``Expect: 100-continue`` is answered by the proxy itself (the
upstream's own interim response is swallowed), so a fault can refuse a request before its
body is sent.

On a share ``rate`` of requests (drawn from ``random.Random(seed)`` in arrival order) one
fault of ``kinds`` is injected:

========================  =========================================================================
``503``                   answer ``503 ServiceUnavailable`` without forwarding (nothing happened)
``500_after``             forward, then answer ``500 InternalError``: the write landed, its response is lost
``reset_before``          reset the connection (RST, no response) without forwarding
``reset_after``           forward, then reset the connection: the request took effect, no response
``delay``                 wait 0.3–2 s (``delay_s``), then forward normally
``truncate``              forward, send the response's head (full ``Content-Length``) and part of
                          its body, then close; a response without a body is reset instead
                          (counted as ``reset_after``)
========================  =========================================================================

Every fault closes the client connection; clients reconnect. ``max_faults`` bounds how many
are injected in all (None: no bound). Counts are read with :meth:`FaultProxy.counts`.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import urlsplit

__all__ = ["FAULT_KINDS", "FaultProxy", "Fired"]

FAULT_KINDS = ("503", "500_after", "reset_before", "reset_after", "delay", "truncate")
"""Every fault the proxy can inject, in the order of the module's table."""

_MAX_HEAD_BYTES = 1 << 20
_ERRORS = {500: ("Internal Server Error", "InternalError"), 503: ("Service Unavailable", "ServiceUnavailable")}


@dataclass(frozen=True)
class Fired:
    """One injected fault: request number (arrival order), method, path (no query), kind."""

    request: int
    method: str
    path: str
    kind: str


class _Broken(Exception):
    """A peer closed or broke its connection mid-message."""


class _Head:
    """A parsed HTTP head (request or response); ``raw`` is kept to forward byte for byte."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        lines = raw.split(b"\r\n") if b"\r\n" in raw else raw.split(b"\n")
        self.first = lines[0].decode("latin-1").strip()
        self.headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.decode("latin-1").partition(":")
            if sep:
                self.headers[name.strip().lower()] = value.strip()

    def get(self, name: str) -> str:
        return self.headers.get(name, "")

    @property
    def status(self) -> int:
        """The status code of a response head (ValueError for anything else)."""
        parts = self.first.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ValueError(f"not a response status line: {self.first!r}")
        return int(parts[1])

    @property
    def chunked(self) -> bool:
        return "chunked" in self.get("transfer-encoding").lower()

    @property
    def content_length(self) -> int | None:
        value = self.get("content-length")
        return int(value) if value.isdigit() else None

    @property
    def wants_close(self) -> bool:
        return "close" in self.get("connection").lower()


def _read_head(rfile: BinaryIO) -> bytes | None:
    """One head up to and including its blank line; None on a clean EOF before it starts."""
    lines: list[bytes] = []
    total = 0
    while True:
        line = rfile.readline(_MAX_HEAD_BYTES)
        if not line:
            if lines:
                raise _Broken("connection closed inside a head")
            return None
        if not lines and line in (b"\r\n", b"\n"):
            continue  # tolerated between messages (RFC 9112 §2.2)
        lines.append(line)
        total += len(line)
        if total > _MAX_HEAD_BYTES:
            raise _Broken("head too large")
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _read_exact(rfile: BinaryIO, size: int) -> bytes:
    data = rfile.read(size)
    if len(data) != size:
        raise _Broken(f"connection closed after {len(data)} of {size} body bytes")
    return data


def _read_chunked(rfile: BinaryIO) -> bytes:
    """A chunked body, raw (sizes, extensions, data, trailers), so it is forwarded unchanged."""
    out = bytearray()
    while True:
        line = rfile.readline(_MAX_HEAD_BYTES)
        if not line:
            raise _Broken("connection closed inside a chunked body")
        out += line
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailer section, up to its blank line
                trailer = rfile.readline(_MAX_HEAD_BYTES)
                if not trailer:
                    raise _Broken("connection closed inside chunked trailers")
                out += trailer
                if trailer in (b"\r\n", b"\n"):
                    return bytes(out)
        out += _read_exact(rfile, size + 2)


def _read_body(rfile: BinaryIO, head: _Head) -> bytes:
    if head.chunked:
        return _read_chunked(rfile)
    length = head.content_length
    return _read_exact(rfile, length) if length else b""


def _reset(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN: what the client sees as 'connection reset by peer'."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def _error_response(status: int, head_only: bool) -> bytes:
    reason, code = _ERRORS[status]
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>injected by testing.fault_proxy</Message></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {0 if head_only else len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head if head_only else head + body


class _Upstream:
    """One persistent connection to the upstream server (one per client connection)."""

    def __init__(self, address: tuple[str, int], timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.sock: socket.socket | None = None
        self.rfile: BinaryIO | None = None
        self.used = 0

    def connect(self) -> None:
        self.close()
        self.sock = socket.create_connection(self.address, timeout=self.timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile = self.sock.makefile("rb", buffering=65536)
        self.used = 0

    def close(self) -> None:
        if self.rfile is not None:
            with contextlib.suppress(OSError):
                self.rfile.close()
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock, self.rfile = None, None

    def exchange(self, request: bytes, method: str) -> tuple[_Head, bytes, bool]:
        """Send a whole request, return the final response (head, raw body, close after)."""
        for attempt in range(2):
            if self.sock is None:
                self.connect()
            reused = self.used > 0
            assert self.sock is not None and self.rfile is not None
            try:
                self.sock.sendall(request)
                raw = _read_head(self.rfile)
                if raw is None:
                    raise _Broken("upstream closed the connection before answering")
            except (OSError, _Broken):
                self.close()
                if reused and attempt == 0:
                    continue  # an idle keep-alive connection the server had closed: nothing was processed
                raise
            self.used += 1
            head = _Head(raw)
            while 100 <= head.status < 200 and head.status != 101:
                raw = _read_head(self.rfile)  # an interim response (100 Continue): the proxy sent its own
                if raw is None:
                    raise _Broken("upstream closed the connection after an interim response")
                head = _Head(raw)
            status = head.status
            if method == "HEAD" or status in (204, 304):
                body, until_eof = b"", False
            elif head.chunked or head.content_length is not None:
                body, until_eof = _read_body(self.rfile, head), False
            else:
                body, until_eof = self.rfile.read(), True
            close = until_eof or head.wants_close or head.first.startswith("HTTP/1.0")
            if close:
                self.close()
            return head, body, close
        raise AssertionError("unreachable")


class FaultProxy:
    """A threaded reverse proxy on 127.0.0.1 (an ephemeral port) in front of ``upstream``.

    Args:
        upstream: ``http://host:port`` of the S3 endpoint, or a ``(host, port)`` pair.
        rate: share of requests that get a fault, 0 to 1.
        seed: seeds the draws (which request, which kind, how long a delay).
        kinds: the faults to draw from (a subset of :data:`FAULT_KINDS`), equally likely.
        max_faults: stop injecting after this many (None: no bound).
        delay_s: range of the ``delay`` fault.
    """

    def __init__(
        self,
        upstream: str | tuple[str, int],
        *,
        rate: float = 0.05,
        seed: int = 0,
        kinds: tuple[str, ...] = FAULT_KINDS,
        max_faults: int | None = None,
        delay_s: tuple[float, float] = (0.3, 2.0),
        upstream_timeout_s: float = 120.0,
        idle_timeout_s: float = 600.0,
    ) -> None:
        if isinstance(upstream, str):
            parts = urlsplit(upstream)
            if parts.scheme != "http" or not parts.hostname or not parts.port:
                raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
            upstream = (parts.hostname, parts.port)
        self.upstream = upstream
        self.seed = seed
        self.max_faults = max_faults
        self.delay_s = delay_s
        self._upstream_timeout_s = upstream_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self.fired: list[Fired] = []
        self._requests = 0
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._connections: dict[socket.socket, threading.Thread] = {}
        self.configure(rate=rate, kinds=kinds)

    # -- configuration and figures ---------------------------------------------------------
    def configure(self, *, rate: float | None = None, kinds: tuple[str, ...] | None = None) -> None:
        """Change the fault rate or kinds while running (e.g. 0 for a clean set-up phase)."""
        with self._lock:
            if rate is not None:
                if not 0 <= rate <= 1:
                    raise ValueError(f"rate must be in [0, 1], got {rate!r}")
                self.rate = float(rate)
            if kinds is not None:
                unknown = set(kinds) - set(FAULT_KINDS)
                if unknown or not kinds:
                    raise ValueError(f"kinds must be a non-empty subset of {FAULT_KINDS}, got {kinds!r}")
                self.kinds = tuple(kinds)

    def counts(self) -> dict[str, int]:
        """Requests seen, requests forwarded upstream, and injected faults by kind (every kind listed)."""
        with self._lock:
            figures = {"requests": self._requests, "forwarded": self._counts["forwarded"]}
            figures.update({kind: self._counts[kind] for kind in FAULT_KINDS})
            figures["faults"] = sum(self._counts[kind] for kind in FAULT_KINDS)
            return figures

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the proxy is not started")
        return int(self._listener.getsockname()[1])

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        listener.settimeout(0.2)  # so the accept loop sees stop() promptly
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept_loop, name="fault-proxy-accept", daemon=True)
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Stop accepting, break every open connection, and wait for the handler threads."""
        self._stopping.set()
        if self._acceptor is not None:
            self._acceptor.join(timeout=5)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        with self._lock:
            connections = dict(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in connections.values():
            thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- serving ----------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                continue
            thread = threading.Thread(target=self._serve, args=(client,), name="fault-proxy-conn", daemon=True)
            with self._lock:
                self._connections[client] = thread
            thread.start()

    def _draw(self, method: str, path: str) -> tuple[int, str | None, float]:
        """The request's number, its fault (or None) and the delay a ``delay`` fault would wait."""
        with self._lock:
            self._requests += 1
            number = self._requests
            draw, kind = self._random.random(), self._random.choice(self.kinds)
            delay = self._random.uniform(*self.delay_s)
            exhausted = self.max_faults is not None and sum(self._counts[k] for k in FAULT_KINDS) >= self.max_faults
            if draw >= self.rate or exhausted:
                return number, None, delay
            return number, kind, delay

    def _count(self, number: int, method: str, path: str, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1
            if kind in FAULT_KINDS:
                self.fired.append(Fired(number, method, path, kind))

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(self._idle_timeout_s)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rfile: BinaryIO = client.makefile("rb", buffering=65536)
        upstream = _Upstream(self.upstream, self._upstream_timeout_s)
        reset = False
        try:
            while not self._stopping.is_set():
                raw = _read_head(rfile)
                if raw is None:
                    return
                if not self._handle(client, rfile, _Head(raw), upstream):
                    reset = True
                    return
        except (OSError, _Broken, ValueError, IndexError):
            return  # a peer went away or sent garbage: drop the connection
        finally:
            upstream.close()
            with contextlib.suppress(OSError):
                rfile.close()
            if reset:
                _reset(client)
            else:
                with contextlib.suppress(OSError):
                    client.close()
            with self._lock:
                self._connections.pop(client, None)

    def _handle(self, client: socket.socket, rfile: BinaryIO, head: _Head, upstream: _Upstream) -> bool:
        """Serve one request. Returns False when the client connection must be reset; raises
        ``_Broken`` to close it after a clean end."""
        method, target = [*head.first.split(" "), "", ""][:2]
        path = target.split("?", 1)[0]
        number, kind, delay = self._draw(method, path)
        expects = "100-continue" in head.get("expect").lower()
        if kind == "reset_before":
            self._count(number, method, path, kind)
            return False
        if kind == "503":
            if not expects:  # take the body off the wire first, so the close is a clean FIN
                _read_body(rfile, head)
            client.sendall(_error_response(503, method == "HEAD"))
            self._count(number, method, path, kind)
            raise _Broken("closed after an injected 503")
        if expects:
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = _read_body(rfile, head)
        if kind == "delay":
            self._count(number, method, path, kind)
            if self._stopping.wait(delay):
                raise _Broken("stopping")
        response, response_body, close = upstream.exchange(head.raw + body, method)
        self._count(number, method, path, "forwarded")
        if kind == "500_after":
            client.sendall(_error_response(500, method == "HEAD"))
            self._count(number, method, path, kind)
            raise _Broken("closed after an injected 500")
        if kind == "truncate" and response_body and not close:
            client.sendall(response.raw + response_body[: len(response_body) // 2])
            self._count(number, method, path, kind)
            raise _Broken("closed inside a truncated body")
        if kind in ("reset_after", "truncate"):
            self._count(number, method, path, "reset_after")
            return False
        client.sendall(response.raw + response_body)
        if close or head.wants_close or head.first.endswith("HTTP/1.0"):
            raise _Broken("closed as the exchange asked")
        return True
