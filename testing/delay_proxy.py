"""A TCP proxy that makes loopback behave like a long link: fixed latency, window-bound connections.

    with DelayLink.spawn("127.0.0.1", 8333, rtt_ms=20, window_kib=1024) as link:
        ...  # point S3 clients at link.endpoint_url

Why not ``tc netem``: it is the more faithful option (a real TCP stack sees the delay),
but it needs root, ``ip netns`` and the kernel's ``sch_netem``; where that is missing
(``tc qdisc add dev lo root netem delay 10ms`` answers "Specified qdisc kind is unknown",
as in the VMs this project's benchmarks run in) this proxy stands in for it.

What it models, per connection and per direction: every chunk is released ``rtt/2`` after it
arrived, and at most ``window`` bytes are in flight, where a byte stays in flight until its
"acknowledgement" has come back, ``rtt`` after it was read. So one connection carries at
most ``window / rtt`` (the bandwidth-delay bound of a TCP connection whose window does
not grow past ``window``), every request/response exchange costs at least one ``rtt``,
and ``n`` connections together carry up to ``n`` times as much: exactly what makes one
request slower than several on a real long link. The proxy is byte-transparent (SigV4
signatures, ``Host``, ranges and conditional headers pass untouched).

It runs in its own process (``python -m testing.delay_proxy``), so its CPU use does
not take the benchmark's GIL; the first line it prints is its port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["DelayLink", "serve"]

_READ_BYTES = 256 * 1024


class _Window:
    """Bytes in flight on one direction of one connection, at most ``limit`` (one taker)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._freed = asyncio.Event()

    async def take(self, size: int) -> None:
        # A chunk larger than the window is let through alone.
        while self._used and self._used + size > self._limit:
            self._freed.clear()
            await self._freed.wait()
        self._used += size

    def give(self, size: int) -> None:
        self._used -= size
        self._freed.set()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float, window_bytes: int) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay_s`` late, within the window."""
    loop = asyncio.get_running_loop()
    window = _Window(window_bytes)
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            await asyncio.sleep(max(0.0, due - loop.time()))
            writer.write(chunk)
            await writer.drain()
            loop.call_later(delay_s, window.give, len(chunk))  # the ack travels back
        await asyncio.sleep(max(0.0, due - loop.time()))
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()

    sender = asyncio.ensure_future(deliver())
    try:
        while True:
            try:
                chunk = await reader.read(min(_READ_BYTES, window_bytes))
            except OSError:
                chunk = b""
            if chunk:
                await window.take(len(chunk))
            queue.put_nowait((loop.time() + delay_s, chunk))
            if not chunk:
                break
        await sender
    except (OSError, asyncio.CancelledError):
        sender.cancel()
        raise


async def _connection(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    upstream: tuple[str, int],
    delay_s: float,
    window_bytes: int,
) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection(*upstream)
    except OSError:
        client_writer.close()
        return
    await asyncio.sleep(2 * delay_s)  # the connection's handshake costs a round trip
    pumps = [
        asyncio.ensure_future(_pump(client_reader, server_writer, delay_s, window_bytes)),
        asyncio.ensure_future(_pump(server_reader, client_writer, delay_s, window_bytes)),
    ]
    try:
        await asyncio.gather(*pumps)
    except Exception:  # one side broke: drop both, as a real link would
        for pump in pumps:
            pump.cancel()
    finally:
        for writer in (client_writer, server_writer):
            writer.close()


async def serve(upstream: tuple[str, int], *, port: int, rtt_ms: float, window_kib: int, announce: bool = True) -> None:
    """Proxy 127.0.0.1:``port`` (0: any free port) to ``upstream`` until cancelled."""
    delay_s = rtt_ms / 2000.0
    window_bytes = window_kib * 1024

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _connection(reader, writer, upstream, delay_s, window_bytes)

    server = await asyncio.start_server(handle, "127.0.0.1", port, limit=_READ_BYTES)
    if announce:
        print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


@dataclass
class DelayLink:
    """A running delay proxy process; ``endpoint_url`` is its ``http://127.0.0.1:port``."""

    process: subprocess.Popen[bytes]
    port: int
    rtt_ms: float
    window_kib: int

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def per_connection_mb_s(self) -> float:
        """The most one connection can carry, window / rtt, in MB/s."""
        return self.window_kib * 1024 / (self.rtt_ms / 1000.0) / 1e6

    @classmethod
    @contextlib.contextmanager
    def spawn(cls, host: str, port: int, *, rtt_ms: float = 20.0, window_kib: int = 1024) -> Iterator[DelayLink]:
        from testing.seaweed import die_with_parent

        command = [
            sys.executable, "-m", "testing.delay_proxy", "--upstream", f"{host}:{port}",
            "--rtt-ms", str(rtt_ms), "--window-kib", str(window_kib),
        ]  # fmt: skip
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        process = subprocess.Popen(command, stdout=subprocess.PIPE, preexec_fn=die_with_parent, cwd=root)
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line.strip().isdigit():
                raise RuntimeError(f"delay proxy did not start (exit {process.poll()})")
            yield cls(process, int(line), rtt_ms, window_kib)
        finally:
            process.kill()
            process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--upstream", required=True, help="host:port to forward to")
    parser.add_argument("--port", type=int, default=0, help="port to listen on, 127.0.0.1 (0: any; printed)")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="round-trip time added (half each way)")
    parser.add_argument("--window-kib", type=int, default=1024, help="bytes in flight per connection and direction")
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve((host, int(port)), port=args.port, rtt_ms=args.rtt_ms, window_kib=args.window_kib))


if __name__ == "__main__":
    main()
