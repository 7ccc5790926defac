"""Typed access to one run in a mailbox: records and verified tensor blobs at their keys.

Both sides use it: the learner (join, publish, fetch commits) and the syncer (collect,
commit). It knows the key layout (through :mod:`gradientmail.records.keys`) and the
mailbox operations; it knows nothing about threads, schedules or merges.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gradientmail.backends import Backend, Tensor
from gradientmail.errors import CorruptPayload, IncompatiblePayload, KeyNotFound, RecordExists
from gradientmail.mailbox import Mailbox
from gradientmail.records import Contribution, Manifest, PayloadRef, RoundRecord, keys


@dataclass(frozen=True)
class TensorShape:
    """What a tensor in a payload must look like."""

    shape: tuple[int, ...]
    dtype: str | None
    """None accepts any dtype (checked elsewhere)."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class RunStore:
    """One run's records and blobs, verified on the way in and out."""

    def __init__(self, mailbox: Mailbox, backend: Backend) -> None:
        self.mailbox = mailbox
        self.backend = backend

    # -- manifest ------------------------------------------------------------------
    def read_manifest(self) -> Manifest | None:
        try:
            return Manifest.from_json(self.mailbox.get(keys.MANIFEST))
        except KeyNotFound:
            return None

    def create_manifest(self, manifest: Manifest) -> tuple[Manifest, bool]:
        """Create the manifest once; returns the run's manifest and whether we created it."""
        try:
            self.mailbox.create(keys.MANIFEST, manifest.to_json())
            return manifest, True
        except RecordExists:
            existing = self.read_manifest()
            assert existing is not None  # create-once objects are never deleted
            return existing, False

    # -- committed versions --------------------------------------------------------
    def committed_versions(self, fragment: int) -> list[int]:
        """Every committed version of a fragment, ascending (one LIST)."""
        found = (keys.parse_round_record(k) for k in self.mailbox.list(keys.rounds_prefix(fragment)))
        return sorted(r.version for r in found if r is not None and r.fragment == fragment)

    def newest_version(self, fragment: int, known: int | None = None) -> int | None:
        """The newest committed version. From a known version, probes forward with HEADs
        (cheap, the common case); without one, lists the fragment's round records."""
        if known is None:
            versions = self.committed_versions(fragment)
            return versions[-1] if versions else None
        version = known
        while self.mailbox.exists(keys.round_record(fragment, version + 1)):
            version += 1
        return version

    def read_round(self, fragment: int, version: int) -> RoundRecord:
        record = RoundRecord.from_json(self.mailbox.get(keys.round_record(fragment, version)))
        if record.fragment != fragment or record.version != version:
            raise CorruptPayload(f"round record at fragment {fragment} version {version} names {record.fragment}/{record.version}")
        return record

    def commit(self, record: RoundRecord) -> bool:
        """Create the round record once: True if we committed, False if another writer did."""
        try:
            self.mailbox.create(keys.round_record(record.fragment, record.version), record.to_json())
            return True
        except RecordExists:
            return False

    def commit_version(
        self,
        fragment: int,
        version: int,
        params: Mapping[str, Tensor],
        outer_state: Mapping[str, Tensor],
        writer: str,
        **record_fields: Any,
    ) -> RoundRecord | None:
        """Write a version's blobs under keys unique to this attempt, then create its record.

        The blobs are immutable and written *before* the record (invariant 1), so a record
        never points at missing bytes and a writer that loses the race overwrites nothing.
        Returns the record, or None if another writer committed this version first.
        """
        attempt = uuid.uuid4().hex[:12]
        params_ref = self.write_tensors(keys.params_blob(fragment, version, writer, attempt), params)
        state_ref = self.write_tensors(keys.outer_state_blob(fragment, version, writer, attempt), outer_state)
        record = RoundRecord(
            fragment=fragment, version=version, params=params_ref, outer_state=state_ref, committed_by=writer, **record_fields
        )
        if self.commit(record):
            return record
        for orphan in (params_ref.key, state_ref.key):  # never referenced by any record
            self.mailbox.delete(orphan)
        return None

    # -- tensor blobs --------------------------------------------------------------
    def write_tensors(self, key: str, tensors: Mapping[str, Tensor], metadata: Mapping[str, str] | None = None) -> PayloadRef:
        data = self.backend.encode(tensors, metadata)
        self.mailbox.put(key, data)
        return PayloadRef(key=key, sha256=sha256_hex(data), size_bytes=len(data))

    def read_tensors(self, ref: PayloadRef, expected: Mapping[str, TensorShape] | None = None) -> dict[str, Tensor]:
        """Fetch a blob and verify size, checksum, and (if given) names, shapes and dtypes.

        Raises ``CorruptPayload`` for a size/checksum/decoding failure and
        ``IncompatiblePayload`` for tensors that do not match ``expected``.
        """
        data = self.mailbox.get(ref.key)
        if len(data) != ref.size_bytes:
            raise CorruptPayload(f"{ref.key}: {len(data)} bytes, the record says {ref.size_bytes}")
        if sha256_hex(data) != ref.sha256:
            raise CorruptPayload(f"{ref.key}: checksum mismatch")
        tensors, _ = self.backend.decode(data)
        if expected is not None:
            check_tensors(self.backend, tensors, expected, ref.key)
        return tensors

    # -- contributions -------------------------------------------------------------
    def contribution_records(self, fragment: int) -> list[tuple[str, keys.ContributionKey]]:
        """Every contribution record of a fragment, any base version (one LIST)."""
        found = []
        for key in self.mailbox.list(f"{keys.fragment_root(fragment)}contributions/"):
            parsed = keys.parse_contribution_record(key)
            if parsed is not None and parsed.fragment == fragment:
                found.append((key, parsed))
        return found

    def read_contribution(self, key: str) -> Contribution:
        return Contribution.from_json(self.mailbox.get(key))


def check_tensors(backend: Backend, tensors: Mapping[str, Tensor], expected: Mapping[str, TensorShape], where: str) -> None:
    if set(tensors) != set(expected):
        missing = sorted(set(expected) - set(tensors))
        extra = sorted(set(tensors) - set(expected))
        raise IncompatiblePayload(f"{where}: tensor names differ (missing {missing}, unexpected {extra})")
    for name, spec in expected.items():
        shape = backend.shape(tensors[name])
        if shape != tuple(spec.shape):
            raise IncompatiblePayload(f"{where}: {name} has shape {shape}, expected {tuple(spec.shape)}")
        dtype = backend.dtype_name(tensors[name])
        if spec.dtype is not None and dtype != spec.dtype:
            raise IncompatiblePayload(f"{where}: {name} has dtype {dtype}, expected {spec.dtype}")
