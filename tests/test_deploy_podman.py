"""The CPU image built by podman from a debootstrap base, and a short compose-driven run with it.

scripts/podman-compose-check does the work (and says what it checks); SeaweedFS stands in for
MinIO, whose image cannot be pulled here. Several minutes the first time on a machine (the
base and the images are cached by podman after that), hence slow.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.deploy_tools import ROOT
from tests.system_tools import tool_missing

pytestmark = pytest.mark.slow


def _can_run() -> bool:
    if all(shutil.which(tool) for tool in ("podman", "runc", "iptables", "debootstrap", "docker-compose")):
        return True
    return os.geteuid() == 0 and shutil.which("apt-get") is not None  # the script installs them


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
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "participants: learner-1 learner-2 learner-3" in result.stdout + result.stderr
    assert "podman-compose-check: passed" in result.stderr
