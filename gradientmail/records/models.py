"""Typed, versioned JSON records: what travels through the mailbox besides tensor payloads.

Every record carries ``schema_version``; decoding refuses malformed JSON, unknown fields,
wrong types and unknown schema versions with ``InvalidRecord`` naming the record type and
the problem. Records are immutable (frozen) once built.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from gradientmail.digests import LEGACY_BLOB_DIGEST, DigestName
from gradientmail.errors import InvalidRecord
from gradientmail.records.ids import check_learner_id

SCHEMA_VERSION: Literal[1] = 1
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
MAX_RECORD_BYTES = 16 * 1024 * 1024
"""The largest record of any kind (a manifest of a very large model); each kind sets its own
``max_bytes`` below it, and readers fetch no more than that (records are metadata, not tensors)."""
MAX_STEPS = 2**31 - 1
"""Largest step count a record may carry (far beyond any run; keeps weights finite)."""
MAX_SAMPLES = 2**53
"""Largest sample count a record may carry: samples² / steps stays a finite float."""

_STRICT = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
"""Every record model: immutable, no unknown fields, no coercion (``2.0``, ``true`` or ``"5"``
is not a step count), no NaN or infinity."""

RecordT = TypeVar("RecordT", bound="Record")


def utc_now() -> str:
    """Wall-clock time for humans reading records; never used to judge expiry."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


LearnerId = Annotated[str, AfterValidator(check_learner_id)]


def _check_hex256(value: str) -> str:
    if not SHA256_HEX.match(value):
        raise ValueError("must be 64 lowercase hex digits")
    return value


Hex256 = Annotated[str, AfterValidator(_check_hex256)]
"""A sha256 or BLAKE3 digest, or an HMAC-SHA256, as records carry them."""


class OmitsAbsentFields(BaseModel):
    """A model whose fields named in ``omitted_when_none`` leave the JSON when they are None, so
    a field added after records were signed keeps every older record's canonical JSON (what its
    MAC covers) byte for byte: an old record parses with the field None and dumps as it was."""

    omitted_when_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler) -> Any:
        dumped = handler(self)
        if isinstance(dumped, dict):
            for name in self.omitted_when_none:
                if name in dumped and dumped[name] is None:
                    del dumped[name]
        return dumped


class Record(OmitsAbsentFields):
    """Base of every record: frozen, strict, versioned, optionally signed (``mac``)."""

    model_config = _STRICT
    record_type: ClassVar[str] = "record"
    max_bytes: ClassVar[int] = MAX_RECORD_BYTES
    """Readers fetch at most this many bytes of a record of this kind (size before bytes)."""
    schema_version: Literal[1] = SCHEMA_VERSION
    """Required on the wire (a record without it is refused); code that builds a record gets it."""
    mac: Hex256 | None = None
    """HMAC-SHA256 of the record's signed content under the run key (``records.auth``); None in
    a run without a key."""

    def to_json(self) -> bytes:
        return self.model_dump_json().encode("utf-8")

    def signed_content(self) -> bytes:
        """What the MAC covers: the canonical JSON of every field but ``mac`` (it includes the
        checksums of every blob the record references)."""
        return self.model_dump_json(exclude={"mac"}).encode("utf-8")

    @classmethod
    def from_json(cls: type[RecordT], data: bytes | str) -> RecordT:
        """Parse and validate; raises ``InvalidRecord`` with the reason, whatever the input.

        The parser is pydantic's own (bounded nesting depth), strict about types and refusing
        NaN and infinity, so hostile JSON becomes a reason, never an exception of another kind.
        """
        if len(data) > cls.max_bytes:
            raise InvalidRecord(f"{cls.record_type} record is {len(data)} bytes, over the {cls.max_bytes} limit")
        try:
            record = cls.model_validate_json(data)
        except ValidationError as exc:
            unversioned = "schema_version" not in (data if isinstance(data, str) else data.decode("utf-8", "replace"))
            if unversioned and exc.errors()[0]["type"] not in ("json_invalid", "model_type"):
                raise InvalidRecord(_unversioned(cls.record_type)) from None
            raise InvalidRecord(_problems(cls.record_type, exc)) from None
        except Exception as exc:  # anything else the parser may raise is still just bad input
            raise InvalidRecord(f"malformed {cls.record_type} record: {type(exc).__name__}: {exc}"[:500]) from None
        if "schema_version" not in record.model_fields_set:
            raise InvalidRecord(_unversioned(cls.record_type))
        return record


