"""One round of one fragment: validate contributions, then close the round.

``validate`` decides acceptance of a single contribution; ``close_round`` is the round's rule
from the accepted contributions to what is committed: weights (samples per step capped), the
configured merge, the outer step, the non-finite retry (a non-finite result is never
committed: it is retried without the largest delta) and, with ``update_quantization`` or ``update_sparsity``, the
compact update. The live syncer commits its :class:`RoundDraft`; ``replay_round`` runs the same
function on the participants a record lists, so a replay reproduces the committed bytes
exactly (protocol invariant 4). ``validate`` trusts nothing it reads: whatever goes wrong inside
it becomes a rejection with a reason, never an exception (INV-7).

Passes over a contribution (issue 13): ``validate`` decodes the payload zero-copy (the delta's
tensors borrow the payload's bytes) and takes one ``finite_norm`` pass per tensor, which both
checks finiteness and measures the norm; the per-tensor norms travel in
:attr:`Accepted.tensor_norms` to ``merge_round``, so RDA combines the deltas in one more pass,
and its final scale is folded into the outer step's single pass (a ``MergedDelta``). A replay
runs exactly the same functions on the same inputs, hence the same bytes. ``validate`` is
``fetch_contribution`` (record, payload, size and digest, decode: mailbox reads only, safe on
another thread) then ``check_fetched`` (the backend's passes); the syncer runs the first half
of the next contributions ahead while it checks the current one, in the listed order.

With ``merge_arithmetic="streamed"`` (issue 25) the syncer also adds each accepted delta to the
round's :class:`~gradientmail.algorithms.merge.MergeSum` as it checks it; ``close_round`` takes
that sum when it holds exactly the participants and their final weights, else sums them itself,
as replay does: the same bytes either way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gradientmail.algorithms.merge import (
    MergedDelta,
    MergeSum,
    merge_from_manifest,
    merge_tensors_scaled,
    staleness_discount,
    weight,
)
from gradientmail.algorithms.outer import MergedWork, NesterovOuter, OuterState, round_momentum
from gradientmail.backends import Backend, Tensor
from gradientmail.backends.compact import UpdateParts, compact_update
from gradientmail.errors import (
    ContributionRejected,
    CorruptPayload,
    GradientMailError,
    IncompatiblePayload,
    InvalidRecord,
    MailboxError,
    Unauthenticated,
)
from gradientmail.records import Contribution, Participant, Rejection, RejectionReason, keys
from gradientmail.store import Arrays, CommittedVersion, RunSpec, RunStore, check_tensors

__all__ = [
    "AbandonedRound",
    "Accepted",
    "Base",
    "Fetched",
    "Handed",
    "RoundDraft",
    "all_finite",
    "capped_weights",
    "check_fetched",
    "close_round",
    "compact_update_step",
    "fetch_contribution",
    "load_base",
    "merge_round",
    "outer_step",
    "round_beta",
    "round_sum",
    "replay_round",
    "replayed_draft",
    "validate",
]


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
    norm: float = 0.0
    """L2 norm of the whole delta (every tensor of the fragment)."""
    tensor_norms: dict[str, float] = field(default_factory=dict)
    """``Backend.finite_norm`` of each tensor of the delta, as validation measured it (RDA
    reuses them instead of reading the deltas again); empty: the merge measures them."""


def validate(
    store: RunStore,
    backend: Backend,
    spec: RunSpec,
    base_version: int,
    key: keys.ContributionKey,
    norm_limit: NormLimit | None = None,
) -> Accepted | Rejection:
    """Accept a contribution for ``base_version`` or say why not (the reason codes of the protocol).

    ``norm_limit(steps)`` is the largest delta norm accepted (``outlier`` beyond it; None:
    no bound). Only a retryable mailbox error escapes; anything else that goes wrong is a
    rejection (``malformed`` when nothing more specific applies). The same as
    ``check_fetched(backend, fetch_contribution(...), norm_limit)``: the syncer runs the
    first half ahead, on another thread, for the next contributions (issue 13).
    """
    return check_fetched(backend, fetch_contribution(store, spec, base_version, key), norm_limit)


NormLimit = Callable[[int], "float | None"]


@dataclass
class Fetched:
    """A contribution whose record checked out and whose payload was fetched, verified against
    the record's size and digest, decoded, and matched to the run's names, shapes and dtypes;
    not yet checked for finiteness nor measured."""

    key: keys.ContributionKey
    contribution: Contribution
    arrays: Arrays
    weight: float
    staleness: int


@dataclass(frozen=True)
class Handed:
    """A contribution this node's own learner published, handed to its syncer in memory: the
    record it created and the arrays it encoded into the payload (whose digest the record
    pins). The syncer takes them instead of reading both back: the same record, the same bytes."""

    key: keys.ContributionKey
    record: Contribution
    arrays: Arrays


def fetch_contribution(
    store: RunStore, spec: RunSpec, base_version: int, key: keys.ContributionKey, handed: Handed | None = None
) -> Fetched | Rejection:
    """The first half of :func:`validate`: everything that reads the mailbox (the record,
    the payload and its checks, the decode). No backend is touched, so it may run on another
    thread. Only a retryable mailbox error escapes; anything else becomes a rejection.
    ``handed``: what this node's learner wrote, taken instead of read (the checks of the record
    and of the arrays' names, shapes and dtypes still run); replay never hands anything."""
    try:
        return _fetch(store, spec, base_version, key, handed)
    except MailboxError as exc:
        if exc.retryable:
            raise
        return _reject(key, "corrupt", f"unreadable: {exc}")
    except Exception as exc:  # hostile input must become a reason, whatever it breaks
        return _reject(key, "malformed", f"{type(exc).__name__}: {exc}")


