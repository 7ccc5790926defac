"""A real Prometheus scrapes a real multi-learner run (three processes, one killed with -9):
promtool accepts every metric exposed, every dashboard and rule query parses and names only
metrics the run exports, and the round-monitoring queries return data."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gradientmail.mailbox import FileMailbox
from gradientmail.telemetry import METRICS
from tests.run_procs import Learner, start_learner, syncer_lease, wait_until
from tests.telemetry_tools import (
    RULES,
    Prometheus,
    check_promql,
    dashboard_queries,
    dashboards,
    fill,
    free_port,
    http_get,
    metric_names,
    recorded_names,
    require_tool,
    rule_expressions,
    variable_queries,
)

ROUNDS_DASHBOARD = "gradientmail-rounds.json"


@dataclass
class ScrapedRun:
    prometheus: Prometheus
    learners: dict[str, Learner]
    ports: dict[str, int]
    killed: str
    scraped: set[str]
    """Metric names Prometheus holds for the run (``__name__`` values)."""
    expositions: dict[str, str]
    """Each node's ``/metrics`` text, taken before the kill (the holder's includes the elected-only gauges)."""

    def survivors(self) -> list[str]:
        return [name for name in self.learners if name != self.killed]


@pytest.fixture(scope="module")
def scraped_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScrapedRun]:
    require_tool("promtool")
    require_tool("prometheus")
    workdir = tmp_path_factory.mktemp("scraped-run")
    url, box = f"file://{workdir / 'box'}", FileMailbox(workdir / "box")
    ports = {f"n{i}": free_port() for i in range(3)}
    args = [
        "--steps",
        "100000",
        "--step-sleep",
        "0.02",
        "--sync-every",
        "10",
        "--quorum",
        "2",
        "--wait-for",
        "3",
        "--ttl",
        "1.0",
        "--poll",
        "0.05",
    ]
    learners = {
        name: start_learner(url, name, workdir, "--seed", str(i), "--metrics-port", str(port), *args)
        for i, (name, port) in enumerate(ports.items())
    }
    prometheus = Prometheus.start(workdir, [f"127.0.0.1:{port}" for port in ports.values()], [RULES])
    try:
        wait_until(
            lambda: (
                (prometheus.value("sum(gradientmail_rounds_committed_total)") or 0) >= 6
                and prometheus.value('count(up{job="gradientmail"} == 1)') == 3
            ),
            45,
            "rounds in Prometheus",
        )
        holder = syncer_lease(box)
        assert holder is not None
        expositions = {f"{name} before the kill": http_get(f"http://127.0.0.1:{port}/metrics") for name, port in ports.items()}
        learners[holder.holder].kill()  # kill -9 the syncer: a takeover and two expired leases follow
        takeover = {
            "takeovers": "sum(gradientmail_syncer_takeovers_total)",
            "syncer leases expired": 'max(gradientmail_lease_expirations_total{kind="syncer"})',
            "learner leases expired": 'max(gradientmail_lease_expirations_total{kind="learner"})',
        }
        try:
            wait_until(
                lambda: (
                    all((prometheus.value(q) or 0) >= 1 for q in takeover.values())
                    and prometheus.value("sum(gradientmail_syncer_leader)") == 1
                ),
                30,
                "a takeover seen by Prometheus",
            )
        except AssertionError as exc:
            seen = {name: prometheus.value(q) for name, q in {**takeover, "holders": "sum(gradientmail_syncer_leader)"}.items()}
            raise AssertionError(f"{exc}: {seen}") from None
        # a few more scrapes of the new holder, so rates over 20 s windows have points
        wait_until(
            lambda: (
                (prometheus.value("sum(increase(gradientmail_syncer_takeovers_total[20s]))") or 0) > 0
                and (prometheus.value("sum(rate(gradientmail_round_duration_seconds_count[20s]))") or 0) > 0
                and (prometheus.value("sum(rate(gradientmail_contributions_accepted_total[20s]))") or 0) > 0
            ),
            20,
            "the new holder's rounds in rates",
        )
        for name in ports:
            if name != holder.holder:
                expositions[f"{name} after the takeover"] = http_get(f"http://127.0.0.1:{ports[name]}/metrics")
        yield ScrapedRun(prometheus, learners, ports, holder.holder, prometheus.names(), expositions)
    finally:
        for learner in learners.values():
            if learner.process.poll() is None:
                learner.kill()
        prometheus.stop()


@pytest.mark.slow
def test_every_metric_the_run_exposes_passes_promtool_check_metrics(scraped_run: ScrapedRun) -> None:
    promtool = require_tool("promtool")
    assert len(scraped_run.expositions) == 5
    for where, exposition in scraped_run.expositions.items():
        assert "gradientmail_learner_steps_total" in exposition, where
        result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), f"{where}: {result.stdout}{result.stderr}"
    expected = {
        series
        for spec in METRICS
        for series in (
            [spec.prometheus_name + suffix for suffix in ("_bucket", "_sum", "_count")]
            if spec.kind == "histogram"
            else [spec.prometheus_name]
        )
    }
    ours = {name for name in scraped_run.scraped if name.startswith("gradientmail_")}
    assert ours == expected, f"missing from the run: {sorted(expected - ours)}; not in the catalogue: {sorted(ours - expected)}"


def _run_values(scraped_run: ScrapedRun) -> dict[str, str]:
    """The dashboards' run variables as Grafana would fill them for the run (All is ``.*``)."""
    (run,) = scraped_run.prometheus.api("label/run/values", **{"match[]": "gradientmail_learner_steps_total"})
    return {"namespace": ".*", "job": ".*", "run": str(run)}


