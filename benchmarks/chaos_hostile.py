"""A bucket writer without the run key, for ``python -m benchmarks.chaos --hostile``.

Every ~``EVERY_S`` seconds (seeded) it plants one object, taking the cases in turn, straight into
the mailbox (no proxy, no faults), against the fragment's newest version at that moment:

* ``invalid_names``: contribution records whose names hold no valid learner id (``a=b``, ``..``,
  65 characters): every listing must skip them, the audit name them;
* ``squat``: junk at the next round record's key, before the syncer commits it: the syncer
  deletes it and commits the version itself (INV-20);
* ``flood``: ``FLOOD`` tiny contribution records under as many ids: the round examines at most
  1,024 and stays readable (INV-7);
* ``replayed_head``: the head pointer saved by an earlier plant put back: nobody follows it
  (newer of head and listing), the next commit rewrites it.

Deleting objects (the newest record, a blob) is left to the bad-input corpus
(``benchmarks/bad_runs.py``): the monitor here would rightly count it as a lost commit.
What it planted is listed in the result; the audit at the end may fail only on the names it
dropped (``stray_only``).
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from gradientmail.errors import GradientMailError, RecordExists
from gradientmail.mailbox import Mailbox
from gradientmail.records import keys
from gradientmail.store import RunStore

__all__ = ["EVERY_S", "PLANTS", "HostileWriter", "stray_only"]

EVERY_S = 5.0
FLOOD = 300
PLANTS = ("invalid_names", "squat", "flood", "replayed_head")
STRAY = "no key of the run's layout"
"""What the audit says about the names ``invalid_names`` drops."""


def stray_only(failures: list[str]) -> bool:
    """The audit's failures are all about the names the writer dropped (or there are none)."""
    return all(STRAY in line for line in failures)


class HostileWriter(threading.Thread):
    """Plants one hostile object every ~``EVERY_S`` seconds until stopped (module docstring)."""

    def __init__(self, mailbox: Mailbox, fragments: int, started: float, seed: int) -> None:
        super().__init__(name="chaos-hostile", daemon=True)
        self.mailbox = mailbox
        self.store = RunStore(mailbox)
        self.fragments = fragments
        self.started = started
        self.rng = random.Random(seed * 7919)
        self.stop_event = threading.Event()
        self.events: list[dict[str, Any]] = []
        self.saved_heads: dict[int, bytes] = {}

    def run(self) -> None:
        turn = 0
        while not self.stop_event.wait(EVERY_S * self.rng.uniform(0.6, 1.4)):
            fragment = self.rng.randrange(self.fragments)
            plant = PLANTS[turn % len(PLANTS)]
            turn += 1
            try:
                detail = getattr(self, plant)(fragment)
            except GradientMailError as exc:
                detail = f"failed: {exc}"
            self.events.append(
                {"at_s": round(time.monotonic() - self.started, 3), "plant": plant, "fragment": fragment, "detail": detail}
            )
            print(f"  {time.monotonic() - self.started:6.1f} s  hostile: {plant} on fragment {fragment} ({detail})", flush=True)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)

    def _newest(self, fragment: int) -> int:
        versions = self.store.committed_versions(fragment)
        return versions[-1] if versions else 0

    def invalid_names(self, fragment: int) -> str:
        prefix = keys.contributions_prefix(fragment, self._newest(fragment))
        for learner in ("a=b", "..", "x" * 65):
            self.mailbox.put(f"{prefix}{learner}-0000000001.json", b"{}")
        return "3 names"

    def squat(self, fragment: int) -> str:
        version = self._newest(fragment) + 1
        try:
            self.mailbox.create(keys.round_record(fragment, version), b"not a round record")
        except RecordExists:
            return f"version {version} was committed first"
        return f"version {version}"

    def flood(self, fragment: int) -> str:
        base = self._newest(fragment)
        body = json.dumps({"schema_version": 1, "learner": "f", "fragment": fragment}).encode()
        tag = self.rng.randrange(10**6)
        for i in range(FLOOD):
            self.mailbox.put(keys.ContributionKey(fragment, base, f"flood{tag:06d}x{i:04d}", 1).record, body)
        return f"{FLOOD} records on version {base}"

    def replayed_head(self, fragment: int) -> str:
        """Put back a head saved by an earlier turn (of whichever fragment has one), saving the
        current one for the next; the first turn only saves."""
        fragment = next(iter(self.saved_heads), fragment)
        saved = self.saved_heads.pop(fragment, None)
        current = self.mailbox.get(keys.head(fragment))
        self.saved_heads[fragment] = current
        if saved is None:
            return "head saved for a later replay"
        self.mailbox.put(keys.head(fragment), saved)
        return f"fragment {fragment}'s head of an earlier turn put back"
