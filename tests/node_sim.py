"""Nodes of one run whose background passes run in due order on a fake clock (no threads, no wall
time), each node through a mailbox wrapper that counts its calls: what ``tests/test_request_rate.py``
and ``tests/test_bulletin.py`` measure requests and latencies with. Each node is the library's own
wiring (``NodeLoops``)."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import gradientmail as gm
from gradientmail.backends import get_backend
from gradientmail.mailbox import ForwardingMailbox
from gradientmail.mailbox.base import ObjectInfo
from gradientmail.session.exchange import Exchange
from gradientmail.session.fragment import LearnerFragment
from gradientmail.session.join import RunProposal, join_run
from gradientmail.session.node_loops import LoopPass, NodeLoops
from gradientmail.store import RunSpec, RunStore
from gradientmail.syncer import SyncerRuntime
from tests.fake_clock import FakeClock

NUMPY = get_backend("numpy")
TTL_S = 10.0
POLL_S = 0.2
IDLE_S = TTL_S / 3
_OPS = frozenset({"get", "get_versioned", "head", "exists", "put", "create", "swap", "list", "delete"})


class CountingMailbox:
    """Forwards to a mailbox, counting each request-making call by name (a stamped read counts
    as the ``get_versioned`` it is)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.counts: Counter[str] = Counter()

    def get_stamped(self, key: str, *, max_bytes: int | None = None) -> Any:
        """Defined here, not forwarded by ``__getattr__``: protocols are checked statically."""
        self.counts["get_versioned"] += 1
        return self._inner.get_stamped(key, max_bytes=max_bytes)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in _OPS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            return attr(*args, **kwargs)

        return call


class CoarseStamps(ForwardingMailbox):
    """The shared store as one whose stamps are truncated to ``resolution_s`` (S3: 1 s)."""

    def __init__(self, inner: gm.MemoryMailbox, resolution_s: float) -> None:
        super().__init__(inner)
        self.resolution_s = resolution_s

    def _coarse(self, info: ObjectInfo) -> ObjectInfo:
        if info.modified_at is None:
            return info
        stamp = math.floor(info.modified_at / self.resolution_s) * self.resolution_s
        return ObjectInfo(info.size, info.token, modified_at=stamp, modified_resolution_s=self.resolution_s)

    def get_stamped(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]:
        data, info = self.inner.get_stamped(key, max_bytes=max_bytes)  # type: ignore[attr-defined]
        return data, self._coarse(info)

    def head(self, key: str) -> ObjectInfo | None:
        info = self.inner.head(key)
        return None if info is None else self._coarse(info)


class NoStamps(ForwardingMailbox):
    """The shared store as one whose reads carry no stamp: a versioned read of its own, so the
    forwarded stamped read goes through it and says nothing of when (leases judged on sightings)."""

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        return self.inner.get_versioned(key, max_bytes=max_bytes)


@dataclass
class Node:
    name: str
    box: CountingMailbox
    store: RunStore
    loops: NodeLoops | None = None
    lease_info: Callable[[], dict[str, object]] = lambda: {"step": 0, "step_time_s": 0.0}
    """What the node's lease says at each renewal (a test may change it): by default what an idle
    session's says (no step taken yet)."""
    passes: list[LoopPass] = field(default_factory=list)
    next_at: list[float] = field(default_factory=list)
    alive: bool = True
    lease_alive: bool = True
    lease_written_at: float = 0.0
    """The fake clock at this node's latest learner lease write (its lease pass)."""

    @property
    def exchange(self) -> Exchange:
        assert self.loops is not None
        return self.loops.exchange

    @property
    def syncer(self) -> SyncerRuntime:
        assert self.loops is not None and self.loops.syncer is not None
        return self.loops.syncer


