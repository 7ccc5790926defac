"""The learner's rule, in one place: the delta it publishes, whether a commit merged it, where
its unmerged work begins, and what aligning with a commit does to its parameters.

Pure functions. The exchange thread calls :func:`pseudo_gradient`, :func:`contribution_merged`
and :func:`carry_correction` (the decision and the arithmetic, off the training thread); the
training thread calls :func:`plan_alignment` and applies the plan, with the correction the
exchange computed or, when it has none, :func:`carry_correction` itself. docs/session.md
("Carrying unmerged work") states the rule; INV-9 of docs/protocol.md is what it keeps.

The delta and the correction work on host (NumPy) arrays: the exchange only ever holds host
copies, and the same IEEE fp32 operations give the same bits as any backend computing them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from gradientmail.backends import Backend, Tensor
from gradientmail.backends.payload import numpy_dtype

__all__ = [
    "AlignAction",
    "AlignmentPlan",
    "WorkMark",
    "aligned_parameters",
    "carry_correction",
    "contribution_merged",
    "expects_correction",
    "plan_alignment",
    "pseudo_gradient",
]


@dataclass(frozen=True)
class WorkMark:
    """A point in a learner's count of local work: the steps and samples trained so far."""

    steps: int = 0
    samples: int = 0

    def since(self, start: WorkMark) -> WorkMark:
        """The work trained from ``start`` to this mark."""
        return WorkMark(self.steps - start.steps, self.samples - start.samples)


def pseudo_gradient(
    anchor: Mapping[str, np.ndarray], local: Mapping[str, np.ndarray], dtype_of: Callable[[str], str]
) -> dict[str, np.ndarray]:
    """Δ = anchor − local for every tensor of a fragment, in the dtype it travels in.

    Computed in fp32 on host arrays, then cast (``dtype_of(name)``: the run's ``delta_dtype``
    or the parameter's own); fp32 deltas are not copied again.
    """
    delta: dict[str, np.ndarray] = {}
    for name, base in anchor.items():
        difference = np.subtract(np.asarray(base, dtype=np.float32), np.asarray(local[name], dtype=np.float32))
        dtype = numpy_dtype(dtype_of(name))
        delta[name] = difference if dtype == np.float32 else difference.astype(dtype)
    return delta


def contribution_merged(round_lists_ours: bool, published_base: int | None, commit_base: int) -> bool:
    """Whether the commit built on ``commit_base`` merged the learner's outstanding contribution.

    ``round_lists_ours``: the round built on ``commit_base`` lists a contribution of this
    learner; ``published_base``: the version its outstanding contribution was taken against
    (None: none is outstanding). The one decision every "was our work merged?" uses: where
    the learner's unmerged work begins, the start of the carry correction, when the fragment
    is next due, and whether an error-feedback residual is kept.
    """
    return round_lists_ours and published_base == commit_base


class AlignAction(enum.Enum):
    """What aligning with a commit does to a fragment's parameters."""

    REPLACE = "replace"
    """Write the commit (blended with the local values under ``mixing`` when not carrying)."""
    CARRY = "carry"
    """θ ← θ_commit − (θ_start − θ): add the carry correction θ_commit − θ_start in place."""
    DROP = "drop"
    """The unmerged work spans more than its limit (``plan_alignment``): write the commit and
    report the dropped work (reason ``carry_limit``) with the next contribution."""


@dataclass(frozen=True)
class AlignmentPlan:
    action: AlignAction
    unmerged_from: WorkMark
    """Where the fragment's unmerged work begins once aligned."""
    dropped: WorkMark | None = None
    """The work a ``DROP`` discards (steps and samples), for its ``Realignment``."""


def plan_alignment(
    *,
    carry: bool,
    merged_at: WorkMark | None,
    unmerged_from: WorkMark,
    now: WorkMark,
    anchor_step: int,
    versions_ahead: int,
    carry_limit_steps: int,
    room_steps: int,
) -> AlignmentPlan:
    """The alignment with a commit, from the learner's counts.

    ``carry``: the learner's ``carry_unmerged``; ``merged_at``: where the contribution the
    commit merged was taken (None when it merged nothing of ours); ``unmerged_from``: where the
    fragment's unmerged work begins now; ``anchor_step``: the step the learner aligned with its
    anchor at; ``versions_ahead``: how far the commit is past that anchor. Without carrying, the
    commit replaces the local work and unmerged work begins again now. Carrying, it begins
    where the merged contribution ended (or stays where it was), and is carried unless it is
    empty or too long.

    Too long is decided by how far behind the work is. Work trained on the anchor the commit
    follows is one version behind, like every step a learner trains while its round is in
    flight, however long the commit took (a syncer takeover, a round slowed by a faulty
    store): it is carried up to ``room_steps``, what the next contribution can still hold
    (``RunSpec.carry_room_steps``). Work a commit passed by before (trained before the anchor,
    or all of it when the commit skips versions) is further behind with every commit, and past
    ``carry_limit_steps`` (``max_carried_steps``: a learner away for long) it is dropped.
    """
    if not carry:
        return AlignmentPlan(AlignAction.REPLACE, now)
    start = merged_at if merged_at is not None else unmerged_from
    span = now.since(start)
    passed_by = span.steps if versions_ahead > 1 else max(0, anchor_step - start.steps)
    if span.steps > room_steps or passed_by > carry_limit_steps:
        return AlignmentPlan(AlignAction.DROP, now, dropped=span)
    if span.steps == 0:
        return AlignmentPlan(AlignAction.REPLACE, start)
    return AlignmentPlan(AlignAction.CARRY, start)


def expects_correction(carry: bool, merged: bool, overlap_steps: int | None) -> bool:
    """Whether the exchange should compute a commit's carry correction ahead of the alignment:
    whenever the learner carries, except when the commit merged its contribution under
    ``overlap_steps = 0`` (the learner waited at its publish, so nothing is left to carry)."""
    return carry and not (merged and overlap_steps == 0)


def carry_correction(committed: Mapping[str, np.ndarray], start: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """θ_commit − θ_start in fp32, for every tensor of the commit.

    ``start`` is where the unmerged work began: the parameters the merged contribution was
    taken at, or the anchor when the commit merged nothing of this learner's. Added to the
    live parameters it gives θ_commit − (θ_start − θ): the learner's next delta against the
    commit is then exactly that work plus what it trains next (DiLoCo.carry_unmerged).
    """
    return {
        name: np.subtract(np.asarray(value, dtype=np.float32), np.asarray(start[name], dtype=np.float32))
        for name, value in committed.items()
    }


def aligned_parameters(
    backend: Backend, local: Mapping[str, Tensor], committed: Mapping[str, Tensor], mixing: float
) -> Mapping[str, Tensor]:
    """What a fragment's parameters become when a learner that does not carry aligns.

    ``mixing = 0`` (the guide's default) replaces them with the committed values; ``α > 0``
    keeps a share of the local ones, θ ← α·θ_local + (1 − α)·θ_commit (Streaming DiLoCo).
    """
    if mixing == 0:
        return committed
    return {
        name: backend.add(backend.scale(local[name], mixing), backend.scale(committed[name], 1 - mixing)) for name in committed
    }
