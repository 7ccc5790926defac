"""Decoupled DiLoCo: the algorithm configuration and the functions of the merge note.

``weight``, ``weighted_mean`` and ``rda`` live in :mod:`gradientmail.algorithms.merge`
and are re-exported here, where the merge note names them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from gradientmail.algorithms.config_base import FrozenConfig
from gradientmail.algorithms.fragments import FragmentLayout
from gradientmail.algorithms.merge import (
    ISO_C_OUTER_LR,
    ISO_C_OUTER_MOMENTUM,
    IsoC,
    MergeArithmetic,
    MergeConfig,
    Rda,
    WeightedMean,
    merge_tensors,
    rda,
    weight,
    weighted_mean,
)
from gradientmail.algorithms.outer import MomentumRule, NesterovOuter
from gradientmail.backends.payload import FLOAT_DTYPES
from gradientmail.backends.quantize import DEFAULT_BLOCK, Codec, QuantFormat
from gradientmail.backends.sparse import DEFAULT_CHUNK, SparseCodec

__all__ = ["DiLoCo", "Rda", "WeightedMean", "IsoC", "weight", "weighted_mean", "rda", "merge_tensors", "RUN_FIELDS"]

GraceRule = Literal["slack", "arrivals", "live"]
"""How the syncer sizes the wait after quorum (``DiLoCo.grace_rule``)."""
SyncerLayout = Literal["one", "spread"]
PayloadCompression = Literal["none", "zstd"]
"""How contributions and commits are stored (``DiLoCo.payload_compression``)."""
"""Which nodes close rounds (``DiLoCo.syncer_layout``)."""

RUN_FIELDS = (
    "sync_every",
    "fragments",
    "fragment_layout",
    "global_batch_size",
    "merge",
    "outer_lr",
    "outer_momentum",
    "quorum_size",
    "max_staleness",
    "delta_dtype",
    "delta_quantization",
    "update_quantization",
    "quantization_block",
    "delta_sparsity",
    "update_sparsity",
    "sparsity_chunk",
    "payload_compression",
    "grace_gamma",
    "grace_tau",
    "grace_max_s",
    "grace_rule",
    "grace_periods",
    "momentum_rule",
    "syncer_layout",
)
"""Fields every node of a run must share (compared against the manifest on join).