class Sim:
    """``k`` nodes of one run, their loops' passes run in due order on a fake clock: each node is
    the library's own wiring (``NodeLoops``), its threads never started."""

    def __init__(
        self,
        k: int,
        quorum: int = 2,
        *,
        fragments: int = 1,
        layout: str = "one",
        stamp_resolution_s: float | None = 0.0,
        phase_seed: int | None = None,
    ) -> None:
        """``fragments`` equal tensors ``w0``, ``w1``, … (one per fragment; ``w`` alone for one);
        ``layout``: the run's ``syncer_layout``. Every node's lease says it runs a syncer. The
        store stamps writes on the fake clock, exactly or truncated to ``stamp_resolution_s``
        (S3: 1 s); None: it stamps no read (``NoStamps``). ``phase_seed``: each node's loops
        start at a random instant of the first idle interval (else all at 0, in lock-step), so
        reads and renewals of different nodes fall at every phase of each other's intervals."""
        self.clock = FakeClock()
        memory = gm.MemoryMailbox(clock=self.clock)
        shared: Any = memory
        if stamp_resolution_s is None:
            shared = NoStamps(memory)
        elif stamp_resolution_s > 0:
            shared = CoarseStamps(memory, stamp_resolution_s)
        self.shared = shared
        algorithm = gm.DiLoCo(sync_every=100, fragments=fragments, quorum_size=quorum, syncer_layout=layout)  # type: ignore[arg-type]
        self.spec: RunSpec
        model = {"w": np.zeros(8, np.float32)} if fragments == 1 else {f"w{i}": np.zeros(8, np.float32) for i in range(fragments)}
        self.spec, _ = join_run(RunStore(shared), NUMPY, model, RunProposal(algorithm, lease_ttl_s=TTL_S), "creator")
        self.anchors = [RunStore(shared).read_params(self.spec, RunStore(shared).read_round(f, 0)) for f in range(fragments)]
        self.anchor = self.anchors[0]
        self.nodes: list[Node] = []
        rng = None if phase_seed is None else random.Random(phase_seed)
        for i in range(k):
            box = CountingMailbox(shared)
            store = RunStore(box)  # type: ignore[arg-type]
            store.read_spec()  # as a node joining the run: its blobs go under the run's digest
            node = Node(f"l{i}", box, store)
            if layout == "spread":
                node.lease_info = lambda: {"step": 0, "step_time_s": 0.0, "closes": True}
            node.loops = NodeLoops(
                node.store,
                self.spec,
                node.name,
                [LearnerFragment.joined(f, names, self.anchors[f], 0) for f, names in enumerate(self.spec.fragments)],
                backend=NUMPY,
                poll_interval_s=POLL_S,
                idle_interval_s=None,
                on_change=lambda: None,
                lease_info=lambda node=node: node.lease_info(),
                clock=self.clock,
            )
            node.loops.start(threads=False)  # the first lease renewal and election pass
            node.passes = node.loops.passes()
            node.next_at = [0.0 if rng is None else rng.uniform(0.0, IDLE_S) for _ in node.passes]
            self.nodes.append(node)

    def run_until(self, end: float, until: Callable[[], bool] | None = None) -> None:
        while True:
            due = [(at, n, i) for n, node in enumerate(self.nodes) if node.alive for i, at in enumerate(node.next_at)]
            at, n, i = min(due)
            if at > end:
                self.clock.now = end
                return
            self.clock.now = max(self.clock.now, at)
            node = self.nodes[n]
            loop_pass = node.passes[i]
            if loop_pass.name != "lease" or node.lease_alive:
                loop_pass.run()
                if loop_pass.name == "lease":
                    node.lease_written_at = self.clock.now
            node.next_at[i] = self.clock.now + max(loop_pass.loop.next_pause(), 1e-3)
            loop_pass.loop.take_wake()  # the pass's own wake-ups (a hurry) are in its next pause
            for other in self.nodes:  # another loop woken by this pass (a commit, an announcement) runs next
                for j, woken in enumerate(other.passes):
                    if other.alive and woken.loop.take_wake():
                        other.next_at[j] = self.clock.now + 1e-3
            if until is not None and until():
                return

    def leader(self) -> Node | None:
        leaders = [node for node in self.nodes if node.alive and node.syncer.election.is_leader]
        assert len(leaders) <= 1
        return leaders[0] if leaders else None

    def reset(self) -> None:
        for node in self.nodes:
            node.box.counts.clear()


def idle_rates(k: int, seconds: float = 120.0) -> tuple[float, Counter[str]]:
    """Requests per second per learner, and the calls by name, of ``k`` idle nodes."""
    sim = Sim(k)
    sim.run_until(2 * TTL_S)  # the election settles; one-time reads done
    sim.reset()
    start = sim.clock.now
    sim.run_until(start + seconds)
    total: Counter[str] = Counter()
    for node in sim.nodes:
        total.update(node.box.counts)
    return sum(total.values()) / seconds / k, total
