"""One thin link on one machine: a network namespace whose loopback carries every byte between the
processes inside it through one pipe of a set rate, shared by all of them.

    with ShapedLink.create(rate_mbit=100) as link:
        link.exempt_ports(server_internal_ports)        # a server's own backend traffic is not the link
        subprocess.run(link.command([sys.executable, "-m", "benchmarks.peer_torchft", "--link-namespace", link.namespace]))
        link.shaped_bytes()                             # what crossed the pipe

Why a namespace's loopback: every process a benchmark arm starts inside it (learners, a syncer,
an S3 server, a gloo ring) talks to the others over that one device, so one queueing discipline on
it is one pipe every arm's traffic crosses, whatever the arm's topology (to a bucket, or peer to
peer); a byte sent from one process to another passes it once. Nothing outside the namespace is
reachable from it, so a run cannot leak traffic off this machine.

Why HTB and not ``tbf``: both shape (the kernels this project runs on have ``tbf`` and ``htb`` but
neither ``netem`` nor ``prio``), but a ``tbf`` root shapes every byte on the device, and an S3
server such as SeaweedFS moves each object a second time between its own parts (gateway, filer,
volume) over the same loopback. HTB's default class is the shaped pipe; ``exempt_ports`` sends the
traffic of named ports (both directions) to a second class that is not limited, with ``u32``
filters. Delay is not modelled here (no ``netem``): ``testing.delay_proxy`` adds it in front of a
server where an arm needs it.

Needs root and iproute2 (``ip``, ``tc``); :func:`unavailable` says why not, so a benchmark can
skip cleanly. Everything it creates is deleted on exit.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

__all__ = ["BURST_BYTES", "ShapedLink", "exempt_ports", "unavailable"]

_SHAPED = "1:10"
_EXEMPT = "1:20"
_EXEMPT_RATE = "100gbit"
BURST_BYTES = 256 * 1024
"""The shaped class's burst: four of loopback's 64 KiB segments (with GSO a loopback packet is up
to 64 KiB, and a burst smaller than one packet would stall it), about 2 ms at 1 Gbit/s and 0.2 s
at 10 Mbit/s: the pipe's average rate is the set one over any stretch longer than that."""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True)


def exempt_ports(namespace: str, ports: Iterable[int]) -> None:
    """Traffic from or to each TCP/UDP port in ``ports`` bypasses the pipe of the link in
    ``namespace`` (made by :meth:`ShapedLink.create`): a server's internal hops, which a real
    deployment keeps inside its own data centre. Callable from a process inside the namespace
    (``benchmarks.peer_torchft --link-namespace``) as well as from the one that made it."""
    for port in ports:
        if not 0 < port < 65536:
            raise ValueError(f"not a port: {port!r}")
        for direction in ("sport", "dport"):
            _run(
                "ip", "netns", "exec", namespace, "tc", "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip",
                "prio", "1", "u32", "match", "ip", direction, str(port), "0xffff", "flowid", _EXEMPT,
            )  # fmt: skip


def unavailable() -> str:
    """Why a shaped link cannot be made here ("" when it can): root, ``ip``, ``tc``, a namespace,
    an HTB qdisc and a ``u32`` filter, each tried once in a scratch namespace."""
    if os.geteuid() != 0:
        return "shaping a link needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"shaping a link needs iproute2's {tool}"
    try:
        with ShapedLink.create(rate_mbit=10) as link:
            link.exempt_ports([9])
    except subprocess.CalledProcessError as exc:
        return f"{' '.join(exc.cmd[:6])}…: {(exc.stderr or '').strip() or exc}"
    except OSError as exc:
        return f"shaping a link failed: {exc}"
    return ""


@dataclass
class ShapedLink:
    """A namespace (``namespace``) whose loopback is up and shaped to ``rate_mbit`` megabits per
    second, in total over both directions, for every byte but that of :meth:`exempt_ports`."""

    namespace: str
    rate_mbit: float
    exempt: list[int] = field(default_factory=list)

    @classmethod
    @contextlib.contextmanager
    def create(cls, rate_mbit: float) -> Iterator[ShapedLink]:
        if not rate_mbit > 0:
            raise ValueError(f"a link's rate must be positive, got {rate_mbit!r} Mbit/s")
        namespace = f"gm-link-{uuid.uuid4().hex[:8]}"
        _run("ip", "netns", "add", namespace)
        try:
            link = cls(namespace, rate_mbit)
            link._tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", _SHAPED.split(":")[1])
            rate = f"{rate_mbit * 1000:.0f}kbit"
            burst = str(BURST_BYTES)
            link._tc(
                "class", "add", "dev", "lo", "parent", "1:", "classid", _SHAPED,
                "htb", "rate", rate, "ceil", rate, "burst", burst, "cburst", burst,
            )  # fmt: skip
            link._tc("class", "add", "dev", "lo", "parent", "1:", "classid", _EXEMPT, "htb", "rate", _EXEMPT_RATE)
            _run("ip", "-n", namespace, "link", "set", "lo", "up")
            yield link
        finally:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)

    def command(self, argv: Iterable[str]) -> list[str]:
        """``argv`` run inside the namespace (environment and working directory kept)."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def exempt_ports(self, ports: Iterable[int]) -> None:
        """:func:`exempt_ports` on this link."""
        ports = list(ports)
        exempt_ports(self.namespace, ports)
        self.exempt.extend(ports)

    def shaped_bytes(self) -> int:
        """Bytes that have crossed the pipe so far (the shaped class's counter)."""
        return self._class_bytes(_SHAPED)

    def exempt_bytes(self) -> int:
        """Bytes that bypassed it (the exempt ports' class)."""
        return self._class_bytes(_EXEMPT)

    def _class_bytes(self, classid: str) -> int:
        shown = self._tc("-s", "class", "show", "dev", "lo", "classid", classid).stdout
        found = re.search(r"Sent (\d+) bytes", shown)
        if found is None:
            raise RuntimeError(f"tc printed no counter for class {classid}: {shown!r}")
        return int(found.group(1))

    def _tc(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run("ip", "netns", "exec", self.namespace, "tc", *args)