The rest (``in_flight``, ``overlap_steps``, ``mixing``, ``carry_unmerged``, ``max_carried_steps``,
``flush_on_close``, ``error_feedback``) shape one
learner's own loop, so a Mac learner and a GPU learner may set them differently.
"""


class DiLoCo(FrozenConfig):
    """Every knob of the exchange, with the guide's defaults; invalid values name the field.

    Standard DiLoCo and Local SGD are configurations of this class; see
    :meth:`standard` and :meth:`local_sgd`.
    """

    sync_every: int = Field(default=100, gt=0)
    """Nominal local steps between two exchanges of the same fragment (H)."""
    fragments: int = Field(default=1, gt=0)
    """Number of fragments (P), exchanged staggered across ``sync_every``."""
    global_batch_size: int | None = Field(default=None, gt=0)
    """A batch the live learners share (``Session.batch_size`` is each one's part, following
    the count of training learners as they join and leave); None: each learner chooses its own."""
    fragment_layout: FragmentLayout = "by_bytes"
    """How parameters are grouped into the fragments: ``by_bytes`` (balanced bin packing,
    Decoupled DiLoCo's) or ``strided`` (the model's numbered blocks dealt round the fragments,
    block j to fragment j mod P: Streaming DiLoCo's). The plan is recorded in the manifest."""
    merge: MergeConfig = Field(default_factory=Rda)
    """How the syncer merges accepted deltas: ``Rda()`` (default), ``WeightedMean()`` or ``IsoC()``."""
    outer_lr: float = Field(default=0.7, gt=0)
    """Nesterov outer learning rate η (with ``merge=IsoC()``: 1.4 unless set)."""
    outer_momentum: float = Field(default=0.9, ge=0, lt=1)
    """Nesterov outer momentum β; 0 disables momentum (with ``merge=IsoC()``: 0.8 unless set)."""
    syncer_layout: SyncerLayout = "one"
    """Which nodes close rounds (docs/protocol.md, "The syncer's load spread over the nodes"):
    ``one`` (the default) — the elected syncer closes every fragment's; ``spread`` — the elected
    node assigns each fragment to one of the live nodes that run a syncer (largest fragment to the
    least-loaded node, ``syncer.assignment``), announces the assignment in its bulletin, and each
    node closes the rounds of its own fragments, so with N such nodes each downloads and uploads
    about 1/N of the syncer's bytes."""
    momentum_rule: MomentumRule = "damped"
    """β of each round (docs/algorithms.md, "Momentum on carried work"): ``damped`` (the default,
    chosen on the torchft side-by-side and the regime matrix, docs/benchmarks-log.md) —
    ``outer_momentum`` × the share of the merged work trained on the round's base, so work
    carried across an alignment is not pushed by momentum it never saw; ``fixed`` —
    ``outer_momentum`` every round (the guide). The same wherever no work is carried."""
    merge_arithmetic: MergeArithmetic = "streamed"
    """How the syncer sums a round's merge (docs/algorithms.md, "Summed as contributions
    arrive"): ``streamed`` (the default) — each accepted contribution is added as it arrives,
    so only the outer step remains when the last one lands; ``normalized`` — the factors
    ``wᵢ/W`` once every contribution is in (the form before issue 25). The two differ in the
    last bits, not in what they compute. The run's manifest decides, not each node: a
    manifest written before this field existed reads as ``normalized``, so its rounds replay
    to their bytes."""
    quorum_size: int = Field(default=1, gt=0)
    """Accepted contributions a round waits for before its grace window (K)."""
    max_staleness: int = Field(default=0, ge=0)
    """Versions a contribution's base may lag the round's and still be merged, its weight times
    1/(1 + staleness) (asynchronous Local-SGD's rule). 0: only deltas against the round's own
    base (the guide). Needs ``carry_unmerged=False`` on every learner: a learner that carries
    its unmerged work would have it merged twice."""
    in_flight: int | None = Field(default=None, gt=0)
    """Most fragments one learner may have published and not yet aligned; None: no bound."""
    overlap_steps: int | None = Field(default=None, ge=0)
    """Most steps a learner trains past a publish before waiting for the commit; None: never waits."""
    mixing: float = Field(default=0.0, ge=0, lt=1)
    """Share of the local parameters kept when aligning (α in θ ← α·θ_local + (1−α)·θ_commit); 0 replaces."""
    carry_unmerged: bool = True
    """Carry a learner's work that a commit did not merge across the alignment
    (θ ← θ_commit − Δ_unmerged), so its next contribution holds it; False: the guide's
    behaviour, aligning replaces it. See docs/session.md for the measurements behind the default."""
    max_carried_steps: int | None = Field(default=None, gt=0)
    """Most steps of unmerged work a learner carries that a commit passed by before (trained
    before its anchor, or any when the commit skips versions); past it the work is dropped and
    reported with reason ``carry_limit``. None: 4 × ``sync_every``. Work trained on the anchor
    the commit follows is carried up to what the next contribution may hold
    (``RunSpec.carry_room_steps``, ``align.plan_alignment``)."""
    flush_on_close: bool = True
    """Publish the steps trained since the last contribution when the session closes (a round
    made only of such final contributions commits θ − Δ without momentum); False: the guide's
    behaviour, they are dropped. See docs/session.md for the measurements behind the default."""
    delta_dtype: str | None = None
    """dtype deltas travel in; None means each parameter's own dtype."""
    delta_quantization: QuantFormat | None = None
    """Blockwise quantization of published deltas (``int8``, ``fp8_e4m3``, ``int4``, ``int2``; one
    fp32 scale per ``quantization_block`` elements); the syncer dequantizes and merges in fp32.
    None: deltas travel as ``delta_dtype``."""
    update_quantization: QuantFormat | None = None
    """Each commit also publishes its change from the previous version in this form, and a
    learner one version behind fetches that instead of the parameters. The committed
    parameters are *defined* as the previous ones plus the dequantized change (the outer
    step's exact result stays in the outer state as an fp32 master), so the learner rebuilds
    the very bytes committed, and checks them against the record's checksum."""
    quantization_block: int = Field(default=DEFAULT_BLOCK, gt=0)
    """Elements per fp32 scale in both quantized forms (a multiple of 8 dividing 262144)."""
    delta_sparsity: float | None = Field(default=None, gt=0, lt=1)
    """Share of each ``sparsity_chunk`` elements a published delta carries: the chunk's
    largest magnitudes, their values quantized as ``delta_quantization`` (``int2`` when unset)
    with one fp32 scale per chunk (SparseLoCo's wire form, ``backends/sparse.py``); the syncer
    merges them dense in fp32. ``sparsity_chunk × delta_sparsity`` must be a power of two ≥ 8
    (1/64 of 4096: 64). None: deltas travel dense."""
    update_sparsity: float | None = Field(default=None, gt=0, lt=1)
    """Each commit also publishes its change from the previous version sparse: of every
    ``sparsity_chunk`` elements this share of the largest changes, their values quantized as
    ``update_quantization`` (``int4`` when unset), and a learner one version behind fetches that
    instead of the parameters. As with ``update_quantization`` the committed parameters are
    *defined* as the previous ones plus that change; what did not travel stays in the syncer's
    fp32 master and joins the next commit's change. With sparse deltas and SparseLoCo's plain
    outer step (``outer_lr=1, outer_momentum=0``) a commit changes only the union of the merged
    deltas' elements: ``update_sparsity = M × delta_sparsity`` carries all of it for M
    contributions a round (docs/algorithms.md, "Sparse commits"). None: no sparse update."""
    sparsity_chunk: int = Field(default=DEFAULT_CHUNK, gt=0)
    """Elements per chunk of ``delta_sparsity`` and ``update_sparsity`` (a power of two, at most 65 536)."""
    payload_compression: PayloadCompression = "none"
    """``zstd``: contributions, commits (parameters and outer state) and learners' saved state in
    the mailbox are stored compressed,
    zstd level 1 over bytes shuffled by element size (``backends/lossless.py``); a quantized or
    sparse payload, already compact, is stored as is. The records pin the raw bytes, so replay
    and repair do not depend on the compressor. It saves 7–13 % of fp32 bytes and 22–29 % of
    bf16 and pays on links slower than about 50–100 MB/s on two cores (docs/benchmarks-log.md,
    "Lossless compression"). Needs the ``compression`` extra (numcodecs)."""
    error_feedback: bool = True
    """With ``delta_quantization`` or ``delta_sparsity``: what a merged contribution's codes
    could not carry (the rounding, and the elements a sparse one left out) is added to the
    learner's next contribution of that fragment (dropped when the work was not merged)."""
    grace_gamma: float = Field(default=0.5, ge=0, le=1)
    """γ: share of the slack a grace window may spend."""
    grace_tau: float = Field(default=4.0, ge=0)
    """τ: learner steps of slack a round may use (grace = γ·max(0, τ·ξ_step − (ξ_quorum + ξ_sync)))."""
    grace_max_s: float = Field(default=60.0, ge=0)
    """Upper bound on one grace window, in seconds."""
    grace_rule: GraceRule = "live"
    """How the syncer sizes a round's wait after quorum (docs/protocol.md, "Quorum and grace"):
    ``live`` (the default, chosen on the regime matrix, docs/benchmarks-log.md) — until every live
    learner is in, up to ``grace_periods`` round periods; ``slack`` — the learners' slack in
    step time (the formula above, Decoupled DiLoCo's);
    ``arrivals`` — at least how late learners' contributions arrived after quorum in recent
    rounds (the 90th percentile, those that came stale included), up to ``grace_periods``
    round periods. Every rule ends the wait once every live learner is in."""
    grace_periods: float = Field(default=1.0, ge=0)
    """With ``grace_rule`` ``arrivals`` or ``live``: the longest wait, in round periods
    (``sync_every`` × the learners' step time), so that a learner much slower than the rest is
    not waited for."""

    @model_validator(mode="before")
    @classmethod
    def _iso_c_outer_step(cls, data: Any) -> Any:
        """A run merging with Iso-C gets Iso-C's outer step unless it sets its own."""
        if isinstance(data, dict):
            merge = data.get("merge")
            kind = merge.get("kind") if isinstance(merge, dict) else getattr(merge, "kind", None)
            if kind == "iso_c":
                data = {"outer_lr": ISO_C_OUTER_LR, "outer_momentum": ISO_C_OUTER_MOMENTUM, **data}
        return data

    @field_validator("outer_lr", "grace_tau", "grace_max_s", "grace_gamma", "grace_periods", "outer_momentum", "mixing")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
        return value

    @field_validator("delta_dtype")
    @classmethod
    def _float_dtype(cls, value: str | None) -> str | None:
        if value is not None and value not in FLOAT_DTYPES:
            raise ValueError(f"must be None or one of {sorted(FLOAT_DTYPES)}")
        return value

    @field_validator("quantization_block")
    @classmethod
    def _codec_block(cls, value: int) -> int:
        Codec("int8", value)  # the block rules live with the codec
        return value

    @field_validator("delta_quantization")
    @classmethod
    def _not_with_delta_dtype(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("delta_dtype") is not None:
            raise ValueError("delta_dtype and delta_quantization are alternatives: set one")
        return value

    @model_validator(mode="after")
    def _sparsity_codec(self) -> DiLoCo:
        """The sparse codec's rules (``backends/sparse.py``) say what is wrong with the pair."""
        if self.delta_sparsity is not None and self.delta_dtype is not None:
            raise ValueError("delta_dtype and delta_sparsity are alternatives: set one")
        for name, codec in (("delta_sparsity", "delta_codec"), ("update_sparsity", "update_codec")):
            share = getattr(self, name)
            if share is None:
                continue
            if self.sparsity_chunk * share != int(self.sparsity_chunk * share):
                raise ValueError(
                    f"{name} × sparsity_chunk must be a whole number of elements, got {self.sparsity_chunk * share:g}; "
                    f"with sparsity_chunk={self.sparsity_chunk}, e.g. {64 / self.sparsity_chunk:g} (64 of each chunk)"
                )
            try:
                getattr(self, codec)
            except ValueError as exc:  # the codec names the rule broken
                raise ValueError(f"{name}={share:g} with sparsity_chunk={self.sparsity_chunk}: {exc}") from exc
        return self

    @property
    def delta_codec(self) -> Codec | SparseCodec | None:
        """How contributions travel: sparse (``delta_sparsity``), quantized
        (``delta_quantization``), or None when they travel as floats."""
        if self.delta_sparsity is not None:
            k = round(self.sparsity_chunk * self.delta_sparsity)
            return SparseCodec(k, self.sparsity_chunk, self.delta_quantization or "int2")
        return Codec(self.delta_quantization, self.quantization_block) if self.delta_quantization else None

    @property
    def update_codec(self) -> Codec | SparseCodec | None:
        """How a commit's change from the previous version travels: sparse (``update_sparsity``),
        quantized (``update_quantization``), or None: only full parameters."""
        if self.update_sparsity is not None:
            k = round(self.sparsity_chunk * self.update_sparsity)
            return SparseCodec(k, self.sparsity_chunk, self.update_quantization or "int4")
        return Codec(self.update_quantization, self.quantization_block) if self.update_quantization else None

    @field_validator("carry_unmerged")
    @classmethod
    def _not_with_mixing(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("mixing"):
            raise ValueError("carrying unmerged work and mixing are alternatives: set carry_unmerged=False to use mixing")
        if value and info.data.get("max_staleness"):
            raise ValueError("carried work would be merged twice when stale deltas are accepted: set carry_unmerged=False")
        return value

    @property
    def carry_limit_steps(self) -> int:
        """``max_carried_steps``, or its default of 4 × ``sync_every``."""
        return self.max_carried_steps if self.max_carried_steps is not None else 4 * self.sync_every

    @field_validator("in_flight")
    @classmethod
    def _within_fragments(cls, value: int | None, info: ValidationInfo) -> int | None:
        fragments = info.data.get("fragments")
        if value is not None and fragments is not None and value > fragments:
            raise ValueError(f"cannot exceed fragments ({fragments})")
        return value

    @property
    def outer(self) -> NesterovOuter:
        """The outer optimizer these settings describe."""
        return NesterovOuter(lr=self.outer_lr, momentum=self.outer_momentum)

    @classmethod
    def from_manifest(cls, form: Mapping[str, Any]) -> DiLoCo:
        """Rebuild from a run manifest; one written before ``merge_arithmetic`` existed merged
        with the normalized factors, and says so by leaving the field out."""
        if isinstance(form, Mapping) and "merge_arithmetic" not in form:
            form = {**form, "merge_arithmetic": "normalized"}
        return super().from_manifest(form)

    def run_config(self) -> dict[str, Any]:
        """The manifest form restricted to the fields every node must share."""
        form = self.to_manifest()
        return {name: form[name] for name in RUN_FIELDS}

    @classmethod
    def standard(cls, nodes: int, sync_every: int = 500, **overrides: Any) -> DiLoCo:
        """Standard DiLoCo: one fragment, lock-step rounds of every node, weighted mean."""
        settings: dict[str, Any] = dict(
            sync_every=sync_every,
            fragments=1,
            in_flight=1,
            overlap_steps=0,
            merge=WeightedMean(),
            quorum_size=nodes,
            momentum_rule="fixed",
        )
        settings.update(overrides)
        return cls(**settings)

    @classmethod
    def local_sgd(cls, sync_every: int = 100, **overrides: Any) -> DiLoCo:
        """Local SGD: every commit is the weighted average of the learners' parameters."""
        settings: dict[str, Any] = dict(sync_every=sync_every, outer_lr=1.0, outer_momentum=0.0, merge=WeightedMean())
        settings.update(overrides)
        return cls(**settings)
