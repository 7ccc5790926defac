"""Generate the Grafana dashboards in dashboards/grafana/ with Grafana's foundation SDK.

    python dashboards/generate.py          # rewrite dashboards/grafana/*.json
    python dashboards/generate.py --check  # exit 1 if a committed file differs from the code

The JSON files are committed (compose, the Helm chart and Grafana's file provider read them);
this script is their source, and tests/test_dashboards.py checks they are what it generates.
Needs ``grafana-foundation-sdk`` (the ``dev`` extra).

Every panel and variable reads the ``${datasource}`` variable (any Prometheus data source: the
provisioned one, kube-prometheus-stack's), and every query selects one run through the
``namespace``, ``job`` and ``run`` variables, so several runs can share one Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.builders import stat, statetimeline, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

OUT = Path(__file__).resolve().parent / "grafana"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RUN = 'namespace=~"$namespace",job=~"$job",run="$run"'
"""The selector every query carries: one run of one job in one namespace."""
PRESENT = "gradientmail_learner_steps_total"
"""Every node of a run exports it: the variables read their values from it."""
TAGS = ["gradientmail"]


def m(name: str, extra: str = "") -> str:
    """``name{<the run's selector>[,extra]}``."""
    return f"{name}{{{RUN}{',' + extra if extra else ''}}}"


F = 'fragment=~"$fragment"'
PUT_CLASS = 'operation=~"put|create|swap|list"'
GET_CLASS = 'operation=~"get|get_versioned|head|exists"'
NOT_OK = 'outcome!="ok"'
L = 'learner="$learner"'
RATE = "[$__rate_interval]"


@dataclass(frozen=True)
class Panel:
    kind: str
    """stat, timeseries or state-timeline."""
    title: str
    description: str
    targets: tuple[tuple[str, str], ...]
    """(PromQL, legend)."""
    width: int
    height: int = 8
    unit: str = "short"
    stacked: bool = False
    decimals: float | None = None
    text_mode: cm.BigValueTextMode = cm.BigValueTextMode.AUTO


@dataclass(frozen=True)
class Row:
    title: str


def row_panels(title: str, *panels: Panel) -> list[Row | Panel]:
    return [Row(title), *panels]


def _variable(name: str, label: str, query: str, *, multi: bool = False, include_all: bool = False) -> db.QueryVariable:
    variable = (
        db.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"qryType": 1, "query": query, "refId": f"{name}-values"})
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
        .multi(multi)
        .include_all(include_all)
    )
    return variable.all_value(".*") if include_all else variable


def run_variables() -> list[db.DatasourceVariable | db.QueryVariable]:
    """``datasource``, then ``namespace`` and ``job`` (All matches a scrape without the label), then ``run``."""
    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        _variable("namespace", "Namespace", f"label_values({PRESENT}, namespace)", include_all=True),
        _variable("job", "Job", f'label_values({PRESENT}{{namespace=~"$namespace"}}, job)', include_all=True),
        _variable("run", "Run", f'label_values({PRESENT}{{namespace=~"$namespace",job=~"$job"}}, run)'),
    ]


def _build_panel(panel: Panel, panel_id: int) -> stat.Panel | timeseries.Panel | statetimeline.Panel:
    targets = []
    for ref, (expr, legend) in zip("ABCDEFGH"[: len(panel.targets)], panel.targets, strict=True):
        query = prom.Dataquery().ref_id(ref).expr(expr).legend_format(legend)
        targets.append(query.instant() if panel.kind == "stat" else query.range())
    legend = cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST).placement(cm.LegendPlacement.BOTTOM)
    built: stat.Panel | timeseries.Panel | statetimeline.Panel
    if panel.kind == "stat":
        built = (
            stat.Panel()
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .color_mode(cm.BigValueColorMode.VALUE)
            .graph_mode(cm.BigValueGraphMode.NONE)
            .text_mode(panel.text_mode)
        )
    elif panel.kind == "timeseries":
        built = (
            timeseries.Panel()
            .line_width(1)
            .fill_opacity(10)
            .show_points(cm.VisibilityMode.NEVER)
            .stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL if panel.stacked else cm.StackingMode.NONE))
            .legend(legend.show_legend(True))
            .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
        )
    else:
        built = (
            statetimeline.Panel()
            .show_value(cm.VisibilityMode.NEVER)
            .merge_values(True)
            .row_height(0.8)
            .legend(legend.show_legend(False))
        )
    built = (
        built.id(panel_id)
        .title(panel.title)
        .description(panel.description)
        .datasource(DATASOURCE)
        .height(panel.height)
        .span(panel.width)
        .unit(panel.unit)
        .targets(targets)
    )
    return built.decimals(panel.decimals) if panel.decimals is not None else built


