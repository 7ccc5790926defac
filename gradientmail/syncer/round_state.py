"""One fragment's rounds as the elected syncer holds them: the state and its rules, no I/O.

As ``session.fragment.LearnerFragment`` does for the learner, :class:`FragmentRounds` keeps
everything the syncer knows of one fragment together: the newest version and the round open on
it (``FragmentView``, ``OpenRound``), its adaptive grace window, the bounds' history, when the
rounds closed lately reached quorum, which contribution keys the recent round records list, the
contributions it judged stale and the heads whose record is gone. Its methods take the time
they are given and return decisions (which contributions a pass examines, whether to announce,
close or wait); ``SyncerRuntime`` makes the requests and wakes the threads. Where a rule needs
a round record it is handed a reader (``RecordReader``) that returns None for one gone or
unreadable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field

from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.algorithms.merge import MergeSum
from gradientmail.backends import Backend
from gradientmail.polling import RepeatedFailures
from gradientmail.records import Participant, Rejection, RoundRecord, RoundTiming, keys
from gradientmail.store import UNKNOWN_HEAD, OpenRoundNote, VersionDraft
from gradientmail.syncer.bounds import NORM_RATIO, ROUND_CONTRIBUTION_LIMIT, SEED_ROUNDS, ContributionHistory, round_outliers
from gradientmail.syncer.grace import GraceEstimator
from gradientmail.syncer.rounds import Accepted, Base, RoundDraft
from gradientmail.telemetry.hooks import RoundPhases

__all__ = [
    "QUORUM_TIMES_KEPT",
    "STRANGERS_PER_PASS",
    "FragmentRounds",
    "FragmentView",
    "OpenRound",
    "RecordReader",
    "RoundStep",
    "RoundView",
]

QUORUM_TIMES_KEPT = 8
"""Closed rounds per fragment whose quorum time is kept (the lateness of contributions that
arrive after their round, for ``grace_rule="arrivals"``)."""
STRANGERS_PER_PASS = 16
"""Contributions of ids neither live nor in the round before that one pass examines: a flood of
records under made-up ids costs a pass at most this many reads and never holds a round up."""

RecordReader = Callable[[int], RoundRecord | None]
"""A fragment's round record at a version, or None when it is gone or unreadable."""


@dataclass
class OpenRound:
    """The round collecting contributions against ``base_version``."""

    base_version: int
    opened_at: float = 0.0
    """Syncer clock when the round opened (its base was committed or loaded)."""
    seen: set[str] = field(default_factory=set)
    accepted: list[Accepted] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    first_seen_at: float | None = None
    last_seen_at: float | None = None
    """When the latest accepted contribution arrived: with ``first_seen_at``, the arrival spread."""
    quorum_at: float | None = None
    grace_s: float = 0.0
    fetch_s: float = 0.0
    accepted_at_quorum: int = 0
    hurried: bool = False
    """Whether the syncer's loop hurried for this round already (once per round: a bounded cost)."""
    lagging: bool = False
    """A listed contribution names a base newer than ours: probe for the newer version next pass."""
    examined: int = 0
    """New contributions this round fetched or chose to (``ROUND_CONTRIBUTION_LIMIT``)."""
    summed: MergeSum | None = None
    """The merge of ``accepted`` summed as they were accepted (``merge_arithmetic="streamed"``);
    ``close_round`` takes it when it still holds exactly the round's participants."""

    @property
    def learners(self) -> set[str]:
        return {a.contribution.learner for a in self.accepted}

    @property
    def learner_bases(self) -> set[tuple[str, int]]:
        """(learner, base version) of each accepted contribution: one of each may be merged."""
        return {(a.contribution.learner, a.contribution.anchor_version) for a in self.accepted}

    def timing(self, started: float, now: float) -> RoundTiming:
        """The timings the round record keeps, for a close that started at ``started``."""
        first = self.first_seen_at or started
        return RoundTiming(
            quorum_wait_s=(self.quorum_at or started) - first,
            grace_s=self.grace_s,
            sync_s=self.fetch_s + now - started,
            arrival_spread_s=(self.last_seen_at or started) - first,
        )

    def phases(self, started: float, draft: RoundDraft, committed_at: float, now: float) -> RoundPhases:
        """When each phase of this round ended, for telemetry (``hooks.round_committed``)."""
        return RoundPhases(
            opened_at=self.opened_at,
            first_seen_at=self.first_seen_at or started,
            quorum_at=self.quorum_at or started,
            closing_at=started,
            merged_at=draft.merged_at,
            stepped_at=draft.stepped_at,
            committed_at=committed_at,
            now=now,
            grace_window_s=self.grace_s,
            grace_contributions=len(self.accepted) - self.accepted_at_quorum,
            fetch_s=self.fetch_s,
            fetched_bytes=sum(a.contribution.payload.wire_bytes for a in self.accepted),
        )


