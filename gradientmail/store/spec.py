"""The run's view of itself, derived once from its manifest: algorithm, fragments, tensor shapes.

Every role reads the same view: the learner to cast and check what it publishes and
fetches, the syncer to bound and check what it accepts, the CLI to export and replay.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends.payload import numpy_dtype
from gradientmail.digests import DigestName
from gradientmail.records import Manifest, ParameterSpec
from gradientmail.store.retention import Retention

if TYPE_CHECKING:
    from gradientmail.backends.quantize import Codec
    from gradientmail.backends.sparse import SparseCodec

__all__ = ["DEFAULT_LEASE_TTL_S", "PAYLOAD_HEADER_SLACK", "RunSpec", "TensorShape"]

DEFAULT_LEASE_TTL_S = 10.0
"""The lease TTL of a run whose manifest does not record one."""

PAYLOAD_HEADER_SLACK = 1 << 20
"""Bytes allowed above the raw tensor bytes for a Safetensors header."""


@dataclass(frozen=True)
class TensorShape:
    """What a tensor in a payload must look like."""

    shape: tuple[int, ...]
    dtype: str | None
    """None accepts any dtype (checked elsewhere)."""


@dataclass(frozen=True)
class RunSpec:
    """The manifest and what every role derives from it."""

    manifest: Manifest
    algorithm: DiLoCo
    fragments: tuple[tuple[str, ...], ...]
    parameters: Mapping[str, ParameterSpec]
    retention: Retention
    lease_ttl_s: float
    """Every node judges every lease by this TTL (the manifest's), never by the lease's own."""
    blob_digest: DigestName
    """The digest this run's writers pin blobs by: the manifest's, sha256 where it names none."""

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> RunSpec:
        return cls(
            manifest=manifest,
            algorithm=DiLoCo.from_manifest(manifest.algorithm),
            fragments=manifest.plan,
            parameters={p.name: p for p in manifest.parameters},
            retention=Retention.from_manifest(manifest.retention) if manifest.retention is not None else Retention(),
            lease_ttl_s=manifest.lease_ttl_s if manifest.lease_ttl_s is not None else DEFAULT_LEASE_TTL_S,
            blob_digest=manifest.blobs_pinned_by,
        )

    @property
    def max_contribution_steps(self) -> int:
        """The most steps an honest contribution can hold: the default carry limit (4·H; the
        manifest's ``max_carried_steps`` if larger) plus four periods of training before the next
        publish. Beyond it the counts are invented: rejected as ``invalid_counts``."""
        every = self.algorithm.sync_every
        return max(self.algorithm.carry_limit_steps, 4 * every) + 4 * every

    @property
    def carry_room_steps(self) -> int:
        """The most unmerged steps a learner carries at all (``align.plan_alignment``): what its
        next contribution can hold with one period of training added, so carrying never makes
        a contribution the syncer refuses; never less than the carry limit."""
        return max(self.algorithm.carry_limit_steps, self.max_contribution_steps - self.algorithm.sync_every)

    def dtype(self, name: str) -> str:
        """The stored dtype of parameter ``name``."""
        return self.parameters[name].dtype

    def delta_dtype(self, name: str) -> str:
        """The dtype parameter ``name``'s deltas are computed in before they travel: ``delta_dtype``
        or its own; float32 when they are quantized or sparse (the codes are taken from fp32)."""
        if self.algorithm.delta_codec is not None:
            return "float32"
        return self.algorithm.delta_dtype or self.parameters[name].dtype

    def shapes(self, fragment: int) -> dict[str, tuple[int, ...]]:
        """Each parameter of ``fragment`` and its shape, in fragment order."""
        return {n: tuple(self.parameters[n].shape) for n in self.fragments[fragment]}

    def param_specs(self, fragment: int) -> dict[str, TensorShape]:
        return {n: TensorShape(tuple(self.parameters[n].shape), self.dtype(n)) for n in self.fragments[fragment]}

    def delta_specs(self, fragment: int) -> dict[str, TensorShape]:
        return {n: TensorShape(tuple(self.parameters[n].shape), self.delta_dtype(n)) for n in self.fragments[fragment]}

    def fragment_bytes(self, fragment: int) -> int:
        """Bytes of ``fragment``'s parameters as stored: what a syncer of it moves per commit."""
        return sum(self.parameters[n].numel * numpy_dtype(self.dtype(n)).itemsize for n in self.fragments[fragment])

    @property
    def model_bytes(self) -> int:
        """Bytes of every parameter as stored: what bounds a learner state of this run."""
        return sum(self.fragment_bytes(fragment) for fragment in range(len(self.fragments)))

    def max_payload_bytes(self, fragment: int) -> int:
        """The largest a valid contribution payload of ``fragment`` can be."""
        return self.contribution_bytes(fragment, self.algorithm.delta_codec) + PAYLOAD_HEADER_SLACK

    def contribution_bytes(self, fragment: int, codec: Codec | SparseCodec | None) -> int:
        """Bytes of a contribution of ``fragment`` in the wire form ``codec`` (None: as the run's
        ``delta_dtype``), headers left out: the size check's and the link hint's one count."""
        names = self.fragments[fragment]
        if codec is not None:
            return sum(codec.nbytes(self.parameters[n].numel) for n in names)
        return sum(self.parameters[n].numel * numpy_dtype(self.delta_dtype(n)).itemsize for n in names)
