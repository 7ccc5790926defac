"""The instruments, built from the catalogue with the OpenTelemetry metrics API, and round spans.

Learner metrics and the syncer's state are observable instruments: their callbacks read the
registered sessions' ``stats`` and the runtimes' counters when a reader collects (a scrape or
an OTLP export), so nothing runs per training step. Round metrics and spans are recorded once
per committed round, from the syncer thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.trace import Tracer
from opentelemetry.util.types import AttributeValue

from gradientmail.mailbox import MeteredMailbox, RequestCounts
from gradientmail.records import RoundRecord
from gradientmail.telemetry import catalogue as c
from gradientmail.telemetry import hooks
from gradientmail.telemetry.catalogue import MetricSpec

Reading = Callable[[], Iterable[tuple[float, dict[str, str]]]]


class MetricsRecorder:
    """Owns every instrument of one meter; ``hooks`` forwards round events to it."""

    def __init__(self, meter: Meter, tracer: Tracer | None) -> None:
        self._meter = meter
        self._tracer = tracer
        self.rounds_committed = self._counter(c.ROUNDS_COMMITTED)
        self.round_duration = self._histogram(c.ROUND_DURATION)
        self.phase_duration = self._histogram(c.ROUND_PHASE_DURATION)
        self.grace_window = self._histogram(c.GRACE_WINDOW)
        self.grace_contributions = self._counter(c.GRACE_CONTRIBUTIONS)
        self.accepted = self._counter(c.CONTRIBUTIONS_ACCEPTED)
        self.rejected = self._counter(c.CONTRIBUTIONS_REJECTED)
        self.syncer_fetched = self._counter(c.SYNCER_FETCHED)
        self.syncer_published = self._counter(c.SYNCER_PUBLISHED)
        self._observe(
            c.ROUND_PARTICIPANTS,
            lambda: ((len(record.participants), _fragment(run, f)) for (run, f), record in _newest_records().items()),
        )
        self._observe(
            c.CONTRIBUTION_WEIGHT,
            lambda: (
                (p.weight, {**_fragment(run, f), "learner": p.learner})
                for (run, f), record in _newest_records().items()
                for p in record.participants
            ),
        )
        self._observe(c.CONTRIBUTION_WEIGHT_RATIO, _weight_ratios)
        self._observe(
            c.FRAGMENT_VERSION, lambda: ((record.version, _fragment(run, f)) for (run, f), record in _newest_records().items())
        )
        self._observe(c.LEARNER_VERSION_LAG, _version_lags)
        self._observe(c.LEARNERS_LIVE, _live_learners)
        self._observe(
            c.LEASE_EXPIRATIONS,
            lambda: (
                item
                for r in hooks.syncers()
                for item in (
                    (r.learners.expired, {**_node(r), "kind": "learner"}),
                    (r.election.leases_expired, {**_node(r), "kind": "syncer"}),
                )
            ),
        )
        self._observe(c.LEASE_AGE, _lease_ages)
        self._observe(c.LEASE_TTL, _per_node(lambda r: r.election.ttl_s))
        self._observe(c.SYNCER_LEADER, _per_node(lambda r: int(r.election.is_leader)))
        self._observe(c.SYNCER_TERM, _per_node(lambda r: r.election.term))
        self._observe(c.SYNCER_ELECTIONS, _per_node(lambda r: r.election.elections_won))
        self._observe(c.SYNCER_TAKEOVERS, _per_node(lambda r: r.election.takeovers))
        self._observe(c.SYNCER_LOST_RACES, _per_node(lambda r: r.lost_races))
        self._observe(c.SYNCER_REMOVED_ROUNDS, _per_node(lambda r: r.forged_rounds_removed))
        self._observe(c.SYNCER_RESTORED_BLOBS, _per_node(lambda r: r.blobs_restored))
        self._observe(c.STORE_UNPARSABLE_KEYS, _per_node(lambda r: r.store.unparsable_keys))
        self._observe(c.LEARNER_STEPS, _per_learner(lambda s: s.stats.steps))
        self._observe(c.LEARNER_SAMPLES, _per_learner(lambda s: s.stats.samples))
        self._observe(c.LEARNER_BLOCKED, _per_learner(lambda s: s.stats.blocked_s))
        self._observe(c.LEARNER_CONTRIBUTIONS, _per_learner(lambda s: s.stats.contributions))
        self._observe(c.LEARNER_ALIGNMENTS, _per_learner(lambda s: s.stats.alignments))
        self._observe(
            c.LEARNER_FRAGMENT_VERSION,
            lambda: (
                (version, {**_learner(s), "fragment": str(f)})
                for s in hooks.sessions()
                for f, version in enumerate(list(s.stats.versions))
            ),
        )
        self._observe(c.LEARNER_PUBLISHED, _per_learner(lambda s: s.bytes_published))
        self._observe(c.LEARNER_FETCHED, _per_learner(lambda s: s.bytes_fetched))
        self._observe(c.LEARNER_REBUILT, _per_learner(lambda s: s.rebuilt_commits))
        self._observe(c.LEARNER_REBUILD_FALLBACKS, _per_learner(lambda s: s.rebuild_fallbacks))
        self._observe(
            c.LEARNER_REPORTED,
            lambda: (
                (value, {**_learner(s), "name": name})
                for s in hooks.sessions()
                for name, value in dict(s.reported.values).items()
            ),
        )
        self._observe(c.MAILBOX_REQUESTS, lambda: _requests(lambda counts: counts.requests()))
        self._observe(c.MAILBOX_REQUEST_SECONDS, lambda: _requests(lambda counts: counts.seconds()))

    # -- events from the syncer thread -------------------------------------------------------
    def syncer_attached(self, runtime: Any) -> None:
        """Start every per-fragment counter at 0, so dashboards and alerts see the series from the
        first scrape instead of only after the first rejection or commit."""
        for fragment in range(len(runtime.spec.fragments)):
            labels = _fragment(_run_id(runtime), fragment)
            for counter in (self.rounds_committed, self.grace_contributions, self.syncer_fetched, self.syncer_published):
                counter.add(0, labels)
            for reason in c.REJECTION_REASONS:
                self.rejected.add(0, {**labels, "reason": reason})

    def round_committed(self, runtime: Any, fragment: int, record: RoundRecord, phases: hooks.RoundPhases) -> None:
        labels = _fragment(_run_id(runtime), fragment)
        self.rounds_committed.add(1, labels)
        self.round_duration.record(max(0.0, phases.committed_at - phases.opened_at), labels)
        durations = phases.durations()
        for phase, seconds in durations.items():
            self.phase_duration.record(seconds, {**labels, "phase": phase})
        self.grace_window.record(phases.grace_window_s, labels)
        self.grace_contributions.add(phases.grace_contributions, labels)
        for participant in record.participants:
            self.accepted.add(1, {**labels, "learner": participant.learner})
        for rejection in record.rejected:
            self.rejected.add(1, {**labels, "reason": rejection.reason})
        self.syncer_fetched.add(phases.fetched_bytes, labels)
        self.syncer_published.add(record.params.wire_bytes + record.outer_state.wire_bytes, labels)
        if self._tracer is not None:
            self._trace(runtime.node_id, fragment, record, phases)

    def _trace(self, node: str, fragment: int, record: RoundRecord, phases: hooks.RoundPhases) -> None:
        """A ``gradientmail.round`` span with one child per phase, placed with explicit times."""
        assert self._tracer is not None
        wall_ns, clock_now = time.time_ns(), phases.now

        def at(clock_time: float) -> int:
            return wall_ns - int((clock_now - clock_time) * 1e9)

        attributes: dict[str, AttributeValue] = {
            "gradientmail.fragment": fragment,
            "gradientmail.version": record.version,
            "gradientmail.base_version": record.base_version or 0,
            "gradientmail.node": node,
            "gradientmail.term": record.term,
            "gradientmail.participants": len(record.participants),
            "gradientmail.rejected": len(record.rejected),
            "gradientmail.grace_window_s": phases.grace_window_s,
            "gradientmail.grace_contributions": phases.grace_contributions,
            "gradientmail.fetch_s": phases.fetch_s,
            "gradientmail.final": record.final,
        }
        root = self._tracer.start_span("gradientmail.round", start_time=at(phases.opened_at), attributes=attributes)
        context = trace.set_span_in_context(root)
        start = phases.opened_at
        for phase, seconds in phases.durations().items():
            child = self._tracer.start_span(
                f"gradientmail.round.{phase}",
                context=context,
                start_time=at(start),
                attributes={"gradientmail.fragment": fragment, "gradientmail.phase": phase},
            )
            start += seconds
            child.end(end_time=at(start))
        root.end(end_time=at(phases.committed_at))

    # -- building instruments ----------------------------------------------------------------
    def _counter(self, spec: MetricSpec) -> Any:
        return self._meter.create_counter(spec.name, unit=spec.unit, description=spec.help)

    def _histogram(self, spec: MetricSpec) -> Any:
        return self._meter.create_histogram(
            spec.name, unit=spec.unit, description=spec.help, explicit_bucket_boundaries_advisory=c.SECONDS_BUCKETS
        )

    def _observe(self, spec: MetricSpec, reading: Reading) -> None:
        def callback(options: CallbackOptions) -> list[Observation]:
            return [Observation(value, labels) for value, labels in reading()]

        create = self._meter.create_observable_counter if spec.kind == "counter" else self._meter.create_observable_gauge
        create(spec.name, callbacks=[callback], unit=spec.unit, description=spec.help)


def _run_id(owner: Any) -> str:
    """The run id of a syncer runtime or session (the ``run`` label): its manifest's."""
    spec = owner.spec
    return str(spec.manifest.run_id) if spec is not None else ""


