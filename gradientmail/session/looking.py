"""When a learner looks for news: the pace of its exchange, from its own schedule.

The rules (docs/session.md, "Polling"), apart from the exchange that follows them, so that a fake
clock pins them: :class:`LearnerLooking` holds what they remember (when the learner last looked,
the bulletin it follows, each fragment's announced close and probe before its publish) and
returns decisions; it makes no request and wakes no thread. The exchange reads, fetches and
sleeps as it says.

* a fragment whose commit the learner awaits (it published) is probed at ``poll_interval_s``,
  sooner in a hurry: that cost is per round;
* every other fragment is looked at once per ``algorithms.schedule.look_interval``: a tenth of
  the learner's sync period (``sync_every`` × its step time), never faster than ``poll_interval_s`` nor slower than
  the idle interval (a third of the lease TTL), and at the idle interval while it does not train.
  A look is one read of the elected syncer's bulletin (``store.bulletin``), or none when the node
  holds the election or its election watch just read the lease;
* following another node's bulletin, a fragment awaiting a commit is probed in a hurry (after the
  upload) and when the bulletin's announced close of its round has come, once per round;
* a fragment about to be due is probed once, :func:`due_lead_s` before its scheduled publish, so
  its contribution goes out on the newest version rather than one a commit just replaced;
* without a bulletin to follow, a look probes every fragment (and, once per ``HEAD_CHECK_TTLS``
  lease TTLs, from the head pointer); following one, one fragment in turn is checked from its head
  pointer once per ``BULLETIN_CHECK_TTLS`` TTLs (the bulletin is a hint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gradientmail.algorithms.schedule import look_interval
from gradientmail.store import UNKNOWN_HEAD, RoundsBulletin

__all__ = [
    "BULLETIN_CHECK_TTLS",
    "DUE_LEAD_POLLS",
    "HEAD_CHECK_TTLS",
    "FragmentSeen",
    "LearnerLooking",
    "LearnerSchedule",
    "Look",
    "NextPass",
    "due_lead_s",
    "joins_with",
]

DUE_LEAD_POLLS = 2
"""How many poll intervals before a fragment's scheduled publish its head is probed."""
HEAD_CHECK_TTLS = 3
"""Without a bulletin to follow, the learner starts from the head pointer instead of its known
version once per this many lease TTLs (a learner left behind by retention still finds the newest
version); following one, whenever the bulletin's head is more than one version ahead."""
BULLETIN_CHECK_TTLS = 10
"""Following another node's bulletin (a hint), the learner checks one fragment in turn from its
head pointer once per this many lease TTLs: a bulletin that lags or lies hides a version from an
idle learner for at most this many TTLs times the fragments (a training one probes each fragment
before its publish anyway)."""


@dataclass(frozen=True)
class LearnerSchedule:
    """What the training thread's schedule says, as the exchange reads it."""

    period_s: float | None = None
    """Seconds of one sync period at the current step time; None while no step time is known
    (before the second step, or while the learner does not train)."""
    due_in_s: tuple[float | None, ...] = ()
    """Per fragment, seconds until its next scheduled publish; None when none is pending (one
    is out, or no step time is known)."""
    due_steps: tuple[int, ...] = ()
    """Per fragment, the step of that publish: which due event a probe was for."""


def due_lead_s(poll_interval_s: float) -> float:
    """Seconds before a scheduled publish that its fragment's head is probed."""
    return DUE_LEAD_POLLS * poll_interval_s


def joins_with(quorum_size: int) -> int:
    """Contributions of others a round needs before a learner joins it early: one short of quorum
    (quorum ≥ 2), or any (a quorum of one, where the grace window waits for late arrivals)."""
    return max(1, quorum_size - 1)


@dataclass(frozen=True)
class FragmentSeen:
    """What the rules read of one fragment, as the exchange holds it when it looks."""

    known_version: int
    """The newest version fetched."""
    awaiting: bool = False
    """A contribution uploaded and no commit since."""
    held_base: int | None = None
    """The base version of the uploaded contribution a round may still merge (None: none)."""


@dataclass(frozen=True)
class Look:
    """What one look found: the fragments to probe, and whether to find their newest from the
    head pointer (retention may have taken the versions between)."""

    probe: frozenset[int]
    from_head: bool


@dataclass(frozen=True)
class NextPass:
    """When the exchange's next pass runs: its regular pause, the longest pause before it, and
    whether the loop may settle (nothing awaited: any hurry ends)."""

    interval_s: float
    pause_at_most_s: float
    settle: bool


@dataclass
class _FragmentLooks:
    """One fragment's part of the rules' memory."""

    closes_at: float | None = None
    """When the round our contribution is in closes, as the bulletin announced it."""
    closes_base: int | None = None
    """That round's base version."""
    hurried_for: int | None = None
    """The base version of the round whose announced close the exchange hurried for."""
    probed_for_due: int | None = None
    """The due step whose publish this fragment's head was probed ahead of."""


