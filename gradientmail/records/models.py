"""Typed, versioned JSON records: what travels through the mailbox besides tensor payloads.

Every record carries ``schema_version``; decoding refuses malformed JSON, unknown fields,
wrong types and unknown schema versions with ``InvalidRecord`` naming the record type and
the problem. Records are immutable (frozen) once built.
"""

from __future__ import annotations

import json
import math
import re
import typing
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from gradientmail.errors import InvalidRecord
from gradientmail.records.ids import check_learner_id

SCHEMA_VERSION: Literal[1] = 1
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
MAX_RECORD_BYTES = 16 * 1024 * 1024
"""A record larger than this is refused before parsing (records are metadata, not tensors)."""

RecordT = TypeVar("RecordT", bound="Record")


def utc_now() -> str:
    """Wall-clock time for humans reading records; never used to judge expiry."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


LearnerId = Annotated[str, AfterValidator(check_learner_id)]


class Record(BaseModel):
    """Base of every record: frozen, strict about unknown fields, versioned."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    record_type: ClassVar[str] = "record"
    schema_version: Literal[1] = SCHEMA_VERSION

    def to_json(self) -> bytes:
        return self.model_dump_json().encode("utf-8")

    @classmethod
    def from_json(cls: type[RecordT], data: bytes | str) -> RecordT:
        """Parse and validate; raises ``InvalidRecord`` with the reason."""
        if len(data) > MAX_RECORD_BYTES:
            raise InvalidRecord(f"{cls.record_type} record is {len(data)} bytes, over the {MAX_RECORD_BYTES} limit")
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRecord(f"{cls.record_type} record is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise InvalidRecord(f"{cls.record_type} record must be a JSON object, got {type(raw).__name__}")
        version = raw.get("schema_version")
        if version != SCHEMA_VERSION:
            raise InvalidRecord(
                f"{cls.record_type} record has schema_version {version!r}; this GradientMail reads version {SCHEMA_VERSION}"
            )
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(record)'}: {e['msg']}" for e in exc.errors())
            raise InvalidRecord(f"malformed {cls.record_type} record: {problems}") from None


class ParameterSpec(BaseModel):
    """One model parameter as the manifest pins it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
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
    run_id: str = Field(min_length=1, max_length=128)
    algorithm: dict[str, Any]
    """``DiLoCo.to_manifest()``, the merge as ``{"kind": …}``."""
    parameters: tuple[ParameterSpec, ...] = Field(min_length=1)
    plan: tuple[tuple[str, ...], ...] = Field(min_length=1)
    created_by: LearnerId
    created_at: str = Field(default_factory=utc_now)

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


class PayloadRef(BaseModel):
    """An immutable blob a record points at, with what is needed to verify it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    key: str = Field(min_length=1)
    sha256: str
    size_bytes: int = Field(ge=0)

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not SHA256_HEX.match(value):
            raise ValueError("must be 64 lowercase hex digits")
        return value


RealignReason = Literal["carry_limit"]
"""Why a learner dropped unmerged work instead of carrying it: ``carry_limit``, it spanned more
steps than ``DiLoCo.max_carried_steps`` allows."""


class Realignment(BaseModel):
    """Work a learner dropped (re-aligned to a commit without carrying it), reported with its
    next contribution so that every learner step is accounted for in a round record."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    steps: int = Field(ge=0)
    samples: int = Field(ge=0)
    reason: RealignReason
    at_version: int = Field(ge=0)
    """The version the learner re-aligned to."""


class Contribution(Record):
    """A learner's delta (anchor − local parameters) for one fragment, against one version."""

    record_type: ClassVar[str] = "contribution"
    learner: LearnerId
    fragment: int = Field(ge=0)
    anchor_version: int = Field(ge=0)
    steps: int = Field(ge=0)
    """Local steps in the delta: since the learner's work on this fragment was last merged,
    including ``carried_steps``."""
    samples: int = Field(ge=0)
    carried_steps: int = Field(default=0, ge=0)
    """Of ``steps``, those trained before the learner aligned with ``anchor_version`` and carried
    across that alignment (``DiLoCo.carry_unmerged``)."""
    realigned: tuple[Realignment, ...] = ()
    """Work this learner dropped since its previous merged contribution, with the reason."""
    payload: PayloadRef
    final: bool = False
    """Published on close (flush): a round made only of final contributions skips momentum."""
    step_time_s: float | None = Field(default=None, ge=0)
    """The learner's smoothed seconds per local step, for the grace window."""
    created_at: str = Field(default_factory=utc_now)


class Participant(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
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


RejectionReason = Literal[
    "stale", "zero_steps", "incompatible", "non_finite", "corrupt", "duplicate", "invalid_counts", "malformed"
]
"""Why a contribution took no part in a round; the one list (docs/protocol.md explains each)."""
REJECTION_REASONS: tuple[RejectionReason, ...] = typing.get_args(RejectionReason)


class Rejection(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    learner: str
    """As named by the contribution's key (may be unparseable: that is why it was rejected)."""
    contribution: str
    reason: RejectionReason
    detail: str = ""


class RoundTiming(BaseModel):
    """Seconds spent in each phase of a round (what the grace window was computed from)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    quorum_wait_s: float = 0.0
    grace_s: float = 0.0
    sync_s: float = 0.0
    arrival_spread_s: float = 0.0
    """Seconds between the first and the last accepted contribution's arrival (syncer clock)."""


class RoundRecord(Record):
    """Commits version ``version`` of a fragment. Created once; its existence *is* the commit."""

    record_type: ClassVar[str] = "round"
    fragment: int = Field(ge=0)
    version: int = Field(ge=0)
    base_version: int | None = Field(default=None, ge=0)
    """The version the merged contributions were based on; None for version 0."""
    participants: tuple[Participant, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    merge: dict[str, Any]
    outer_lr: float
    outer_momentum: float
    final: bool = False
    """True when every participant was final: θ − Δ without momentum."""
    params: PayloadRef
    outer_state: PayloadRef
    committed_by: LearnerId
    term: int = Field(default=0, ge=0)
    """Syncer election term of the committer (0 for version 0, written by the first learner)."""
    timing: RoundTiming = Field(default_factory=RoundTiming)
    created_at: str = Field(default_factory=utc_now)


class Lease(Record):
    """A liveness claim: the syncer's lease is renewed by compare-and-swap, a learner's own
    lease by plain puts (its id is its own; a restarted learner takes it over).

    Expiry is judged by observers on their own monotonic clocks: a lease whose
    ``sequence`` has not changed for ``ttl_s`` seconds of the observer's time is expired.
    ``renewed_at`` is for humans only.
    """

    record_type: ClassVar[str] = "lease"
    kind: Literal["learner", "syncer"]
    holder: LearnerId
    term: int = Field(default=0, ge=0)
    sequence: int = Field(default=0, ge=0)
    ttl_s: float = Field(gt=0)
    released: bool = False
    """Set by a holder that leaves cleanly, so others need not wait for the TTL."""
    info: dict[str, Any] = Field(default_factory=dict)
    renewed_at: str = Field(default_factory=utc_now)
