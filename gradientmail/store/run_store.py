"""One run in a mailbox, typed: the only road from the roles to the mailbox's bytes.

The learner (join, publish, fetch commits), the syncer (collect, commit, elect), the CLI and
the tools all read and write through a :class:`RunStore`. It builds every key through
:mod:`gradientmail.records.keys`, verifies every blob it reads (size, checksum, names, shapes,
dtypes) and speaks NumPy arrays only, so one store serves every thread of a node whatever
framework its model uses. It knows nothing about threads, schedules or merges, and it does
not own the mailbox: whoever opened the mailbox closes it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends import payload
from gradientmail.errors import CorruptPayload, GradientMailError, IncompatiblePayload, InvalidRecord, KeyNotFound, RecordExists
from gradientmail.mailbox import Mailbox
from gradientmail.records import (
    Contribution,
    Lease,
    Manifest,
    Participant,
    PayloadRef,
    Realignment,
    Rejection,
    RoundRecord,
    RoundTiming,
    keys,
)
from gradientmail.store.spec import RunSpec, TensorShape

__all__ = ["Arrays", "CommittedVersion", "ContributionCounts", "RunStore", "check_tensors", "sha256_hex"]

Arrays = dict[str, np.ndarray]
"""Named host arrays: what crosses the store's boundary in both directions."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class CommittedVersion:
    """A committed version of a fragment, verified: its record, parameters and outer state."""

    record: RoundRecord
    params: Arrays
    outer_state: Arrays


@dataclass(frozen=True)
class ContributionCounts:
    """What a contribution reports besides its delta."""

    steps: int
    samples: int
    final: bool = False
    step_time_s: float | None = None
    carried_steps: int = 0
    realigned: tuple[Realignment, ...] = ()


