"""Contribution weights and the merges: weighted mean, radial-directional averaging and Iso-C.

Formulas and the numbers they must reproduce are in the merge note (docs/algorithms.md).
Every function is written once against :class:`~gradientmail.backends.Backend`; the
backend is taken from the tensors unless given.

Passes over the deltas (issue 13). Both merges are one fused combination ``Σ fᵢΔᵢ``
(:meth:`Backend.combine`) with different factors: the weighted mean uses ``fᵢ = wᵢ/W``;
RDA uses ``fᵢ = (wᵢ/W)/‖Δᵢ‖``, which gives ``u`` directly, with ``‖u‖²`` accumulated in the
same pass (:meth:`Backend.combine_sumsq`); the result is ``(r̄/‖u‖)·u``. RDA needs the norms
‖Δᵢ‖ first: the syncer's validation already took them (``finite_norm``, the same pass that
checks finiteness), and :func:`merge_tensors_scaled` accepts them, so a round's RDA reads
each delta once; standalone it takes them itself (a second pass). :func:`merge_tensors_scaled`
also leaves the final scale ``r̄/‖u‖`` unapplied (a :class:`MergedDelta`) so the outer step
folds it into its own single pass. :func:`merge_tensors`, :func:`rda` and
:func:`weighted_mean` apply it and return plain tensors, with the same results as before.

Summed as contributions arrive (issue 25, ``DiLoCo.merge_arithmetic="streamed"``). The
factors above need ``W``, known only when the round closes, so every merge waits for the last
contribution. :class:`MergeSum` instead adds each contribution as it is accepted with a factor
that needs no ``W`` (``wᵢ/w₁``, or ``(wᵢ/w₁)/‖Δᵢ‖`` for RDA; ``w₁`` the first weight, which keeps
the sum at the deltas' scale) and leaves ``1/W`` (RDA: ``r̄/‖A‖``, taken in one pass over the sum
``A``) to the final scale the outer step folds in. The sum is defined term by term in merge
order; a sum built as contributions arrive and one combined at once are the same bytes
(:meth:`Backend.accumulate`), which is what lets replay reproduce a streamed round. Runs whose
manifest predates the field keep the normalized factors (``"normalized"``), so their rounds
still replay to their bytes.

Iso-C (issue 14) is the weighted mean followed by one isotropic step per matrix; its mean
singular value is the unapplied scale, its ``U·Vᵀ`` the tensor (:meth:`IsoC.isotropic`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator

from gradientmail.algorithms.config_base import FrozenConfig
from gradientmail.backends import Backend, Tensor, backend_for
from gradientmail.errors import ContributionRejected, InvalidConfig

NORM_FLOOR = 1e-12
"""φ(x) = x / max(‖x‖, NORM_FLOOR): keeps a zero delta at zero instead of dividing by zero."""


def weight(steps: int, samples: int) -> float:
    """Contribution weight samples² / steps (Decoupled DiLoCo's "quantity × quality").

    The counts are squared as exact integers before the one division, so the note's table
    (A 786,432; B 393,216; C 196,608) comes out exactly. Raises ``ContributionRejected``
    with reason ``zero_steps`` for zero steps and ``invalid_counts`` for negative or
    non-integer counts.
    """
    for label, value in (("steps", steps), ("samples", samples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ContributionRejected("invalid_counts", f"{label} must be a non-negative integer, got {value!r}")
    if steps == 0:
        raise ContributionRejected("zero_steps", "a contribution with zero steps carries no training")
    return (samples * samples) / steps


def staleness_discount(staleness: int) -> float:
    """The factor on the weight of a delta based ``staleness`` versions before its round's base:
    1/(1 + staleness), as asynchronous Local-SGD discounts late updates (1 for a fresh one)."""
    if staleness < 0:
        raise ValueError(f"staleness must be non-negative, got {staleness}")
    return 1.0 / (1 + staleness)


def normalized(weights: Sequence[float]) -> list[float]:
    """Weights divided by their sum, in Python floats (before any tensor is scaled)."""
    values = [float(w) for w in weights]
    if not values:
        raise ValueError("a merge needs at least one contribution")
    if any(not (w >= 0.0) or w == float("inf") for w in values):
        raise ValueError(f"weights must be finite and non-negative, got {values}")
    total = sum(values)
    if total <= 0.0:
        raise ValueError("the contribution weights sum to zero")
    return [w / total for w in values]


def weighted_mean(deltas: Sequence[Tensor], weights: Sequence[float], backend: Backend | None = None) -> Tensor:
    """Δ = Σ wᵢΔᵢ / W for one tensor, in fp32."""
    _check_lengths(deltas, weights)
    backend = backend or backend_for(deltas[0])
    return backend.combine(list(deltas), normalized(weights))


def rda(
    deltas: Sequence[Tensor],
    weights: Sequence[float],
    backend: Backend | None = None,
    *,
    norms: Sequence[float] | None = None,
) -> Tensor:
    """Radial-directional average of one tensor: mean length r̄ on the mean direction φ(u).

    r̄ = Σ wᵢ‖Δᵢ‖ / W and u = Σ wᵢ φ(Δᵢ) / W; the result is r̄ φ(u), zero when u is zero.
    ``norms`` are the ‖Δᵢ‖ when already known (``Backend.finite_norm`` of each delta).
    """
    _check_lengths(deltas, weights)
    backend = backend or backend_for(deltas[0])
    direction, factor = rda_unscaled(deltas, weights, backend, norms=norms)
    return backend.scale(direction, factor)


def rda_unscaled(
    deltas: Sequence[Tensor],
    weights: Sequence[float],
    backend: Backend | None = None,
    *,
    norms: Sequence[float] | None = None,
) -> tuple[Tensor, float]:
    """RDA as ``(u, r̄/max(‖u‖, floor))``: the result is their product. One pass over the
    deltas when ``norms`` are given, two when they are taken here."""
    _check_lengths(deltas, weights)
    backend = backend or backend_for(deltas[0])
    shares = normalized(weights)
    if norms is None:
        norms = [backend.finite_norm(delta) for delta in deltas]
    elif len(norms) != len(deltas):
        raise ValueError(f"{len(deltas)} deltas but {len(norms)} norms")
    mean_length = sum(share * norm for share, norm in zip(shares, norms, strict=True))
    factors = [share / max(norm, NORM_FLOOR) for share, norm in zip(shares, norms, strict=True)]
    direction, sumsq = backend.combine_sumsq(list(deltas), factors)
    return direction, mean_length / max(math.sqrt(sumsq), NORM_FLOOR)


def _check_lengths(deltas: Sequence[Tensor], weights: Sequence[float]) -> None:
    if len(deltas) != len(weights):
        raise ValueError(f"{len(deltas)} deltas but {len(weights)} weights")
    if not deltas:
        raise ValueError("a merge needs at least one contribution")


class WeightedMean(FrozenConfig):
    """Merge every tensor with the weighted mean (what the Pythia-14M run used)."""

    kind: Literal["weighted_mean"] = "weighted_mean"

    def uses_weighted_mean(self, tensor_name: str) -> bool:
        return True


class Rda(FrozenConfig):
    """The default merge: RDA, except the weighted mean for tensors named like ``direct_pattern``.

    A tensor whose lowercased name contains ``direct_pattern`` takes the weighted mean
    (the paper's treatment of embeddings). The pattern itself is not lowercased, so one
    with capitals matches nothing. ``None`` applies RDA to every tensor.
    """

    kind: Literal["rda"] = "rda"
    direct_pattern: str | None = Field(default="embed", min_length=1)

    def uses_weighted_mean(self, tensor_name: str) -> bool:
        return self.direct_pattern is not None and self.direct_pattern in tensor_name.lower()


class IsoC(FrozenConfig):
    """Iso-C / IsoLoCo: the weighted mean, with every matrix's singular values replaced by their mean.

    Per tensor: Δ = Σ wᵢΔᵢ / W; a tensor of ≥ 2 dims (viewed as ``(shape[0], -1)``, so a
    conv kernel is ``(out, in·kh·kw)``) becomes ``mean(sigma)·U·Vᵀ`` over its non-zero singular
    values; 0-d and 1-D tensors, and tensors named like ``direct_pattern`` (as for
    :class:`Rda`), keep the weighted mean. The outer step is Nesterov, as for every merge.

    ``form="exact"`` takes a float64 SVD (the definition; backends agree within 1e-5).
    ``form="fast"`` orthogonalises by Newton–Schulz in fp32: ``ns_steps`` steps with Muon's
    quintic coefficients, then ``polish_steps`` cubic steps that converge the singular values
    to 1; ``fast_scale`` picks the mean-singular-value estimate: ``"mean"`` (⟨O, Δ⟩/‖O‖², the
    nuclear norm over the rank once O is orthogonal) or ``"rms"`` (the paper's ‖Δ‖_F/√min(m, n),
    larger than the mean on any non-flat spectrum). Measured gaps: docs/algorithms.md.
    """

    kind: Literal["iso_c"] = "iso_c"
    form: Literal["exact", "fast"] = "exact"
    direct_pattern: str | None = Field(default=None, min_length=1)
    """None (default): every matrix, embeddings too (measured better: docs/algorithms.md)."""
    ns_steps: int = Field(default=6, ge=0, le=100)
    polish_steps: int = Field(default=3, ge=0, le=100)
    fast_scale: Literal["mean", "rms"] = "mean"

    def uses_weighted_mean(self, tensor_name: str) -> bool:
        return self.direct_pattern is not None and self.direct_pattern in tensor_name.lower()

    @field_validator("polish_steps")
    @classmethod
    def _fast_form_iterates(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("form") == "fast" and info.data.get("ns_steps") == 0 and value == 0:
            raise ValueError("the fast form needs at least one Newton–Schulz step (ns_steps + polish_steps > 0)")
        return value

    def isotropic(self, backend: Backend, mean: Tensor) -> tuple[Tensor, float]:
        """``(direction, scale)`` of the isotropic form of one merged matrix (≥ 2 dims)."""
        if self.form == "exact":
            return backend.isotropic_exact(mean)
        return backend.isotropic_fast(mean, ns_steps=self.ns_steps, polish_steps=self.polish_steps, scale=self.fast_scale)


ISO_C_OUTER_LR = 1.4
ISO_C_OUTER_MOMENTUM = 0.8
"""Outer step of a run merging with Iso-C when the run does not set one: the best of our sweep
(lr 0.7–2.4 × momentum 0.7–0.9, docs/algorithms.md); Iso-C's flattened spectrum moves less
than the mean delta it replaces, so it wants a larger outer step than DiLoCo's 0.7 / 0.9."""

Merge = Rda | WeightedMean | IsoC
"""Any merge configuration."""

MergeArithmetic = Literal["normalized", "streamed"]
"""How a round's merge is summed (``DiLoCo.merge_arithmetic``): ``normalized`` — factors
``wᵢ/W`` once every contribution is in (:func:`merge_tensors_scaled`); ``streamed`` — a
:class:`MergeSum` added to as contributions arrive."""

MergeConfig = Annotated[Merge, Field(discriminator="kind")]
"""The merge field of :class:`~gradientmail.algorithms.diloco.DiLoCo` (manifest: ``{"kind": …}``)."""

MERGE_KINDS = ("rda", "weighted_mean", "iso_c")


def merge_from_manifest(form: Mapping[str, object]) -> Merge:
    """The merge configuration for its manifest form; unknown kinds name the field."""
    kind = form.get("kind") if isinstance(form, Mapping) else None
    if kind == "rda":
        return Rda.from_manifest(form)
    if kind == "weighted_mean":
        return WeightedMean.from_manifest(form)
    if kind == "iso_c":
        return IsoC.from_manifest(form)
    raise InvalidConfig("merge.kind", f"unknown merge kind {kind!r}; expected one of {list(MERGE_KINDS)}")


class MergedDelta(Mapping[str, Tensor]):
    """A merged fragment delta held as an fp32 tensor and a scale per name (value = scale·tensor).

    Reading an item multiplies them out (a pass over that tensor); the outer step reads
    :meth:`unscaled` instead and folds the scale into its own pass.
    """

    def __init__(self, backend: Backend, parts: Mapping[str, tuple[Tensor, float]]) -> None:
        self.backend = backend
        self._parts = dict(parts)

    def unscaled(self, name: str) -> tuple[Tensor, float]:
        return self._parts[name]

    def __getitem__(self, name: str) -> Tensor:
        tensor, factor = self._parts[name]
        return tensor if factor == 1.0 else self.backend.scale(tensor, factor)

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)


def merge_tensors_scaled(
    merge: Merge,
    deltas: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    backend: Backend | None = None,
    *,
    norms: Sequence[Mapping[str, float]] | None = None,
) -> MergedDelta:
    """Merge a fragment, leaving RDA's final scale to the consumer (see :class:`MergedDelta`).

    ``norms``: per contribution, ``Backend.finite_norm`` of each of its tensors (what the
    syncer's validation measured); without them RDA takes the norms itself (same values).
    """
    if not deltas:
        raise ValueError("a merge needs at least one contribution")
    names = list(deltas[0])
    for index, delta in enumerate(deltas[1:], start=1):
        if set(delta) != set(names):
            raise ValueError(f"contribution {index} holds tensors {sorted(delta)}, expected {sorted(names)}")
    if norms is not None and len(norms) != len(deltas):
        raise ValueError(f"{len(deltas)} contributions but {len(norms)} sets of norms")
    backend = backend or backend_for(deltas[0][names[0]])
    parts: dict[str, tuple[Tensor, float]] = {}
    for name in names:
        column = [delta[name] for delta in deltas]
        if merge.uses_weighted_mean(name):
            parts[name] = (weighted_mean(column, weights, backend), 1.0)
        elif isinstance(merge, IsoC):
            mean = weighted_mean(column, weights, backend)
            parts[name] = merge.isotropic(backend, mean) if len(backend.shape(mean)) >= 2 else (mean, 1.0)
        else:
            known = [n[name] for n in norms] if norms is not None else None
            parts[name] = rda_unscaled(column, weights, backend, norms=known)
    return MergedDelta(backend, parts)


def merge_tensors(
    merge: Merge,
    deltas: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    backend: Backend | None = None,
) -> dict[str, Tensor]:
    """Merge a fragment: one delta mapping per contribution, the same weights for every tensor."""
    merged = merge_tensors_scaled(merge, deltas, weights, backend)
    return {name: merged[name] for name in merged}


class MergeSum:
    """A fragment's merge summed as contributions arrive, in merge order (``"streamed"``).

    Per tensor the running sum is ``A = Σ fᵢ·Δᵢ`` in fp32, added term by term: ``fᵢ = wᵢ/w₁``
    for the weighted mean and Iso-C, ``(wᵢ/w₁)/max(‖Δᵢ‖, floor)`` for RDA (``w₁`` the first
    positive weight; the merge's result does not depend on it, only the sum's scale). What
    needs every weight is taken by :meth:`merged`: the weighted mean is ``A`` times ``w₁/W``,
    RDA ``A`` times ``r̄/‖A‖`` (``r̄ = Σ wᵢ‖Δᵢ‖/W``; one pass over ``A``), Iso-C the isotropic
    form of ``A`` with its scale times ``w₁/W``. The sums are owned here and added to in place,
    so a draft's merged delta stops being valid once another contribution is added.
    """

    def __init__(self, merge: Merge, backend: Backend) -> None:
        self.merge = merge
        self.backend = backend
        self._sums: dict[str, Tensor] = {}
        self._lengths: dict[str, float] = {}  # RDA tensors: Σ (wᵢ/w₁)·‖Δᵢ‖, in order
        self._terms: list[tuple[Mapping[str, Tensor], float]] = []
        self._reference = 0.0
        self._total = 0.0  # Σ wᵢ/w₁, in order

    @classmethod
    def of(
        cls,
        merge: Merge,
        backend: Backend,
        deltas: Sequence[Mapping[str, Tensor]],
        weights: Sequence[float],
        norms: Sequence[Mapping[str, float]] | None = None,
    ) -> MergeSum:
        """Every term at once: one :meth:`Backend.combine` pass per tensor, the bytes of adding
        them one by one."""
        _check_lengths(deltas, weights)
        if norms is not None and len(norms) != len(deltas):
            raise ValueError(f"{len(deltas)} contributions but {len(norms)} sets of norms")
        summed = cls(merge, backend)
        factors = [
            summed._admit(delta, value, None if norms is None else norms[index])
            for index, (delta, value) in enumerate(zip(deltas, weights, strict=True))
        ]
        for name in deltas[0]:
            summed._sums[name] = backend.combine([delta[name] for delta in deltas], [f[name] for f in factors])
        return summed

    def add(self, delta: Mapping[str, Tensor], weight_value: float, norms: Mapping[str, float] | None = None) -> None:
        """Add one contribution's delta with its weight (and, for RDA, the ‖Δᵢ‖ per tensor that
        validation measured; measured here otherwise). The delta is kept by reference to
        recognise the terms (:meth:`holds`), never written."""
        for name, factor in self._admit(delta, weight_value, norms).items():
            total = self._sums.get(name)
            tensor = delta[name]
            self._sums[name] = (
                self.backend.combine([tensor], [factor]) if total is None else self.backend.accumulate(total, tensor, factor)
            )

    def holds(self, deltas: Sequence[Mapping[str, Tensor]], weights: Sequence[float]) -> bool:
        """Whether this sum is of exactly these deltas with these weights, in this order."""
        return len(deltas) == len(self._terms) and all(
            delta is held and float(value) == held_weight
            for delta, value, (held, held_weight) in zip(deltas, weights, self._terms, strict=True)
        )

    def merged(self) -> MergedDelta:
        """The merge of the terms so far, its final scale unapplied (:class:`MergedDelta`)."""
        if not self._terms:
            raise ValueError("a merge needs at least one contribution")
        if self._total <= 0.0:
            raise ValueError("the contribution weights sum to zero")
        backend, parts = self.backend, {}
        for name, total in self._sums.items():
            if name in self._lengths:
                mean_length = self._lengths[name] / self._total
                direction_norm = backend.finite_norm(total) / self._total
                parts[name] = (total, mean_length / max(direction_norm, NORM_FLOOR) / self._total)
            elif isinstance(self.merge, IsoC) and not self.merge.uses_weighted_mean(name) and len(backend.shape(total)) >= 2:
                direction, factor = self.merge.isotropic(backend, total)
                parts[name] = (direction, factor / self._total)
            else:
                parts[name] = (total, 1.0 / self._total)
        return MergedDelta(backend, parts)

    def _admit(self, delta: Mapping[str, Tensor], weight_value: float, norms: Mapping[str, float] | None) -> dict[str, float]:
        """Record one term; its factor per tensor."""
        value = float(weight_value)
        if not (value >= 0.0) or value == float("inf"):
            raise ValueError(f"weights must be finite and non-negative, got {value}")
        if self._terms and set(delta) != set(self._terms[0][0]):
            raise ValueError(
                f"contribution {len(self._terms)} holds tensors {sorted(delta)}, expected {sorted(self._terms[0][0])}"
            )
        if self._reference == 0.0 and value > 0.0:
            self._reference = value
        share = value / self._reference if self._reference > 0.0 else 0.0
        self._terms.append((delta, value))
        self._total += share
        factors: dict[str, float] = {}
        for name, tensor in delta.items():
            if isinstance(self.merge, Rda) and not self.merge.uses_weighted_mean(name):
                length = norms[name] if norms is not None and name in norms else self.backend.finite_norm(tensor)
                self._lengths[name] = self._lengths.get(name, 0.0) + share * length
                factors[name] = share / max(length, NORM_FLOOR)
            else:
                factors[name] = share
        return factors
