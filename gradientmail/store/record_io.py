"""Records at their keys: the one place a record is signed on its way out and verified on its way in.

Every family of the store (versions, contributions, leases, queue claims, barrier arrivals,
learner states) writes and reads its records through one :class:`RecordIO`: with a run key
every record written is signed and every record read must verify (``Unauthenticated``
otherwise); every read fetches at most what the record type may weigh (size before bytes);
every listing goes through the one parser of the key layout (``keys.parse_key``), a name that
is none skipped, counted and logged once.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TypeVar

from gradientmail.errors import InvalidRecord, ObjectTooLarge
from gradientmail.mailbox import Mailbox
from gradientmail.records import Record, keys
from gradientmail.records.auth import RunKey
from gradientmail.store.store_clock import ClockSample

__all__ = ["UNPARSABLE_NAMES_LOGGED", "UNPARSABLE_NAMES_REMEMBERED", "RecordIO", "SkippedNames"]

log = logging.getLogger(__name__)
RecordT = TypeVar("RecordT", bound=Record)

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


class RecordIO:
    """One run's records in one mailbox (module docstring)."""

    def __init__(self, mailbox: Mailbox, key: RunKey | None = None) -> None:
        self.mailbox = mailbox
        self.key = key
        self.skipped = SkippedNames()

    def encode(self, location: str, record: Record) -> bytes:
        """``record``'s bytes for ``location``: signed for that key in a signed run."""
        return (self.key.sign(location, record) if self.key is not None else record).to_json()

    def read(self, cls: type[RecordT], location: str) -> tuple[RecordT, bytes]:
        """Fetch (at most ``cls.max_bytes``), parse and, with a key, verify a record.

        Raises ``KeyNotFound``, ``InvalidRecord`` (``Unauthenticated`` for a bad MAC).
        """
        try:
            data = self.mailbox.get(location, max_bytes=cls.max_bytes)
        except ObjectTooLarge as exc:
            raise InvalidRecord(f"{cls.record_type} record at {location}: {exc}") from None
        return self.parse(cls, location, data), data

    def parse(self, cls: type[RecordT], location: str, data: bytes) -> RecordT:
        record = cls.from_json(data)
        return self.key.verify(location, record) if self.key is not None else record

    def listed(self, prefix: str) -> list[tuple[str, keys.ParsedKey]]:
        """The names under ``prefix`` with what each is (one LIST); a name that is none is
        skipped and reported (``SkippedNames``)."""
        found = []
        for name in self.mailbox.list(prefix):
            parsed = keys.parse_key(name)
            if parsed is None:
                self.skipped.skip(name)
            else:
                found.append((name, parsed))
        return found

    def stray_names(self, prefix: str = "") -> tuple[int, list[str]]:
        """How many names are under ``prefix`` (one LIST), and those that are no key of the
        layout, whether or not a listing skipped them before (what ``audit`` reports)."""
        names = self.mailbox.list(prefix)
        return len(names), [name for name in names if keys.parse_key(name) is None]

    def clock_sample(self, location: str, sent: float, returned: float, token: str | None = None) -> ClockSample | None:
        """The clock sample of the write to ``location`` that was sent at ``sent`` and answered
        at ``returned``: a HEAD for the store's stamp of it (None: no stamp, or, given the
        write's ``token``, another write landed there since)."""
        info = self.mailbox.head(location)
        if info is None or info.modified_at is None or (token is not None and info.token != token):
            return None
        return ClockSample(sent, returned, info.modified_at, info.modified_resolution_s)