@dataclass
class FragmentView:
    """The newest committed version of a fragment as the syncer holds it, and the round on it."""

    version: int
    record: RoundRecord
    base: Base
    round: OpenRound
    record_sha256: str = ""
    """Digest of ``record``'s stored bytes: the next version's ``previous``."""

    def version_draft(self, draft: RoundDraft, backend: Backend, algorithm: DiLoCo, timing: RoundTiming) -> VersionDraft:
        """The next version as the store commits it: ``draft`` with the open round's rejections,
        its ``timing``, and this record's digest as ``previous``."""
        codec = algorithm.update_codec
        return VersionDraft.of(
            algorithm,
            self.record.fragment,
            self.version + 1,
            {name: backend.to_numpy(tensor) for name, tensor in draft.params.items()},
            {name: backend.to_numpy(tensor) for name, tensor in draft.state.to_tensors().items()},
            outer_momentum=draft.momentum,
            update=(codec, draft.update) if codec is not None and draft.update is not None else None,
            base_version=self.version,
            participants=draft.participant_records(),
            rejected=tuple(self.round.rejected),
            final=draft.final,
            timing=timing,
            previous=self.record_sha256 or None,
            samples_per_step_cap=draft.samples_per_step_cap,
            backend=backend.name,
        )


@dataclass(frozen=True)
class RoundView:
    """A read-only look at the round open on one fragment (for tests, tools and telemetry)."""

    base_version: int
    seen: frozenset[str]
    """Contribution record keys the round has looked at (judged, or set aside as old)."""
    accepted: int
    rejected: int
    quorum_at: float | None
    """Syncer clock when quorum was reached; None while the round waits for it."""
    grace_s: float
    """The grace window after quorum (0 until quorum, or when every live learner is in)."""


@dataclass(frozen=True)
class RoundStep:
    """What an open round with accepted contributions does now (``FragmentRounds.step``)."""

    close: bool
    announce: bool = False
    """Quorum was reached now: the bulletin should say when the round closes."""
    wait_s: float | None = None
    """In its grace window: seconds until it ends (the next pass comes no later)."""


