"""One run in a mailbox, typed: the only road from the roles to the mailbox's bytes.

The learner (join, publish, fetch commits), the syncer (collect, commit, elect), the CLI and
the tools all read and write through a :class:`RunStore`. It builds every key through
:mod:`gradientmail.records.keys`, verifies every blob it reads (size, checksum, names, shapes,
dtypes) and speaks NumPy arrays only, so one store serves every thread of a node whatever
framework its model uses. It knows nothing about threads, schedules or merges, and it does
not own the mailbox: whoever opened the mailbox closes it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends import payload, quantized_payload
from gradientmail.backends.compact import UpdateCodec, UpdateParts, apply_update, decode_update, encode_update
from gradientmail.digests import DigestName
from gradientmail.errors import (
    CorruptPayload,
    GradientMailError,
    IncompatiblePayload,
    InvalidRecord,
    KeyNotFound,
    MailboxError,
    ObjectTooLarge,
    RecordExists,
)
from gradientmail.mailbox import Mailbox
from gradientmail.mailbox.base import Gathered, joined
from gradientmail.records import (
    SCHEMA_VERSION,
    Contribution,
    Head,
    Manifest,
    PayloadRef,
    Realignment,
    Record,
    RoundContent,
    RoundRecord,
    SavedState,
    keys,
)
from gradientmail.records.auth import RunKey
from gradientmail.store.barrier_records import BarrierRecords
from gradientmail.store.blobs import Arrays, Blobs, check_tensors, pins, sha256_hex, typesize
from gradientmail.store.cas import CasRecords
from gradientmail.store.lease_records import LeaseRead, LeaseRecords
from gradientmail.store.queue_records import QueueRecords
from gradientmail.store.record_io import RecordIO
from gradientmail.store.spec import RunSpec
from gradientmail.store.state_records import LearnerStateRecords

__all__ = [
    "Arrays",
    "CommittedVersion",
    "ContributionCounts",
    "LeaseRead",
    "RunStore",
    "StoredRound",
    "VersionDraft",
    "check_tensors",
    "sha256_hex",
]

log = logging.getLogger(__name__)
RecordT = TypeVar("RecordT", bound=Record)


@dataclass(frozen=True)
class StoredRound:
    """A round record as stored: the record and the sha256 of its bytes (the next link of the chain)."""

    record: RoundRecord
    sha256: str


@dataclass(frozen=True)
class PublishedContribution:
    """What ``RunStore.publish_contribution`` wrote: the contribution's key, its payload's bytes
    and its record."""

    key: keys.ContributionKey
    size_bytes: int
    record: Contribution


@dataclass(frozen=True)
class CommittedVersion:
    """A committed version of a fragment, verified: its record, parameters and outer state."""

    record: RoundRecord
    params: Arrays
    outer_state: Arrays
    record_sha256: str = ""
    """sha256 of the record's stored bytes: what the next version's ``previous`` names."""


@dataclass(frozen=True)
class ContributionCounts:
    """What a contribution reports besides its delta."""

    steps: int
    samples: int
    final: bool = False
    step_time_s: float | None = None
    carried_steps: int = 0
    realigned: tuple[Realignment, ...] = ()


@dataclass(frozen=True)
class VersionDraft:
    """A version to commit, as its writer computed it: the round record less what the store adds
    (``records.RoundContent``) and the tensors its blobs hold. The syncer builds one per round; a
    joining learner builds version 0 (no base, no participants)."""

    content: RoundContent
    params: Mapping[str, np.ndarray]
    outer_state: Mapping[str, np.ndarray]
    compress: bool = False
    """Store the blobs zstd-compressed (the run's ``payload_compression``)."""
    update: tuple[UpdateCodec, Mapping[str, UpdateParts]] | None = None
    """The compact form of ``params`` − version ``base_version``'s parameters, written as a
    third blob and referenced as the record's ``update``."""

    @classmethod
    def of(
        cls,
        algorithm: DiLoCo,
        fragment: int,
        version: int,
        params: Mapping[str, np.ndarray],
        outer_state: Mapping[str, np.ndarray],
        *,
        outer_momentum: float | None = None,
        update: tuple[UpdateCodec, Mapping[str, UpdateParts]] | None = None,
        **content: Any,
    ) -> VersionDraft:
        """A draft of a run of ``algorithm``: the record restates its merge and outer step (what
        replay checks), with β ``outer_momentum`` when the round's rule scaled it; ``content``:
        the rest of ``RoundContent``'s fields."""
        momentum = algorithm.outer_momentum if outer_momentum is None else outer_momentum
        head = RoundContent(
            fragment=fragment, version=version, merge=algorithm.merge.to_manifest(), outer_lr=algorithm.outer_lr,
            outer_momentum=momentum, **content,
        )  # fmt: skip
        return cls(head, params, outer_state, compress=algorithm.payload_compression == "zstd", update=update)


class RunStore:
    """One run's records, blobs and leases, verified on the way in and out.

    With a run key every record written is signed and every record read must verify
    (``Unauthenticated`` otherwise); without one, records are neither signed nor checked.
    Every read fetches at most what the thing read may legitimately weigh (size before bytes).
    """

    def __init__(self, mailbox: Mailbox, key: RunKey | None = None) -> None:
        self._mailbox = mailbox
        self._key = key
        self._io = RecordIO(mailbox, key)
        self.blobs = Blobs(mailbox)
        """Verified blobs at their keys (``store/blobs.py``)."""
        cas = CasRecords(self._io)
        self.leases = LeaseRecords(self._io, cas)
        """The syncer lease and the learners' own (``store/lease_records.py``)."""
        self.queues = QueueRecords(self._io, cas)
        """Work-queue claims and done markers (``store/queue_records.py``)."""
        self.barriers = BarrierRecords(self._io, cas)
        """Barrier arrivals and clock probes (``store/barrier_records.py``)."""
        self.states = LearnerStateRecords(self._io, cas, put_blob=self._put_state_blob, read_blob=self.blobs.read)
        """Learner states saved in the mailbox (``store/state_records.py``)."""

    @property
    def mailbox(self) -> Mailbox:
        """The mailbox under this store (not owned: whoever opened it closes it), for tools and
        tests that look at or damage the stored bytes themselves."""
        return self._mailbox

    @property
    def url(self) -> str:
        """The mailbox's URL (never holds secrets), for messages."""
        return self._mailbox.url

    @property
    def key(self) -> RunKey | None:
        """The run key records are signed and checked with (None: an unsigned run)."""
        return self._key

    @property
    def unparsable_keys(self) -> int:
        """Distinct names this store's listings skipped as no key of the layout."""
        return self._io.skipped.count

    def listed(self, prefix: str) -> list[tuple[str, keys.ParsedKey]]:
        """The names under ``prefix`` with what each is (one LIST), through the one parser of
        the key layout (``keys.parse_key``); a name that is none is skipped and reported."""
        return self._io.listed(prefix)

    def stray_names(self, prefix: str = "") -> tuple[int, list[str]]:
        """How many names are under ``prefix``, and those that are no key of the layout, found
        by this LIST itself (not by what listings before skipped)."""
        return self._io.stray_names(prefix)

    # -- manifest ------------------------------------------------------------------
    def read_manifest(self, *, verify: bool = True) -> Manifest | None:
        """The run's manifest, None if there is none. ``verify=False`` skips the MAC check (to
        say which key a run wants when ours does not verify it); never act on such a read."""
        try:
            if verify:
                return self._adopt(self._io.read(Manifest, keys.MANIFEST)[0])
            return Manifest.from_json(self._mailbox.get(keys.MANIFEST, max_bytes=Manifest.max_bytes))
        except KeyNotFound:
            return None
        except ObjectTooLarge as exc:
            raise InvalidRecord(f"manifest: {exc}") from None

    def _adopt(self, manifest: Manifest) -> Manifest:
        """Write blobs from now on under the digest the run's (verified) manifest names."""
        self.blobs.digest = manifest.blobs_pinned_by
        return manifest

    def read_spec(self) -> RunSpec:
        """The run's view of itself. Raises ``GradientMailError`` when there is no run here."""
        manifest = self.read_manifest()
        if manifest is None:
            raise GradientMailError(f"no run at {self.url}: {keys.MANIFEST} is missing")
        return RunSpec.from_manifest(manifest)

    def create_manifest(self, manifest: Manifest) -> bool:
        """Create the manifest once; False when another node created the run first."""
        try:
            self._mailbox.create(keys.MANIFEST, self._io.encode(keys.MANIFEST, manifest))
            self._adopt(manifest)
            return True
        except RecordExists:
            return False

    # -- committed versions --------------------------------------------------------
    def committed_versions(self, fragment: int) -> list[int]:
        """Every committed version of a fragment, ascending (one LIST)."""
        found = (parsed for _, parsed in self.listed(keys.rounds_prefix(fragment)))
        return sorted(r.version for r in found if isinstance(r, keys.RoundKey) and r.fragment == fragment)

    def newest_version(self, fragment: int, known: int | None = None, *, from_head: bool = False) -> int | None:
        """The newest committed version. From a known version, probes forward with HEADs
        (cheap, the common case); without one, starts from the newer of the fragment's head
        pointer (when it is valid and its record exists) and the newest round record listed
        (one LIST; retention keeps it short), so a head replayed from an older version cannot
        point a joiner or a new syncer back at a kept checkpoint (it is ignored and logged).
        ``from_head`` with a known version (a learner left behind by retention): start from the
        head when it is ahead of ``known`` and its record exists — never behind ``known``, so a
        replayed head cannot move the reader back, and no LIST is needed.
        Either way the answer is confirmed by probing forward."""
        if known is not None and from_head:
            head = self.read_head(fragment)
            if head is not None and head.version > known and self.round_exists(fragment, head.version):
                known = head.version
        elif known is None:
            head = self.read_head(fragment)
            listed = self.committed_versions(fragment)
            candidates = listed[-1:]
            if head is not None and self._mailbox.exists(keys.round_record(fragment, head.version)):
                candidates.append(head.version)
                if listed and head.version < listed[-1]:
                    log.warning(
                        "the head pointer of fragment %d names version %d, behind version %d in the mailbox: ignored "
                        "(a replayed or stale head)",
                        fragment,
                        head.version,
                        listed[-1],
                    )
            if not candidates:
                return None
            known = max(candidates)
        version = known
        while self._mailbox.exists(keys.round_record(fragment, version + 1)):
            version += 1
        return version

    def round_exists(self, fragment: int, version: int) -> bool:
        """Whether version ``version`` of ``fragment`` has its round record (one HEAD)."""
        return self._mailbox.exists(keys.round_record(fragment, version))

    def read_head(self, fragment: int) -> Head | None:
        """The fragment's head pointer, or None when absent, invalid or unauthenticated."""
        location = keys.head(fragment)
        try:
            head = self._io.read(Head, location)[0]
        except KeyNotFound:
            return None
        except InvalidRecord as exc:
            log.warning("ignoring the head pointer of fragment %d: %s", fragment, exc)
            return None
        return head if head.fragment == fragment else None

    def read_round(self, fragment: int, version: int) -> RoundRecord:
        return self.read_stored_round(fragment, version).record

    def read_stored_round(self, fragment: int, version: int) -> StoredRound:
        """A round record with the sha256 of its stored bytes; ``CorruptPayload`` when the record
        names another fragment or version than its key (a copied record: a rollback attempt)."""
        location = keys.round_record(fragment, version)
        record, data = self._io.read(RoundRecord, location)
        if record.fragment != fragment or record.version != version:
            raise CorruptPayload(
                f"round record at fragment {fragment} version {version} names {record.fragment}/{record.version}"
            )
        return StoredRound(record, sha256_hex(data))

    def remove_unreadable_round(self, fragment: int, version: int) -> str | None:
        """Delete the round record at ``version`` when no node of this run can have written it,
        so that one object dropped at the next record key cannot stop the fragment (INV-20);
        returns why, or None when the record reads (or is gone, or may be a newer
        GradientMail's). Call it only for the newest version, never on history.

        In a signed run: whatever does not verify under the run key (garbage, unsigned, another
        key, a genuine record copied to this key). Unsigned: what does not parse as this
        fragment's round record at this version, unless it states a newer ``schema_version``."""
        location = keys.round_record(fragment, version)
        data = b""
        try:
            data = self._mailbox.get(location, max_bytes=RoundRecord.max_bytes)
            record = self._io.parse(RoundRecord, location, data)
            if record.fragment != fragment or record.version != version:
                raise CorruptPayload(f"it names fragment {record.fragment} version {record.version}")
        except KeyNotFound:
            return None
        except (InvalidRecord, CorruptPayload, ObjectTooLarge) as exc:
            if self._key is None and _states_newer_schema(data):
                return None
            self._mailbox.delete(location)
            return str(exc)
        return None

    def load_version(self, spec: RunSpec, fragment: int, version: int) -> CommittedVersion:
        """A committed version's record, parameters and outer state, verified."""
        stored = self.read_stored_round(fragment, version)
        record = stored.record
        return CommittedVersion(
            record, self.read_params(spec, record), self.blobs.read_tensors(record.outer_state), stored.sha256
        )

    def read_params(self, spec: RunSpec, record: RoundRecord) -> Arrays:
        """The parameters a round record commits, verified (what a learner aligns with)."""
        return self.blobs.read_tensors(record.params, spec.param_specs(record.fragment))

    def rebuild_params(self, spec: RunSpec, record: RoundRecord, base: Mapping[str, np.ndarray]) -> Arrays:
        """The parameters ``record`` commits, rebuilt from ``base`` (those of its base version)
        and its compact update: what a learner one version behind fetches instead of them.

        Raises ``CorruptPayload``/``IncompatiblePayload`` when the update does not decode, or the
        rebuilt parameters do not encode to the committed blob's exact size and digest (a wrong
        base, a damaged update): the caller then reads the full parameters.
        """
        codec = spec.algorithm.update_codec
        if codec is None or record.update is None:
            raise IncompatiblePayload(f"fragment {record.fragment} version {record.version} has no compact update")
        parts = decode_update(self.blobs.read(record.update), codec, spec.shapes(record.fragment))
        params = {name: apply_update(np.asarray(base[name]), update, codec) for name, update in parts.items()}
        check_tensors(params, spec.param_specs(record.fragment), record.update.key)
        rebuilt = payload.encode(params)
        if not pins(record.params, rebuilt):
            raise CorruptPayload(
                f"fragment {record.fragment} version {record.version}: the parameters rebuilt from its update "
                "differ from the committed ones"
            )
        return params

    def commit_version(
        self, draft: VersionDraft, *, committed_by: str, term: int, digest: DigestName | None = None
    ) -> StoredRound | None:
        """Write a version's blobs under keys unique to this attempt, then create its record,
        then point the fragment's head at it. ``digest``: the run's ``blob_digest`` (None: the
        one of the manifest this store read).

        The blobs are immutable and written *before* the record (INV-1), so a record never
        points at missing bytes and a writer that loses the race overwrites nothing: it deletes
        the blobs it wrote (two, or three with an update) and returns None.
        Returns the stored record, or None if another writer committed this version first.
        """
        fragment, version = draft.content.fragment, draft.content.version
        attempt = uuid.uuid4().hex[:12]
        # Each blob is hashed while it uploads (issue 13); one after the other, so no more than
        # one encoded blob is held at a time (writing both at once measured no faster on loopback).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gm-commit-digest") as hashing:
            params_ref = self.blobs.write_tensors(
                keys.params_blob(fragment, version, committed_by, attempt),
                draft.params,
                hashing,
                compress=draft.compress,
                digest=digest,
            )
            state_ref = self.blobs.write_tensors(
                keys.outer_state_blob(fragment, version, committed_by, attempt),
                draft.outer_state,
                hashing,
                compress=draft.compress,
                digest=digest,
            )
            update_ref = None
            if draft.update is not None:
                codec, parts = draft.update
                update_key = keys.update_blob(fragment, version, committed_by, attempt)
                update_ref = self.blobs.put(update_key, encode_update(parts, codec), hashing, digest=digest)
        record = RoundRecord.committed(
            draft.content, params=params_ref, outer_state=state_ref, update=update_ref, committed_by=committed_by, term=term
        )
        location = keys.round_record(fragment, version)
        data = self._io.encode(location, record)
        if len(data) > RoundRecord.max_bytes:  # never commit what every reader would refuse
            for orphan in (params_ref.key, state_ref.key, *([update_ref.key] if update_ref else [])):
                self._mailbox.delete(orphan)
            raise GradientMailError(
                f"fragment {fragment} version {version}: the round record would be {len(data)} bytes, over the "
                f"{RoundRecord.max_bytes} its readers accept ({len(record.participants)} participants); not committed"
            )
        try:
            self._mailbox.create(location, data)
        except RecordExists:
            for orphan in (params_ref.key, state_ref.key, *([update_ref.key] if update_ref else [])):  # never referenced
                self._mailbox.delete(orphan)
            return None
        stored = StoredRound(self._io.parse(RoundRecord, location, data), sha256_hex(data))
        self.write_head(fragment, version, stored.sha256)
        return stored

    def write_head(self, fragment: int, version: int, record_sha256: str) -> None:
        """Point the fragment's head at ``version``. Best effort: the head is a hint, readers
        probe past it, so a failed write is logged and left for the next commit."""
        location = keys.head(fragment)
        try:
            self._mailbox.put(
                location, self._io.encode(location, Head(fragment=fragment, version=version, record_sha256=record_sha256))
            )
        except MailboxError as exc:
            log.warning("could not update the head pointer of fragment %d: %s", fragment, exc)

    # -- contributions: the learner's side ------------------------------------------
    def publish_contribution(
        self,
        learner: str,
        fragment: int,
        anchor_version: int,
        delta: Mapping[str, np.ndarray] | bytes,
        counts: ContributionCounts,
        first_sequence: int = 1,
        *,
        compress: bool = False,
        digest: DigestName | None = None,
        saved_state: SavedState | None = None,
    ) -> PublishedContribution:
        """Put a delta, then create its record once; returns its key, the payload's bytes and the
        record. ``delta`` is the named arrays, or a payload already encoded (a quantized one).

        ``first_sequence`` is the lowest sequence number to use; taken ones are skipped, so a
        restarted learner never collides with what it published before. ``compress``: named
        arrays are stored compressed (``DiLoCo.payload_compression``). ``digest``: the run's
        ``blob_digest`` (None: the one of the manifest this store read). ``saved_state``: the
        learner's newest state saved in the mailbox, which the record names (``store.states``).

        Raises:
            GradientMailError: the record exists after all (a second process uses this id).
        """
        sequence = first_sequence
        while self._mailbox.exists(keys.contribution_record(fragment, anchor_version, learner, sequence)):
            sequence += 1
        key = keys.ContributionKey(fragment, anchor_version, learner, sequence)
        if isinstance(delta, bytes):  # already compact (quantized or sparse): stored as is
            blob = self.blobs.put(key.blob, delta, digest=digest)
        elif compress:
            encoded = joined(Gathered(payload.encode_pieces(delta)))
            blob = self.blobs.put_compressed(key.blob, encoded, typesize(delta.values()), digest=digest)
        else:
            blob = self.blobs.put(key.blob, Gathered(payload.encode_pieces(delta)), digest=digest)
        contribution = Contribution(
            learner=learner,
            fragment=fragment,
            anchor_version=anchor_version,
            steps=counts.steps,
            samples=counts.samples,
            payload=blob,
            final=counts.final,
            step_time_s=counts.step_time_s,
            carried_steps=counts.carried_steps,
            realigned=counts.realigned,
            saved_state=saved_state,
        )
        try:
            self._mailbox.create(key.record, self._io.encode(key.record, contribution))
        except RecordExists:  # another process uses our learner id: refuse to guess
            raise GradientMailError(f"contribution {key.record} already exists: is learner id {learner!r} used twice?") from None
        return PublishedContribution(key, blob.wire_bytes, contribution)

    def contributors(self, fragment: int, base_version: int) -> set[str]:
        """Learners with a contribution against ``base_version`` of ``fragment`` (one LIST)."""
        listed = (parsed for _, parsed in self.listed(keys.contributions_prefix(fragment, base_version)))
        return {parsed.learner for parsed in listed if isinstance(parsed, keys.ContributionKey)}

    def newest_contribution(self, learner: str, fragment: int) -> Contribution | None:
        """``learner``'s newest contribution to ``fragment`` still in the mailbox (one LIST, one
        GET); None when it has none, or that one does not read or verify (logged)."""
        own = [key for key in self.contributions(fragment) if key.learner == learner]
        if not own:
            return None
        latest = max(own, key=lambda key: (key.base_version, key.sequence))
        try:
            contribution = self.read_contribution(latest)
        except (InvalidRecord, KeyNotFound) as exc:
            log.warning("learner %s's newest contribution %s does not read: %s", learner, latest.record, exc)
            return None
        return contribution if contribution.learner == learner else None

    # -- contributions: the syncer's side -------------------------------------------
    def contributions(self, fragment: int) -> list[keys.ContributionKey]:
        """Every contribution of a fragment, any base version (one LIST)."""
        listed = (parsed for _, parsed in self.listed(keys.contributions_root(fragment)))
        return [parsed for parsed in listed if isinstance(parsed, keys.ContributionKey) and parsed.fragment == fragment]

    def read_contribution(self, key: keys.ContributionKey) -> Contribution:
        """The contribution record. Raises ``InvalidRecord`` when it does not parse, or is too
        large, and ``Unauthenticated`` when it does not verify under the run key."""
        return self._io.read(Contribution, key.record)[0]

    def read_delta(self, spec: RunSpec, contribution: Contribution) -> Arrays:
        """The contribution's delta, verified against the record and the run's delta shapes;
        dequantized (or densified) to fp32 when the run quantizes (or sparsifies) deltas."""
        codec = spec.algorithm.delta_codec
        if codec is None:
            return self.blobs.read_tensors(contribution.payload, spec.delta_specs(contribution.fragment))
        data = self.blobs.read(contribution.payload)
        return quantized_payload.decode_dequantized(data, codec, spec.shapes(contribution.fragment))

    def delete_contribution(self, key: keys.ContributionKey) -> None:
        """Remove a contribution that no round will read again (payload first, then record)."""
        self._mailbox.delete(key.blob)
        self._mailbox.delete(key.record)

    def _put_state_blob(self, key: str, data: bytes, compress: bool, digest: DigestName) -> PayloadRef:
        if compress:
            return self.blobs.put_compressed(key, data, 4, digest=digest)
        return self.blobs.put(key, data, digest=digest)

    # -- retention -----------------------------------------------------------------
    def version_blobs(self, fragment: int) -> dict[int, list[str]]:
        """Every blob under the fragment's ``versions/``, by version (one LIST)."""
        found: dict[int, list[str]] = {}
        for key, parsed in self.listed(keys.versions_prefix(fragment)):
            if isinstance(parsed, keys.VersionBlobKey) and parsed.fragment == fragment:
                found.setdefault(parsed.version, []).append(key)
        return found

    def contribution_objects_below(self, fragment: int, base_version: int) -> list[str]:
        """Every contribution record and blob (orphan blobs too) based on a version older than
        ``base_version`` (one LIST)."""
        root = keys.contributions_root(fragment)
        found = []
        for key in self._mailbox.list(root):
            base = key[len(root) :].split("/", 1)[0]
            if base.isdigit() and int(base) < base_version:
                found.append(key)
        return found

    def delete_keys(self, doomed: list[str]) -> None:
        """Delete objects retention gave up (blobs before the record that references them)."""
        for key in sorted(doomed, key=lambda k: k.endswith(".json")):
            self._mailbox.delete(key)


def _states_newer_schema(data: bytes) -> bool:
    """Whether ``data`` is a JSON object whose ``schema_version`` is newer than ours (written by
    a newer GradientMail: never ours to delete)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return False
    version = value.get("schema_version") if isinstance(value, dict) else None
    return isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
