"""Every metric GradientMail exports, in one place: name, type, unit, labels and help text.

The instruments are created from these specs (``instruments.py``), the docs list them
(``docs/observability.md``) and the tests compare them with what a real Prometheus scraped,
so a name lives here and nowhere else. Names follow OpenTelemetry (dotted, UCUM units);
:attr:`MetricSpec.prometheus_name` is what the Prometheus endpoint exposes (dots become
underscores, the unit becomes a suffix, counters end in ``_total``).

Labels are bounded: the run id (every series carries ``run``, so runs sharing a Prometheus are
told apart), fragments, learner and node ids (tens per run), fixed reason, phase and kind
vocabularies. Never a key or a version.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from gradientmail.records import Rejection

Kind = Literal["counter", "gauge", "histogram"]

PHASES = ("collect", "quorum_wait", "grace", "merge", "outer_step", "commit")
"""The phases of a round, in order (``phase`` label and child span names)."""
REJECTION_REASONS: tuple[str, ...] = typing.get_args(Rejection.model_fields["reason"].annotation)
"""Every value of the ``reason`` label: the protocol's rejection reasons."""
LEASE_KINDS = ("learner", "syncer")
RUN_LABEL = "run"
"""The label every series carries: the run id from the run's manifest."""

SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Histogram bounds for round and phase durations: milliseconds (merges) to minutes (collect)."""

_UNIT_SUFFIX = {"s": "seconds", "By": "bytes", "1": ""}


@dataclass(frozen=True)
class MetricSpec:
    name: str
    """OpenTelemetry instrument name (dotted)."""
    kind: Kind
    """Prometheus type as exposed."""
    unit: str
    """UCUM unit; ``{thing}`` annotations carry no suffix."""
    labels: tuple[str, ...]
    """Every label of the series, ``run`` first."""
    help: str

    @property
    def prometheus_name(self) -> str:
        """The metric family name on the Prometheus endpoint (histograms add ``_bucket`` …)."""
        base = self.name.replace(".", "_")
        suffix = "" if self.unit.startswith("{") else _UNIT_SUFFIX[self.unit]
        if suffix and not base.endswith("_" + suffix):
            base += "_" + suffix
        return base + "_total" if self.kind == "counter" else base


def _spec(name: str, kind: Kind, unit: str, labels: tuple[str, ...], help: str) -> MetricSpec:
    return MetricSpec(name, kind, unit, (RUN_LABEL, *labels), help)


F, L, N = ("fragment",), ("learner",), ("node",)

# -- the syncer: rounds ------------------------------------------------------------------
ROUNDS_COMMITTED = _spec(
    "gradientmail.rounds.committed",
    "counter",
    "{round}",
    F,
    "Rounds this node committed, per fragment (one per new fragment version).",
)
ROUND_DURATION = _spec(
    "gradientmail.round.duration", "histogram", "s", F, "Seconds from a round opening (previous commit seen) to its commit."
)
ROUND_PHASE_DURATION = _spec(
    "gradientmail.round.phase.duration",
    "histogram",
    "s",
    (*F, "phase"),
    "Seconds a committed round spent in each phase: collect, quorum_wait, grace, merge, outer_step, commit.",
)
GRACE_WINDOW = _spec(
    "gradientmail.round.grace.window",
    "histogram",
    "s",
    F,
    "Grace window the syncer chose after quorum (0 when every live learner had reported).",
)
GRACE_CONTRIBUTIONS = _spec(
    "gradientmail.round.grace.contributions",
    "counter",
    "{contribution}",
    F,
    "Contributions accepted during grace windows, after quorum was reached.",
)
ROUND_PARTICIPANTS = _spec(
    "gradientmail.round.participants", "gauge", "{learner}", F, "Learners merged into the newest round the syncer committed."
)
CONTRIBUTIONS_ACCEPTED = _spec(
    "gradientmail.contributions.accepted",
    "counter",
    "{contribution}",
    F + L,
    "Contributions merged into committed rounds, per fragment and learner.",
)
CONTRIBUTIONS_REJECTED = _spec(
    "gradientmail.contributions.rejected",
    "counter",
    "{contribution}",
    (*F, "reason"),
    "Contributions rejected in committed rounds, per fragment and protocol reason.",
)
CONTRIBUTION_WEIGHT = _spec(
    "gradientmail.contribution.weight",
    "gauge",
    "1",
    F + L,
    "Weight samples^2/steps of each learner's contribution in the newest committed round.",
)
CONTRIBUTION_WEIGHT_RATIO = _spec(
    "gradientmail.contribution.weight.ratio",
    "gauge",
    "1",
    F + L,
    "Share of the merge weight each learner had in the newest committed round (sums to 1).",
)
SYNCER_FETCHED = _spec(
    "gradientmail.syncer.fetched", "counter", "By", F, "Payload bytes of contributions merged into committed rounds."
)
SYNCER_PUBLISHED = _spec(
    "gradientmail.syncer.published", "counter", "By", F, "Bytes of parameters and outer state the syncer committed."
)
FRAGMENT_VERSION = _spec(
    "gradientmail.fragment.version",
    "gauge",
    "{version}",
    F,
    "Newest committed version of each fragment, as the elected syncer knows it.",
)
LEARNER_VERSION_LAG = _spec(
    "gradientmail.learner.version.lag",
    "gauge",
    "{version}",
    L + F,
    "Versions a live learner is behind the newest commit, from its lease as the syncer reads it.",
)
LEARNERS_LIVE = _spec(
    "gradientmail.learners.live", "gauge", "{learner}", (), "Learners whose lease is live in the elected syncer's judgement."
)
# -- the syncer: leases and election ----------------------------------------------------------
LEASE_EXPIRATIONS = _spec(
    "gradientmail.lease.expirations",
    "counter",
    "{lease}",
    ("kind", *N),
    "Leases this node saw expire unreleased (a learner or the syncer died or lost the mailbox); "
    "every node watches every lease, so aggregate with max, not sum.",
)
LEASE_AGE = _spec(
    "gradientmail.lease.age",
    "gauge",
    "s",
    ("kind", "holder", *N),
    "Seconds since each live lease (the syncer's, each learner's) last changed, as this node judges it; "
    "the lease expires when this reaches the run's TTL.",
)
LEASE_TTL = _spec("gradientmail.lease.ttl", "gauge", "s", N, "The run's lease TTL in seconds, as this node applies it.")
SYNCER_LEADER = _spec("gradientmail.syncer.leader", "gauge", "1", N, "1 while this node holds the syncer lease, else 0.")
SYNCER_TERM = _spec(
    "gradientmail.syncer.term", "gauge", "{term}", N, "Election term of the syncer lease as this node last saw it."
)
SYNCER_ELECTIONS = _spec(
    "gradientmail.syncer.elections",
    "counter",
    "{election}",
    N,
    "Times this node won the syncer lease (first election, takeover or re-taking its own).",
)
SYNCER_TAKEOVERS = _spec(
    "gradientmail.syncer.takeovers",
    "counter",
    "{election}",
    N,
    "Times this node took the syncer lease over from another holder (expired or released).",
)
SYNCER_LOST_RACES = _spec(
    "gradientmail.syncer.lost_races",
    "counter",
    "{round}",
    N,
    "Rounds this node merged but another syncer committed first (create-once refused).",
)
SYNCER_REMOVED_ROUNDS = _spec(
    "gradientmail.syncer.removed_rounds",
    "counter",
    "{record}",
    N,
    "Round records at a fragment's newest version that no node wrote, deleted by this node as syncer (INV-20).",
)
SYNCER_RESTORED_BLOBS = _spec(
    "gradientmail.syncer.restored_blobs",
    "counter",
    "{blob}",
    N,
    "Deleted or damaged blobs of a loaded version this node rewrote by replaying its round (INV-21).",
)
STORE_UNPARSABLE_KEYS = _spec(
    "gradientmail.store.unparsable_keys",
    "counter",
    "{key}",
    N,
    "Distinct names in the mailbox this node's listings skipped as no key of the run's layout.",
)
# -- learners ---------------------------------------------------------------------------------
LEARNER_STEPS = _spec("gradientmail.learner.steps", "counter", "{step}", L, "Local training steps counted by session.step().")
LEARNER_SAMPLES = _spec(
    "gradientmail.learner.samples", "counter", "{sample}", L, "Samples (or tokens) reported to session.step()."
)
LEARNER_BLOCKED = _spec(
    "gradientmail.learner.blocked",
    "counter",
    "s",
    L,
    "Seconds session.step() spent blocked waiting for a commit (overlap_steps).",
)
LEARNER_CONTRIBUTIONS = _spec(
    "gradientmail.learner.contributions",
    "counter",
    "{contribution}",
    L,
    "Contributions (fragment deltas) this learner handed to its exchange for publishing.",
)
LEARNER_ALIGNMENTS = _spec(
    "gradientmail.learner.alignments", "counter", "{alignment}", L, "Committed versions this learner aligned its model with."
)
LEARNER_FRAGMENT_VERSION = _spec(
    "gradientmail.learner.fragment.version",
    "gauge",
    "{version}",
    L + F,
    "Committed version each fragment of this learner's model is aligned with.",
)
LEARNER_PUBLISHED = _spec(
    "gradientmail.learner.published", "counter", "By", L, "Contribution payload bytes this learner published."
)
LEARNER_FETCHED = _spec("gradientmail.learner.fetched", "counter", "By", L, "Committed parameter bytes this learner fetched.")
LEARNER_REBUILT = _spec(
    "gradientmail.learner.rebuilt_commits", "counter", "1", L, "Commits this learner rebuilt from their compact update."
)
LEARNER_REBUILD_FALLBACKS = _spec(
    "gradientmail.learner.rebuild_fallbacks",
    "counter",
    "1",
    L,
    "Compact updates that did not rebuild the committed bytes; the full parameters were read instead.",
)

LEARNER_REPORTED = _spec(
    "gradientmail.learner.reported",
    "gauge",
    "1",
    (*L, "name"),
    "The newest value of each scalar the training loop reported with session.report(name=value) (loss, lr, ...).",
)

# -- every node: its mailbox requests (mailbox/metered.py) --------------------------------------
MAILBOX_REQUESTS = _spec(
    "gradientmail.mailbox.requests",
    "counter",
    "{request}",
    (*N, "operation", "outcome"),
    "Requests this node made to the mailbox, by operation (get, put, create, swap, list, ...) and outcome "
    "(ok, not_found, exists, conflict, too_large, error).",
)
MAILBOX_REQUEST_SECONDS = _spec(
    "gradientmail.mailbox.request.time",
    "counter",
    "s",
    (*N, "operation", "outcome"),
    "Seconds those requests took, in all: divided by the requests, their mean latency.",
)

METRICS: tuple[MetricSpec, ...] = tuple(v for v in list(globals().values()) if isinstance(v, MetricSpec))
"""Every metric, in the order above."""