def _fragment(run: str, fragment: int) -> dict[str, str]:
    return {c.RUN_LABEL: run, "fragment": str(fragment)}


def _learner(session: Any) -> dict[str, str]:
    return {c.RUN_LABEL: _run_id(session), "learner": session.learner_id}


def _node(runtime: Any) -> dict[str, str]:
    return {c.RUN_LABEL: _run_id(runtime), "node": runtime.node_id}


def _per_learner(value: Callable[[Any], float]) -> Reading:
    return lambda: ((value(s), _learner(s)) for s in hooks.sessions())


def _per_node(value: Callable[[Any], float]) -> Reading:
    return lambda: ((value(r), _node(r)) for r in hooks.syncers())


def _request_counters() -> Iterable[tuple[RequestCounts, dict[str, str]]]:
    """Each node's mailbox request counts, once: a session's (its syncer runtime shares its
    mailbox) and a dedicated syncer's."""
    seen: set[int] = set()
    owners = [(s.request_counts, {c.RUN_LABEL: _run_id(s), "node": s.learner_id}) for s in hooks.sessions()]
    for runtime in hooks.syncers():
        mailbox = runtime.store.mailbox
        if isinstance(mailbox, MeteredMailbox):
            owners.append((mailbox.counts, _node(runtime)))
    for counts, labels in owners:
        if id(counts) not in seen:
            seen.add(id(counts))
            yield counts, labels


