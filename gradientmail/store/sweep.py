"""Retention's execution: the keys a run's :class:`~gradientmail.store.retention.Retention` gives
up after a commit, found and deleted through the store (keys from ``records/keys.py``).

Kept apart from the rule itself, which the run's spec (and so the store) imports.
"""

from __future__ import annotations

from gradientmail.errors import InvalidRecord, KeyNotFound
from gradientmail.records import RoundRecord, keys
from gradientmail.store.retention import ORPHAN_GRACE_VERSIONS, Retention
from gradientmail.store.run_store import RunStore

__all__ = ["DELETES_PER_SWEEP", "RetentionSweep", "referenced_blobs"]

DELETES_PER_SWEEP = 256
"""Most objects one sweep deletes (one request each): an honest commit gives up a few dozen; a
flood of thousands is collected over the following commits instead of stalling one."""


def referenced_blobs(record: RoundRecord) -> frozenset[str]:
    """The blobs a round record references (retention keeps them while it keeps the version)."""
    return frozenset(ref.key for ref in (record.params, record.outer_state, record.update) if ref is not None)


class RetentionSweep:
    """Deletes what a run's :class:`Retention` no longer keeps, one fragment after each commit.

    It remembers the blobs each version's record references (told by :meth:`committed`, else
    read once), so that the orphan check costs no request per kept version and sweep.
    """

    def __init__(self, store: RunStore, retention: Retention, max_staleness: int) -> None:
        self._store = store
        self._retention = retention
        self._max_staleness = max_staleness
        self._blobs_of: dict[tuple[int, int], frozenset[str]] = {}
        """(fragment, version) → the blob keys its record references (the orphan check)."""

    def committed(self, record: RoundRecord) -> None:
        """Remember the blobs of a record this node just committed (never read back)."""
        self._blobs_of[(record.fragment, record.version)] = referenced_blobs(record)

    def apply(self, fragment: int, newest: int) -> None:
        """Delete the versions, orphan blobs and contributions the policy gives up once
        ``newest`` is committed (three LISTs, a GET per kept record not yet known, the deletes)."""
        store, retention = self._store, self._retention
        blobs = store.version_blobs(fragment)
        records = set(store.committed_versions(fragment))
        kept = retention.kept_versions(records | set(blobs), newest)
        doomed = [keys.round_record(fragment, v) for v in records - kept]
        for version, found in blobs.items():
            if version not in kept:
                doomed.extend(found)
            elif version <= newest - ORPHAN_GRACE_VERSIONS and version in records:
                referenced = self._referenced(fragment, version)
                doomed.extend(k for k in found if referenced is not None and k not in referenced)
        doomed.extend(store.contribution_objects_below(fragment, retention.oldest_kept_base(newest, self._max_staleness)))
        if doomed:
            doomed.sort(key=lambda k: k.endswith(".json"))  # blobs before the records, as delete_keys does
            store.delete_keys(doomed[:DELETES_PER_SWEEP])  # the rest next commit: a flood never stalls one
        for key in [k for k in self._blobs_of if k[0] == fragment and k[1] not in kept]:
            del self._blobs_of[key]

    def _referenced(self, fragment: int, version: int) -> frozenset[str] | None:
        cached = self._blobs_of.get((fragment, version))
        if cached is None:
            try:
                record = self._store.read_round(fragment, version)
            except (KeyNotFound, InvalidRecord):
                return None  # not ours to judge: leave its blobs alone
            cached = self._blobs_of[(fragment, version)] = referenced_blobs(record)
        return cached