def check_fetched(backend: Backend, fetched: Fetched | Rejection, norm_limit: NormLimit | None = None) -> Accepted | Rejection:
    """The second half of :func:`validate`: the delta on the backend, finite, its norm within
    ``norm_limit``. A rejection from the first half passes through."""
    if isinstance(fetched, Rejection):
        return fetched
    try:
        return _check(backend, fetched, norm_limit)
    except MailboxError as exc:
        if exc.retryable:
            raise
        return _reject(fetched.key, "corrupt", f"unreadable: {exc}")
    except Exception as exc:  # hostile input must become a reason, whatever it breaks
        return _reject(fetched.key, "malformed", f"{type(exc).__name__}: {exc}")


def _reject(key: keys.ContributionKey, reason: RejectionReason, detail: str) -> Rejection:
    return Rejection(learner=key.learner, contribution=key.record, reason=reason, detail=detail[:500])


def _fetch(
    store: RunStore, spec: RunSpec, base_version: int, key: keys.ContributionKey, handed: Handed | None
) -> Fetched | Rejection:
    def reject(reason: RejectionReason, detail: str) -> Rejection:
        return _reject(key, reason, detail)

    try:
        contribution = handed.record if handed is not None else store.read_contribution(key)
    except Unauthenticated as exc:
        return reject("unauthenticated", str(exc))
    except InvalidRecord as exc:
        return reject("malformed", str(exc))
    if (contribution.learner, contribution.fragment, contribution.anchor_version) != (
        key.learner,
        key.fragment,
        key.base_version,
    ):
        return reject(
            "malformed",
            f"record names learner {contribution.learner!r} fragment {contribution.fragment} version "
            f"{contribution.anchor_version}, its key {key.learner!r} {key.fragment} {key.base_version}",
        )
    if contribution.payload.key != key.blob:
        return reject("malformed", f"payload key {contribution.payload.key!r} is not the contribution's own ({key.blob})")
    staleness = base_version - contribution.anchor_version
    if not 0 <= staleness <= spec.algorithm.max_staleness:
        return reject("stale", f"based on version {contribution.anchor_version}, current is {base_version}")
    if contribution.steps > spec.max_contribution_steps:
        return reject("invalid_counts", f"{contribution.steps} steps, more than the run allows ({spec.max_contribution_steps})")
    if contribution.carried_steps > contribution.steps:
        return reject("invalid_counts", f"carried_steps {contribution.carried_steps} exceeds steps {contribution.steps}")
    try:
        contribution_weight = weight(contribution.steps, contribution.samples) * staleness_discount(staleness)
    except ContributionRejected as exc:
        return reject("zero_steps" if exc.reason == "zero_steps" else "invalid_counts", str(exc))
    if contribution.payload.size_bytes > spec.max_payload_bytes(key.fragment):
        return reject("corrupt", f"payload of {contribution.payload.size_bytes} bytes exceeds the fragment's bound")
    try:
        if handed is not None:
            check_tensors(handed.arrays, spec.delta_specs(key.fragment), f"contribution {key.record}")
            arrays = handed.arrays
        else:
            arrays = store.read_delta(spec, contribution)
    except CorruptPayload as exc:
        return reject("corrupt", str(exc))
    except IncompatiblePayload as exc:
        return reject("incompatible", str(exc))
    return Fetched(key, contribution, arrays, contribution_weight, staleness)


