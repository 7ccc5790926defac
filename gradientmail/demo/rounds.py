"""Watch a directory mailbox for new round records: how the launcher sees commits happen.

The launcher only reads; it never writes to the mailbox. Records are create-once and
written atomically (temporary file, then rename), so a listed record is complete.
"""

from __future__ import annotations

from pathlib import Path

from gradientmail.errors import InvalidRecord
from gradientmail.records import RoundRecord
from gradientmail.records.keys import FRAGMENTS, RoundKey, parse_round_record

__all__ = ["RoundWatcher"]


class RoundWatcher:
    """Returns each round record of the mailbox once, in (version, fragment) order per poll."""

    def __init__(self, mailbox_dir: Path) -> None:
        self.mailbox_dir = mailbox_dir
        self._seen: set[RoundKey] = set()
        self.records: list[RoundRecord] = []
        """Every record seen so far, in the order they were found."""

    def poll(self) -> list[RoundRecord]:
        """Round records that appeared since the previous poll (unreadable ones are retried)."""
        found: list[tuple[RoundKey, Path]] = []
        for path in (self.mailbox_dir / FRAGMENTS).glob("*/rounds/*.json"):
            key = parse_round_record(path.relative_to(self.mailbox_dir).as_posix())
            if key is not None and key not in self._seen:
                found.append((key, path))
        records: list[RoundRecord] = []
        for key, path in sorted(found, key=lambda item: (item[0].version, item[0].fragment)):
            try:
                records.append(RoundRecord.from_json(path.read_bytes()))
            except (OSError, InvalidRecord):
                continue  # try again next poll; the launcher must never take the run down
            self._seen.add(key)
        self.records.extend(records)
        return records
