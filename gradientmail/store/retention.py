"""What a run keeps in its mailbox, and the pure rule that says what may go.

Without retention every version's parameters and outer state stay forever (a long run of a
large model fills a bucket: 300 rounds of a 1.75 MB model left 1 GB). The syncer applies
this rule after each commit through a :class:`RetentionSweep` (the rule's execution: which
keys go, built by the store from ``records/keys.py``); docs/operations.md sizes it.

* the newest ``keep_versions`` versions (records and blobs): learners and a new syncer load
  the newest, audit replays the window;
* every ``checkpoint_every``-th version, the newest ``keep_checkpoints`` of them: restarts
  from further back, exports;
* contributions of the newest ``audit_rounds`` rounds: replay of every round in the window.

Everything else under ``versions/`` and ``rounds/`` is deleted, and blobs of a kept version
that its record does not reference (a killed or losing commit attempt) once the version is
two commits old: the grace that lets an attempt in flight finish or clean up after itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from gradientmail.algorithms.config_base import FrozenConfig
from gradientmail.errors import InvalidRecord, KeyNotFound
from gradientmail.records import RoundRecord, keys

if TYPE_CHECKING:  # run_store imports spec, which imports this module
    from gradientmail.store.run_store import RunStore

__all__ = ["ORPHAN_GRACE_VERSIONS", "Retention", "RetentionSweep", "referenced_blobs"]

ORPHAN_GRACE_VERSIONS = 2
"""Commits after which an unreferenced blob of a kept version is collected."""


class Retention(FrozenConfig):
    """A run's storage policy (stored in the manifest, applied by whichever node is syncer)."""

    keep_versions: int = Field(default=10, ge=2)
    """Newest versions kept whole (round record, parameters, outer state)."""
    audit_rounds: int = Field(default=8, ge=1)
    """Newest rounds whose inputs (contributions) are kept so that `gradientmail audit` can
    replay them; at most ``keep_versions − 1`` (a replay needs the version before)."""
    checkpoint_every: int = Field(default=100, ge=1)
    """Every version divisible by this is a checkpoint."""
    keep_checkpoints: int = Field(default=5, ge=0)
    """Newest checkpoints kept beyond the newest versions; 0 keeps none."""

    @model_validator(mode="after")
    def _window_fits(self) -> Retention:
        if self.audit_rounds > self.keep_versions - 1:
            raise ValueError(f"audit_rounds ({self.audit_rounds}) must be at most keep_versions - 1 ({self.keep_versions - 1})")
        return self

    def kept_versions(self, versions: list[int] | set[int], newest: int) -> set[int]:
        """Of ``versions``, those the policy keeps when ``newest`` is the newest commit."""
        recent = {v for v in versions if v > newest - self.keep_versions}
        checkpoints = sorted((v for v in versions if v % self.checkpoint_every == 0 and v not in recent), reverse=True)
        return recent | set(checkpoints[: self.keep_checkpoints])

    def oldest_audited_base(self, newest: int) -> int:
        """Contributions based on versions older than this belong to no round still audited."""
        return max(0, newest - self.audit_rounds)

    def oldest_kept_base(self, newest: int, max_staleness: int) -> int:
        """Contributions based on versions older than this are deleted: no audited round lists
        them, and none can still be merged late (``max_staleness``) into one."""
        return max(0, self.oldest_audited_base(newest) - max_staleness)


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
            store.delete_keys(doomed)
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