def _check(backend: Backend, fetched: Fetched, norm_limit: NormLimit | None) -> Accepted | Rejection:
    def reject(reason: RejectionReason, detail: str) -> Rejection:
        return _reject(fetched.key, reason, detail)

    # zero-copy: the tensors borrow the payload's bytes, which nothing writes
    delta = {name: backend.borrow_numpy(array) for name, array in fetched.arrays.items()}
    tensor_norms: dict[str, float] = {}
    for name, tensor in delta.items():
        tensor_norm = float(backend.finite_norm(tensor))  # one pass: finiteness and the norm
        if not math.isfinite(tensor_norm):
            if not backend.all_finite(tensor):
                return reject("non_finite", f"{name} holds NaN or infinite values")
            return reject("non_finite", "the delta's norm overflows")
        tensor_norms[name] = tensor_norm
    norm = math.sqrt(sum(n**2 for n in tensor_norms.values()))
    if not math.isfinite(norm):
        return reject("non_finite", "the delta's norm overflows")
    contribution = fetched.contribution
    limit = norm_limit(contribution.steps) if norm_limit is not None else None
    if limit is not None and norm > limit:
        return reject("outlier", f"delta norm {norm:.4g} exceeds {limit:.4g}, the bound from recent rounds and parameters")
    return Accepted(fetched.key, contribution, delta, fetched.weight, fetched.staleness, norm, tensor_norms)


def capped_weights(accepted: Sequence[Accepted], samples_per_step_cap: float | None) -> list[Accepted]:
    """The accepted contributions with samples capped at ``samples_per_step_cap`` × steps in
    their weights (weight = (cap·steps)²/steps · discount); unchanged without a cap."""
    if samples_per_step_cap is None:
        return list(accepted)
    out = []
    for a in accepted:
        steps, samples = a.contribution.steps, a.contribution.samples
        ceiling = samples_per_step_cap * steps
        if samples > ceiling * (1 + 1e-12):  # at the cap (the typical learner itself), not capped by rounding
            a = replace(a, weight=ceiling * ceiling / steps * staleness_discount(a.staleness))
        out.append(a)
    return out


def all_finite(backend: Backend, tensors: Mapping[str, Tensor]) -> bool:
    return all(backend.all_finite(t) for t in tensors.values())


