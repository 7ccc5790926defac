"""A learner's quantized or sparse contribution, with error feedback across its rounds.

What a contribution's codes cannot carry (the residual, fp32) is kept on the fragment and added
to its next contribution, but only when the round merged the contribution it belongs to: work the
round did not merge is re-sent whole by the carry (or dropped with it), so its residual goes too.
Both rules live here, beside the exchange that calls them; the residual lives on the fragment's
:class:`~gradientmail.session.fragment.LearnerFragment`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gradientmail.algorithms import align
from gradientmail.backends.quantize import Codec, quantize, quantize_with_feedback
from gradientmail.backends.quantized_payload import encode_parts, encode_sparse_parts
from gradientmail.backends.sparse import SparseCodec, sparsify, sparsify_with_feedback
from gradientmail.session.fragment import LearnerFragment, Residual

__all__ = ["encode_delta", "settle_residual"]


def encode_delta(
    codec: Codec | SparseCodec,
    fragment: LearnerFragment,
    anchor_version: int,
    delta: Mapping[str, np.ndarray],
    *,
    feedback: bool,
) -> bytes:
    """The quantized (or sparse) payload of ``delta``; with ``feedback``, plus the residual of the
    fragment's previous contribution when its round merged it, and the new residual kept on the
    fragment for the next one."""
    previous, fragment.residual = fragment.residual, None
    carried = previous.arrays if previous is not None and previous.merged else {}
    left: dict[str, np.ndarray] = {}
    if isinstance(codec, SparseCodec):
        sparse: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for name, value in delta.items():
            if feedback:
                offsets, codes, scales, left[name] = sparsify_with_feedback(value, carried.get(name), codec)
                sparse[name] = (offsets, codes, scales)
            else:
                sparse[name] = sparsify(value, codec)
        data = encode_sparse_parts(sparse, codec)
    else:
        parts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, value in delta.items():
            if feedback:
                codes, scales, left[name] = quantize_with_feedback(value, carried.get(name), codec)
            else:
                codes, scales = quantize(value, codec)
            parts[name] = (codes, scales)
        data = encode_parts(parts, codec)
    if feedback:
        fragment.residual = Residual(anchor_version, left)
    return data


def settle_residual(fragment: LearnerFragment, known: int, ours: bool) -> None:
    """A commit built on ``known`` arrived (``ours``: it lists our contribution): the residual of a
    contribution against ``known`` is kept for the next one if the round merged it, else dropped
    (one not yet due stays)."""
    residual = fragment.residual
    if residual is None or residual.merged or residual.anchor_version > known:
        return
    if align.contribution_merged(ours, residual.anchor_version, known):
        residual.merged = True
    else:
        fragment.residual = None
