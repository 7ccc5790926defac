"""One compare-and-swap record under every mutable coordination object.

Leases, queue claims (and, created once, barrier arrivals and the markers beside them) are
records that change in place: read with their version token, created once, replaced by
compare-and-swap on the token read, or (a learner's own lease) put. :class:`CasRecords` is that
pattern once, over :class:`~gradientmail.store.record_io.RecordIO` (signed, bounded, verified),
and the families (``lease_records``, ``queue_records``, ``barrier_records``) name their keys
and check what the record says of itself. No object found there stops a reader: one too large,
unparsable or unverified comes back as ``CasRead(record=None, token, problem)``, which its
writer may replace by compare-and-swap on that token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from gradientmail.errors import InvalidRecord, KeyNotFound, ObjectTooLarge
from gradientmail.mailbox.base import StampedGet
from gradientmail.records import Record
from gradientmail.store.record_io import RecordIO

__all__ = ["CasRead", "CasRecords"]

RecordT = TypeVar("RecordT", bound=Record)


@dataclass(frozen=True)
class CasRead(Generic[RecordT]):
    """A mutable record as found, and the token a compare-and-swap replaces it on."""

    record: RecordT | None
    """None when the bytes there are not a valid (or not a signed) record of the type."""
    token: str
    problem: str = ""
    written_at: float | None = None
    """The store's stamp of this version's write, from a store that reads it with the bytes
    (``StampedGet``, when asked for); None otherwise."""
    written_resolution_s: float = 0.0


class CasRecords:
    """Read with a token, create once, swap on a token, put (module docstring)."""

    def __init__(self, io: RecordIO) -> None:
        self._io = io

    def read(
        self, cls: type[RecordT], location: str, *, need_token: bool = True, stamped: bool = False
    ) -> CasRead[RecordT] | None:
        """The record at ``location`` and its version token; None if absent. Of an object too
        large only its token is read (a HEAD; skipped with ``need_token=False``, which a
        directory store pays for by hashing the file). ``stamped``: also the store's stamp of
        the write, where the store reads it with the bytes."""
        mailbox = self._io.mailbox
        try:
            if stamped and isinstance(mailbox, StampedGet):
                data, info = mailbox.get_stamped(location, max_bytes=cls.max_bytes)
                token, written_at, resolution_s = info.token, info.modified_at, info.modified_resolution_s
            else:
                (data, token), written_at, resolution_s = mailbox.get_versioned(location, max_bytes=cls.max_bytes), None, 0.0
        except KeyNotFound:
            return None
        except ObjectTooLarge as exc:
            if not need_token:
                return CasRead(None, "", str(exc))
            found = mailbox.head(location)
            return None if found is None else CasRead(None, found.token, str(exc))
        try:
            return CasRead(self._io.parse(cls, location, data), token, "", written_at, resolution_s)
        except InvalidRecord as exc:
            return CasRead(None, token, str(exc))

    def create(self, location: str, record: Record) -> str:
        """Create the record once; ``RecordExists`` when one is there already."""
        return self._io.mailbox.create(location, self._io.encode(location, record))

    def swap(self, location: str, record: Record, expected_token: str) -> str:
        """Replace the record by compare-and-swap; ``VersionConflict`` or ``KeyNotFound``."""
        return self._io.mailbox.swap(location, self._io.encode(location, record), expected_token)

    def put(self, location: str, record: Record) -> str:
        """Write the record unconditionally (only its owner writes there); its token."""
        return self._io.mailbox.put(location, self._io.encode(location, record))
