"""The key layout of a run: the one place that knows where every record and blob lives.

All keys are relative to the run's root (an S3 prefix or a directory). Numbers are
zero-padded so lexicographic listing is numeric order. See docs/protocol.md, "Key layout".

    manifest.json                                            create-once, first learner
    fragments/{f:04d}/head.json                              mutable hint: the newest version
    fragments/{f:04d}/rounds/{v:010d}.json                   create-once, commits version v
    fragments/{f:04d}/versions/{v:010d}/params-{w}.{a}.safetensors   immutable, attempt-unique
    fragments/{f:04d}/versions/{v:010d}/outer-{w}.{a}.safetensors    immutable, attempt-unique
    fragments/{f:04d}/contributions/{b:010d}/{learner}-{n}.safetensors   immutable, learner
    fragments/{f:04d}/contributions/{b:010d}/{learner}-{n}.json          create-once, learner
    leases/learners/{learner}.json                           mutable (plain put by its learner)
    leases/syncer.json                                       mutable (compare-and-swap), election
    queues/{q}/claims/{u:010d}.json                          claim of unit u: create, then compare-and-swap
    queues/{q}/done/{u:010d}.json                            create-once, the learner that finished unit u
    states/{learner}/state.json                              mutable (plain put by its learner): its saved state
    states/{learner}/{s:012d}-{a}.state                      immutable, the state saved at total step s
    barriers/{b}/arrivals/{node}.json                        create-once, a node's arrival at barrier b
    barriers/{b}/clock/{node}.json                           mutable (plain put by its node): store-clock probes
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gradientmail.errors import InvalidKey
from gradientmail.records.ids import LEARNER_ID, check_learner_id

MANIFEST = "manifest.json"
SYNCER_LEASE = "leases/syncer.json"
LEARNER_LEASES = "leases/learners/"
FRAGMENTS = "fragments/"
QUEUES = "queues/"
STATES = "states/"
BARRIERS = "barriers/"
FOLDERS = (FRAGMENTS, "leases/", QUEUES, STATES, BARRIERS)
"""The layout's folders: every object under them is a key of the table above."""

_ID = LEARNER_ID.pattern.removeprefix("^").removesuffix("$")  # a learner id, inside a key
_HEAD = re.compile(r"^fragments/(\d{4})/head\.json$")
_ROUND = re.compile(r"^fragments/(\d{4})/rounds/(\d{10})\.json$")
_VERSION_BLOB = re.compile(
    rf"^fragments/(\d{{4}})/versions/(\d{{10}})/(params|outer|update)-({_ID})\.([0-9a-f]{{1,32}})\.safetensors$"
)
_CONTRIBUTION = re.compile(rf"^fragments/(\d{{4}})/contributions/(\d{{10}})/({_ID})-(\d{{10}})\.(json|safetensors)$")
_LEARNER_LEASE = re.compile(rf"^leases/learners/({_ID})\.json$")
_QUEUE = re.compile(rf"^queues/({_ID})/(claims|done)/(\d{{10}})\.json$")
_STATE = re.compile(rf"^states/({_ID})/(state\.json|\d{{12}}-[0-9a-f]{{1,32}}\.state)$")
_BARRIER = re.compile(rf"^barriers/({_ID})/(arrivals|clock)/({_ID})\.json$")


def fragment_root(fragment: int) -> str:
    return f"fragments/{fragment:04d}/"


def head(fragment: int) -> str:
    """The mutable pointer to a fragment's newest committed version (a hint, never the commit)."""
    return f"{fragment_root(fragment)}head.json"


def versions_prefix(fragment: int) -> str:
    """Where the blobs of every version of ``fragment`` live (what retention collects)."""
    return f"{fragment_root(fragment)}versions/"


def rounds_prefix(fragment: int) -> str:
    return f"{fragment_root(fragment)}rounds/"


def round_record(fragment: int, version: int) -> str:
    """The create-once record whose existence commits ``version`` of ``fragment``."""
    return f"{rounds_prefix(fragment)}{version:010d}.json"