def test_every_dashboard_and_rule_query_parses_and_names_exported_metrics(scraped_run: ScrapedRun, tmp_path: Path) -> None:
    learner = scraped_run.survivors()[0]
    run = _run_values(scraped_run)
    expressions: list[tuple[str, str]] = [(f"rule {name}", expr) for name, expr in rule_expressions()]
    for file, board in dashboards().items():
        expressions += [
            (f"{file}: {title}", expr) for title, expr in dashboard_queries(board, {**run, "fragment": ".*", "learner": learner})
        ]
        for variable, metric, selector, label in variable_queries(board):
            assert metric in scraped_run.scraped, f"{file}: variable {variable} reads {metric}, which the run does not export"
            values = scraped_run.prometheus.api(f"label/{label}/values", **{"match[]": fill(selector, run)})
            if label != "namespace":  # a scrape outside Kubernetes sets no namespace: the variable offers All
                assert values, f"{file}: variable {variable} has no values"
    check_promql([expr for _, expr in expressions], tmp_path)
    known = scraped_run.scraped | recorded_names()
    for where, expr in expressions:
        names = metric_names(expr)
        assert names, f"{where}: names no GradientMail metric: {expr}"
        assert names <= known, f"{where}: {sorted(names - known)} not exported by the run"


def test_the_round_dashboard_queries_return_data_for_the_run(scraped_run: ScrapedRun) -> None:
    board = dashboards()[ROUNDS_DASHBOARD]
    queries = dashboard_queries(board, {**_run_values(scraped_run), "fragment": ".*"})

    def empty() -> list[tuple[str, str]]:
        return [(title, expr) for title, expr in queries if not scraped_run.prometheus.query(expr)]

    # the elected-only gauges come from whoever holds the election; on a loaded machine a 1 s
    # lease can change hands again, and a new holder's gauges start at its next scrape
    try:
        wait_until(lambda: not empty(), 20, "data for every round dashboard query")
    except AssertionError:
        raise AssertionError("queries without data:\n" + "\n".join(f"{t}: {e}" for t, e in empty())) from None


def test_the_run_recorded_its_takeover_and_the_recording_rules_evaluate(scraped_run: ScrapedRun) -> None:
    prometheus = scraped_run.prometheus
    # under load two nodes may both report the lease for a moment (a holder deposed by a takeover
    # learns so at its next renewal, a third of the TTL on): wait for one, then check who it is
    wait_until(lambda: len(prometheus.query("gradientmail_syncer_leader == 1")) == 1, 15, "one syncer holder")
    holder = prometheus.query("gradientmail_syncer_leader == 1")
    assert len(holder) == 1 and holder[0]["metric"]["node"] != scraped_run.killed
    assert prometheus.value("max(gradientmail_syncer_term)") >= 2
    # a holder that took over judges a dead learner's lease expired one TTL after it first read it
    wait_until(lambda: prometheus.value("max(gradientmail_learners_live)") == 2, 15, "the two survivors live")
    # every series names its run, and the survivors judge each live lease younger than the TTL
    assert not prometheus.query('{__name__=~"gradientmail_.+", run=""}')
    ages = prometheus.query("gradientmail_lease_age_seconds")
    assert {a["metric"]["kind"] for a in ages} == {"learner", "syncer"}
    assert {a["metric"]["holder"] for a in ages if a["metric"]["kind"] == "learner"} <= set(scraped_run.learners)
    assert prometheus.value("max(gradientmail_lease_ttl_seconds)") == 1.0
    for recorded in recorded_names():
        wait_until(lambda: prometheus.query(recorded), 10, f"recording rule {recorded}")
    # the rule may first have evaluated during the takeover (no holder): wait for a fresh evaluation
    wait_until(lambda: prometheus.value("gradientmail:syncer_holders:sum") == 1, 15, "one syncer holder recorded")
    alerts = prometheus.api("alerts")["alerts"]  # type: ignore[index]
    firing = {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}
    assert firing == {"GradientMailLeaseExpired"}, alerts  # the kill -9, and nothing else
