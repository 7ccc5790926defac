"""testing.shaped_link: a namespace's loopback shaped to a rate really holds bytes to it, exempt
ports bypass it, its counters see what crossed, and it leaves nothing behind. The bounds are the
shaper's (a pipe cannot carry more than its rate and burst), not a speed target."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from testing.shaped_link import BURST_BYTES, ShapedLink, unavailable
from tests.system_tools import tool_missing

_TRANSFER = textwrap.dedent(
    """
    import socket, sys, threading, time
    port, size = int(sys.argv[1]), int(sys.argv[2])
    server = socket.create_server(("127.0.0.1", port))
    received = []
    def sink():
        conn, _ = server.accept()
        total = 0
        while chunk := conn.recv(1 << 20):
            total += len(chunk)
        received.append(total)
    reader = threading.Thread(target=sink)
    reader.start()
    client = socket.create_connection(("127.0.0.1", port))
    started = time.perf_counter()
    client.sendall(b"x" * size)
    client.shutdown(socket.SHUT_WR)
    reader.join()
    print(time.perf_counter() - started, received[0])
    """
)


def _transfer_s(link: ShapedLink, port: int, size: int) -> float:
    done = subprocess.run(
        link.command([sys.executable, "-c", _TRANSFER, str(port), str(size)]), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seconds, received = done.stdout.split()
    assert int(received) == size
    return float(seconds)


@pytest.fixture
def shaping() -> None:
    why = unavailable()
    if why:
        tool_missing(why)


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.slow
def test_the_pipe_holds_bytes_to_its_rate_and_exempt_ports_bypass_it(shaping):
    rate_mbit, size = 20, 2_500_000
    with ShapedLink.create(rate_mbit) as link:
        assert link.namespace in _namespaces()
        link.exempt_ports([7702])
        shaped_s = _transfer_s(link, 7701, size)
        # no faster than the rate allows once the burst is spent (the shaper's bound, not a target)
        assert shaped_s >= 0.8 * (size - BURST_BYTES) * 8 / (rate_mbit * 1e6), shaped_s
        assert link.shaped_bytes() >= size
        before = link.shaped_bytes()
        exempt_s = _transfer_s(link, 7702, size)
        assert link.exempt_bytes() >= size
        assert link.shaped_bytes() - before < size // 100  # the exempt transfer did not cross the pipe
        assert exempt_s < shaped_s / 3, (exempt_s, shaped_s)
        namespace = link.namespace
    assert namespace not in _namespaces()  # deleted on exit


def test_a_link_refuses_a_rate_or_port_that_is_not_one(shaping):
    with pytest.raises(ValueError, match="rate must be positive"), ShapedLink.create(0):
        pass
    with ShapedLink.create(10) as link, pytest.raises(ValueError, match="not a port"):
        link.exempt_ports([70000])