def _requests(
    reading: Callable[[RequestCounts], dict[tuple[str, str], float] | dict[tuple[str, str], int]],
) -> Iterable[tuple[float, dict[str, str]]]:
    return (
        (value, {**labels, "operation": operation, "outcome": outcome})
        for counts, labels in _request_counters()
        for (operation, outcome), value in reading(counts).items()
    )


def _lease_ages() -> Iterable[tuple[float, dict[str, str]]]:
    """Each lease's age as each syncer runtime judges it: the syncer lease's, and every live learner's."""
    for runtime in hooks.syncers():
        node = _node(runtime)
        age = runtime.election.lease_age()
        if age is not None:
            yield age, {**node, "kind": "syncer", "holder": runtime.election.holder or ""}
        for learner, learner_age in runtime.learners.ages().items():
            yield learner_age, {**node, "kind": "learner", "holder": learner}


def _leaders() -> list[Any]:
    return [r for r in hooks.syncers() if r.election.is_leader]


def _newest_records() -> dict[tuple[str, int], RoundRecord]:
    """The newest committed record per (run, fragment) known to an elected runtime in this process."""
    newest: dict[tuple[str, int], RoundRecord] = {}
    for runtime in _leaders():
        run = _run_id(runtime)
        for fragment, record in runtime.committed().items():
            if (run, fragment) not in newest or record.version > newest[(run, fragment)].version:
                newest[(run, fragment)] = record
    return newest


def _weight_ratios() -> Iterable[tuple[float, dict[str, str]]]:
    for (run, fragment), record in _newest_records().items():
        total = sum(p.weight for p in record.participants)
        for participant in record.participants:
            share = participant.weight / total if total > 0 else 0.0
            yield share, {**_fragment(run, fragment), "learner": participant.learner}


def _live_learners() -> Iterable[tuple[float, dict[str, str]]]:
    live: dict[str, int] = {}
    for runtime in _leaders():
        run = _run_id(runtime)
        live[run] = max(live.get(run, 0), len(runtime.live))
    for run, count in live.items():
        yield count, {c.RUN_LABEL: run}


def _version_lags() -> Iterable[tuple[float, dict[str, str]]]:
    """Newest commit minus the version each live learner reports in its lease."""
    newest = _newest_records()
    seen: set[tuple[str, str]] = set()
    for runtime in _leaders():
        run = _run_id(runtime)
        for learner, lease in dict(runtime.live).items():
            if (run, learner) in seen:
                continue
            seen.add((run, learner))
            reported = _reported_versions(lease.info.get("versions"))
            for fragment, version in enumerate(reported):
                if (run, fragment) in newest:
                    yield (
                        max(0, newest[(run, fragment)].version - version),
                        {**_fragment(run, fragment), "learner": learner},
                    )


def _reported_versions(text: object) -> list[int]:
    """A lease's ``versions`` info ("3,4"); empty when missing or not understood."""
    if not isinstance(text, str) or not text:
        return []
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        return []