def dashboard(uid: str, title: str, description: str, variables: list, layout: list[Row | Panel]) -> dict:
    board = (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("10s")
        .time("now-1h", "now")
        .timezone("browser")
        .link(
            db.DashboardLink("GradientMail").type(dm.DashboardLinkType.DASHBOARDS).tags(TAGS).keep_time(True).include_vars(True)
        )
        .variables(variables)
    )
    for panel_id, item in enumerate(layout, start=1):
        if isinstance(item, Row):
            board = board.with_row(db.Row(item.title).id(panel_id))
        else:
            board = board.with_panel(_build_panel(item, panel_id))
    encoded: dict = json.loads(JSONEncoder(sort_keys=True).encode(board.build()))
    return encoded


def _mean(metric: str, by: str, extra: str) -> str:
    selector = f"{F},{extra}" if extra else F
    total, count = m(metric + "_sum", selector), m(metric + "_count", selector)
    return f"sum by ({by}) (rate({total}{RATE})) / sum by ({by}) (rate({count}{RATE}))"


BUCKETS = m("gradientmail_round_duration_seconds_bucket", F)


def _rounds_layout() -> list[Row | Panel]:
    accepted = f"sum(rate({m('gradientmail_contributions_accepted_total', F)}{RATE}))"
    rejected = f"sum(rate({m('gradientmail_contributions_rejected_total', F)}{RATE}))"
    not_stale = m("gradientmail_contributions_rejected_total", F + ',reason!="stale"')
    return [
        *row_panels(
            "Syncer and run",
            Panel(
                "stat",
                "Syncer holder",
                "Node holding the syncer lease (gradientmail_syncer_leader == 1). Empty: no syncer; "
                "see the GradientMailNoSyncer alert.",
                ((f"max by (node) ({m('gradientmail_syncer_leader')}) == 1", "{{node}}"),),
                6,
                4,
                text_mode=cm.BigValueTextMode.NAME,
            ),
            Panel(
                "stat",
                "Live learners",
                "Learners whose lease is live, as the elected syncer judges it.",
                ((f"max({m('gradientmail_learners_live')})", "live"),),
                6,
                4,
            ),
            Panel(
                "stat",
                "Syncer term",
                "Election term of the syncer lease; it grows by one per takeover.",
                ((f"max({m('gradientmail_syncer_term')})", "term"),),
                6,
                4,
            ),
            Panel(
                "stat",
                "Fragment versions",
                "Newest committed version of each fragment.",
                ((f"max by (fragment) ({m('gradientmail_fragment_version', F)})", "fragment {{fragment}}"),),
                6,
                4,
            ),
        ),
        *row_panels(
            "Rounds",
            Panel(
                "timeseries",
                "Rounds committed per minute",
                "Commits per fragment, summed over the nodes that held the syncer.",
                (
                    (
                        f"sum by (fragment) (rate({m('gradientmail_rounds_committed_total', F)}{RATE})) * 60",
                        "fragment {{fragment}}",
                    ),
                ),
                8,
            ),
            Panel(
                "timeseries",
                "Round duration (p50, p90)",
                "Seconds from a round opening (previous commit) to its commit.",
                tuple(
                    (
                        f"histogram_quantile({q}, sum by (le) (rate({BUCKETS}{RATE})))",
                        f"p{int(q * 100)}",
                    )
                    for q in (0.5, 0.9)
                ),
                8,
                unit="s",
            ),
            Panel(
                "timeseries",
                "Mean phase durations (stacked)",
                "Where a round's time goes: collect, quorum_wait, grace, merge, outer_step, commit.",
                ((_mean("gradientmail_round_phase_duration_seconds", "phase", ""), "{{phase}}"),),
                8,
                unit="s",
                stacked=True,
            ),
            Panel(
                "timeseries",
                "Syncer work per round: merge, outer step, commit",
                "Mean seconds of the syncer's own phases; they bound how fast rounds can close.",
                ((_mean("gradientmail_round_phase_duration_seconds", "phase", 'phase=~"merge|outer_step|commit"'), "{{phase}}"),),
                8,
                unit="s",
            ),
            Panel(
                "timeseries",
                "Quorum wait and grace",
                "Mean quorum wait (first accepted contribution to quorum), grace window chosen, and grace actually spent.",
                (
                    (
                        _mean("gradientmail_round_phase_duration_seconds", "fragment", 'phase="quorum_wait"'),
                        "quorum wait, fragment {{fragment}}",
                    ),
                    (_mean("gradientmail_round_grace_window_seconds", "fragment", ""), "grace window, fragment {{fragment}}"),
                    (
                        _mean("gradientmail_round_phase_duration_seconds", "fragment", 'phase="grace"'),
                        "grace spent, fragment {{fragment}}",
                    ),
                ),
                8,
                unit="s",
            ),
            Panel(
                "timeseries",
                "Reports arriving in the grace window, per round",
                "Contributions accepted after quorum, per committed round: what the grace window bought.",
                (
                    (
                        f"sum by (fragment) (rate({m('gradientmail_round_grace_contributions_total', F)}{RATE})) "
                        f"/ sum by (fragment) (rate({m('gradientmail_rounds_committed_total', F)}{RATE}))",
                        "fragment {{fragment}}",
                    ),
                ),
                8,
                decimals=2,
            ),
        ),
        *row_panels(
            "Participants and weights",
            Panel(
                "timeseries",
                "Participants per round",
                "Learners merged into the newest committed round of each fragment.",
                ((f"max by (fragment) ({m('gradientmail_round_participants', F)})", "fragment {{fragment}}"),),
                8,
            ),
            Panel(
                "timeseries",
                "Weight share by learner",
                "Each learner's share of the merge weight (samples²/steps) in the newest round.",
                (
                    (
                        f"max by (fragment, learner) ({m('gradientmail_contribution_weight_ratio', F)})",
                        "{{learner}} / fragment {{fragment}}",
                    ),
                ),
                8,
                unit="percentunit",
            ),
            Panel(
                "timeseries",
                "Contributions accepted per minute by learner",
                "Contributions merged into committed rounds.",
                ((f"sum by (learner) (rate({m('gradientmail_contributions_accepted_total', F)}{RATE})) * 60", "{{learner}}"),),
                8,
            ),
            Panel(
                "timeseries",
                "Rejections per minute by reason",
                "Rejected contributions by protocol reason. stale is normal in moderation; any other reason points at a "
                "learner or the store (see docs/observability.md).",
                ((f"sum by (reason) (rate({m('gradientmail_contributions_rejected_total', F)}{RATE})) * 60", "{{reason}}"),),
                12,
            ),
            Panel(
                "timeseries",
                "Rejected share of contributions",
                "Rejected / (accepted + rejected), all reasons and without stale.",
                (
                    (f"{rejected} / ({accepted} + {rejected})", "all reasons"),
                    (
                        f"sum(rate({not_stale}{RATE})) / ({accepted} + {rejected})",
                        "without stale",
                    ),
                ),
                12,
                unit="percentunit",
            ),
        ),
        *row_panels(
            "Leases and elections",
            Panel(
                "timeseries",
                "Lease age / TTL",
                "Seconds since each lease last changed, as a share of the run's TTL (the freshest node's judgement). "
                "Renewals keep it near 1/3; at 1 the lease expires. See the GradientMailLeaseNearExpiry alert.",
                (
                    (
                        f"min by (kind, holder) ({m('gradientmail_lease_age_seconds')}) "
                        f"/ scalar(max({m('gradientmail_lease_ttl_seconds')}))",
                        "{{kind}} {{holder}}",
                    ),
                ),
                6,
                unit="percentunit",
            ),
            Panel(
                "timeseries",
                "Lease expirations (last 10 min)",
                "Leases that expired unreleased: a learner or the syncer died or lost the mailbox.",
                ((f"max by (kind) (increase({m('gradientmail_lease_expirations_total')}[10m]))", "{{kind}}"),),
                6,
            ),
            Panel(
                "timeseries",
                "Elections and takeovers (last 10 min)",
                "Syncer leases won, and how many of them were taken over from another holder.",
                (
                    (f"sum(increase({m('gradientmail_syncer_elections_total')}[10m]))", "elections"),
                    (f"sum(increase({m('gradientmail_syncer_takeovers_total')}[10m]))", "takeovers"),
                    (f"sum(increase({m('gradientmail_syncer_lost_races_total')}[10m]))", "lost commit races"),
                ),
                6,
            ),
            Panel(
                "state-timeline",
                "Syncer holder over time",
                "1 while a node holds the syncer lease.",
                ((f"max by (node) ({m('gradientmail_syncer_leader')})", "{{node}}"),),
                6,
            ),
        ),
        *row_panels(
            "Learners",
            Panel(
                "timeseries",
                "Version lag by learner",
                "Versions each live learner is behind the newest commit (max over fragments).",
                ((f"max by (learner) ({m('gradientmail_learner_version_lag')})", "{{learner}}"),),
                8,
            ),
            Panel(
                "timeseries",
                "Time step() spent blocked",
                "Share of wall time each learner's step() waited for a commit (overlap_steps).",
                ((f"sum by (learner) (rate({m('gradientmail_learner_blocked_seconds_total')}{RATE}))", "{{learner}}"),),
                8,
                unit="percentunit",
            ),
            Panel(
                "timeseries",
                "Steps per second by learner",
                "Local training steps counted by session.step().",
                ((f"sum by (learner) (rate({m('gradientmail_learner_steps_total')}{RATE}))", "{{learner}}"),),
                8,
            ),
            Panel(
                "timeseries",
                "Bytes moved through the mailbox",
                "Learners publish contributions and fetch commits; the syncer fetches contributions and publishes commits.",
                (
                    (f"sum(rate({m('gradientmail_learner_published_bytes_total')}{RATE}))", "learners published"),
                    (f"sum(rate({m('gradientmail_learner_fetched_bytes_total')}{RATE}))", "learners fetched"),
                    (f"sum(rate({m('gradientmail_syncer_fetched_bytes_total', F)}{RATE}))", "syncer fetched"),
                    (f"sum(rate({m('gradientmail_syncer_published_bytes_total', F)}{RATE}))", "syncer published"),
                ),
                24,
                unit="Bps",
            ),
        ),
        *row_panels(
            "Mailbox requests",
            Panel(
                "timeseries",
                "Requests per second by operation",
                "Every node's requests to the mailbox (gradientmail_mailbox_requests_total), all outcomes.",
                ((f"sum by (operation) (rate({m('gradientmail_mailbox_requests_total')}{RATE}))", "{{operation}}"),),
                8,
            ),
            Panel(
                "timeseries",
                "Requests per committed round",
                "Mailbox requests of every node divided by the rounds committed, over the same window.",
                (
                    (
                        f"sum(rate({m('gradientmail_mailbox_requests_total')}{RATE}))"
                        f" / sum(rate({m('gradientmail_rounds_committed_total')}{RATE}))",
                        "requests per round",
                    ),
                ),
                8,
            ),
            Panel(
                "timeseries",
                "Request cost per day at S3 list prices",
                "USD per day at AWS S3 Standard list prices (put, create, swap, list at $0.005 per 1,000; "
                "get, head at $0.0004; delete free). A lower bound: a large put is several S3 requests, "
                "a long list several pages.",
                (
                    (
                        f"86400 * (0.000005 * sum(rate({m('gradientmail_mailbox_requests_total', PUT_CLASS)}{RATE}))"
                        f" + 0.0000004 * sum(rate({m('gradientmail_mailbox_requests_total', GET_CLASS)}{RATE})))",
                        "USD/day",
                    ),
                ),
                8,
                unit="currencyUSD",
                decimals=2,
            ),
            Panel(
                "timeseries",
                "Requests not ok, by outcome",
                "Per second: not_found is mostly normal (polling for what is not there yet); exists and conflict "
                "are lost create-once and compare-and-swap races; error is the store failing.",
                ((f"sum by (outcome) (rate({m('gradientmail_mailbox_requests_total', NOT_OK)}{RATE}))", "{{outcome}}"),),
                12,
            ),
            Panel(
                "timeseries",
                "Mean request latency by operation",
                "Seconds per request: request time divided by requests, over the window.",
                (
                    (
                        f"sum by (operation) (rate({m('gradientmail_mailbox_request_time_seconds_total')}{RATE}))"
                        f" / sum by (operation) (rate({m('gradientmail_mailbox_requests_total')}{RATE}))",
                        "{{operation}}",
                    ),
                ),
                12,
                unit="s",
            ),
        ),
    ]


