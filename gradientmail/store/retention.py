"""What a run keeps in its mailbox, and the pure rule that says what may go.

Without retention every version's parameters and outer state stay forever (a long run of a
large model fills a bucket: 300 rounds of a 1.75 MB model left 1 GB). The syncer applies
this rule after each commit through a :class:`~gradientmail.store.sweep.RetentionSweep` (the
rule's execution: which keys go, built from ``records/keys.py``); docs/operations.md sizes it.

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

from pydantic import Field, model_validator

from gradientmail.algorithms.config_base import FrozenConfig

__all__ = ["ORPHAN_GRACE_VERSIONS", "Retention"]

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
