"""One round of one fragment: validate contributions, merge, outer step, commit.

``validate`` decides acceptance of a single contribution; ``apply_round`` (``merge_round``
then ``outer_step``) is the pure merge-and-step both the live syncer (which times the two
halves apart) and ``replay_round`` use, so a replay reproduces the committed bytes exactly
(protocol invariant 4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.algorithms.merge import merge_from_manifest, merge_tensors, weight
from gradientmail.algorithms.outer import NesterovOuter, OuterState
from gradientmail.backends import Backend, Tensor
from gradientmail.backends.payload import DTYPES
from gradientmail.errors import ContributionRejected, CorruptPayload, IncompatiblePayload, InvalidRecord, MailboxError
from gradientmail.records import Contribution, Manifest, Rejection, RoundRecord, keys
from gradientmail.store.run_store import RunStore, TensorShape

PAYLOAD_HEADER_SLACK = 1 << 20
"""Bytes allowed above the raw tensor bytes for a Safetensors header."""


@dataclass(frozen=True)
class RunSpec:
    """What the syncer derives once from the manifest."""

    manifest: Manifest
    algorithm: DiLoCo
    fragments: tuple[tuple[str, ...], ...]
    shapes: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, str]

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> RunSpec:
        return cls(
            manifest=manifest,
            algorithm=DiLoCo.from_manifest(manifest.algorithm),
            fragments=manifest.plan,
            shapes={p.name: tuple(p.shape) for p in manifest.parameters},
            dtypes={p.name: p.dtype for p in manifest.parameters},
        )

    def param_specs(self, fragment: int) -> dict[str, TensorShape]:
        return {n: TensorShape(self.shapes[n], self.dtypes[n]) for n in self.fragments[fragment]}

    def delta_specs(self, fragment: int) -> dict[str, TensorShape]:
        wanted = self.algorithm.delta_dtype
        return {n: TensorShape(self.shapes[n], wanted or self.dtypes[n]) for n in self.fragments[fragment]}

    def max_payload_bytes(self, fragment: int) -> int:
        total = 0
        for name, spec in self.delta_specs(fragment).items():
            count = 1
            for dim in spec.shape:
                count *= dim
            total += count * DTYPES[spec.dtype or "float64"][1].itemsize
        return total + PAYLOAD_HEADER_SLACK


@dataclass
class Accepted:
    key: str
    contribution: Contribution
    delta: dict[str, Tensor]
    weight: float


def validate(
    store: RunStore, spec: RunSpec, fragment: int, base_version: int, key: str, learner_from_key: str
) -> Accepted | Rejection:
    """Accept a contribution for ``base_version`` or say why not (the reason codes of the protocol)."""

    def reject(reason: str, detail: str) -> Rejection:
        return Rejection(learner=learner_from_key, contribution=key, reason=reason, detail=detail[:500])

    try:
        contribution = store.read_contribution(key)
    except InvalidRecord as exc:
        return reject("malformed", str(exc))
    if contribution.learner != learner_from_key or contribution.fragment != fragment:
        return reject("malformed", f"record names learner {contribution.learner!r} fragment {contribution.fragment}")
    if contribution.anchor_version != base_version:
        return reject("stale", f"based on version {contribution.anchor_version}, current is {base_version}")
    try:
        contribution_weight = weight(contribution.steps, contribution.samples)
    except ContributionRejected as exc:
        return reject(exc.reason, str(exc))
    if contribution.payload.size_bytes > spec.max_payload_bytes(fragment):
        return reject("corrupt", f"payload of {contribution.payload.size_bytes} bytes exceeds the fragment's bound")
    try:
        delta = store.read_tensors(contribution.payload, spec.delta_specs(fragment))
    except CorruptPayload as exc:
        return reject("corrupt", str(exc))
    except IncompatiblePayload as exc:
        return reject("incompatible", str(exc))
    except MailboxError as exc:
        if exc.retryable:
            raise
        return reject("corrupt", f"payload unreadable: {exc}")
    for name, tensor in delta.items():
        if not store.backend.all_finite(tensor):
            return reject("non_finite", f"{name} holds NaN or infinite values")
    return Accepted(key, contribution, delta, contribution_weight)


def apply_round(
    backend: Backend,
    spec: RunSpec,
    base_params: Mapping[str, Tensor],
    base_state: OuterState,
    accepted: Sequence[Accepted],
) -> tuple[dict[str, Tensor], OuterState, bool]:
    """Merge the accepted deltas and take the outer step: new params, new state, final flag."""
    merged, final = merge_round(backend, spec, accepted)
    params, state = outer_step(backend, spec, base_params, base_state, merged, final)
    return params, state, final


def merge_round(backend: Backend, spec: RunSpec, accepted: Sequence[Accepted]) -> tuple[dict[str, Tensor], bool]:
    """The first half of ``apply_round`` (timed apart by the syncer): merged delta, final flag."""
    merged = merge_tensors(spec.algorithm.merge, [a.delta for a in accepted], [a.weight for a in accepted], backend)
    return merged, all(a.contribution.final for a in accepted)


def outer_step(
    backend: Backend, spec: RunSpec, base_params: Mapping[str, Tensor], base_state: OuterState,
    merged: Mapping[str, Tensor], final: bool,
) -> tuple[dict[str, Tensor], OuterState]:
    """The second half of ``apply_round``: the Nesterov outer step on the merged delta."""
    outer = NesterovOuter(lr=spec.algorithm.outer_lr, momentum=spec.algorithm.outer_momentum)
    return outer.step(backend, base_params, base_state, merged, final=final)


def load_version(store: RunStore, spec: RunSpec, fragment: int, version: int) -> tuple[RoundRecord, dict[str, Tensor], OuterState]:
    """A committed version's record, parameters and outer state, verified."""
    record = store.read_round(fragment, version)
    params = store.read_tensors(record.params, spec.param_specs(fragment))
    state = OuterState.from_tensors(store.read_tensors(record.outer_state))
    return record, params, state


def replay_round(store: RunStore, spec: RunSpec, fragment: int, version: int) -> dict[str, Tensor]:
    """Recompute ``version`` from ``version − 1`` and the participants its record lists."""
    record = store.read_round(fragment, version)
    if record.base_version is None:
        raise ValueError("version 0 has no inputs to replay")
    _, base_params, base_state = load_version(store, spec, fragment, record.base_version)
    accepted = []
    for participant in record.participants:
        parsed = keys.parse_contribution_record(participant.contribution)
        learner = parsed.learner if parsed else participant.learner
        outcome = validate(store, spec, fragment, record.base_version, participant.contribution, learner)
        if not isinstance(outcome, Accepted):
            raise CorruptPayload(f"participant {participant.contribution} no longer validates: {outcome.reason}")
        accepted.append(outcome)
    if merge_from_manifest(record.merge) != spec.algorithm.merge:
        raise CorruptPayload("the round record's merge differs from the manifest's")
    params, _, _ = apply_round(store.backend, spec, base_params, base_state, accepted)
    return params