class LearnerLooking:
    """The learner's when-to-look rules and what they remember, on the exchange's clock.

    Every method takes ``now`` where time matters; none makes a request or wakes a thread.
    ``joined_at``: when the learner joined (at the newest version, so its first check from the
    head pointer is ``HEAD_CHECK_TTLS`` TTLs away).
    """

    def __init__(
        self,
        fragments: int,
        *,
        poll_interval_s: float,
        idle_interval_s: float,
        lease_ttl_s: float,
        quorum_size: int,
        joined_at: float,
    ) -> None:
        self.fragments = fragments
        self.poll_interval_s = poll_interval_s
        self.idle_interval_s = idle_interval_s
        self._head_every_s = HEAD_CHECK_TTLS * lease_ttl_s
        self._bulletin_check_every_s = BULLETIN_CHECK_TTLS * lease_ttl_s
        self._quorum_size = quorum_size
        self.open_rounds: dict[int, int] = {}
        """Fragment → the version other learners have opened a round on that this learner may
        join (what ``Session.step`` publishes into early)."""
        self._looked_at = float("-inf")
        self._followed_at = float("-inf")
        """When a look last followed a bulletin (else it probes every fragment)."""
        self._noted: tuple[RoundsBulletin | None, float] | None = None
        """The bulletin in the syncer lease this node's election watch read last, and when."""
        self._next_head_check = 0
        """The fragment a look that follows a bulletin checks from its head pointer next."""
        self._head_checked_at = joined_at
        self._looks = [_FragmentLooks() for _ in range(fragments)]

    # -- the pace ------------------------------------------------------------------
    def look_every_s(self, schedule: LearnerSchedule) -> float:
        """Seconds between two looks at the fragments no commit is awaited of, at ``schedule``."""
        return look_interval(self.poll_interval_s, self.idle_interval_s, schedule.period_s)

    def look_due(self, now: float, look_every_s: float, *, own_bulletin: bool) -> bool:
        """Whether this pass looks: always while this node holds the election (looking is free),
        once per look interval, and whenever the election watch read a bulletin since."""
        noted = self._noted
        due = own_bulletin or now - self._looked_at >= 0.9 * look_every_s or (noted is not None and noted[1] > self._looked_at)
        if due:
            self._looked_at = now
        return due

    def following(self, now: float, look_every_s: float) -> bool:
        """Whether the learner follows a bulletin: a look followed one within a look interval and a poll."""
        return now - self._followed_at <= look_every_s + self.poll_interval_s

    def next_pass(
        self, now: float, look_every_s: float, schedule: LearnerSchedule, *, awaiting: bool, following: bool
    ) -> NextPass:
        """The pace after a pass: the regular pace while a commit is awaited and no bulletin is
        ``following``, else the look pace; no later than the next look, the next round's announced
        close or the next fragment's probe before its publish."""
        wakes = (self._looked_at + look_every_s - now, self._next_due_probe_in(schedule), self._next_close_in(now))
        return NextPass(
            self.poll_interval_s if awaiting and not following else look_every_s,
            max(0.0, min(wakes)),
            settle=not awaiting,
        )

    # -- bulletins -----------------------------------------------------------------
    def note(self, bulletin: RoundsBulletin | None, now: float) -> None:
        """The bulletin the node's election watch just read (None: none readable)."""
        self._noted = (bulletin, now)

    def noted_live(self) -> int | None:
        """The live learners of the bulletin the election watch read last (None: none read)."""
        noted = self._noted
        return noted[0].live if noted is not None and noted[0] is not None else None

    def fresh_bulletin(self, now: float, look_every_s: float) -> tuple[RoundsBulletin | None, float] | None:
        """The bulletin the election watch read within a look interval and a poll, and when;
        None when the look must read the syncer lease itself."""
        noted = self._noted
        return noted if noted is not None and now - noted[1] <= look_every_s + self.poll_interval_s else None

    def has_news(self, bulletin: RoundsBulletin, seen: Sequence[FragmentSeen]) -> bool:
        """Whether ``bulletin`` says a fragment moved or the rounds to join changed (wake the exchange)."""
        moved = any(head == UNKNOWN_HEAD or head > f.known_version for f, head in zip(seen, bulletin.heads, strict=True))
        return moved or self.rounds_opened(bulletin, seen) != self.open_rounds

    def rounds_opened(self, bulletin: RoundsBulletin, seen: Sequence[FragmentSeen]) -> dict[int, int]:
        """The rounds on our known versions with enough contributions from others to join, from
        the bulletin's counts less our own contribution (:func:`joins_with`)."""
        needed = joins_with(self._quorum_size)
        opened = {}
        for index, fragment in enumerate(seen):
            note = bulletin.open.get(index)
            if note is None or note.base_version != fragment.known_version:
                continue
            ours = int(fragment.awaiting and fragment.held_base == note.base_version)
            if note.accepted - ours >= needed:
                opened[index] = note.base_version
        return opened

    def rounds_counted(self, others: Mapping[int, int], seen: Sequence[FragmentSeen]) -> dict[int, int]:
        """The rounds to join from the contributions of others listed on each fragment's known
        version (``others``: fragment → how many), when no bulletin is followed."""
        needed = joins_with(self._quorum_size)
        return {index: f.known_version for index, f in enumerate(seen) if others.get(index, 0) >= needed}

    def set_open_rounds(self, opened: dict[int, int]) -> bool:
        """Take the rounds to join; True when they changed to some (the training thread should look)."""
        if opened == self.open_rounds:
            return False
        self.open_rounds = opened
        return bool(opened)

    # -- looks ---------------------------------------------------------------------
    def unfollowed(self, now: float) -> Look:
        """A look without a bulletin: every fragment, from the head pointer once per
        ``HEAD_CHECK_TTLS`` lease TTLs."""
        from_head = now - self._head_checked_at >= self._head_every_s
        if from_head:
            self._head_checked_at = now
        return Look(frozenset(range(self.fragments)), from_head)

    def followed(self, now: float, bulletin: RoundsBulletin, read_at: float, seen: Sequence[FragmentSeen], *, own: bool) -> Look:
        """A look that follows ``bulletin`` (read at ``read_at``; ``own``: this node's own): the
        fragments it says moved, plus another node's announced closes noted and one fragment in
        turn checked from its head pointer once per ``BULLETIN_CHECK_TTLS`` TTLs."""
        self._followed_at = now
        if not own:  # this node's own commits wake the exchange as they are made
            self._note_closings(bulletin, read_at, seen)
        heads = list(zip(seen, bulletin.heads, strict=True))
        moved = {index for index, (f, head) in enumerate(heads) if head == UNKNOWN_HEAD or head > f.known_version}
        gap = any(head > f.known_version + 1 for f, head in heads)
        if not own and now - self._head_checked_at >= self._bulletin_check_every_s:
            self._head_checked_at = now
            moved.add(self._next_head_check % self.fragments)
            self._next_head_check += 1
            gap = True
        return Look(frozenset(moved), gap)

    def _note_closings(self, bulletin: RoundsBulletin, read_at: float, seen: Sequence[FragmentSeen]) -> None:
        """When the rounds our awaited contributions are in close, as the bulletin read at
        ``read_at`` announces: the exchange hurries then, once per round."""
        for index, fragment in enumerate(seen):
            note = bulletin.open.get(index)
            if not fragment.awaiting or fragment.held_base is None or note is None or note.closes_in_s is None:
                continue
            looks = self._looks[index]
            if note.base_version == fragment.held_base and looks.hurried_for != note.base_version:
                looks.closes_at, looks.closes_base = read_at + note.closes_in_s, note.base_version

    def round_closing(self, now: float, awaiting: set[int]) -> bool:
        """Whether a round we await has reached its announced close (hurry to fetch its commit).
        Every pass: drops every announced close that has passed or whose contribution is no longer
        awaited (its commit came first), so that the next pause only ever waits for one ahead."""
        closing = False
        for index, looks in enumerate(self._looks):
            if looks.closes_at is None or (index in awaiting and looks.closes_at > now):
                continue
            looks.hurried_for, looks.closes_at, looks.closes_base = looks.closes_base, None, None
            closing |= index in awaiting
        return closing

    def _next_close_in(self, now: float) -> float:
        return min((looks.closes_at - now for looks in self._looks if looks.closes_at is not None), default=float("inf"))

    # -- before a publish ----------------------------------------------------------
    def due_soon(self, schedule: LearnerSchedule) -> set[int]:
        """Fragments whose scheduled publish is within :func:`due_lead_s`, each probed once per
        due step, so the publish goes out on the newest version."""
        lead = due_lead_s(self.poll_interval_s)
        soon = {index for index, due_in in self._unprobed_dues(schedule) if due_in <= lead}
        for index in soon:
            self._looks[index].probed_for_due = schedule.due_steps[index]
        return soon

    def _next_due_probe_in(self, schedule: LearnerSchedule) -> float:
        """Seconds until the next fragment enters its probe window before a publish (inf: none)."""
        lead = due_lead_s(self.poll_interval_s)
        return max(0.0, min((due_in - lead for _, due_in in self._unprobed_dues(schedule)), default=float("inf")))

    def _unprobed_dues(self, schedule: LearnerSchedule) -> list[tuple[int, float]]:
        """(fragment, seconds to its scheduled publish) of those not probed ahead of it yet."""
        return [
            (index, due_in)
            for index, (due_in, due_step) in enumerate(zip(schedule.due_in_s, schedule.due_steps, strict=False))
            if due_in is not None and index < self.fragments and self._looks[index].probed_for_due != due_step
        ]