def _learner_layout() -> list[Row | Panel]:
    def rate(metric: str) -> str:
        return f"sum(rate({m(metric, L)}{RATE}))"

    return [
        *row_panels(
            "Throughput",
            Panel(
                "stat",
                "Steps per second",
                "Local steps of this learner.",
                ((rate("gradientmail_learner_steps_total"), "steps/s"),),
                6,
                4,
                decimals=2,
            ),
            Panel(
                "stat",
                "Samples per second",
                "Samples (or tokens) reported to step().",
                ((rate("gradientmail_learner_samples_total"), "samples/s"),),
                6,
                4,
                decimals=1,
            ),
            Panel(
                "stat",
                "Blocked share",
                "Share of wall time step() waited for a commit.",
                ((rate("gradientmail_learner_blocked_seconds_total"), "blocked"),),
                6,
                4,
                unit="percentunit",
            ),
            Panel(
                "stat",
                "Worst version lag",
                "Versions behind the newest commit, worst fragment.",
                ((f"max({m('gradientmail_learner_version_lag', L)})", "lag"),),
                6,
                4,
            ),
        ),
        *row_panels(
            "Training",
            Panel(
                "timeseries",
                "Reported scalars",
                "What the training loop reported with session.report(name=value): loss, learning rate, ...",
                ((f"max by (name) ({m('gradientmail_learner_reported', L)})", "{{name}}"),),
                12,
            ),
            Panel(
                "timeseries",
                "Samples (or tokens) per second",
                "The samples this learner passed to step(), per second.",
                ((rate("gradientmail_learner_samples_total"), "samples/s"),),
                12,
            ),
        ),
        *row_panels(
            "Versions",
            Panel(
                "timeseries",
                "Aligned version vs newest commit",
                "The version each fragment of this learner is aligned with, and the newest commit.",
                (
                    (f"max by (fragment) ({m('gradientmail_learner_fragment_version', L)})", "aligned, fragment {{fragment}}"),
                    (f"max by (fragment) ({m('gradientmail_fragment_version')})", "newest, fragment {{fragment}}"),
                ),
                12,
            ),
            Panel(
                "timeseries",
                "Version lag per fragment",
                "From the learner's lease, as the syncer reads it.",
                ((f"max by (fragment) ({m('gradientmail_learner_version_lag', L)})", "fragment {{fragment}}"),),
                12,
            ),
        ),
        *row_panels(
            "Contributions",
            Panel(
                "timeseries",
                "Contributions per minute",
                "Handed to the exchange by this learner vs merged into committed rounds.",
                (
                    (f"{rate('gradientmail_learner_contributions_total')} * 60", "published"),
                    (f"{rate('gradientmail_contributions_accepted_total')} * 60", "merged"),
                ),
                8,
            ),
            Panel(
                "timeseries",
                "Weight share per fragment",
                "This learner's share of the merge weight in the newest round.",
                ((f"max by (fragment) ({m('gradientmail_contribution_weight_ratio', L)})", "fragment {{fragment}}"),),
                8,
                unit="percentunit",
            ),
            Panel(
                "timeseries",
                "Alignments per minute",
                "Committed versions this learner aligned with.",
                ((f"{rate('gradientmail_learner_alignments_total')} * 60", "alignments"),),
                8,
            ),
        ),
        *row_panels(
            "Mailbox traffic and blocking",
            Panel(
                "timeseries",
                "Bytes per second",
                "Contribution bytes published, committed parameter bytes fetched.",
                (
                    (rate("gradientmail_learner_published_bytes_total"), "published"),
                    (rate("gradientmail_learner_fetched_bytes_total"), "fetched"),
                ),
                12,
                unit="Bps",
            ),
            Panel(
                "timeseries",
                "Blocked share of wall time",
                "step() waiting for a commit because overlap_steps ran out.",
                ((rate("gradientmail_learner_blocked_seconds_total"), "blocked"),),
                12,
                unit="percentunit",
            ),
        ),
    ]


