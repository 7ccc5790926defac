"""scripts/podman-compose-check's Prometheus check, run with the learner image's Python inside
the compose network while the learners train. It asks compose's prometheus service through its
HTTP API (http://prometheus:9090, the address Grafana's datasource uses) until every learner
named in CHECK_LEARNERS is an active target that is up and has gradientmail series, and the
rule groups named in CHECK_RULE_GROUPS (CHECK_RULE_COUNT rules in all) are loaded, evaluated,
and none failed; then prints the figures. Exits non-zero with what it last saw otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.parse
import urllib.request
from typing import Any

PROMETHEUS = os.environ.get("CHECK_PROMETHEUS", "http://prometheus:9090")
TIMEOUT_S = float(os.environ.get("CHECK_TIMEOUT_S", "150"))
SERIES = 'count by (service) ({job="gradientmail", __name__=~"gradientmail_.+"})'


def get(path: str, **query: str) -> Any:
    url = f"{PROMETHEUS}/api/v1/{path}" + ("?" + urllib.parse.urlencode(query) if query else "")
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    if body.get("status") != "success":
        sys.exit(f"prometheus check: {path} answered {body}")
    return body["data"]


def targets_figures(learners: set[str], started: float) -> tuple[list[str] | None, str]:
    """The figures once every learner is up with gradientmail series (and no other gradientmail
    target is down), else None."""
    targets = [t for t in get("targets", state="active")["activeTargets"] if t["labels"].get("job") == "gradientmail"]
    up = sorted(t["labels"].get("service", "?") for t in targets if t["health"] == "up")
    state = f"targets up: {up} of {len(targets)} active"
    if not (learners <= set(up) and len(up) == len(targets)):
        return None, state
    series = {s["metric"].get("service"): int(s["value"][1]) for s in get("query", query=SERIES)["result"]}
    if not all(series.get(name) for name in learners):  # up, but the scrape's samples not queryable yet
        return None, f"{state}; gradientmail series per learner: {series}"
    return [
        f"prometheus targets: {len(up)} of {len(targets)} up ({' '.join(up)}) after {time.monotonic() - started:.1f} s",
        "prometheus gradientmail series per learner: " + " ".join(f"{name}={series[name]}" for name in sorted(learners)),
    ], state


def rules_figures(groups_wanted: list[str], rules_wanted: int) -> tuple[list[str] | None, str]:
    """The figures once the rule file's groups are loaded and every rule evaluated, else None."""
    groups = get("rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    failing = [f"{rule['name']}: {rule.get('lastError')}" for rule in rules if rule["health"] == "err"]
    if failing:
        sys.exit("prometheus check: rules that fail: " + "; ".join(failing))
    evaluated = sum(rule["health"] == "ok" for rule in rules)
    names = sorted(group["name"] for group in groups)
    state = f"rule groups {names}, {evaluated} of {len(rules)} rules evaluated"
    if names != groups_wanted or len(rules) != rules_wanted or evaluated != len(rules):
        return None, state
    runtime, build = get("status/runtimeinfo"), get("status/buildinfo")
    if not runtime.get("reloadConfigSuccess"):
        sys.exit(f"prometheus check: the configuration did not load: {runtime}")
    files = " ".join(sorted({group["file"] for group in groups}))
    return [
        f"prometheus {build['version']}: configuration loaded, rule file {files}",
        f"prometheus rules: {len(groups)} groups ({' '.join(names)}), {len(rules)} rules, {evaluated} evaluated ok, 0 failing",
    ], state


def main() -> None:
    learners = set(os.environ["CHECK_LEARNERS"].split())
    groups_wanted = sorted(os.environ["CHECK_RULE_GROUPS"].split())
    rules_wanted = int(os.environ["CHECK_RULE_COUNT"])
    started = time.monotonic()
    targets: list[str] | None = None
    rules: list[str] | None = None
    states = {"prometheus": "no answer yet"}
    while targets is None or rules is None:
        if time.monotonic() - started > TIMEOUT_S:
            sys.exit(f"prometheus check: gave up after {TIMEOUT_S:.0f} s; last seen: {'; '.join(states.values())}")
        try:
            if rules is None:
                rules, states["rules"] = rules_figures(groups_wanted, rules_wanted)
            if targets is None:
                targets, states["targets"] = targets_figures(learners, started)
        except OSError as error:  # not answering yet
            states["prometheus"] = f"{error}"
        time.sleep(1)
    print("\n".join(rules + targets), flush=True)


if __name__ == "__main__":
    main()