def _unversioned(record_type: str) -> str:
    return f"{record_type} record has schema_version None; this GradientMail reads version {SCHEMA_VERSION}"


def _problems(record_type: str, error: ValidationError) -> str:
    errors = error.errors()
    for item in errors:
        if item["loc"] == ("schema_version",) and item["type"] == "literal_error":
            return f"{record_type} record has schema_version {item['input']!r}; this GradientMail reads version {SCHEMA_VERSION}"
    if errors and errors[0]["type"] == "json_invalid":
        return f"{record_type} record is not JSON: {errors[0]['msg']}"
    if errors and errors[0]["type"] == "model_type":
        return f"{record_type} record must be a JSON object, got {type(errors[0]['input']).__name__}"
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(record)'}: {e['msg']}" for e in errors)
    return f"malformed {record_type} record: {problems}"[:2000]


class ParameterSpec(BaseModel):
    """One model parameter as the manifest pins it."""

    model_config = _STRICT
    name: str = Field(min_length=1, max_length=512)
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        """Elements in the tensor."""
        return math.prod(self.shape)

    @field_validator("shape")
    @classmethod
    def _non_negative(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(d < 0 for d in value):
            raise ValueError("dimensions must be non-negative")
        return value


class Manifest(Record):
    """The run's identity: algorithm configuration, model signature and fragment plan."""

    record_type: ClassVar[str] = "manifest"
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"blob_digest"})
    run_id: str = Field(min_length=1, max_length=128)
    algorithm: dict[str, Any]
    """``DiLoCo.to_manifest()``, the merge as ``{"kind": …}``."""
    parameters: tuple[ParameterSpec, ...] = Field(min_length=1)
    plan: tuple[tuple[str, ...], ...] = Field(min_length=1)
    created_by: LearnerId
    created_at: str = Field(default_factory=utc_now)
    key_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")
    """Fingerprint of the run key (not the key): set when the run's records are signed, so a node
    with another key, or none, refuses to join instead of being ignored."""
    lease_ttl_s: float | None = Field(default=None, gt=0, le=3600)
    """The run's lease TTL: every node judges every lease by it (a lease's own ``ttl_s`` is only
    informative). None (runs from before it was recorded): 10 s."""
    retention: dict[str, Any] | None = None
    """``Retention.to_manifest()``: what the syncer keeps and collects; None: the defaults."""
    blob_digest: DigestName | None = None
    """The digest the run's writers pin blobs by (``gradientmail.digests``; new runs: BLAKE3).
    None, and absent from the JSON (``omitted_when_none``): a run from before it was recorded,
    whose blobs are pinned by sha256."""

    @property
    def blobs_pinned_by(self) -> DigestName:
        """The digest the run's writers pin blobs by: ``blob_digest``, sha256 where it is None."""
        return self.blob_digest or LEGACY_BLOB_DIGEST

    @field_validator("plan")
    @classmethod
    def _plan_is_partition(cls, plan: tuple[tuple[str, ...], ...], info: Any) -> tuple[tuple[str, ...], ...]:
        parameters = info.data.get("parameters")
        if parameters is not None:
            names = [p.name for p in parameters]
            planned = [n for fragment in plan for n in fragment]
            if sorted(planned) != sorted(names) or len(set(planned)) != len(planned):
                raise ValueError("the plan must list every parameter exactly once")
            if any(not fragment for fragment in plan):
                raise ValueError("every fragment must hold at least one parameter")
        return plan