class FragmentRounds:
    """One fragment's rounds on the elected syncer: its view, grace window, bounds and the
    memory its rules need, with the decisions they make."""

    def __init__(self, fragment: int, algorithm: DiLoCo, *, margin_s: float, failures: RepeatedFailures) -> None:
        self.fragment = fragment
        self.view: FragmentView | None = None
        """The newest version and its open round; None until loaded (and while not elected)."""
        self.grace = GraceEstimator(
            algorithm.grace_gamma,
            algorithm.grace_tau,
            algorithm.grace_max_s,
            rule=algorithm.grace_rule,
            periods=algorithm.grace_periods,
            sync_every=algorithm.sync_every,
            margin_s=margin_s,
        )
        self.history = ContributionHistory()
        self.failures = failures
        """This fragment's failing passes, logged once per spell (one fragment holds up no other)."""
        self.notified = False
        """A learner in this process uploaded a contribution to it since the last pass (set and
        taken under the runtime's lock: another thread sets it)."""
        self._quorum_size = algorithm.quorum_size
        self._max_staleness = algorithm.max_staleness
        self._quorum_at: dict[int, float] = {}
        """Base version → when the round built on it reached quorum, for the rounds closed lately:
        how late a contribution that comes after its round closed arrived."""
        self._listed: dict[int, frozenset[str]] = {}
        """Version → the contribution keys its round record lists (late and old ones' check)."""
        self._judged_stale: set[str] = set()
        """Contribution keys rejected stale by a round this node committed: not again."""
        self._ghost_heads: set[int] = set()
        """Versions of heads naming a record that is gone, reported once each."""

    def take_notified(self) -> bool:
        """Whether a learner here uploaded to it since the last pass; cleared (under the runtime's lock)."""
        notified, self.notified = self.notified, False
        return notified

    # -- what it shows ---------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """A round with accepted contributions is open (its close comes soon)."""
        view = self.view
        return view is not None and bool(view.round.accepted)

    @property
    def waiting_for_quorum(self) -> bool:
        view = self.view
        return view is not None and bool(view.round.accepted) and view.round.quorum_at is None

    @property
    def head(self) -> int:
        """The newest version held, or ``UNKNOWN_HEAD``."""
        view = self.view
        return view.version if view is not None else UNKNOWN_HEAD

    def round_view(self) -> RoundView | None:
        view = self.view
        if view is None:
            return None
        current = view.round
        return RoundView(
            current.base_version, frozenset(current.seen), len(current.accepted), len(current.rejected),
            current.quorum_at, current.grace_s,
        )  # fmt: skip

    def note(self, now: float) -> OpenRoundNote | None:
        """The bulletin's note of the open round (None: nothing accepted): base, how many, and
        once quorum is reached the seconds left of its grace window."""
        view = self.view
        if view is None or not view.round.accepted:
            return None
        current = view.round
        closes_in = None if current.quorum_at is None else max(0.0, current.quorum_at + current.grace_s - now)
        return OpenRoundNote(current.base_version, len(current.accepted), closes_in)

    # -- opening -------------------------------------------------------------------
    def open(self, view: FragmentView, backend: Backend) -> None:
        """Hold ``view`` (a version loaded or committed) and tell the bounds the norm and size of
        the parameters the next round merges onto."""
        self.view = view
        params = view.base.params.values()
        norm = math.sqrt(sum(backend.finite_norm(tensor) ** 2 for tensor in params))
        self.history.anchor(norm, sum(math.prod(backend.shape(tensor)) for tensor in params))

    def seed_history(self, newest: RoundRecord, read: RecordReader) -> bool:
        """Learn the bounds' history from committed rounds this node did not close: the newest
        one, and when the history is short (a new term), the ones before it, up to
        ``SEED_ROUNDS``. False when the newest lists more participants than a round holds."""
        history = self.history
        known = bool(history.rounds)  # we saw the rounds before: this one follows them
        fits = history.seed(newest.participants) or known
        version = newest.version - 1
        while not known and version > newest.version - SEED_ROUNDS and version > 0:
            record = read(version)
            if record is None:
                break
            history.seed(record.participants, older=True)
            version -= 1
        return fits

    # -- collecting ----------------------------------------------------------------
    def within_budget(self, steps: list[keys.ContributionKey], live: Container[str]) -> list[keys.ContributionKey]:
        """The new contributions this pass examines, in this order (each in listed order): the
        participants of the round before, then learners with a ``live`` lease, then at most
        ``STRANGERS_PER_PASS`` of the others; up to ``ROUND_CONTRIBUTION_LIMIT`` in the round,
        past which they are rejected ``flood`` without a read. Strangers left for a later pass are
        not waited for: the round closes by its rule, and they are judged stale by name afterwards."""
        assert self.view is not None
        current, regulars = self.view.round, {p.learner for p in self.view.record.participants}
        first = [key for key in steps if key.learner in regulars]
        known = [key for key in steps if key.learner not in regulars and key.learner in live]
        strangers = [key for key in steps if key.learner not in regulars and key.learner not in live]
        steps = first + known + strangers[:STRANGERS_PER_PASS]
        room = max(0, ROUND_CONTRIBUTION_LIMIT - current.examined)
        chosen, refused = steps[:room], steps[room:]
        current.examined += len(chosen)
        for key in refused:
            current.seen.add(key.record)
            detail = f"past the {ROUND_CONTRIBUTION_LIMIT} contributions a round examines"
            current.rejected.append(Rejection(learner=key.learner, contribution=key.record, reason="flood", detail=detail))
        return chosen

    def judge(
        self, key: keys.ContributionKey, outcome: Accepted | Rejection, *, now: float, new_sum: Callable[[], MergeSum | None]
    ) -> bool:
        """Take one checked contribution into the open round (a second one of a learner on the same
        base is a ``duplicate``); ``new_sum`` starts the streamed merge. True: announce (a round
        opened, or is one short of quorum: learners may join it)."""
        assert self.view is not None
        current = self.view.round
        if isinstance(outcome, Rejection):
            current.rejected.append(outcome)
            return False
        if (outcome.contribution.learner, outcome.contribution.anchor_version) in current.learner_bases:
            detail = "second contribution against this version"
            current.rejected.append(Rejection(learner=key.learner, contribution=key.record, reason="duplicate", detail=detail))
            return False
        if current.summed is None and not current.accepted:
            current.summed = new_sum()
        if current.summed is not None:  # merged now, while the next contributions are fetched
            current.summed.add(outcome.delta, outcome.weight, outcome.tensor_norms)
        current.accepted.append(outcome)
        current.last_seen_at = now
        if current.first_seen_at is None:
            current.first_seen_at = now
        self.grace.observe_lateness(0.0 if current.quorum_at is None else now - current.quorum_at)
        return len(current.accepted) in (1, self._quorum_size - 1)

    def listed_by(self, version: int, read: RecordReader) -> frozenset[str]:
        """The contribution keys the round record at ``version`` lists (merged or rejected)."""
        cached = self._listed.get(version)
        if cached is None:
            record = read(version)
            if record is None:
                return frozenset()
            cached = self._listed[version] = _listed(record.participants, record.rejected)
        return cached

    def mergeable_late(self, key: keys.ContributionKey, read: RecordReader) -> bool:
        """A contribution based on an older version that ``max_staleness`` lets into this round:
        within the bound, and in no round record yet (neither merged nor rejected)."""
        assert self.view is not None
        version = self.view.version
        if version - key.base_version > self._max_staleness:
            return False
        return not any(key.record in self.listed_by(v, read) for v in range(key.base_version + 1, version + 1))

    def old_contribution(self, key: keys.ContributionKey, read: RecordReader, *, now: float) -> None:
        """A contribution against an older version: kept for audit once a round lists it (retention
        collects it when the round leaves the audit window), else stale — once: a round this node
        committed that rejected it stale (listed or only counted) is not repeated."""
        assert self.view is not None
        view = self.view
        view.round.seen.add(key.record)
        last_round = key.base_version + 1 + self._max_staleness  # the last round that could list it
        if key.record in self._judged_stale or any(
            key.record in self.listed_by(v, read) for v in range(key.base_version + 1, min(last_round, view.version) + 1)
        ):
            return
        detail = f"based on version {key.base_version}, current is {view.version}"
        view.round.rejected.append(Rejection(learner=key.learner, contribution=key.record, reason="stale", detail=detail))
        closed_quorum_at = self._quorum_at.get(key.base_version)
        if closed_quorum_at is not None:  # it came after its round closed: how much later
            self.grace.observe_lateness(now - closed_quorum_at)

    # -- closing -------------------------------------------------------------------
    def step(self, now: float, *, everyone: bool) -> RoundStep:
        """The open round's next step: wait for quorum (``quorum_size`` accepted, or ``everyone``
        live in), then the grace window (none when everyone is in), then close."""
        assert self.view is not None
        current = self.view.round
        announce = False
        if current.quorum_at is None:
            if len(current.accepted) < self._quorum_size and not everyone:
                return RoundStep(close=False)
            current.quorum_at = now
            current.accepted_at_quorum = len(current.accepted)
            self.grace.observe_step_times(a.contribution.step_time_s for a in current.accepted)
            current.grace_s = 0.0 if everyone else self.grace.window(now - (current.first_seen_at or now))
            announce = True  # when it closes: learners awaiting its commit look then
        closes_at = current.quorum_at + current.grace_s
        if not everyone and now < closes_at:
            return RoundStep(close=False, announce=announce, wait_s=closes_at - now)
        return RoundStep(close=True, announce=announce)

    def reject_round_outliers(self) -> None:
        """At close: reject as ``outlier`` the accepted deltas the round's own majority bounds
        (``bounds.round_outliers``), before the merge and the weight cap see them."""
        assert self.view is not None
        current = self.view.round
        accepted = current.accepted
        outliers = set(round_outliers([(a.contribution.steps, a.norm) for a in accepted]))
        if not outliers:
            return
        current.summed = None  # the next close sums afresh
        current.accepted = [a for i, a in enumerate(accepted) if i not in outliers]
        for i in sorted(outliers):
            detail = f"delta norm {accepted[i].norm:.4g} exceeds {NORM_RATIO:g}x the round's typical (scaled by its steps)"
            current.rejected.append(
                Rejection(learner=accepted[i].key.learner, contribution=accepted[i].key.record, reason="outlier", detail=detail)
            )

    def not_finite(self, dropped: Iterable[Rejection]) -> None:
        """The merge was not finite: drop these contributions from the round (the next close sums afresh)."""
        assert self.view is not None
        current = self.view.round
        for rejection in dropped:
            current.summed = None
            current.accepted = [a for a in current.accepted if a.key.record != rejection.contribution]
            current.rejected.append(rejection)

    def first_ghost(self, version: int) -> bool:
        """Whether the head's ``version`` with its record gone is reported now (once each)."""
        first = version not in self._ghost_heads
        self._ghost_heads.add(version)
        return first

    def committed(self, view: FragmentView, draft: RoundDraft, *, sync_s: float) -> list[keys.ContributionKey]:
        """After this node committed ``view`` from the round open before: learn from the round,
        keep what the next rounds check, and return the contributions it rejected stale."""
        assert self.view is not None
        closed, base = self.view.round, self.view.version
        self.grace.observe_sync(sync_s)
        if closed.quorum_at is not None:
            self._quorum_at[base] = closed.quorum_at
            for old in [v for v in self._quorum_at if v < base - QUORUM_TIMES_KEPT]:
                del self._quorum_at[old]
        self.history.record([(a.contribution.steps, a.contribution.samples, a.norm) for a in draft.participants])
        self._listed[view.version] = _listed(view.record.participants, closed.rejected)
        parsed = [keys.parse_contribution_record(r.contribution) for r in closed.rejected if r.reason == "stale"]
        stale = [k for k in parsed if k is not None]
        self._judged_stale.update(k.record for k in stale)
        return stale

    def forget_below(self, oldest_base: int) -> None:
        """Retention deleted the contributions based below ``oldest_base``: none is left to check."""
        for version in [v for v in self._listed if v < oldest_base]:
            del self._listed[version]
        self._judged_stale = {k for k in self._judged_stale if _base_of(k) >= oldest_base}

    def forget(self) -> None:
        """Not closing this fragment now: a future term or assignment recovers from the mailbox."""
        self.view = None


def _listed(participants: Iterable[Participant], rejected: Iterable[Rejection]) -> frozenset[str]:
    return frozenset([p.contribution for p in participants] + [r.contribution for r in rejected])


def _base_of(record_key: str) -> int:
    """The base version a contribution record key names (-1 if it names none)."""
    parsed = keys.parse_contribution_record(record_key)
    return parsed.base_version if parsed is not None else -1
