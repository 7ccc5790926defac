"""Watch a run's mailbox for new round records: how the launcher sees commits happen.

The launcher only reads, through the library's ``RunStore`` (the same key layout and record
checks the learners use), so it works on any mailbox, not only a directory. It never
writes, and it does not own the mailbox: whoever opened it closes it.
"""

from __future__ import annotations

from gradientmail.errors import GradientMailError
from gradientmail.mailbox import Mailbox
from gradientmail.records import RoundRecord
from gradientmail.store import RunStore

__all__ = ["RoundWatcher"]


class RoundWatcher:
    """Returns each round record of the run once, in (version, fragment) order per poll."""

    def __init__(self, mailbox: Mailbox) -> None:
        self.store = RunStore(mailbox)
        self._fragments = 0
        """How many fragments the run has: 0 until a learner has written the manifest."""
        self._seen: set[tuple[int, int]] = set()
        """(fragment, version) of every record returned so far."""
        self.records: list[RoundRecord] = []
        """Every record seen so far, in the order they were found."""

    def poll(self) -> list[RoundRecord]:
        """Round records committed since the previous poll (unreadable ones are retried).

        Any mailbox or record error only postpones a record to the next poll: watching must
        never take the run down.
        """
        try:
            found = sorted(
                (version, fragment)
                for fragment in range(self._fragment_count())
                for version in self.store.committed_versions(fragment)
                if (fragment, version) not in self._seen
            )
        except GradientMailError:
            return []
        records: list[RoundRecord] = []
        for version, fragment in found:
            try:
                records.append(self.store.read_round(fragment, version))
            except GradientMailError:
                continue
            self._seen.add((fragment, version))
        self.records.extend(records)
        return records

    def _fragment_count(self) -> int:
        """The manifest's number of fragments, read once it exists (it never changes)."""
        if not self._fragments:
            manifest = self.store.read_manifest()
            self._fragments = len(manifest.plan) if manifest is not None else 0
        return self._fragments