PayloadEncoding = Literal["zstd-shuffle"]
"""How a blob is stored when not as is: ``zstd-shuffle``, Blosc zstd frames with byte shuffle
(``backends/lossless.py``, ``DiLoCo.payload_compression``)."""


class PayloadRef(OmitsAbsentFields):
    """An immutable blob a record points at, with what is needed to verify it: its digest, in
    exactly one of ``sha256`` and ``blake3`` (the run's ``Manifest.blob_digest`` when it was
    written; a reader checks by the one the reference carries), and ``size_bytes``, both the raw
    blob's; with an ``encoding`` the object holds it compressed (``stored_bytes`` long when
    written), and a reader checks the raw bytes it decodes."""

    model_config = _STRICT
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"sha256", "blake3"})
    key: str = Field(min_length=1, max_length=1024)
    sha256: Hex256 | None = None
    blake3: Hex256 | None = None
    size_bytes: int = Field(ge=0, le=2**50)
    encoding: PayloadEncoding | None = None
    stored_bytes: int | None = Field(default=None, ge=0, le=2**50)
    """Bytes the writer stored under an ``encoding`` (what crossed the wire); information only:
    readers bound the object by the codec's worst case for ``size_bytes``."""

    @model_validator(mode="after")
    def _one_digest(self) -> PayloadRef:
        if (self.sha256 is None) == (self.blake3 is None):
            raise ValueError("a payload reference carries exactly one digest: sha256 or blake3")
        return self

    @classmethod
    def pinned(cls, key: str, digest: DigestName, hexdigest: str, size_bytes: int, **fields: Any) -> PayloadRef:
        """The reference to the blob at ``key`` whose ``digest`` is ``hexdigest``."""
        pinned: dict[str, Any] = {digest: hexdigest}
        return cls(key=key, size_bytes=size_bytes, **pinned, **fields)

    @property
    def digest_name(self) -> DigestName:
        """The digest this reference pins its blob by."""
        return "sha256" if self.sha256 is not None else "blake3"

    @property
    def hexdigest(self) -> str:
        """The blob's digest (of ``digest_name``), hex."""
        digest = self.sha256 if self.sha256 is not None else self.blake3
        assert digest is not None  # _one_digest
        return digest

    @property
    def wire_bytes(self) -> int:
        """Bytes the object holds: what a transfer of it moves."""
        return self.size_bytes if self.stored_bytes is None else self.stored_bytes


RealignReason = Literal["carry_limit"]
"""Why a learner dropped unmerged work instead of carrying it: ``carry_limit``, it spanned more
steps than ``DiLoCo.max_carried_steps`` allows."""


class Realignment(BaseModel):
    """Work a learner dropped (re-aligned to a commit without carrying it), reported with its
    next contribution so that every learner step is accounted for in a round record."""

    model_config = _STRICT
    steps: int = Field(ge=0, le=MAX_STEPS)
    samples: int = Field(ge=0, le=MAX_SAMPLES)
    reason: RealignReason
    at_version: int = Field(ge=0)
    """The version the learner re-aligned to."""


class SavedState(BaseModel):
    """A learner's newest state saved in the mailbox (``state_dir="mailbox"``), as its
    contributions name it: the resume point a replayed older state record cannot undo, since
    contributions are create-once, signed and merged into the hash chain (docs/session.md,
    "Learner state")."""

    model_config = _STRICT
    total_steps: int = Field(ge=0)
    state: PayloadRef


