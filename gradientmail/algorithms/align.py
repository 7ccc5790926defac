"""The learner's two pieces of arithmetic: the delta it publishes and the parameters it aligns to.

Written once against :class:`~gradientmail.backends.Backend`, so PyTorch and MLX learners
compute them alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gradientmail.backends import Backend, Tensor

__all__ = ["aligned_parameters", "carried_parameters", "pseudo_gradient"]


def pseudo_gradient(
    backend: Backend, anchor: Mapping[str, Tensor], local: Mapping[str, Tensor], dtype_of: Callable[[str], str]
) -> dict[str, Tensor]:
    """Δ = anchor − local for every tensor of a fragment, in the dtype it travels in.

    Computed in fp32, then cast (``dtype_of(name)``: the run's ``delta_dtype`` or the
    parameter's own).
    """
    return {name: backend.cast(backend.sub(anchor[name], local[name]), dtype_of(name)) for name in anchor}


def aligned_parameters(
    backend: Backend, local: Mapping[str, Tensor], committed: Mapping[str, Tensor], mixing: float
) -> Mapping[str, Tensor]:
    """What a fragment's parameters become when the learner aligns with a commit.

    ``mixing = 0`` (the guide's default) replaces them with the committed values; ``α > 0``
    keeps a share of the local ones, θ ← α·θ_local + (1 − α)·θ_commit (Streaming DiLoCo).
    """
    if mixing == 0:
        return committed
    return {
        name: backend.add(backend.scale(local[name], mixing), backend.scale(committed[name], 1 - mixing)) for name in committed
    }


def carried_parameters(
    backend: Backend, committed: Mapping[str, Tensor], start: Mapping[str, Tensor], local: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """A commit with the learner's unmerged work carried onto it: θ_commit − (θ_start − θ_local).

    ``start`` is where the unmerged work began: the anchor when the commit merged nothing of
    this learner's, or the parameters it published when it merged that contribution. The
    learner's next delta against the commit (θ_commit − θ) is then exactly that work plus
    what it trains next, so nothing it trained is lost (DiLoCo.carry_unmerged).
    """
    return {name: backend.sub(committed[name], backend.sub(start[name], local[name])) for name in committed}
