"""A barrier's records (``session/barrier.py``): each node's arrival, created once, and its clock probes.

An arrival is read only as the arrival of the node its key names at the barrier its key names
(garbage, another key's or a copy of another node's record counts as no party), and each write
gives a clock sample (the store's stamp of it) for the one instant the parties leave at.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gradientmail.errors import InvalidRecord, KeyNotFound, RecordExists
from gradientmail.records import BarrierArrival, keys
from gradientmail.store.cas import CasRecords
from gradientmail.store.record_io import RecordIO
from gradientmail.store.store_clock import ClockSample

__all__ = ["BarrierRecords"]

log = logging.getLogger(__name__)


class BarrierRecords:
    """Every barrier of one run (``RunStore.barriers``)."""

    def __init__(self, io: RecordIO, cas: CasRecords) -> None:
        self._io = io
        self._cas = cas

    def arrive(self, arrival: BarrierArrival, clock: Callable[[], float]) -> ClockSample | None:
        """Create ``arrival`` (create-once) and return the clock sample its write gives: ``clock()``
        around the write and the store's stamp of it. None when the store stamps no writes, or
        the node had arrived already (a call again after a timeout). An object squatting the
        node's own key that is not its arrival (garbage, or unsigned in a signed run) is
        written over: only that node writes there."""
        location = keys.barrier_arrival(arrival.barrier, arrival.node)
        sent = clock()
        try:
            self._cas.create(location, arrival)
        except RecordExists:
            if self.read_arrival(arrival.barrier, arrival.node) is not None:
                return None
            log.warning("barrier %s: the arrival key of %s held something else; writing over it", arrival.barrier, arrival.node)
            self._cas.put(location, arrival)
        return self._io.clock_sample(location, sent, clock())

    def probe_clock(self, barrier: str, node: str, clock: Callable[[], float]) -> ClockSample | None:
        """Write ``node``'s clock probe for ``barrier`` and return the sample (None: no stamps)."""
        location = keys.barrier_clock_probe(barrier, node)
        sent = clock()
        self._io.mailbox.put(location, b"{}")
        return self._io.clock_sample(location, sent, clock())

    def barrier_names(self) -> list[str]:
        """The barriers with a record in the mailbox (one LIST of them all)."""
        return sorted({parsed.barrier for _, parsed in self._io.listed(keys.BARRIERS) if isinstance(parsed, keys.BarrierKey)})

    def nodes(self, barrier: str) -> set[str]:
        """The nodes with an arrival listed at ``barrier`` (one LIST; not yet read or verified)."""
        return {
            parsed.node
            for _, parsed in self._io.listed(keys.barrier_prefix(barrier, "arrivals"))
            if isinstance(parsed, keys.BarrierKey) and parsed.barrier == barrier and parsed.part == "arrivals"
        }

    def read_arrival(self, barrier: str, node: str) -> tuple[BarrierArrival, float | None] | None:
        """``node``'s arrival at ``barrier`` and the store's stamp of it (None: a store without
        stamps), read and, with a run key, verified; None when there is none, or what is there is
        not that node's arrival at that barrier (garbage, another key's, a copy of another
        node's record), so no dropped object counts as a party."""
        location = keys.barrier_arrival(barrier, node)
        try:
            arrival, _ = self._io.read(BarrierArrival, location)
        except (KeyNotFound, InvalidRecord):
            return None
        if arrival.barrier != barrier or arrival.node != node:
            return None
        info = self._io.mailbox.head(location)
        if info is None:
            return None
        return arrival, info.modified_at
