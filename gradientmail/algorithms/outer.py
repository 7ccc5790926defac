"""The outer optimizer: Nesterov momentum on merged deltas, with fp32 state.

For a fragment with parameters θ (the committed anchor), momentum m and merged delta Δ
(anchor − local, so it points *against* the update direction, like a gradient):

    m ← β·m + Δ
    θ ← θ − η·(Δ + β·m)

From zero momentum the first step moves θ by η(1 + β)Δ = 1.33Δ with the defaults η = 0.7,
β = 0.9. A round made only of final contributions (flush on close) applies θ ← θ − Δ and
leaves the momentum as it was. Parameters stored in bf16/fp16 keep an fp32 master copy in
the outer state, so rounding to the storage dtype never accumulates across rounds.

Each tensor takes one fused pass (:meth:`Backend.outer_update`) that reads θ, m and Δ once and
writes new θ' and m'. A :class:`~gradientmail.algorithms.merge.MergedDelta` passes its
unapplied scale (RDA's r̄/‖u‖) into that pass instead of costing one of its own; the
arithmetic is the same (``fp32(s·u)`` first), so the bytes match stepping on the scaled delta.

β per round (``DiLoCo.momentum_rule``): a learner that trains on while its round closes
publishes work computed on a model older than the base it is applied to (its carried steps);
momentum on such delayed deltas overshoots, since the deltas do not yet reflect the steps the
momentum already took (asynchrony acts as momentum of its own: Mitliagkas et al. 2016). The
``damped`` rule scales β by the share of the merged work trained on the round's base
(:func:`round_momentum`); with no carried work — lock-step rounds — it is β itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gradientmail.algorithms.merge import MergedDelta
from gradientmail.backends import Backend, Tensor

LOW_PRECISION_DTYPES = frozenset({"bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"})

MomentumRule = Literal["damped", "fixed"]
"""β of each round's outer step (``DiLoCo.momentum_rule``): ``damped`` — ``outer_momentum`` ×
the fresh share of the merged work (:func:`round_momentum`); ``fixed`` — ``outer_momentum``."""


@dataclass(frozen=True)
class MergedWork:
    """What the momentum rule reads of one merged contribution (all in its round record)."""

    weight: float
    steps: int
    carried_steps: int
    staleness: int = 0


def fresh_share(work: Sequence[MergedWork]) -> float:
    """The share of the merged work trained on the round's base, weighted as the merge weights
    it: a contribution's steps less those carried across its alignment, none of a stale one's
    (based on an older version). 1 with nothing carried, or nothing weighed."""
    total = sum(w.weight for w in work)
    if total <= 0:
        return 1.0
    fresh = 0.0
    for w in work:
        if w.staleness == 0 and w.steps > 0:
            fresh += w.weight * (w.steps - min(w.carried_steps, w.steps)) / w.steps
        elif w.staleness == 0:
            fresh += w.weight
    return min(1.0, fresh / total)


def round_momentum(momentum: float, rule: MomentumRule, work: Sequence[MergedWork]) -> float:
    """β for one round's outer step: the one rule the syncer steps by and replay recomputes."""
    return momentum if rule == "fixed" else momentum * fresh_share(work)


@dataclass
class OuterState:
    """Per-fragment outer optimizer state; fp32 tensors keyed by parameter name."""

    momentum: dict[str, Tensor] = field(default_factory=dict)
    master: dict[str, Tensor] = field(default_factory=dict)
    """fp32 master copies, only for parameters stored in a low-precision dtype."""

    @classmethod
    def zeros(cls, backend: Backend, params: Mapping[str, Tensor]) -> OuterState:
        """Zero momentum (and fp32 masters where needed) for a fragment's first version."""
        state = cls()
        for name, value in params.items():
            state.momentum[name] = backend.zeros_like(value)
            if backend.dtype_name(value) in LOW_PRECISION_DTYPES:
                state.master[name] = backend.to_fp32(value)
        return state

    def to_tensors(self) -> dict[str, Tensor]:
        """Flat mapping for a payload: ``momentum/<name>`` and ``master/<name>``."""
        flat = {f"momentum/{name}": value for name, value in self.momentum.items()}
        flat.update({f"master/{name}": value for name, value in self.master.items()})
        return flat

    @classmethod
    def from_tensors(cls, flat: Mapping[str, Tensor]) -> OuterState:
        state = cls()
        for key, value in flat.items():
            kind, _, name = key.partition("/")
            if kind == "momentum":
                state.momentum[name] = value
            elif kind == "master":
                state.master[name] = value
            else:
                raise ValueError(f"unexpected outer-state tensor {key!r}")
        return state


@dataclass(frozen=True)
class NesterovOuter:
    """Nesterov momentum with the DiLoCo defaults (lr 0.7, momentum 0.9)."""

    lr: float = 0.7
    momentum: float = 0.9

    def step(
        self,
        backend: Backend,
        params: Mapping[str, Tensor],
        state: OuterState,
        delta: Mapping[str, Tensor],
        *,
        final: bool = False,
    ) -> tuple[dict[str, Tensor], OuterState]:
        """New parameters (in each parameter's own dtype) and the new outer state.

        ``final`` marks a round made only of final contributions: θ − Δ, momentum kept.
        """
        new_params: dict[str, Tensor] = {}
        new_state = OuterState()
        for name, value in params.items():
            dtype = backend.dtype_name(value)
            theta = state.master.get(name, value)
            grad, factor = delta.unscaled(name) if isinstance(delta, MergedDelta) else (delta[name], 1.0)
            momentum = state.momentum.get(name)
            if momentum is None:
                momentum = backend.zeros_like(value)
            new_theta, new_momentum = backend.outer_update(
                theta, momentum, grad, lr=self.lr, beta=self.momentum, delta_scale=factor, final=final
            )
            new_state.momentum[name] = new_momentum
            if dtype in LOW_PRECISION_DTYPES:
                new_state.master[name] = new_theta
            new_params[name] = new_theta if dtype == "float32" else backend.cast(new_theta, dtype)
        return new_params, new_state