@dataclass(frozen=True)
class RoundDraft:
    """A closed round, ready to commit: what ``close_round`` computed from the accepted
    contributions (the caller adds the round's bookkeeping: rejections, timing, the chain)."""

    participants: tuple[Accepted, ...]
    """The contributions merged, in merge order, with their capped weights."""
    params: dict[str, Tensor]
    """The parameters to commit (with ``update_quantization``, the compact ones)."""
    state: OuterState
    final: bool
    update: Mapping[str, UpdateParts] | None
    """The compact update's parts (runs with ``update_quantization`` or ``update_sparsity``), else None."""
    samples_per_step_cap: float | None
    non_finite: tuple[Rejection, ...] = ()
    """Contributions dropped, in order, because a merge with them was not finite."""
    merged_at: float = 0.0
    """``clock()`` when the last merge ended (the syncer's phase timings)."""
    stepped_at: float = 0.0
    """``clock()`` when the last outer step ended."""
    momentum: float | None = None
    """β the outer step used (``round_momentum``); the round record states it."""

    def participant_records(self) -> tuple[Participant, ...]:
        """The round record's ``participants``."""
        return tuple(
            Participant(
                learner=a.contribution.learner,
                contribution=a.key.record,
                steps=a.contribution.steps,
                samples=a.contribution.samples,
                weight=a.weight,
                carried_steps=a.contribution.carried_steps,
                staleness=a.staleness,
                realigned=a.contribution.realigned,
                norm=a.norm,
            )
            for a in self.participants
        )


@dataclass(frozen=True)
class AbandonedRound:
    """Every merge was non-finite down to the last contribution: nothing to commit, the round
    starts over with whatever arrives next."""

    non_finite: tuple[Rejection, ...]


def close_round(
    backend: Backend,
    spec: RunSpec,
    base: Base,
    accepted: Sequence[Accepted],
    samples_per_step_cap: float | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    summed: MergeSum | None = None,
) -> RoundDraft | AbandonedRound:
    """Merge the accepted deltas onto ``base`` and take the outer step: the one rule the live
    syncer commits by and ``replay_round`` recomputes (INV-4).

    Weights are capped at ``samples_per_step_cap`` × steps; while the result is not finite,
    the participant with the largest delta is dropped and the merge retried (a ``non_finite``
    rejection each, INV-12); with ``update_quantization`` the committed parameters are the
    base's plus the quantized change (INV-16). ``clock`` times the merge and the outer step.
    ``summed``: the round's merge summed as its contributions arrived (``merge_arithmetic=
    "streamed"``), used when it holds exactly the participants with their capped weights;
    otherwise the sum is taken here (the same bytes either way).
    """
    participants = capped_weights(accepted, samples_per_step_cap)
    non_finite: list[Rejection] = []
    while participants:
        merged, final = merge_round(backend, spec, participants, summed)
        merged_at = clock()
        momentum = round_beta(spec, participants)
        params, state = outer_step(backend, spec, base, merged, final, momentum)
        stepped_at = clock()
        if all_finite(backend, params) and all_finite(backend, state.momentum) and all_finite(backend, state.master):
            committed, state, update = compact_update_step(backend, spec, base, params, state)
            return RoundDraft(
                tuple(participants),
                committed,
                state,
                final,
                update,
                samples_per_step_cap,
                tuple(non_finite),
                merged_at,
                stepped_at,
                momentum,
            )
        worst = max(participants, key=lambda a: a.norm)
        participants = [a for a in participants if a is not worst]
        non_finite.append(
            Rejection(
                learner=worst.key.learner,
                contribution=worst.key.record,
                reason="non_finite",
                detail=f"the merge with this delta (norm {worst.norm:.4g}) was not finite",
            )
        )
    return AbandonedRound(tuple(non_finite))


def merge_round(
    backend: Backend, spec: RunSpec, accepted: Sequence[Accepted], summed: MergeSum | None = None
) -> tuple[MergedDelta, bool]:
    """The merge of ``close_round``: merged delta, final flag.

    The merged delta keeps RDA's final scale unapplied for the outer step to fold in; the
    norms validation measured are reused when every contribution carries all of them. With
    ``merge_arithmetic="streamed"`` the merge is a :class:`MergeSum` in merge order: ``summed``
    when it holds exactly these deltas and weights, else one taken here."""
    deltas = [a.delta for a in accepted]
    weights = [a.weight for a in accepted]
    known = all(set(a.tensor_norms) >= set(a.delta) for a in accepted)
    norms = [a.tensor_norms for a in accepted] if known else None
    final = all(a.contribution.final for a in accepted)
    merge = spec.algorithm.merge
    if spec.algorithm.merge_arithmetic == "normalized":
        return merge_tensors_scaled(merge, deltas, weights, backend, norms=norms), final
    if summed is None or not summed.holds(deltas, weights):
        summed = MergeSum.of(merge, backend, deltas, weights, norms)
    return summed.merged(), final


