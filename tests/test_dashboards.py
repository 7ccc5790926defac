"""Grafana dashboards and provisioning are well formed; the Prometheus rules pass promtool's
checks and its unit tests (alerts fire on synthetic series of a stalled run and a dead syncer)."""

from __future__ import annotations

import subprocess

import yaml

from tests.telemetry_tools import GRAFANA, PROVISIONING, RULE_TESTS, RULES, all_panels, dashboards, metric_names, require_tool


def provisioned_datasource_uids() -> set[str]:
    uids = set()
    for path in (PROVISIONING / "datasources").glob("*.yaml"):
        for source in yaml.safe_load(path.read_text())["datasources"]:
            uids.add(source["uid"])
    return uids


def datasource_refs(node: object) -> list[object]:
    """Every ``datasource`` value anywhere in a dashboard."""
    found: list[object] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                found.append(value)
            found += datasource_refs(value)
    elif isinstance(node, list):
        for item in node:
            found += datasource_refs(item)
    return found


def test_there_is_a_round_dashboard_and_a_learner_dashboard():
    boards = dashboards()
    assert set(boards) == {"gradientmail-rounds.json", "gradientmail-learner.json"}
    uids = [board["uid"] for board in boards.values()]
    assert len(set(uids)) == len(uids) and all(uids)
    titles = [board["title"] for board in boards.values()]
    assert len(set(titles)) == len(titles)


def test_panel_ids_are_unique_and_panels_are_laid_out():
    for name, board in dashboards().items():
        panels = list(all_panels(board["panels"]))
        ids = [panel["id"] for panel in panels]
        assert len(set(ids)) == len(ids), f"{name}: duplicate panel ids"
        for panel in panels:
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, f"{name}: {panel['title']}"
            if panel["type"] != "row":
                assert panel["targets"] and panel.get("description"), f"{name}: {panel['title']}"
                assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_every_datasource_reference_is_the_provisioned_prometheus():
    uids = provisioned_datasource_uids()
    assert uids == {"gradientmail-prometheus"}
    for name, board in dashboards().items():
        refs = datasource_refs(board)
        assert refs, name
        for ref in refs:
            assert isinstance(ref, dict) and ref == {"type": "prometheus", "uid": "gradientmail-prometheus"}, f"{name}: {ref}"


def test_the_dashboard_provider_points_at_one_folder():
    providers = []
    for path in (PROVISIONING / "dashboards").glob("*.yaml"):
        providers += yaml.safe_load(path.read_text())["providers"]
    assert [p["type"] for p in providers] == ["file"]
    assert providers[0]["options"]["path"].startswith("/")
    assert GRAFANA.is_dir()


def test_promtool_checks_the_rules_and_their_unit_tests_pass():
    promtool = require_tool("promtool")
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    names = {test["name"] for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]}
    assert {"a stalled run", "a dead syncer that nobody replaces"} <= names


def test_the_query_checker_finds_metric_names_but_not_label_values():
    expr = 'sum by (reason) (rate(gradientmail_x_total{reason="gradientmail_fake"}[5m])) / on () gradientmail:y:rate5m'
    assert metric_names(expr) == {"gradientmail_x_total", "gradientmail:y:rate5m"}