def params_blob(fragment: int, version: int, writer: str, attempt: str) -> str:
    """Parameters of a version, under a key unique to the commit attempt (losers never overwrite)."""
    return f"{fragment_root(fragment)}versions/{version:010d}/params-{check_learner_id(writer)}.{_attempt(attempt)}.safetensors"


def outer_state_blob(fragment: int, version: int, writer: str, attempt: str) -> str:
    return f"{fragment_root(fragment)}versions/{version:010d}/outer-{check_learner_id(writer)}.{_attempt(attempt)}.safetensors"


def update_blob(fragment: int, version: int, writer: str, attempt: str) -> str:
    """A version's compact change from the previous one (runs with ``update_quantization``)."""
    return f"{fragment_root(fragment)}versions/{version:010d}/update-{check_learner_id(writer)}.{_attempt(attempt)}.safetensors"


def _attempt(attempt: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{1,32}", attempt):
        raise InvalidKey(f"commit attempt id {attempt!r} must be 1-32 lowercase hex digits")
    return attempt


def contributions_prefix(fragment: int, base_version: int) -> str:
    """Where contributions against ``base_version`` of ``fragment`` are listed."""
    return f"{contributions_root(fragment)}{base_version:010d}/"


def contributions_root(fragment: int) -> str:
    """Where contributions of ``fragment`` against any base version are listed."""
    return f"{fragment_root(fragment)}contributions/"


def contribution_record(fragment: int, base_version: int, learner: str, sequence: int) -> str:
    return f"{contributions_prefix(fragment, base_version)}{check_learner_id(learner)}-{sequence:010d}.json"


def contribution_blob(fragment: int, base_version: int, learner: str, sequence: int) -> str:
    return f"{contributions_prefix(fragment, base_version)}{check_learner_id(learner)}-{sequence:010d}.safetensors"


def learner_lease(learner: str) -> str:
    return f"{LEARNER_LEASES}{check_learner_id(learner)}.json"


def queue_claim(queue: str, unit: int) -> str:
    """The claim of ``unit`` of work queue ``queue`` (who trains it; replaced when its holder died)."""
    return f"{queue_prefix(queue, 'claims')}{unit:010d}.json"


def queue_done(queue: str, unit: int) -> str:
    """The create-once record that ``unit`` of ``queue`` was trained to its end."""
    return f"{queue_prefix(queue, 'done')}{unit:010d}.json"


def queue_prefix(queue: str, part: str) -> str:
    """Where the claims (``part="claims"``) or the done records (``"done"``) of a queue live."""
    return f"{QUEUES}{check_learner_id(queue)}/{part}/"


def learner_state_prefix(learner: str) -> str:
    """Where a learner's saved states live (``SessionOptions.state_dir="mailbox"``)."""
    return f"{STATES}{check_learner_id(learner)}/"


def learner_state_record(learner: str) -> str:
    """The record naming a learner's newest saved state."""
    return f"{learner_state_prefix(learner)}state.json"


def learner_state_blob(learner: str, total_steps: int, attempt: str) -> str:
    """A learner's state saved at ``total_steps`` (a key per save, ``attempt`` making it unique:
    the record moves to it last)."""
    return f"{learner_state_prefix(learner)}{total_steps:012d}-{_attempt(attempt)}.state"


def barrier_prefix(barrier: str, part: str) -> str:
    """Where the arrivals (``part="arrivals"``) or the clock probes (``"clock"``) of a barrier live."""
    return f"{BARRIERS}{check_learner_id(barrier)}/{part}/"


def barrier_arrival(barrier: str, node: str) -> str:
    """The create-once record of ``node``'s arrival at ``barrier``; its store stamp is the arrival time."""
    return f"{barrier_prefix(barrier, 'arrivals')}{check_learner_id(node)}.json"


def barrier_clock_probe(barrier: str, node: str) -> str:
    """The object ``node`` rewrites to sample the store's clock while it waits at ``barrier``."""
    return f"{barrier_prefix(barrier, 'clock')}{check_learner_id(node)}.json"


@dataclass(frozen=True)
class BarrierKey:
    barrier: str
    part: str
    """``arrivals`` or ``clock``."""
    node: str


@dataclass(frozen=True)
class LearnerStateKey:
    learner: str
    blob: bool
    """The saved bytes (``{s}.state``), else the record (``state.json``)."""


@dataclass(frozen=True)
class QueueKey:
    queue: str
    part: str
    """``claims`` or ``done``."""
    unit: int


@dataclass(frozen=True)
class RoundKey:
    fragment: int
    version: int


@dataclass(frozen=True)
class ContributionKey:
    """One contribution: its record and its payload share everything but the suffix."""

    fragment: int
    base_version: int
    learner: str
    sequence: int

    @property
    def record(self) -> str:
        return contribution_record(self.fragment, self.base_version, self.learner, self.sequence)

    @property
    def blob(self) -> str:
        return contribution_blob(self.fragment, self.base_version, self.learner, self.sequence)


@dataclass(frozen=True)
class HeadKey:
    fragment: int


@dataclass(frozen=True)
class VersionBlobKey:
    """A blob of a committed version (or of an attempt that lost its race)."""

    fragment: int
    version: int
    kind: str
    """``params``, ``outer`` or ``update``."""
    writer: str


@dataclass(frozen=True)
class ContributionBlobKey:
    contribution: ContributionKey


@dataclass(frozen=True)
class LearnerLeaseKey:
    learner: str


@dataclass(frozen=True)
class SingletonKey:
    """The manifest or the syncer lease."""

    key: str


ParsedKey = (
    HeadKey
    | RoundKey
    | VersionBlobKey
    | ContributionKey
    | ContributionBlobKey
    | LearnerLeaseKey
    | SingletonKey
    | QueueKey
    | LearnerStateKey
    | BarrierKey
)
"""What a name in a run's mailbox is, by the key layout above."""


def parse_key(key: object) -> ParsedKey | None:
    """What an object name in a run's mailbox is, or None when it is no name of the layout.

    The one parser of every listing: it never raises (anything may be dropped in a bucket),
    and it accepts only names the key builders above produce, learner ids included, so a
    parsed key can always be rebuilt."""
    if not isinstance(key, str):
        return None
    if key in (MANIFEST, SYNCER_LEASE):
        return SingletonKey(key)
    if (match := _ROUND.match(key)) is not None:
        return RoundKey(int(match[1]), int(match[2]))
    if (match := _CONTRIBUTION.match(key)) is not None:
        contribution = ContributionKey(int(match[1]), int(match[2]), match[3], int(match[4]))
        return contribution if match[5] == "json" else ContributionBlobKey(contribution)
    if (match := _VERSION_BLOB.match(key)) is not None:
        return VersionBlobKey(int(match[1]), int(match[2]), match[3], match[4])
    if (match := _LEARNER_LEASE.match(key)) is not None:
        return LearnerLeaseKey(match[1])
    if (match := _HEAD.match(key)) is not None:
        return HeadKey(int(match[1]))
    if (match := _QUEUE.match(key)) is not None:
        return QueueKey(match[1], match[2], int(match[3]))
    if (match := _STATE.match(key)) is not None:
        return LearnerStateKey(match[1], match[2] != "state.json")
    if (match := _BARRIER.match(key)) is not None:
        return BarrierKey(match[1], match[2], match[3])
    return None


def parse_round_record(key: str) -> RoundKey | None:
    """The (fragment, version) a round-record key names, or None for any other key."""
    parsed = parse_key(key)
    return parsed if isinstance(parsed, RoundKey) else None


def parse_version_blob(key: str) -> RoundKey | None:
    """The (fragment, version) whose blob directory holds ``key``, or None for any other key."""
    parsed = parse_key(key)
    return RoundKey(parsed.fragment, parsed.version) if isinstance(parsed, VersionBlobKey) else None


def parse_contribution_record(key: str) -> ContributionKey | None:
    """What a contribution-record key names, or None if the key is not one (an invalid
    learner id included: the key could not be rebuilt)."""
    parsed = parse_key(key)
    return parsed if isinstance(parsed, ContributionKey) else None


def parse_learner_lease(key: str) -> str | None:
    """The learner whose own lease ``key`` is (the inverse of :func:`learner_lease`), or None
    for any other key, a learner id that is not valid included."""
    parsed = parse_key(key)
    return parsed.learner if isinstance(parsed, LearnerLeaseKey) else None
