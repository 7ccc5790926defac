"""How a learner reads a commit: rebuilt from its compact updates when that is cheaper, else whole.

With ``update_quantization`` (or ``update_sparsity``) every round record names a compact update
from its base version's parameters; a learner that holds the parameters of a version rebuilds a
newer one from the updates of the versions between, each step checked against that version's
committed size and digest (``RunStore.rebuild_params``), when together they weigh less than the
parameters. Anything that does not rebuild (a damaged update, one retention collected) falls back
to the full parameters: the bytes aligned with are the committed ones either way (INV-16).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from gradientmail.errors import CorruptPayload, GradientMailError, IncompatiblePayload, KeyNotFound
from gradientmail.records import RoundRecord
from gradientmail.store import RunSpec, RunStore

__all__ = ["CommitReader"]

log = logging.getLogger(__name__)


class CommitReader:
    """Reads commits for one learner and counts what that cost (the session's byte counters)."""

    def __init__(self, store: RunStore, spec: RunSpec, learner_id: str) -> None:
        self._store = store
        self._spec = spec
        self._learner = learner_id
        self.bytes_fetched = 0
        """Committed parameter bytes fetched (compact updates, or whole parameters)."""
        self.compact_fetches = 0
        """Commits rebuilt from their compact update (``update_quantization``)."""
        self.compact_fallbacks = 0
        """Compact updates that did not rebuild the committed bytes: full parameters read instead."""

    def read(
        self, fragment: int, known_version: int, known_params: Mapping[str, np.ndarray] | None, record: RoundRecord
    ) -> dict[str, np.ndarray]:
        """The parameters ``record`` commits: rebuilt from the compact updates of the versions
        since ``known_version`` when ``known_params`` (its parameters) are at hand and those
        updates weigh less than the parameters, else read whole. Counts what it fetched."""
        base = known_params
        chain = self._update_chain(fragment, known_version, record) if base is not None else []
        if base is not None and chain:
            try:
                for step in chain:
                    base = self._store.rebuild_params(self._spec, step, base)
            except (CorruptPayload, IncompatiblePayload, KeyNotFound) as exc:
                self.compact_fallbacks += 1
                log.warning("learner %s: %s; reading the full parameters", self._learner, exc)
            else:
                self.compact_fetches += 1
                self.bytes_fetched += sum(step.update.wire_bytes for step in chain if step.update is not None)
                return dict(base)
        self.bytes_fetched += record.params.wire_bytes
        return self._store.read_params(self._spec, record)

    def _update_chain(self, fragment: int, known: int, record: RoundRecord) -> list[RoundRecord]:
        """The round records from ``known`` + 1 to ``record`` if each carries a compact update on
        the version before it and together they weigh less than ``record``'s parameters; else []."""
        if record.update is None:
            return []
        chain = [record]
        while chain[0].base_version != known:
            previous = chain[0].base_version
            if previous is None or previous <= known:
                return []
            try:
                chain.insert(0, self._store.read_round(fragment, previous))
            except (KeyNotFound, GradientMailError):
                return []  # retention took it, or it does not verify: read the parameters
            if chain[0].update is None or sum(r.update.wire_bytes for r in chain if r.update) >= record.params.wire_bytes:
                return []
        return chain