class Contribution(Record):
    """A learner's delta (anchor − local parameters) for one fragment, against one version."""

    record_type: ClassVar[str] = "contribution"
    max_bytes: ClassVar[int] = 1024 * 1024
    learner: LearnerId
    fragment: int = Field(ge=0)
    anchor_version: int = Field(ge=0)
    steps: int = Field(ge=0, le=MAX_STEPS)
    """Local steps in the delta: since the learner's work on this fragment was last merged,
    including ``carried_steps``."""
    samples: int = Field(ge=0, le=MAX_SAMPLES)
    carried_steps: int = Field(default=0, ge=0, le=MAX_STEPS)
    """Of ``steps``, those trained before the learner aligned with ``anchor_version`` and carried
    across that alignment (``DiLoCo.carry_unmerged``)."""
    realigned: tuple[Realignment, ...] = Field(default=(), max_length=1024)
    """Work this learner dropped since its previous merged contribution, with the reason."""
    payload: PayloadRef
    final: bool = False
    """Published on close (flush): a round made only of final contributions skips momentum."""
    step_time_s: float | None = Field(default=None, ge=0, le=86400)
    """The learner's smoothed seconds per local step, for the grace window."""
    saved_state: SavedState | None = None
    """The learner's newest state saved in the mailbox as of this publish (None without one)."""
    created_at: str = Field(default_factory=utc_now)


class Participant(BaseModel):
    model_config = _STRICT
    learner: LearnerId
    contribution: str
    """Key of the contribution record that was merged."""
    steps: int
    samples: int
    weight: float
    carried_steps: int = 0
    """Of ``steps``, those carried across an alignment (see ``Contribution.carried_steps``)."""
    staleness: int = 0
    """Versions the contribution's base lagged the round's (``DiLoCo.max_staleness``); its
    weight already includes the discount 1/(1 + staleness)."""
    realigned: tuple[Realignment, ...] = ()
    """Work the learner reported dropped since its previous merged contribution."""
    norm: float | None = None
    """L2 norm of the delta over the fragment (fp64 sum of squares): the syncer's outlier bound
    is a robust statistic of recent rounds' norms, and a new syncer reads them from here."""


RejectionReason = Literal[
    "stale",
    "zero_steps",
    "incompatible",
    "non_finite",
    "corrupt",
    "duplicate",
    "invalid_counts",
    "malformed",
    "unauthenticated",
    "outlier",
    "flood",
]
"""Why a contribution took no part in a round; the one list (docs/protocol.md explains each)."""
REJECTION_REASONS: tuple[RejectionReason, ...] = typing.get_args(RejectionReason)
MAX_LISTED_REJECTIONS = 256
"""Rejections a round record lists one by one; the rest are counted by reason."""
MAX_REJECTION_DETAIL = 500
"""Characters of a listed rejection's detail (it may quote what a bucket writer chose)."""


class Rejection(BaseModel):
    model_config = _STRICT
    learner: str
    """As named by the contribution's key (may be unparseable: that is why it was rejected)."""
    contribution: str
    reason: RejectionReason
    detail: str = ""


def bound_rejections(rejected: Sequence[Rejection]) -> tuple[tuple[Rejection, ...], dict[RejectionReason, int]]:
    """The rejections a round record lists (the first ``MAX_LISTED_REJECTIONS``, details cut to
    ``MAX_REJECTION_DETAIL`` characters) and the count by reason of the rest."""
    listed = tuple(
        r if len(r.detail) <= MAX_REJECTION_DETAIL else r.model_copy(update={"detail": r.detail[:MAX_REJECTION_DETAIL] + "…"})
        for r in rejected[:MAX_LISTED_REJECTIONS]
    )
    omitted: dict[RejectionReason, int] = {}
    for r in rejected[MAX_LISTED_REJECTIONS:]:
        omitted[r.reason] = omitted.get(r.reason, 0) + 1
    return listed, omitted


class RoundTiming(BaseModel):
    """Seconds spent in each phase of a round (what the grace window was computed from)."""

    model_config = _STRICT
    quorum_wait_s: float = 0.0
    grace_s: float = 0.0
    sync_s: float = 0.0
    arrival_spread_s: float = 0.0
    """Seconds between the first and the last accepted contribution's arrival (syncer clock)."""