class RunStore:
    """One run's records, blobs and leases, verified on the way in and out."""

    def __init__(self, mailbox: Mailbox) -> None:
        self._mailbox = mailbox

    @property
    def url(self) -> str:
        """The mailbox's URL (never holds secrets), for messages."""
        return self._mailbox.url

    # -- manifest ------------------------------------------------------------------
    def read_manifest(self) -> Manifest | None:
        try:
            return Manifest.from_json(self._mailbox.get(keys.MANIFEST))
        except KeyNotFound:
            return None

    def read_spec(self) -> RunSpec:
        """The run's view of itself. Raises ``GradientMailError`` when there is no run here."""
        manifest = self.read_manifest()
        if manifest is None:
            raise GradientMailError(f"no run at {self.url}: {keys.MANIFEST} is missing")
        return RunSpec.from_manifest(manifest)

    def create_manifest(self, manifest: Manifest) -> tuple[Manifest, bool]:
        """Create the manifest once; returns the run's manifest and whether we created it."""
        try:
            self._mailbox.create(keys.MANIFEST, manifest.to_json())
            return manifest, True
        except RecordExists:
            existing = self.read_manifest()
            if existing is None:  # create-once objects are never deleted
                raise GradientMailError(f"{keys.MANIFEST} exists but cannot be read") from None
            return existing, False

    # -- committed versions --------------------------------------------------------
    def committed_versions(self, fragment: int) -> list[int]:
        """Every committed version of a fragment, ascending (one LIST)."""
        found = (keys.parse_round_record(k) for k in self._mailbox.list(keys.rounds_prefix(fragment)))
        return sorted(r.version for r in found if r is not None and r.fragment == fragment)

    def newest_version(self, fragment: int, known: int | None = None) -> int | None:
        """The newest committed version. From a known version, probes forward with HEADs
        (cheap, the common case); without one, lists the fragment's round records."""
        if known is None:
            versions = self.committed_versions(fragment)
            return versions[-1] if versions else None
        version = known
        while self._mailbox.exists(keys.round_record(fragment, version + 1)):
            version += 1
        return version

    def read_round(self, fragment: int, version: int) -> RoundRecord:
        record = RoundRecord.from_json(self._mailbox.get(keys.round_record(fragment, version)))
        if record.fragment != fragment or record.version != version:
            raise CorruptPayload(
                f"round record at fragment {fragment} version {version} names {record.fragment}/{record.version}"
            )
        return record

    def load_version(self, spec: RunSpec, fragment: int, version: int) -> CommittedVersion:
        """A committed version's record, parameters and outer state, verified."""
        record = self.read_round(fragment, version)
        return CommittedVersion(record, self.read_params(spec, record), self.read_tensors(record.outer_state))

    def read_params(self, spec: RunSpec, record: RoundRecord) -> Arrays:
        """The parameters a round record commits, verified (what a learner aligns with)."""
        return self.read_tensors(record.params, spec.param_specs(record.fragment))

    def commit_version(
        self,
        fragment: int,
        version: int,
        params: Mapping[str, np.ndarray],
        outer_state: Mapping[str, np.ndarray],
        *,
        algorithm: DiLoCo,
        committed_by: str,
        term: int,
        base_version: int | None = None,
        participants: tuple[Participant, ...] = (),
        rejected: tuple[Rejection, ...] = (),
        final: bool = False,
        timing: RoundTiming | None = None,
    ) -> RoundRecord | None:
        """Write a version's blobs under keys unique to this attempt, then create its record.

        The blobs are immutable and written *before* the record (INV-1), so a record never
        points at missing bytes and a writer that loses the race overwrites nothing.
        Returns the record, or None if another writer committed this version first.
        """
        attempt = uuid.uuid4().hex[:12]
        params_ref = self._write_tensors(keys.params_blob(fragment, version, committed_by, attempt), params)
        state_ref = self._write_tensors(keys.outer_state_blob(fragment, version, committed_by, attempt), outer_state)
        record = RoundRecord(
            fragment=fragment,
            version=version,
            base_version=base_version,
            participants=participants,
            rejected=rejected,
            merge=algorithm.merge.to_manifest(),
            outer_lr=algorithm.outer_lr,
            outer_momentum=algorithm.outer_momentum,
            final=final,
            params=params_ref,
            outer_state=state_ref,
            committed_by=committed_by,
            term=term,
            timing=timing or RoundTiming(),
        )
        try:
            self._mailbox.create(keys.round_record(fragment, version), record.to_json())
            return record
        except RecordExists:
            for orphan in (params_ref.key, state_ref.key):  # never referenced by any record
                self._mailbox.delete(orphan)
            return None

    # -- contributions: the learner's side ------------------------------------------
    def publish_contribution(
        self,
        learner: str,
        fragment: int,
        anchor_version: int,
        delta: Mapping[str, np.ndarray],
        counts: ContributionCounts,
        first_sequence: int = 1,
    ) -> tuple[keys.ContributionKey, int]:
        """Put a delta, then create its record once; returns its key and the payload's bytes.

        ``first_sequence`` is the lowest sequence number to use; taken ones are skipped, so a
        restarted learner never collides with what it published before.

        Raises:
            GradientMailError: the record exists after all (a second process uses this id).
        """
        sequence = first_sequence
        while self._mailbox.exists(keys.contribution_record(fragment, anchor_version, learner, sequence)):
            sequence += 1
        key = keys.ContributionKey(fragment, anchor_version, learner, sequence)
        data = payload.encode(delta)
        self._mailbox.put(key.blob, data)
        contribution = Contribution(
            learner=learner,
            fragment=fragment,
            anchor_version=anchor_version,
            steps=counts.steps,
            samples=counts.samples,
            payload=PayloadRef(key=key.blob, sha256=sha256_hex(data), size_bytes=len(data)),
            final=counts.final,
            step_time_s=counts.step_time_s,
            carried_steps=counts.carried_steps,
            realigned=counts.realigned,
        )
        try:
            self._mailbox.create(key.record, contribution.to_json())
        except RecordExists:  # another process uses our learner id: refuse to guess
            raise GradientMailError(f"contribution {key.record} already exists: is learner id {learner!r} used twice?") from None
        return key, len(data)

    def contributors(self, fragment: int, base_version: int) -> set[str]:
        """Learners with a contribution against ``base_version`` of ``fragment`` (one LIST)."""
        listed = (
            keys.parse_contribution_record(k) for k in self._mailbox.list(keys.contributions_prefix(fragment, base_version))
        )
        return {parsed.learner for parsed in listed if parsed is not None}

    # -- contributions: the syncer's side -------------------------------------------
    def contributions(self, fragment: int) -> list[keys.ContributionKey]:
        """Every contribution of a fragment, any base version (one LIST)."""
        listed = (keys.parse_contribution_record(k) for k in self._mailbox.list(keys.contributions_root(fragment)))
        return [parsed for parsed in listed if parsed is not None and parsed.fragment == fragment]

    def read_contribution(self, key: keys.ContributionKey) -> Contribution:
        """The contribution record. Raises ``InvalidRecord`` when it does not parse."""
        return Contribution.from_json(self._mailbox.get(key.record))

    def read_delta(self, spec: RunSpec, contribution: Contribution) -> Arrays:
        """The contribution's delta, verified against the record and the run's delta shapes."""
        return self.read_tensors(contribution.payload, spec.delta_specs(contribution.fragment))

    def delete_contribution(self, key: keys.ContributionKey) -> None:
        """Remove a contribution that no round will read again (payload first, then record)."""
        self._mailbox.delete(key.blob)
        self._mailbox.delete(key.record)

    # -- tensor blobs --------------------------------------------------------------
    def _write_tensors(self, key: str, tensors: Mapping[str, np.ndarray]) -> PayloadRef:
        data = payload.encode(tensors)
        self._mailbox.put(key, data)
        return PayloadRef(key=key, sha256=sha256_hex(data), size_bytes=len(data))

    def read_blob(self, ref: PayloadRef) -> bytes:
        """A referenced blob's bytes, after checking its size and checksum (``CorruptPayload``)."""
        data = self._mailbox.get(ref.key)
        if len(data) != ref.size_bytes:
            raise CorruptPayload(f"{ref.key}: {len(data)} bytes, the record says {ref.size_bytes}")
        if sha256_hex(data) != ref.sha256:
            raise CorruptPayload(f"{ref.key}: checksum mismatch")
        return data

    def read_tensors(self, ref: PayloadRef, expected: Mapping[str, TensorShape] | None = None) -> Arrays:
        """Fetch a blob and verify size, checksum, and (if given) names, shapes and dtypes.

        Raises ``CorruptPayload`` for a size/checksum/decoding failure and
        ``IncompatiblePayload`` for tensors that do not match ``expected``.
        """
        tensors, _ = payload.decode(self.read_blob(ref))
        if expected is not None:
            check_tensors(tensors, expected, ref.key)
        return tensors

    # -- leases --------------------------------------------------------------------
    def read_lease(self, key: str) -> tuple[Lease, str] | None:
        """The lease and its version token, or None if absent or unreadable."""
        try:
            data, token = self._mailbox.get_versioned(key)
        except KeyNotFound:
            return None
        try:
            return Lease.from_json(data), token
        except InvalidRecord:
            return None

    def learner_lease_keys(self) -> list[str]:
        return self._mailbox.list(keys.LEARNER_LEASES)

    def put_lease(self, key: str, lease: Lease) -> str:
        """Write a lease unconditionally (a learner's own); returns its token."""
        return self._mailbox.put(key, lease.to_json())

    def create_lease(self, key: str, lease: Lease) -> str:
        """Create a lease once; raises ``RecordExists`` when someone holds it already."""
        return self._mailbox.create(key, lease.to_json())

    def swap_lease(self, key: str, lease: Lease, expected_token: str) -> str:
        """Replace a lease by compare-and-swap; raises ``VersionConflict`` or ``KeyNotFound``."""
        return self._mailbox.swap(key, lease.to_json(), expected_token)


def check_tensors(tensors: Mapping[str, np.ndarray], expected: Mapping[str, TensorShape], where: str) -> None:
    """Raise ``IncompatiblePayload`` unless the names, shapes and dtypes are the expected ones."""
    if set(tensors) != set(expected):
        missing = sorted(set(expected) - set(tensors))
        extra = sorted(set(tensors) - set(expected))
        raise IncompatiblePayload(f"{where}: tensor names differ (missing {missing}, unexpected {extra})")
    for name, spec in expected.items():
        shape = tuple(int(d) for d in tensors[name].shape)
        if shape != tuple(spec.shape):
            raise IncompatiblePayload(f"{where}: {name} has shape {shape}, expected {tuple(spec.shape)}")
        dtype = payload.dtype_name_of(tensors[name])
        if spec.dtype is not None and dtype != spec.dtype:
            raise IncompatiblePayload(f"{where}: {name} has dtype {dtype}, expected {spec.dtype}")
