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
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.backends import lossless, payload, quantized_payload
from gradientmail.backends.compact import UpdateCodec, UpdateParts, apply_update, decode_update, encode_update
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
from gradientmail.mailbox.base import Gathered, HashingGet, HashingPut, StampedGet, joined
from gradientmail.records import (
    SCHEMA_VERSION,
    BarrierArrival,
    Contribution,
    Head,
    LearnerStateRecord,
    Lease,
    Manifest,
    Participant,
    PayloadRef,
    QueueClaim,
    QueueDone,
    Realignment,
    Record,
    Rejection,
    RoundRecord,
    RoundTiming,
    keys,
)
from gradientmail.records.auth import RunKey
from gradientmail.records.models import bound_rejections
from gradientmail.store.spec import RunSpec, TensorShape
from gradientmail.store.store_clock import ClockSample

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

Arrays = dict[str, np.ndarray]
"""Named host arrays: what crosses the store's boundary in both directions."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
class LeaseRead:
    """A lease as found: ``lease`` is None when its bytes are not a valid (or not a signed)
    lease; such a lease counts as expired and is replaced by compare-and-swap on ``token``."""

    lease: Lease | None
    token: str
    problem: str = ""
    written_at: float | None = None
    """The store's stamp of this version's write (``ObjectInfo.modified_at``) from a store that
    reads it with the bytes (``StampedGet``); None otherwise."""
    written_resolution_s: float = 0.0


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
    """A version to commit, as the writer computed it: what its round record will say, less
    what the store adds (blob references, the writer and its term). The syncer builds one per
    round; a joining learner builds version 0 (no base, no participants)."""

    fragment: int
    version: int
    params: Mapping[str, np.ndarray]
    outer_state: Mapping[str, np.ndarray]
    algorithm: DiLoCo
    """The run's algorithm: the record restates its merge and outer step (what replay checks)."""
    base_version: int | None = None
    """The version merged onto; None only for version 0."""
    participants: tuple[Participant, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    final: bool = False
    timing: RoundTiming | None = None
    previous: str | None = None
    """sha256 of version − 1's stored record (the hash chain, INV-11)."""
    samples_per_step_cap: float | None = None
    backend: str | None = None
    """The backend that computed the round (audit replays on it for exact bytes)."""
    update: tuple[UpdateCodec, Mapping[str, UpdateParts]] | None = None
    """The compact form of ``params`` − version ``base_version``'s parameters, written as a
    third blob and referenced as the record's ``update``."""
    outer_momentum: float | None = None
    """β the round's outer step used (``DiLoCo.momentum_rule``); None: ``algorithm.outer_momentum``."""


UNPARSABLE_NAMES_LOGGED = 1000
"""Distinct unparsable names a store logs (each once); past it they are only counted."""
UNPARSABLE_NAMES_REMEMBERED = 100_000
"""Distinct unparsable names a store tells apart (by an 8-byte digest); past it, new ones are
no longer counted (the count then reads "at least")."""


class SkippedNames:
    """Names in a listing that are no key of the run's layout: anyone who can write to the
    bucket can drop one, so each is skipped, counted and logged once, never fatal to a pass."""

    def __init__(self) -> None:
        self._seen: set[bytes] = set()
        self.count = 0
        """Distinct names skipped, up to ``UNPARSABLE_NAMES_REMEMBERED`` (``gradientmail.store.unparsable_keys``)."""

    def skip(self, name: str) -> None:
        digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        if digest in self._seen or len(self._seen) >= UNPARSABLE_NAMES_REMEMBERED:
            return
        self._seen.add(digest)
        self.count += 1
        if self.count <= UNPARSABLE_NAMES_LOGGED:
            log.warning("skipping %r in the mailbox: not a name of the run's key layout (docs/protocol.md)", name[:300])
        elif self.count == UNPARSABLE_NAMES_REMEMBERED:
            log.warning("%d distinct names in the mailbox are no key of the run's layout; no longer counting", self.count)


class RunStore:
    """One run's records, blobs and leases, verified on the way in and out.

    With a run key every record written is signed and every record read must verify
    (``Unauthenticated`` otherwise); without one, records are neither signed nor checked.
    Every read fetches at most what the thing read may legitimately weigh (size before bytes).
    """

    def __init__(self, mailbox: Mailbox, key: RunKey | None = None) -> None:
        self._mailbox = mailbox
        self._key = key
        self._skipped = SkippedNames()

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
        return self._skipped.count

    def listed(self, prefix: str) -> list[tuple[str, keys.ParsedKey]]:
        """The names under ``prefix`` with what each is (one LIST), through the one parser of
        the key layout (``keys.parse_key``); a name that is none is skipped and reported."""
        found = []
        for name in self._mailbox.list(prefix):
            parsed = keys.parse_key(name)
            if parsed is None:
                self._skipped.skip(name)
            else:
                found.append((name, parsed))
        return found

    # -- records -------------------------------------------------------------------
    def _encode(self, location: str, record: Record) -> bytes:
        return (self._key.sign(location, record) if self._key is not None else record).to_json()

    def _read_record(self, cls: type[RecordT], location: str) -> tuple[RecordT, bytes]:
        """Fetch (at most ``cls.max_bytes``), parse and, with a key, verify a record.

        Raises ``KeyNotFound``, ``InvalidRecord`` (``Unauthenticated`` for a bad MAC).
        """
        try:
            data = self._mailbox.get(location, max_bytes=cls.max_bytes)
        except ObjectTooLarge as exc:
            raise InvalidRecord(f"{cls.record_type} record at {location}: {exc}") from None
        return self._parse(cls, location, data), data

    def _parse(self, cls: type[RecordT], location: str, data: bytes) -> RecordT:
        record = cls.from_json(data)
        return self._key.verify(location, record) if self._key is not None else record

    # -- manifest ------------------------------------------------------------------
    def read_manifest(self, *, verify: bool = True) -> Manifest | None:
        """The run's manifest, None if there is none. ``verify=False`` skips the MAC check (to
        say which key a run wants when ours does not verify it); never act on such a read."""
        try:
            if verify:
                return self._read_record(Manifest, keys.MANIFEST)[0]
            return Manifest.from_json(self._mailbox.get(keys.MANIFEST, max_bytes=Manifest.max_bytes))
        except KeyNotFound:
            return None
        except ObjectTooLarge as exc:
            raise InvalidRecord(f"manifest: {exc}") from None

    def read_spec(self) -> RunSpec:
        """The run's view of itself. Raises ``GradientMailError`` when there is no run here."""
        manifest = self.read_manifest()
        if manifest is None:
            raise GradientMailError(f"no run at {self.url}: {keys.MANIFEST} is missing")
        return RunSpec.from_manifest(manifest)

    def create_manifest(self, manifest: Manifest) -> bool:
        """Create the manifest once; False when another node created the run first."""
        try:
            self._mailbox.create(keys.MANIFEST, self._encode(keys.MANIFEST, manifest))
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
            head = self._read_record(Head, location)[0]
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
        record, data = self._read_record(RoundRecord, location)
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
            record = self._parse(RoundRecord, location, data)
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
        return CommittedVersion(record, self.read_params(spec, record), self.read_tensors(record.outer_state), stored.sha256)

    def read_params(self, spec: RunSpec, record: RoundRecord) -> Arrays:
        """The parameters a round record commits, verified (what a learner aligns with)."""
        return self.read_tensors(record.params, spec.param_specs(record.fragment))

    def rebuild_params(self, spec: RunSpec, record: RoundRecord, base: Mapping[str, np.ndarray]) -> Arrays:
        """The parameters ``record`` commits, rebuilt from ``base`` (those of its base version)
        and its compact update: what a learner one version behind fetches instead of them.

        Raises ``CorruptPayload``/``IncompatiblePayload`` when the update does not decode, or the
        rebuilt parameters do not encode to the committed blob's exact size and sha256 (a wrong
        base, a damaged update): the caller then reads the full parameters.
        """
        codec = spec.algorithm.update_codec
        if codec is None or record.update is None:
            raise IncompatiblePayload(f"fragment {record.fragment} version {record.version} has no compact update")
        parts = decode_update(self.read_blob(record.update), codec, spec.shapes(record.fragment))
        params = {name: apply_update(np.asarray(base[name]), update, codec) for name, update in parts.items()}
        check_tensors(params, spec.param_specs(record.fragment), record.update.key)
        rebuilt = payload.encode(params)
        if len(rebuilt) != record.params.size_bytes or sha256_hex(rebuilt) != record.params.sha256:
            raise CorruptPayload(
                f"fragment {record.fragment} version {record.version}: the parameters rebuilt from its update "
                "differ from the committed ones"
            )
        return params

    def commit_version(self, draft: VersionDraft, *, committed_by: str, term: int) -> StoredRound | None:
        """Write a version's blobs under keys unique to this attempt, then create its record,
        then point the fragment's head at it.

        The blobs are immutable and written *before* the record (INV-1), so a record never
        points at missing bytes and a writer that loses the race overwrites nothing: it deletes
        the blobs it wrote (two, or three with an update) and returns None.
        Returns the stored record, or None if another writer committed this version first.
        """
        fragment, version = draft.fragment, draft.version
        attempt = uuid.uuid4().hex[:12]
        # Each blob is hashed while it uploads (issue 13); one after the other, so no more than
        # one encoded blob is held at a time (writing both at once measured no faster on loopback).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gm-commit-sha256") as hashing:
            compress = draft.algorithm.payload_compression == "zstd"
            params_ref = self._write_tensors(
                keys.params_blob(fragment, version, committed_by, attempt), draft.params, hashing, compress=compress
            )
            state_ref = self._write_tensors(
                keys.outer_state_blob(fragment, version, committed_by, attempt), draft.outer_state, hashing, compress=compress
            )
            update_ref = None
            if draft.update is not None:
                codec, parts = draft.update
                update_key = keys.update_blob(fragment, version, committed_by, attempt)
                update_ref = self._put_blob(update_key, encode_update(parts, codec), hashing)
        algorithm = draft.algorithm
        rejected, omitted = bound_rejections(draft.rejected)
        record = RoundRecord(
            fragment=fragment,
            version=version,
            base_version=draft.base_version,
            participants=draft.participants,
            rejected=rejected,
            rejections_omitted=omitted,
            merge=algorithm.merge.to_manifest(),
            outer_lr=algorithm.outer_lr,
            outer_momentum=algorithm.outer_momentum if draft.outer_momentum is None else draft.outer_momentum,
            final=draft.final,
            params=params_ref,
            outer_state=state_ref,
            committed_by=committed_by,
            term=term,
            timing=draft.timing or RoundTiming(),
            previous=draft.previous,
            samples_per_step_cap=draft.samples_per_step_cap,
            backend=draft.backend,
            update=update_ref,
        )
        location = keys.round_record(fragment, version)
        data = self._encode(location, record)
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
        stored = StoredRound(self._parse(RoundRecord, location, data), sha256_hex(data))
        self.write_head(fragment, version, stored.sha256)
        return stored

    def write_head(self, fragment: int, version: int, record_sha256: str) -> None:
        """Point the fragment's head at ``version``. Best effort: the head is a hint, readers
        probe past it, so a failed write is logged and left for the next commit."""
        location = keys.head(fragment)
        try:
            self._mailbox.put(
                location, self._encode(location, Head(fragment=fragment, version=version, record_sha256=record_sha256))
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
    ) -> PublishedContribution:
        """Put a delta, then create its record once; returns its key, the payload's bytes and the
        record. ``delta`` is the named arrays, or a payload already encoded (a quantized one).

        ``first_sequence`` is the lowest sequence number to use; taken ones are skipped, so a
        restarted learner never collides with what it published before. ``compress``: named
        arrays are stored compressed (``DiLoCo.payload_compression``).

        Raises:
            GradientMailError: the record exists after all (a second process uses this id).
        """
        sequence = first_sequence
        while self._mailbox.exists(keys.contribution_record(fragment, anchor_version, learner, sequence)):
            sequence += 1
        key = keys.ContributionKey(fragment, anchor_version, learner, sequence)
        if isinstance(delta, bytes):  # already compact (quantized or sparse): stored as is
            blob = self._put_blob(key.blob, delta)
        elif compress:
            blob = self._put_compressed(key.blob, joined(Gathered(payload.encode_pieces(delta))), _typesize(delta.values()))
        else:
            blob = self._put_blob(key.blob, Gathered(payload.encode_pieces(delta)))
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
        )
        try:
            self._mailbox.create(key.record, self._encode(key.record, contribution))
        except RecordExists:  # another process uses our learner id: refuse to guess
            raise GradientMailError(f"contribution {key.record} already exists: is learner id {learner!r} used twice?") from None
        return PublishedContribution(key, blob.wire_bytes, contribution)

    def contributors(self, fragment: int, base_version: int) -> set[str]:
        """Learners with a contribution against ``base_version`` of ``fragment`` (one LIST)."""
        listed = (parsed for _, parsed in self.listed(keys.contributions_prefix(fragment, base_version)))
        return {parsed.learner for parsed in listed if isinstance(parsed, keys.ContributionKey)}

    # -- contributions: the syncer's side -------------------------------------------
    def contributions(self, fragment: int) -> list[keys.ContributionKey]:
        """Every contribution of a fragment, any base version (one LIST)."""
        listed = (parsed for _, parsed in self.listed(keys.contributions_root(fragment)))
        return [parsed for parsed in listed if isinstance(parsed, keys.ContributionKey) and parsed.fragment == fragment]

    def read_contribution(self, key: keys.ContributionKey) -> Contribution:
        """The contribution record. Raises ``InvalidRecord`` when it does not parse, or is too
        large, and ``Unauthenticated`` when it does not verify under the run key."""
        return self._read_record(Contribution, key.record)[0]

    def read_delta(self, spec: RunSpec, contribution: Contribution) -> Arrays:
        """The contribution's delta, verified against the record and the run's delta shapes;
        dequantized (or densified) to fp32 when the run quantizes (or sparsifies) deltas."""
        codec = spec.algorithm.delta_codec
        if codec is None:
            return self.read_tensors(contribution.payload, spec.delta_specs(contribution.fragment))
        data = self.read_blob(contribution.payload)
        return quantized_payload.decode_dequantized(data, codec, spec.shapes(contribution.fragment))

    def delete_contribution(self, key: keys.ContributionKey) -> None:
        """Remove a contribution that no round will read again (payload first, then record)."""
        self._mailbox.delete(key.blob)
        self._mailbox.delete(key.record)

    # -- tensor blobs --------------------------------------------------------------
    def _write_tensors(
        self,
        key: str,
        tensors: Mapping[str, np.ndarray],
        hashing: ThreadPoolExecutor | None = None,
        *,
        compress: bool = False,
    ) -> PayloadRef:
        """Put a blob of ``tensors``, its pieces gathered (no encoded copy where the store writes
        pieces); with ``hashing``, its sha256 is taken there while it uploads; ``compress``: stored
        as zstd-shuffle frames, shuffled by the element size that holds most of the bytes."""
        pieces = Gathered(payload.encode_pieces(tensors))
        if not compress:
            return self._put_blob(key, pieces, hashing)
        return self._put_compressed(key, joined(pieces), _typesize(tensors.values()), hashing)

    def _put_compressed(self, key: str, raw: bytes, typesize: int, hashing: ThreadPoolExecutor | None = None) -> PayloadRef:
        """Put ``raw`` compressed (``backends/lossless.py``); the reference pins the raw bytes."""
        digest = hashing.submit(sha256_hex, raw) if hashing is not None else None
        stored = lossless.compress(raw, typesize)
        self._mailbox.put(key, stored)
        sha256 = digest.result() if digest is not None else sha256_hex(raw)
        return PayloadRef(key=key, sha256=sha256, size_bytes=len(raw), encoding=lossless.ENCODING, stored_bytes=len(stored))

    def _put_blob(self, key: str, data: bytes | Gathered, hashing: ThreadPoolExecutor | None = None) -> PayloadRef:
        """Put a blob and reference it by size and sha256. A store that hashes what it writes
        (``HashingPut``) hands the digest over, and writes a gathered payload out of its pieces:
        the bytes are hashed once and never joined. Any other gets them joined and hashes them
        here, on ``hashing`` while the upload runs when given."""
        mailbox = self._mailbox
        if isinstance(mailbox, HashingPut):
            _, sha256 = mailbox.put_sha256(key, data)
            return PayloadRef(key=key, sha256=sha256, size_bytes=len(data))
        data = joined(data)
        digest = hashing.submit(sha256_hex, data) if hashing is not None else None
        try:
            self._mailbox.put(key, data)
        finally:
            sha256 = digest.result() if digest is not None else sha256_hex(data)
        return PayloadRef(key=key, sha256=sha256, size_bytes=len(data))

    def read_blob(self, ref: PayloadRef) -> bytes:
        """A referenced blob's bytes, after checking its size and checksum (``CorruptPayload``).
        No more than the record's ``size_bytes`` is fetched from a larger object. A store that
        hashes while it downloads (``HashingGet``) hands the digest over with the bytes; any
        other is hashed here. Either way nothing is returned before its digest matched."""
        mailbox = self._mailbox
        if ref.encoding is not None:
            return self._read_compressed(ref)
        try:
            if isinstance(mailbox, HashingGet):
                data, digest = mailbox.get_sha256(ref.key, max_bytes=ref.size_bytes)
            else:
                data = mailbox.get(ref.key, max_bytes=ref.size_bytes)
                digest = None
        except ObjectTooLarge as exc:
            raise CorruptPayload(f"{ref.key}: larger than the {ref.size_bytes} bytes its record says ({exc})") from None
        if len(data) != ref.size_bytes:
            raise CorruptPayload(f"{ref.key}: {len(data)} bytes, the record says {ref.size_bytes}")
        if (digest if digest is not None else sha256_hex(data)) != ref.sha256:
            raise CorruptPayload(f"{ref.key}: checksum mismatch")
        return data

    def _read_compressed(self, ref: PayloadRef) -> bytes:
        """A compressed blob's raw bytes: no more fetched than the codec's worst case for the
        declared size, no frame decoded past it (INV-13), the raw bytes checked by sha256."""
        bound = lossless.stored_bound(ref.size_bytes)
        try:
            stored = self._mailbox.get(ref.key, max_bytes=bound)
        except ObjectTooLarge as exc:
            raise CorruptPayload(f"{ref.key}: larger than {bound} bytes, the most {ref.size_bytes} compress to ({exc})") from None
        try:
            data = lossless.decompress(stored, ref.size_bytes)
        except lossless.LosslessError as exc:
            raise CorruptPayload(f"{ref.key}: {exc}") from None
        if sha256_hex(data) != ref.sha256:
            raise CorruptPayload(f"{ref.key}: checksum mismatch")
        return data

    def blob_intact(self, ref: PayloadRef) -> bool:
        """Whether the blob ``ref`` names is there with its size and checksum (one read)."""
        try:
            self.read_blob(ref)
        except (KeyNotFound, CorruptPayload):
            return False
        return True

    def restore_blob(self, ref: PayloadRef, data: bytes) -> None:
        """Write ``data`` back at ``ref.key`` if it is exactly the bytes ``ref`` pins (size and
        sha256); ``CorruptPayload`` otherwise, and nothing is written."""
        if len(data) != ref.size_bytes or sha256_hex(data) != ref.sha256:
            raise CorruptPayload(f"{ref.key}: the recomputed bytes differ from those its record pins")
        # the record pins the raw bytes: any compressor's frames of them read back the same
        self._mailbox.put(ref.key, data if ref.encoding is None else lossless.compress(data, 4))

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
    def read_lease(self, key: str, *, need_token: bool = True) -> LeaseRead | None:
        """The lease and its version token; None if absent. A lease that is too large, does
        not parse or does not verify comes back with ``lease=None`` and the problem.

        Of an oversized lease only the syncer's needs its token (to be replaced by
        compare-and-swap); ``need_token=False`` skips that HEAD, which a directory store pays
        for by hashing the file."""
        mailbox = self._mailbox
        try:
            if isinstance(mailbox, StampedGet):
                data, info = mailbox.get_stamped(key, max_bytes=Lease.max_bytes)
                token, written_at, resolution_s = info.token, info.modified_at, info.modified_resolution_s
            else:
                (data, token), written_at, resolution_s = mailbox.get_versioned(key, max_bytes=Lease.max_bytes), None, 0.0
        except KeyNotFound:
            return None
        except ObjectTooLarge as exc:
            if not need_token:
                return LeaseRead(None, "", str(exc))
            found = self._mailbox.head(key)
            return None if found is None else LeaseRead(None, found.token, str(exc))
        try:
            return LeaseRead(self._parse(Lease, key, data), token, "", written_at, resolution_s)
        except InvalidRecord as exc:
            return LeaseRead(None, token, str(exc))

    def learner_lease_keys(self) -> list[str]:
        return self._mailbox.list(keys.LEARNER_LEASES)

    def put_lease(self, key: str, lease: Lease) -> str:
        """Write a lease unconditionally (a learner's own); returns its token."""
        return self._mailbox.put(key, self._encode(key, lease))

    def create_lease(self, key: str, lease: Lease) -> str:
        """Create a lease once; raises ``RecordExists`` when someone holds it already."""
        return self._mailbox.create(key, self._encode(key, lease))

    def swap_lease(self, key: str, lease: Lease, expected_token: str) -> str:
        """Replace a lease by compare-and-swap; raises ``VersionConflict`` or ``KeyNotFound``."""
        return self._mailbox.swap(key, self._encode(key, lease), expected_token)

    # The typed lease API: the roles (session, syncer) name a lease by what it is, never by its
    # key, so the key layout stays in records.keys and this store (docs/architecture.md). The
    # key-taking forms above remain for the entry points and tools (CLI, audit, benchmarks).

    def read_syncer_lease(self, *, need_token: bool = True) -> LeaseRead | None:
        """The run's syncer lease as :meth:`read_lease` finds it; None while nobody holds it."""
        return self.read_lease(keys.SYNCER_LEASE, need_token=need_token)

    def read_learner_lease(self, learner: str, *, need_token: bool = True) -> LeaseRead | None:
        """One learner's own lease as :meth:`read_lease` finds it; None if it has none.
        ``InvalidKey`` for an id that is not a valid learner id."""
        return self.read_lease(keys.learner_lease(learner), need_token=need_token)

    def learners_with_leases(self) -> list[str]:
        """The learners that have a lease in the mailbox, live or not (one LIST), sorted; objects
        under the learners' lease prefix that are not a learner's lease key are skipped."""
        found = (parsed for _, parsed in self.listed(keys.LEARNER_LEASES))
        return [parsed.learner for parsed in found if isinstance(parsed, keys.LearnerLeaseKey)]

    def put_learner_lease(self, lease: Lease) -> str:
        """Write a learner's own lease (kind ``learner``) at its holder's key with a plain put
        (its id is its own; a restart takes it over); returns its token. ``ValueError`` for a
        lease of another kind."""
        if lease.kind != "learner":
            raise ValueError(f"put_learner_lease needs a learner lease, got kind {lease.kind!r}")
        return self.put_lease(keys.learner_lease(lease.holder), lease)

    def swap_learner_lease(self, lease: Lease, expected_token: str) -> str:
        """Replace a learner's own lease by compare-and-swap against the token of its last write;
        raises ``VersionConflict`` (someone else wrote it) or ``KeyNotFound`` (it was deleted)."""
        if lease.kind != "learner":
            raise ValueError(f"swap_learner_lease needs a learner lease, got kind {lease.kind!r}")
        return self.swap_lease(keys.learner_lease(lease.holder), lease, expected_token)

    def create_syncer_lease(self, lease: Lease) -> str:
        """Create the syncer lease once (the first election); raises ``RecordExists`` when
        another node holds it already."""
        return self.create_lease(keys.SYNCER_LEASE, lease)

    def swap_syncer_lease(self, lease: Lease, expected_token: str) -> str:
        """Replace the syncer lease by compare-and-swap (renew, take over, release); raises
        ``VersionConflict`` (someone else wrote it) or ``KeyNotFound`` (it was deleted)."""
        return self.swap_lease(keys.SYNCER_LEASE, lease, expected_token)

    # -- work queues -----------------------------------------------------------------
    def queue_units(self, queue: str) -> tuple[set[int], set[int]]:
        """The units of ``queue`` that have a claim, and those that are done (two LISTs)."""
        claimed: set[int] = set()
        done: set[int] = set()
        for part, into in (("claims", claimed), ("done", done)):
            for _, parsed in self.listed(keys.queue_prefix(queue, part)):
                if isinstance(parsed, keys.QueueKey) and parsed.queue == queue and parsed.part == part:
                    into.add(parsed.unit)
        return claimed, done

    def read_queue_claim(self, queue: str, unit: int) -> tuple[QueueClaim | None, str] | None:
        """A unit's claim and its version token; ``(None, token)`` for one that does not parse or
        verify (it may be replaced); None when the unit has no claim."""
        location = keys.queue_claim(queue, unit)
        try:
            data, token = self._mailbox.get_versioned(location, max_bytes=QueueClaim.max_bytes)
        except KeyNotFound:
            return None
        except ObjectTooLarge:
            info = self._mailbox.head(location)
            return None if info is None else (None, info.token)
        try:
            claim = self._parse(QueueClaim, location, data)
        except InvalidRecord:
            return None, token
        return (claim, token) if claim.queue == queue and claim.unit == unit else (None, token)

    def create_queue_claim(self, claim: QueueClaim) -> str:
        """Claim an unclaimed unit; ``RecordExists`` when another learner was first."""
        location = keys.queue_claim(claim.queue, claim.unit)
        return self._mailbox.create(location, self._encode(location, claim))

    def swap_queue_claim(self, claim: QueueClaim, expected_token: str) -> str:
        """Take a unit's claim over by compare-and-swap; ``VersionConflict`` when someone else did."""
        location = keys.queue_claim(claim.queue, claim.unit)
        return self._mailbox.swap(location, self._encode(location, claim), expected_token)

    def create_queue_done(self, done: QueueDone) -> bool:
        """Record that a unit was trained to its end; False when it was already (create-once)."""
        location = keys.queue_done(done.queue, done.unit)
        try:
            self._mailbox.create(location, self._encode(location, done))
        except RecordExists:
            return False
        return True

    # -- barriers --------------------------------------------------------------------
    def arrive_at_barrier(self, arrival: BarrierArrival, clock: Callable[[], float]) -> ClockSample | None:
        """Create ``arrival`` (create-once) and return the clock sample its write gives: ``clock()``
        around the write and the store's stamp of it. None when the store stamps no writes, or
        the node had arrived already (a call again after a timeout). An object squatting the
        node's own key that is not its arrival (garbage, or unsigned in a signed run) is
        written over: only that node writes there."""
        location = keys.barrier_arrival(arrival.barrier, arrival.node)
        data = self._encode(location, arrival)
        sent = clock()
        try:
            self._mailbox.create(location, data)
        except RecordExists:
            found = self.read_barrier_arrival(arrival.barrier, arrival.node)
            if found is not None:
                return None
            log.warning("barrier %s: the arrival key of %s held something else; writing over it", arrival.barrier, arrival.node)
            self._mailbox.put(location, data)
        return self._sample(location, sent, clock())

    def probe_store_clock(self, barrier: str, node: str, clock: Callable[[], float]) -> ClockSample | None:
        """Write ``node``'s clock probe for ``barrier`` and return the sample (None: no stamps)."""
        location = keys.barrier_clock_probe(barrier, node)
        sent = clock()
        self._mailbox.put(location, b"{}")
        return self._sample(location, sent, clock())

    def _sample(self, location: str, sent: float, returned: float, token: str | None = None) -> ClockSample | None:
        """The clock sample of the write to ``location`` that was sent at ``sent`` and answered
        at ``returned``: a HEAD for the store's stamp of it (None: no stamp, or, given the
        write's ``token``, another write landed there since)."""
        info = self._mailbox.head(location)
        if info is None or info.modified_at is None or (token is not None and info.token != token):
            return None
        return ClockSample(sent, returned, info.modified_at, info.modified_resolution_s)

    def lease_write_sample(self, name: str, token: str, sent: float, returned: float) -> ClockSample | None:
        """The clock sample of a lease write this node made (``name``: the lease's key, as
        ``store.leases.LeaseName.key`` gives it; ``token``: what the write returned); one HEAD."""
        return self._sample(name, sent, returned, token)

    def barrier_nodes(self, barrier: str) -> set[str]:
        """The nodes with an arrival listed at ``barrier`` (one LIST; not yet read or verified)."""
        return {
            parsed.node
            for _, parsed in self.listed(keys.barrier_prefix(barrier, "arrivals"))
            if isinstance(parsed, keys.BarrierKey) and parsed.barrier == barrier and parsed.part == "arrivals"
        }

    def read_barrier_arrival(self, barrier: str, node: str) -> tuple[BarrierArrival, float | None] | None:
        """``node``'s arrival at ``barrier`` and the store's stamp of it (None: a store without
        stamps), read and, with a run key, verified; None when there is none, or what is there is
        not that node's arrival at that barrier (garbage, another key's, a copy of another
        node's record), so no dropped object counts as a party."""
        location = keys.barrier_arrival(barrier, node)
        try:
            arrival, _ = self._read_record(BarrierArrival, location)
        except (KeyNotFound, InvalidRecord):
            return None
        if arrival.barrier != barrier or arrival.node != node:
            return None
        info = self._mailbox.head(location)
        if info is None:
            return None
        return arrival, info.modified_at

    # -- learner states (state_dir="mailbox") ---------------------------------------
    def save_learner_state(self, learner: str, run_id: str, total_steps: int, data: bytes, *, compress: bool = False) -> None:
        """Put a learner's saved state: the bytes under a key of their own, then the record that
        names them (so a kill in between leaves the previous save whole), then delete the
        learner's older saves. ``compress``: stored compressed (mostly fp32 tensors: shuffled by 4)."""
        blob = keys.learner_state_blob(learner, total_steps, uuid.uuid4().hex[:8])
        ref = self._put_compressed(blob, data, 4) if compress else self._put_blob(blob, data)
        record = LearnerStateRecord(learner=learner, run_id=run_id, total_steps=total_steps, state=ref)
        location = keys.learner_state_record(learner)
        self._mailbox.put(location, self._encode(location, record))
        for key, parsed in self.listed(keys.learner_state_prefix(learner)):
            if isinstance(parsed, keys.LearnerStateKey) and parsed.blob and key != blob:
                try:
                    self._mailbox.delete(key)
                except GradientMailError as exc:  # a learner without delete permission: the old save stays
                    log.warning("could not delete the older learner state %s: %s", key, exc)

    def read_learner_state(self, learner: str) -> tuple[LearnerStateRecord, bytes] | None:
        """A learner's newest saved state, checked (signature in a signed run, the learner, a
        blob of its own prefix, size and sha256); None when it has none. ``InvalidRecord``,
        ``CorruptPayload`` or ``KeyNotFound`` (the blob is gone) otherwise."""
        location = keys.learner_state_record(learner)
        try:
            record, _ = self._read_record(LearnerStateRecord, location)
        except KeyNotFound:
            return None
        named = keys.parse_key(record.state.key)
        if record.learner != learner or not (isinstance(named, keys.LearnerStateKey) and named.blob and named.learner == learner):
            raise InvalidRecord(f"learner state record at {location} names {record.state.key!r}, not a state of {learner}")
        return record, self.read_blob(record.state)

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


def _states_newer_schema(data: bytes) -> bool:
    """Whether ``data`` is a JSON object whose ``schema_version`` is newer than ours (written by
    a newer GradientMail: never ours to delete)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return False
    version = value.get("schema_version") if isinstance(value, dict) else None
    return isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION


def _typesize(arrays: Iterable[np.ndarray]) -> int:
    """The element size that holds most of a blob's bytes: what its byte shuffle groups by."""
    by_size: dict[int, int] = {}
    for array in arrays:
        by_size[array.dtype.itemsize] = by_size.get(array.dtype.itemsize, 0) + array.nbytes
    return max(by_size, key=lambda size: by_size[size]) if by_size else 1