STORE_ADDED_FIELDS = frozenset({"rejections_omitted", "params", "outer_state", "committed_by", "term", "created_at", "update"})
"""The round record's fields the store fills in when it commits a :class:`RoundContent`: the
blob references, who committed it in which term, when, and the count of the rejections past
those listed (besides every record's ``schema_version`` and ``mac``)."""


class RoundContent(BaseModel):
    """A round record less what the store adds when it commits it (``STORE_ADDED_FIELDS``): what
    the writer of a version decides. Each field is the :class:`RoundRecord` field of its name (a
    test holds the two to the same names, types and defaults), so a new field of the record is
    declared there and here, and written by the writer alone."""

    model_config = _STRICT
    fragment: int = Field(ge=0)
    version: int = Field(ge=0)
    base_version: int | None = Field(default=None, ge=0)
    participants: tuple[Participant, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    """Every rejection of the round: the store lists the first ``MAX_LISTED_REJECTIONS`` and counts the rest."""
    merge: dict[str, Any]
    outer_lr: float
    outer_momentum: float
    final: bool = False
    timing: RoundTiming = Field(default_factory=RoundTiming)
    previous: Hex256 | None = None
    backend: str | None = Field(default=None, max_length=32)
    samples_per_step_cap: float | None = Field(default=None, gt=0)


class RoundRecord(Record):
    """Commits version ``version`` of a fragment. Created once; its existence *is* the commit."""

    record_type: ClassVar[str] = "round"
    max_bytes: ClassVar[int] = 8 * 1024 * 1024
    fragment: int = Field(ge=0)
    version: int = Field(ge=0)
    base_version: int | None = Field(default=None, ge=0)
    """The version the merged contributions were based on; None for version 0."""
    participants: tuple[Participant, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    """The first ``MAX_LISTED_REJECTIONS`` rejections of the round, in order."""
    rejections_omitted: dict[RejectionReason, int] = Field(default_factory=dict)
    """Rejections past those listed, counted by reason, so a flood of bad objects cannot make
    the record larger than its readers accept."""
    merge: dict[str, Any]
    outer_lr: float
    outer_momentum: float
    """β the round's outer step used: ``DiLoCo.outer_momentum``, scaled by the fresh share of
    the merged work under ``momentum_rule="damped"``."""
    final: bool = False
    """True when every participant was final: θ − Δ without momentum."""
    params: PayloadRef
    outer_state: PayloadRef
    committed_by: LearnerId
    term: int = Field(default=0, ge=0)
    """Syncer election term of the committer (0 for version 0, written by the first learner)."""
    timing: RoundTiming = Field(default_factory=RoundTiming)
    created_at: str = Field(default_factory=utc_now)
    previous: Hex256 | None = None
    """sha256 of the stored bytes of the previous version's round record (None for version 0):
    the records of a fragment form a hash chain, so a rollback or a rewritten record shows."""
    backend: str | None = Field(default=None, max_length=32)
    """The backend that merged (``numpy``, ``torch``): replay on the same one reproduces the bytes."""
    samples_per_step_cap: float | None = Field(default=None, gt=0)
    """The bound on samples per step used for the weights (samples are capped at it × steps);
    None: no bound applied. Replay recomputes the weights with it."""
    update: PayloadRef | None = None
    """With ``update_quantization``: the quantized change from ``base_version``'s parameters;
    those parameters plus the dequantized change are exactly ``params`` (docs/protocol.md)."""

    @classmethod
    def committed(
        cls,
        content: RoundContent,
        *,
        params: PayloadRef,
        outer_state: PayloadRef,
        update: PayloadRef | None,
        committed_by: str,
        term: int,
    ) -> RoundRecord:
        """The record that commits ``content``: with the store's fields, its rejections bounded
        (``bound_rejections``)."""
        rejected, omitted = bound_rejections(content.rejected)
        fields: dict[str, Any] = dict(content)
        fields.update(
            rejected=rejected, rejections_omitted=omitted, params=params, outer_state=outer_state, update=update,
            committed_by=committed_by, term=term,
        )  # fmt: skip
        return cls(**fields)


class Head(Record):
    """A fragment's newest committed version, rewritten after each commit so that finding it
    does not list the history. Only a hint: readers confirm the record exists and probe past it."""

    record_type: ClassVar[str] = "head"
    max_bytes: ClassVar[int] = 4096
    fragment: int = Field(ge=0)
    version: int = Field(ge=0)
    record_sha256: Hex256


class Lease(Record):
    """A liveness claim: the syncer's lease is renewed by compare-and-swap, a learner's own
    lease by plain puts (its id is its own; a restarted learner takes it over).

    Expiry is judged by observers on their own monotonic clocks: a lease whose
    ``sequence`` has not changed for ``ttl_s`` seconds of the observer's time is expired.
    ``renewed_at`` is for humans only.
    """

    record_type: ClassVar[str] = "lease"
    max_bytes: ClassVar[int] = 64 * 1024
    kind: Literal["learner", "syncer"]
    holder: LearnerId
    term: int = Field(default=0, ge=0)
    sequence: int = Field(default=0, ge=0)
    ttl_s: float = Field(gt=0)
    """The writer's TTL, for humans: observers judge expiry by the run's TTL (the manifest's)."""
    released: bool = False
    """Set by a holder that leaves cleanly, so others need not wait for the TTL."""
    info: dict[str, Any] = Field(default_factory=dict)
    renewed_at: str = Field(default_factory=utc_now)


class QueueClaim(Record):
    """Who trains one unit of a shared work queue (``session.queue``): created by the first
    learner to take the unit, replaced by compare-and-swap (``generation`` + 1) by one that
    takes over the unit of a learner whose lease expired."""

    record_type: ClassVar[str] = "queue claim"
    max_bytes: ClassVar[int] = 4096
    queue: LearnerId
    unit: int = Field(ge=0)
    units: int = Field(ge=1)
    """The queue's size as its learners declare it (they must agree)."""
    holder: LearnerId
    generation: int = Field(default=1, ge=1)
    claimed_at: str = Field(default_factory=utc_now)


class LearnerStateRecord(Record):
    """Where a learner's saved state is (``SessionOptions.state_dir="mailbox"``): a blob under the
    learner's own prefix, pinned by size and sha256. Rewritten (a plain put) at every save."""

    record_type: ClassVar[str] = "learner state"
    max_bytes: ClassVar[int] = 4096
    learner: LearnerId
    run_id: str = Field(min_length=1, max_length=128)
    total_steps: int = Field(ge=0)
    state: PayloadRef
    saved_at: str = Field(default_factory=utc_now)


class QueueDone(Record):
    """Create-once: ``holder`` trained ``unit`` of ``queue`` to its end. At most one per unit."""

    record_type: ClassVar[str] = "queue done"
    max_bytes: ClassVar[int] = 4096
    queue: LearnerId
    unit: int = Field(ge=0)
    holder: LearnerId
    generation: int = Field(ge=1)
    """The claim generation it finished under."""
    done_at: str = Field(default_factory=utc_now)


class BarrierArrival(Record):
    """Create-once: ``node`` arrived at barrier ``barrier``, expecting ``parties`` nodes. The
    store's stamp of the write (``ObjectInfo.modified_at``), not ``arrived_at``, is the arrival
    time every node computes the release from (``session.barrier``)."""

    record_type: ClassVar[str] = "barrier arrival"
    max_bytes: ClassVar[int] = 4096
    barrier: LearnerId
    node: LearnerId
    parties: int = Field(ge=1, le=100_000)
    arrived_at: str = Field(default_factory=utc_now)
    """The node's own clock (information only)."""
