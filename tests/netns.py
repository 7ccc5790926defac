"""Machines that share nothing but a network: Linux network namespaces joined to one server
namespace by veth pairs, for tests that run nodes as separate machines would (their own
loopback, their own address, the server reached through a link). Needs root and ``ip``
(iproute2); everything it creates is deleted on exit, and nothing reaches beyond it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from tests.system_tools import tool_missing

__all__ = ["Network", "star_network"]


@dataclass(frozen=True)
class Network:
    server: str
    """The server's namespace."""
    machines: dict[str, tuple[str, str]]
    """Machine name -> (its namespace, the server's address as that machine reaches it)."""
    host_route: str
    """The server's address as this process (the host namespace) reaches it."""

    def run(self, machine: str, command: list[str]) -> list[str]:
        """``command`` run on ``machine``: inside its namespace."""
        return ["ip", "netns", "exec", self.machines[machine][0], *command]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def star_network(machines: list[str]) -> Iterator[Network]:
    """A server namespace and one namespace per machine, each linked to the server by its own
    /30 (10.213.N.0: the server .1, the machine .2); the host gets a link too, to start and
    watch the server. Fails under CI, skips elsewhere, without root or ``ip``."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        tool_missing("network namespaces need root and iproute2's ip")
    tag = uuid.uuid4().hex[:5]
    server = f"gm-{tag}-s3"
    created: list[str] = []
    host_links: list[str] = []
    try:
        _ip("netns", "add", server)
        created.append(server)
        _ip("-n", server, "link", "set", "lo", "up")
        routes: dict[str, tuple[str, str]] = {}
        for index, name in enumerate([*machines, ""], start=1):
            outer, inner = f"gm{tag}s{index}", f"gm{tag}m{index}"
            subnet = f"10.213.{index}"
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", outer, "netns", server)
            _ip("-n", server, "addr", "add", f"{subnet}.1/30", "dev", outer)
            _ip("-n", server, "link", "set", outer, "up")
            if name:  # a machine: its own namespace
                namespace = f"gm-{tag}-{index}"
                _ip("netns", "add", namespace)
                created.append(namespace)
                _ip("-n", namespace, "link", "set", "lo", "up")
                _ip("link", "set", inner, "netns", namespace)
                _ip("-n", namespace, "addr", "add", f"{subnet}.2/30", "dev", inner)
                _ip("-n", namespace, "link", "set", inner, "up")
                routes[name] = (namespace, f"{subnet}.1")
            else:  # the host's link
                _ip("addr", "add", f"{subnet}.2/30", "dev", inner)
                _ip("link", "set", inner, "up")
                host_links.append(inner)
                host_route = f"{subnet}.1"
        yield Network(server, routes, host_route)
    finally:
        for link in host_links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        for namespace in reversed(created):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