def generate() -> dict[str, str]:
    """File name → the JSON text it must hold."""
    selector = "{" + RUN + "}"
    boards = {
        "gradientmail-rounds.json": dashboard(
            "gradientmail-rounds",
            "GradientMail · rounds",
            "Round monitoring for a GradientMail run: rounds and phases per fragment, participants and weights, "
            "rejections, grace, leases and elections, learner lag, blocked time and bytes.",
            [
                *run_variables(),
                _variable(
                    "fragment",
                    "Fragment",
                    f"label_values(gradientmail_rounds_committed_total{selector}, fragment)",
                    multi=True,
                    include_all=True,
                ),
            ],
            _rounds_layout(),
        ),
        "gradientmail-learner.json": dashboard(
            "gradientmail-learner",
            "GradientMail · learner",
            "One learner of a GradientMail run: throughput, blocked time, versions and lag, contributions, weight share "
            "and bytes.",
            [*run_variables(), _variable("learner", "Learner", f"label_values({PRESENT}{selector}, learner)")],
            _learner_layout(),
        ),
    }
    return {name: json.dumps(board, indent=2, ensure_ascii=False, sort_keys=True) + "\n" for name, board in boards.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if a committed file differs")
    args = parser.parse_args(argv)
    stale = []
    for name, text in generate().items():
        path = OUT / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"out of date (run python dashboards/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
