"""Learner states saved in the mailbox (``state_dir="mailbox"``, ``session/resume.py``).

A save is a blob under a key of its own, then the record that names it (so a kill in between
leaves the previous save whole), then the learner's older saves deleted. A read checks the
record (signed in a signed run, the learner's, naming a blob of the learner's own prefix) and
the blob (size, sha256) before anything is unpickled.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from gradientmail.errors import GradientMailError, InvalidRecord, KeyNotFound
from gradientmail.records import LearnerStateRecord, PayloadRef, keys
from gradientmail.store.cas import CasRecords
from gradientmail.store.record_io import RecordIO

__all__ = ["LearnerStateRecords"]

log = logging.getLogger(__name__)


class LearnerStateRecords:
    """Every learner's saved state in one run (``RunStore.states``). ``put_blob(key, data,
    compress)`` and ``read_blob(ref)`` are the store's verified blobs."""

    def __init__(
        self,
        io: RecordIO,
        cas: CasRecords,
        *,
        put_blob: Callable[[str, bytes, bool], PayloadRef],
        read_blob: Callable[[PayloadRef], bytes],
    ) -> None:
        self._io = io
        self._cas = cas
        self._put_blob = put_blob
        self._read_blob = read_blob

    def save(self, learner: str, run_id: str, total_steps: int, data: bytes, *, compress: bool = False) -> None:
        """Put a learner's saved state (``compress``: stored compressed, mostly fp32 tensors)."""
        blob = keys.learner_state_blob(learner, total_steps, uuid.uuid4().hex[:8])
        ref = self._put_blob(blob, data, compress)
        record = LearnerStateRecord(learner=learner, run_id=run_id, total_steps=total_steps, state=ref)
        self._cas.put(keys.learner_state_record(learner), record)
        for key, parsed in self._io.listed(keys.learner_state_prefix(learner)):
            if isinstance(parsed, keys.LearnerStateKey) and parsed.blob and key != blob:
                try:
                    self._io.mailbox.delete(key)
                except GradientMailError as exc:  # a learner without delete permission: the old save stays
                    log.warning("could not delete the older learner state %s: %s", key, exc)

    def read(self, learner: str) -> tuple[LearnerStateRecord, bytes] | None:
        """A learner's newest saved state, checked; None when it has none. ``InvalidRecord``,
        ``CorruptPayload`` or ``KeyNotFound`` (the blob is gone) otherwise."""
        location = keys.learner_state_record(learner)
        try:
            record, _ = self._io.read(LearnerStateRecord, location)
        except KeyNotFound:
            return None
        named = keys.parse_key(record.state.key)
        if record.learner != learner or not (isinstance(named, keys.LearnerStateKey) and named.blob and named.learner == learner):
            raise InvalidRecord(f"learner state record at {location} names {record.state.key!r}, not a state of {learner}")
        return record, self._read_blob(record.state)
