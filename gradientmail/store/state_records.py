"""Learner states saved in the mailbox (``state_dir="mailbox"``, ``session/resume.py``).

A save is a blob under a key of its own, then the record that names it (so a kill in between
leaves the previous save whole), then the learner's older saves deleted. A read checks the
record (signed in a signed run, the learner's, naming a blob of the learner's own prefix, of no
more bytes than ``max_state_bytes`` allows for the run's model) and the blob (size, digest)
before anything is fetched past that bound or unpickled.

The record is rewritten at every save, so a bucket writer can put an older one back (and its
blob). What a replay cannot undo is the learner's contributions: each names the newest save as
of its publish (``Contribution.saved_state``), create-once and signed. ``newest_resume_point``
is the rule a resume follows: the newer of the record and what its newest contributions name.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable

from gradientmail.digests import DigestName
from gradientmail.errors import GradientMailError, InvalidRecord, KeyNotFound
from gradientmail.records import LearnerStateRecord, PayloadRef, SavedState, keys
from gradientmail.store.cas import CasRecords
from gradientmail.store.record_io import RecordIO

__all__ = [
    "STATE_BYTES_PER_MODEL_BYTE",
    "STATE_SLACK_BYTES",
    "LearnerStateRecords",
    "max_state_bytes",
    "newest_resume_point",
]

log = logging.getLogger(__name__)

STATE_BYTES_PER_MODEL_BYTE = 16
"""A learner state's bytes per byte of the run's stored parameters. Adam keeps two moments per
parameter (8 bytes per fp32 parameter, 16 per bf16 one kept in fp32); 16 leaves room for a
scheduler, a sampler and an fp32 master copy of a bf16 model."""
STATE_SLACK_BYTES = 64 * 2**20
"""Bytes a learner state may hold besides that: the random generators, step counts, the work
queues' marks, small registered objects (and the whole bound where no model is known)."""


def max_state_bytes(model_bytes: int) -> int:
    """The most bytes a learner state of a run whose stored parameters take ``model_bytes`` may
    declare: a record claiming more is refused before its blob is fetched or decoded (a
    decompression bomb, or a size no allocation survives), and a save of more is refused with a
    message saying why."""
    return STATE_BYTES_PER_MODEL_BYTE * max(0, model_bytes) + STATE_SLACK_BYTES


def newest_resume_point(recorded: SavedState | None, named: Iterable[SavedState | None]) -> SavedState | None:
    """Which save a learner resumes from: the state record's, unless the learner's newest
    contributions (``named``: what each names) name a later one (the record is then a replay of
    an older save, or gone). Ties go to the record."""
    latest = max((saved for saved in named if saved is not None), key=lambda saved: saved.total_steps, default=None)
    if latest is None or (recorded is not None and recorded.total_steps >= latest.total_steps):
        return recorded
    return latest


class LearnerStateRecords:
    """Every learner's saved state in one run (``RunStore.states``). ``put_blob(key, data,
    compress, digest)`` and ``read_blob(ref)`` are the store's verified blobs."""

    def __init__(
        self,
        io: RecordIO,
        cas: CasRecords,
        *,
        put_blob: Callable[[str, bytes, bool, DigestName], PayloadRef],
        read_blob: Callable[[PayloadRef], bytes],
    ) -> None:
        self._io = io
        self._cas = cas
        self._put_blob = put_blob
        self._read_blob = read_blob

    def save(
        self,
        learner: str,
        run_id: str,
        total_steps: int,
        data: bytes,
        *,
        digest: DigestName,
        compress: bool = False,
        keep: str | None = None,
    ) -> SavedState:
        """Put a learner's saved state, pinned by ``digest`` (the run's blob digest; a new
        run's where there is no run yet), ``compress``: stored compressed, mostly fp32 tensors;
        what the learner's next contributions name (``Contribution.saved_state``). Older saves
        are deleted but ``keep`` (the one before, which contributions published since name)."""
        blob = keys.learner_state_blob(learner, total_steps, uuid.uuid4().hex[:8])
        ref = self._put_blob(blob, data, compress, digest)
        record = LearnerStateRecord(learner=learner, run_id=run_id, total_steps=total_steps, state=ref)
        self._cas.put(keys.learner_state_record(learner), record)
        for key, parsed in self._io.listed(keys.learner_state_prefix(learner)):
            if isinstance(parsed, keys.LearnerStateKey) and parsed.blob and key not in (blob, keep):
                try:
                    self._io.mailbox.delete(key)
                except GradientMailError as exc:  # a learner without delete permission: the old save stays
                    log.warning("could not delete the older learner state %s: %s", key, exc)
        return SavedState(total_steps=total_steps, state=ref)

    def read_record(self, learner: str) -> LearnerStateRecord | None:
        """A learner's state record, checked (signed, the learner's, naming a state blob of the
        learner's own prefix); None when it has none; ``InvalidRecord`` otherwise."""
        location = keys.learner_state_record(learner)
        try:
            record, _ = self._io.read(LearnerStateRecord, location)
        except KeyNotFound:
            return None
        if record.learner != learner:
            raise InvalidRecord(f"learner state record at {location} is {record.learner}'s, not {learner}'s")
        return record

    def read_state(self, learner: str, saved: SavedState, *, max_bytes: int) -> bytes:
        """The bytes of one saved state of ``learner``, checked before anything is fetched: a blob
        of the learner's own prefix declaring at most ``max_bytes``. ``InvalidRecord``,
        ``CorruptPayload`` or ``KeyNotFound`` (the blob is gone)."""
        named = keys.parse_key(saved.state.key)
        if not (isinstance(named, keys.LearnerStateKey) and named.blob and named.learner == learner):
            raise InvalidRecord(f"the learner state named {saved.state.key!r} is not a state of {learner}")
        if saved.state.size_bytes > max_bytes:
            raise InvalidRecord(
                f"the learner state {saved.state.key} declares {saved.state.size_bytes} bytes, "
                f"more than the {max_bytes} a learner state of this run may hold"
            )
        return self._read_blob(saved.state)