def round_sum(backend: Backend, spec: RunSpec) -> MergeSum | None:
    """An empty sum for a round to add its contributions to as they are accepted
    (:meth:`MergeSum.add`); None where the run merges with the normalized factors."""
    return MergeSum(spec.algorithm.merge, backend) if spec.algorithm.merge_arithmetic == "streamed" else None


def round_beta(spec: RunSpec, participants: Sequence[Accepted]) -> float:
    """The β of the outer step of a round merging ``participants`` (their weights as capped):
    the run's ``momentum_rule`` applied to what the round merges (INV-18)."""
    work = [MergedWork(a.weight, a.contribution.steps, a.contribution.carried_steps, a.staleness) for a in participants]
    return round_momentum(spec.algorithm.outer_momentum, spec.algorithm.momentum_rule, work)


def outer_step(
    backend: Backend, spec: RunSpec, base: Base, merged: Mapping[str, Tensor], final: bool, momentum: float
) -> tuple[dict[str, Tensor], OuterState]:
    """The outer step of ``close_round``: the Nesterov outer step on the merged delta, with
    the round's β (``round_momentum``)."""
    outer = NesterovOuter(lr=spec.algorithm.outer_lr, momentum=momentum)
    return outer.step(backend, base.params, base.state, merged, final=final)


def compact_update_step(
    backend: Backend, spec: RunSpec, base: Base, params: Mapping[str, Tensor], state: OuterState
) -> tuple[dict[str, Tensor], OuterState, dict[str, UpdateParts] | None]:
    """With ``update_quantization`` or ``update_sparsity`` (``backends/compact.py``): the
    parameters to commit are the base's plus the compact change towards the outer step's result
    (quantized, or its largest elements), so a learner holding the base rebuilds them from
    the compact update alone; the exact result stays in the outer state as the fp32 master
    (the next outer step starts from it, so no rounding accumulates). Without it: unchanged.
    NumPy on host copies, so every backend commits the same bytes."""
    codec = spec.algorithm.update_codec
    if codec is None:
        return dict(params), state, None
    committed: dict[str, Tensor] = {}
    parts: dict[str, UpdateParts] = {}
    masters = dict(state.master)
    for name, value in params.items():
        target = state.master.get(name, value)  # fp32: the master, or the fp32 params themselves
        old = backend.to_numpy(base.params[name])
        parts[name], rebuilt = compact_update(old, backend.to_numpy(target), codec)
        committed[name] = backend.from_numpy(rebuilt)
        masters[name] = target
    return committed, OuterState(momentum=state.momentum, master=masters), parts


def replay_round(store: RunStore, backend: Backend, spec: RunSpec, fragment: int, version: int) -> dict[str, Tensor]:
    """Recompute ``version``'s parameters (``replayed_draft``)."""
    return replayed_draft(store, backend, spec, fragment, version).params


def replayed_draft(store: RunStore, backend: Backend, spec: RunSpec, fragment: int, version: int) -> RoundDraft:
    """Recompute ``version`` from ``version − 1`` and the participants its record lists with
    ``close_round``, the function the live syncer committed it by (INV-4).

    Raises:
        GradientMailError: version 0 (it has no inputs); ``CorruptPayload`` when a participant
            no longer validates, the record's merge is not the manifest's, or the merge is not
            finite or not weighted as the record says.
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
    draft = close_round(backend, spec, base, accepted, record.samples_per_step_cap)
    if isinstance(draft, AbandonedRound) or draft.non_finite:  # a committed round was finite: not its inputs
        raise CorruptPayload(f"fragment {fragment} version {version}: the replayed merge is not finite")
    for participant, outcome in zip(record.participants, draft.participants, strict=True):
        if outcome.weight != participant.weight:
            raise CorruptPayload(
                f"participant {participant.contribution}: weight {outcome.weight!r}, the record says {participant.weight!r}"
            )
    return draft
