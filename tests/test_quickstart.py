"""docs/quickstart.md, as a reader pastes it: the page's own ``bash`` blocks, in order, with two
machines that share nothing but a network (two network namespaces, each with its own loopback
and address, a learner process in each) and a SeaweedFS server in a third for the bucket.

What stands in for what: the bucket is that server's (block 1's ``aws s3api`` is not run;
``AWS_ENDPOINT_URL`` points boto3 at the server, as docs/deploy.md says for any S3-compatible
store; each machine reaches it through its own link), its keys replace the page's example keys,
and the install block is not run (this environment is the installed project;
``tests/test_install_line.py`` runs the install line).
To keep the run short the learners train fewer steps than the page's 500, with a shorter sync
period (``GRADIENTMAIL_SYNC_EVERY``, a variable the page's ``--help`` pointer lists)."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.netns import Network, star_network
from tests.run_procs import ROOT
from tests.seaweedfs import S3Server, SeaweedFS

PAGE = ROOT / "docs" / "quickstart.md"
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


def blocks() -> list[str]:
    return BLOCK.findall(PAGE.read_text())


def test_the_page_has_the_blocks_the_test_runs():
    found = blocks()
    assert len(found) == 5, found
    bucket, install, keygen, learner, status = found
    assert bucket.startswith("aws s3api create-bucket")
    assert 'pip install ".[torch,s3]"' in install  # the README's GPU install line
    assert keygen.strip() == "gradientmail keygen --out run.key"
    assert "gradientmail node" in learner and "GRADIENTMAIL_LEARNER_ID=machine-a" in learner
    assert status.strip().endswith("gradientmail status s3://my-training/runs/first")


@pytest.mark.slow
@pytest.mark.s3
def test_two_learners_started_as_the_quickstart_says_make_a_healthy_run(tmp_path):
    _, _, keygen, learner, status = blocks()
    prefix = f"quickstart-{uuid.uuid4().hex[:8]}"
    machines = ["machine-a", "machine-b"]
    with star_network(machines) as network:
        server = SeaweedFS.start(tmp_path / "server", netns=network.server, host=network.host_route)
        try:
            _run_the_page(tmp_path, network, server.server, prefix, keygen, learner, status)
        finally:
            server.stop()


def _run_the_page(tmp_path: Path, network: Network, s3_server: S3Server, prefix: str, *blocks_: str) -> None:
    keygen, learner, status = blocks_
    port = s3_server.port

    def as_here(block: str) -> str:
        """The page's block with the test server's bucket, keys and a short run."""
        block = block.replace("s3://my-training/runs/first", f"s3://{s3_server.bucket}/{prefix}")
        block = block.replace("AKIAEXAMPLEEXAMPLE", s3_server.access_key).replace("your-secret-key", s3_server.secret_key)
        block = block.replace("AWS_REGION=us-east-1", f"AWS_REGION={s3_server.region}")
        return block.replace("GRADIENTMAIL_STEPS=500", "GRADIENTMAIL_STEPS=60")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADIENTMAIL_", "AWS_"))}
    env |= {"AWS_EC2_METADATA_DISABLED": "true", "GRADIENTMAIL_SYNC_EVERY": "20"}
    env |= {"GRADIENTMAIL_FRAGMENTS": "2", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

    def bash(script: str, machine: str | None = None, **kwargs: object) -> subprocess.Popen[str]:
        """``script`` on ``machine`` (its namespace, the server through its link), or here."""
        # the checkout is where the page's commands run (section 2: `cd gradientmail`); run.key lives in tmp_path
        script = script.replace("run.key", str(tmp_path / "run.key"))
        address = network.machines[machine][1] if machine else network.host_route
        command = ["bash", "-euo", "pipefail", "-c", script]
        return subprocess.Popen(  # type: ignore[call-overload]
            network.run(machine, command) if machine else command,
            cwd=ROOT,
            env={**env, "AWS_ENDPOINT_URL": f"http://{address}:{port}"},
            text=True,
            **kwargs,
        )

    made = bash(keygen, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert made.wait(timeout=60) == 0, made.stdout.read() if made.stdout else ""
    assert (tmp_path / "run.key").stat().st_mode & 0o777 == 0o600
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in ("machine-a", "machine-b")}
    learners = {
        name: bash(as_here(learner).replace("machine-a", name), name, stdout=logs[name], stderr=subprocess.STDOUT)
        for name in logs
    }
    try:
        for name, process in learners.items():
            assert process.wait(timeout=600) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        for process in learners.values():
            if process.poll() is None:
                process.kill()
    # section 5 runs where section 4's credentials are set (the same shell, or a machine of the run)
    credentials = next(line for line in learner.splitlines() if line.startswith("export AWS_"))
    watched = bash(as_here(credentials + "\n" + status), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = watched.communicate(timeout=120)
    assert watched.returncode == 0, out
    assert "machine-a" in out and "machine-b" in out and "learners:" in out
    versions = [int(v) for v in re.findall(r"newest version (\d+)", out)]
    assert len(versions) == 2 and min(versions) >= 2, out
    rounds = [line for line in out.splitlines() if line.strip().startswith("v")]
    assert any("machine-a w=" in line and "machine-b w=" in line for line in rounds), out  # both in one round
    assert Path(tmp_path / "run.key").read_text().strip() not in out  # the key is never printed
