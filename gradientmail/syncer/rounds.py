"""One round of one fragment: validate contributions, merge, outer step, commit.

``validate`` decides acceptance of a single contribution; ``apply_round`` (``merge_round``
then ``outer_step``) is the pure merge-and-step both the live syncer (which times the two
halves apart) and ``replay_round`` use, so a replay reproduces the committed bytes exactly
(protocol invariant 4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gradientmail.algorithms.merge import merge_from_manifest, merge_tensors, staleness_discount, weight
from gradientmail.algorithms.outer import OuterState
from gradientmail.backends import Backend, Tensor
from gradientmail.errors import (
    ContributionRejected,
    CorruptPayload,
    GradientMailError,
    IncompatiblePayload,
    InvalidRecord,
    MailboxError,
)
from gradientmail.records import Contribution, Rejection, RejectionReason, keys
from gradientmail.store import Arrays, CommittedVersion, RunSpec, RunStore

__all__ = ["Accepted", "Base", "apply_round", "load_base", "merge_round", "outer_step", "replay_round", "validate"]


@dataclass(frozen=True)
class Base:
    """A committed version as the syncer computes with it: tensors of its backend."""

    params: dict[str, Tensor]
    state: OuterState


def load_base(backend: Backend, committed: CommittedVersion) -> Base:
    return Base(_tensors(backend, committed.params), OuterState.from_tensors(_tensors(backend, committed.outer_state)))


def _tensors(backend: Backend, arrays: Arrays) -> dict[str, Tensor]:
    return {name: backend.from_numpy(array) for name, array in arrays.items()}


@dataclass
class Accepted:
    key: keys.ContributionKey
    contribution: Contribution
    delta: dict[str, Tensor]
    weight: float
    staleness: int = 0


def validate(
    store: RunStore, backend: Backend, spec: RunSpec, base_version: int, key: keys.ContributionKey
) -> Accepted | Rejection:
    """Accept a contribution for ``base_version`` or say why not (the reason codes of the protocol)."""

    def reject(reason: RejectionReason, detail: str) -> Rejection:
        return Rejection(learner=key.learner, contribution=key.record, reason=reason, detail=detail[:500])

    try:
        contribution = store.read_contribution(key)
    except InvalidRecord as exc:
        return reject("malformed", str(exc))
    if contribution.learner != key.learner or contribution.fragment != key.fragment:
        return reject("malformed", f"record names learner {contribution.learner!r} fragment {contribution.fragment}")
    staleness = base_version - contribution.anchor_version
    if not 0 <= staleness <= spec.algorithm.max_staleness:
        return reject("stale", f"based on version {contribution.anchor_version}, current is {base_version}")
    try:
        contribution_weight = weight(contribution.steps, contribution.samples) * staleness_discount(staleness)
    except ContributionRejected as exc:
        return reject("zero_steps" if exc.reason == "zero_steps" else "invalid_counts", str(exc))
    if contribution.payload.size_bytes > spec.max_payload_bytes(key.fragment):
        return reject("corrupt", f"payload of {contribution.payload.size_bytes} bytes exceeds the fragment's bound")
    try:
        delta = _tensors(backend, store.read_delta(spec, contribution))
    except CorruptPayload as exc:
        return reject("corrupt", str(exc))
    except IncompatiblePayload as exc:
        return reject("incompatible", str(exc))
    except MailboxError as exc:
        if exc.retryable:
            raise
        return reject("corrupt", f"payload unreadable: {exc}")
    for name, tensor in delta.items():
        if not backend.all_finite(tensor):
            return reject("non_finite", f"{name} holds NaN or infinite values")
    return Accepted(key, contribution, delta, contribution_weight, staleness)


def apply_round(
    backend: Backend, spec: RunSpec, base: Base, accepted: Sequence[Accepted]
) -> tuple[dict[str, Tensor], OuterState, bool]:
    """Merge the accepted deltas and take the outer step: new params, new state, final flag."""
    merged, final = merge_round(backend, spec, accepted)
    params, state = outer_step(backend, spec, base, merged, final)
    return params, state, final


def merge_round(backend: Backend, spec: RunSpec, accepted: Sequence[Accepted]) -> tuple[dict[str, Tensor], bool]:
    """The first half of ``apply_round`` (timed apart by the syncer): merged delta, final flag."""
    merged = merge_tensors(spec.algorithm.merge, [a.delta for a in accepted], [a.weight for a in accepted], backend)
    return merged, all(a.contribution.final for a in accepted)


def outer_step(
    backend: Backend, spec: RunSpec, base: Base, merged: Mapping[str, Tensor], final: bool
) -> tuple[dict[str, Tensor], OuterState]:
    """The second half of ``apply_round``: the Nesterov outer step on the merged delta."""
    return spec.algorithm.outer.step(backend, base.params, base.state, merged, final=final)


def replay_round(store: RunStore, backend: Backend, spec: RunSpec, fragment: int, version: int) -> dict[str, Tensor]:
    """Recompute ``version`` from ``version − 1`` and the participants its record lists (INV-4).

    Raises:
        GradientMailError: version 0 (it has no inputs); ``CorruptPayload`` when a participant
            no longer validates or the record's merge is not the manifest's.
    """
    record = store.read_round(fragment, version)
    if record.base_version is None:
        raise GradientMailError(f"fragment {fragment} version {version} has no inputs to replay (it initialised the fragment)")
    base = load_base(backend, store.load_version(spec, fragment, record.base_version))
    accepted = []
    for participant in record.participants:
        key = keys.parse_contribution_record(participant.contribution)
        if key is None:
            raise CorruptPayload(f"participant {participant.contribution!r} is not a contribution key")
        outcome = validate(store, backend, spec, record.base_version, key)
        if not isinstance(outcome, Accepted):
            raise CorruptPayload(f"participant {participant.contribution} no longer validates: {outcome.reason}")
        accepted.append(outcome)
    if merge_from_manifest(record.merge) != spec.algorithm.merge:
        raise CorruptPayload("the round record's merge differs from the manifest's")
    params, _, _ = apply_round(backend, spec, base, accepted)
    return params
