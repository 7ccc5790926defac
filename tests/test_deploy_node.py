"""The learner entrypoint the images run, and the Apple-host runner, as real processes.

The images' command and environment are read from docker/cpu.Dockerfile (ENTRYPOINT, CMD,
ENV, HEALTHCHECK) and compose.yaml (the learners' settings); the test starts that command with
that environment outside a container, with only the mailbox pointed at the loopback SeaweedFS
(compose's MinIO is not reachable here) and the run made short. scripts/apple-learner runs its
real set-up and launch path against the same server, reusing this test environment's venv.
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gradientmail.mailbox import FileMailbox, S3Mailbox
from gradientmail.records import Lease, keys
from gradientmail.store import RunStore
from tests.deploy_tools import (
    DOCKERFILES,
    ROOT,
    RUN_KEY_VARIABLES,
    dockerfile_env,
    dockerfile_instructions,
    learner_environment,
    load_compose,
)
from tests.run_procs import rounds, wait_until

pytestmark = pytest.mark.s3

SHORT_RUN = {"GRADIENTMAIL_STEPS": "40", "GRADIENTMAIL_SYNC_EVERY": "4", "GRADIENTMAIL_FRAGMENTS": "2"}
"""The only run settings changed from compose's, to keep the run short."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def image_command() -> list[str]:
    ops = dict(dockerfile_instructions(DOCKERFILES["cpu"])[-12:])
    return json.loads(ops["ENTRYPOINT"]) + json.loads(ops["CMD"])


def health_command() -> list[str]:
    healthcheck = dict(dockerfile_instructions(DOCKERFILES["cpu"]))["HEALTHCHECK"]
    return json.loads(healthcheck.split(" CMD ", 1)[1])


def image_environment(home: Path) -> dict[str, str]:
    """The image's ENV, its /opt/gradientmail venv replaced by this test's venv and its copy of
    demo/ (the default job, under /opt/gradientmail-jobs) by the checkout's, in a bare environment."""
    env = {"HOME": str(home), "LANG": "C.UTF-8"}
    for name, value in dockerfile_env(DOCKERFILES["cpu"]).items():
        value = value.replace("/opt/gradientmail/bin", str(Path(sys.executable).parent))
        value = value.replace("/opt/gradientmail-jobs", str(ROOT))
        env[name] = value.replace("$PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    return env


@pytest.fixture
def s3_run(s3_server):
    """A fresh run prefix on the loopback server: (mailbox URL, credentials env, mailbox)."""
    prefix = f"runs/{uuid.uuid4().hex[:12]}"
    url = f"s3://{s3_server.bucket}/{prefix}?endpoint={s3_server.endpoint_url}&region={s3_server.region}&addressing=path"
    credentials = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    mailbox = S3Mailbox(
        s3_server.bucket,
        prefix,
        endpoint_url=s3_server.endpoint_url,
        region=s3_server.region,
        access_key_id=s3_server.access_key,
        secret_access_key=s3_server.secret_key,
        addressing_style="path",
    )
    yield url, credentials, mailbox
    mailbox.close()


def compose_learner_env(service: str, url: str, credentials: dict[str, str], home: Path) -> dict[str, str]:
    """What a compose learner container gets, with the mailbox moved to the test server."""
    compose = load_compose()
    learner = compose["services"][service]
    env = image_environment(home)
    env.update(learner_environment(learner))
    env.update({"GRADIENTMAIL_MAILBOX": url, **credentials, **SHORT_RUN})
    env["GRADIENTMAIL_LEARNER_ID"] = learner["hostname"]  # in a container, the host name (the default id)
    env["GRADIENTMAIL_METRICS_PORT"] = str(_free_port())  # one host here, not one per container
    if "GRADIENTMAIL_RUN_KEY_FILE" in env:  # compose's keygen volume: one key per test, made the same way
        key_file = home / "run.key"
        subprocess.run(
            [sys.executable, "-m", "gradientmail.cli", "keygen", "--out", str(key_file)], check=True, capture_output=True
        )
        env["GRADIENTMAIL_RUN_KEY_FILE"] = str(key_file)
    return env


def _start(command: list[str], env: dict[str, str], workdir: Path, name: str) -> tuple[subprocess.Popen[str], Path]:
    log = workdir / f"{name}.log"
    process = subprocess.Popen(command, cwd=workdir, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
    return process, log


def _healthy(env: dict[str, str], workdir: Path) -> bool:
    return subprocess.run(health_command(), cwd=workdir, env=env, capture_output=True, timeout=30).returncode == 0


def _participants(mailbox, fragments: int) -> set[str]:
    return {p.learner for fragment in range(fragments) for record in rounds(mailbox, fragment)[1:] for p in record.participants}


@pytest.mark.slow
def test_the_image_entrypoint_runs_compose_learners_that_train_together(s3_run, tmp_path):
    url, credentials, mailbox = s3_run
    assert image_command() == ["gradientmail", "node"]
    learners = {}
    for service in ("learner-1", "learner-2"):
        env = compose_learner_env(service, url, credentials, tmp_path)
        learners[service] = (env, *_start(image_command(), env, tmp_path, service))
    for service, (env, process, log) in learners.items():
        wait_until(lambda p=process, e=env: p.poll() is not None or _healthy(e, tmp_path), 60, f"{service}'s health check")
        assert process.poll() is None, f"{service} exited early:\n{log.read_text()[-3000:]}"
    for service, (env, process, log) in learners.items():
        assert process.wait(timeout=180) == 0, log.read_text()[-3000:]
        final = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"event": "final"')]
        assert final and final[0]["learner"] == service and final[0]["steps"] == 40
        assert not _healthy(env, tmp_path), "the health check fails once the node is gone"
    assert _participants(mailbox, 2) == {"learner-1", "learner-2"}


@pytest.mark.slow
def test_sigterm_closes_the_session_and_releases_the_lease(s3_run, tmp_path):
    url, credentials, mailbox = s3_run
    env = compose_learner_env("learner-3", url, credentials, tmp_path)
    env["GRADIENTMAIL_STEPS"] = "100000"
    process, log = _start(image_command(), env, tmp_path, "learner-3")
    try:
        lease_key = keys.learner_lease("learner-3")
        wait_until(lambda: process.poll() is not None or mailbox.exists(lease_key), 60, "the learner's lease")
        wait_until(lambda: process.poll() is not None or '"event": "progress"' in log.read_text(), 60, "training")
        assert process.poll() is None, log.read_text()[-3000:]
        process.send_signal(signal.SIGTERM)  # what `docker stop` and a pod's termination send
        assert process.wait(timeout=30) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
    assert Lease.from_json(mailbox.get(lease_key)).released, "the lease is released, not left to expire"


SCRIPT = """
import numpy as np
import gradientmail as gm
from gradientmail.settings import NodeSettings

model = {"w": np.zeros(4, np.float32)}
steps = NodeSettings.from_env().steps
with gm.session_from_env(model) as session:
    for _ in range(steps):
        model["w"] += 1.0
        session.step(samples=2)
print("SCRIPT-DONE", __name__, session.learner_id, steps)
"""


@pytest.mark.slow
def test_the_node_runs_a_mounted_script_or_an_installed_entry_point(tmp_path):
    script = tmp_path / "mounted" / "train.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    package = tmp_path / "site" / "mytraining"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(SCRIPT.replace("print(", "def main():\n    return 7\n\nprint("))
    base = image_environment(tmp_path)
    base.update(
        {
            "GRADIENTMAIL_MAILBOX": f"file://{tmp_path / 'box'}",
            "GRADIENTMAIL_STEPS": "6",
            "GRADIENTMAIL_SYNC_EVERY": "3",
            "GRADIENTMAIL_MERGE": "weighted_mean",
            "GRADIENTMAIL_METRICS_PORT": str(_free_port()),
        }
    )
    ran = subprocess.run(
        image_command(),
        cwd=tmp_path,
        env={**base, "GRADIENTMAIL_SCRIPT": str(script), "GRADIENTMAIL_LEARNER_ID": "mounted"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "SCRIPT-DONE __main__ mounted 6" in ran.stdout
    env = {
        **base,
        "GRADIENTMAIL_ENTRYPOINT": "mytraining.train:main",
        "GRADIENTMAIL_LEARNER_ID": "installed",
        "PYTHONPATH": str(package.parent),
    }
    ran = subprocess.run(image_command(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 7, ran.stderr[-3000:]  # the function's return value is the exit code
    assert "SCRIPT-DONE mytraining.train installed 6" in ran.stdout
    assert _participants(FileMailbox(tmp_path / "box"), 1) == {"mounted", "installed"}


COMMIT_LINE = re.compile(
    r"gradientmail\.syncer\.runtime INFO node (\S+) committed fragment (\d+) version (\d+) "
    r"\((\d+) merged, (\d+) rejected\) quorum wait \d+\.\d\ds grace \d+\.\d\ds sync \d+\.\d\ds$"
)


@pytest.mark.slow
def test_the_node_logs_one_info_line_per_round_it_commits(tmp_path):
    """What `docker compose logs` shows: every committed round once, with its timings, at the
    node's default log level."""
    script = tmp_path / "train.py"
    script.write_text(
        SCRIPT.replace("model[", "time.sleep(0.1)\n        model[").replace("import numpy", "import time\nimport numpy")
    )
    env = {
        **image_environment(tmp_path),
        "GRADIENTMAIL_MAILBOX": f"file://{tmp_path / 'box'}",
        "GRADIENTMAIL_SCRIPT": str(script),
        "GRADIENTMAIL_LEARNER_ID": "logger",
        "GRADIENTMAIL_STEPS": "12",
        "GRADIENTMAIL_SYNC_EVERY": "3",
        "GRADIENTMAIL_POLL_INTERVAL_S": "0.02",
    }
    ran = subprocess.run(image_command(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    logged = [m.groups() for m in map(COMMIT_LINE.search, ran.stderr.splitlines()) if m]
    committed = RunStore(FileMailbox(tmp_path / "box")).committed_versions(0)
    assert len(committed) > 2, f"the run committed rounds: {committed}"
    assert sorted(int(version) for _, fragment, version, *_ in logged if fragment == "0") == committed[1:]
    assert {(node, merged, rejected) for node, _, _, merged, rejected in logged} == {("logger", "1", "0")}


def test_the_apple_host_runner_checks_the_python_version_first(tmp_path):
    """An interpreter older than 3.10 is refused before anything is created, saying what to do."""
    old_python = tmp_path / "python3.9"
    old_python.write_text('#!/bin/sh\ncase "$2" in *print*) echo 3.9.18 ;; *) exit 1 ;; esac\n')
    old_python.chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    venv = tmp_path / "venv"
    command = [str(ROOT / "scripts/apple-learner"), "--mailbox", "file:///nowhere", "--venv", str(venv)]
    ran = subprocess.run([*command, "--python", str(old_python)], env=env, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 2
    assert f"{old_python} is Python 3.9.18; GradientMail needs Python >= 3.10" in ran.stderr
    assert "brew install python@3.12" in ran.stderr and "--python /path/to/python3.12" in ran.stderr
    assert not venv.exists()
    ran = subprocess.run([*command, "--python", "no-such-python"], env=env, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 2 and "no Python interpreter 'no-such-python'" in ran.stderr, ran.stderr


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"GRADIENTMAIL_SYNC_EVERY": "-1"}, "sync_every"),
        ({"GRADIENTMAIL_SCRIPT": "/nowhere/train.py"}, "script: no file at '/nowhere/train.py'"),
        ({"GRADIENTMAIL_SCRIPT": "a.py", "GRADIENTMAIL_ENTRYPOINT": "b"}, "not both"),
        ({"GRADIENTMAIL_BACKEND": "numpy"}, "backend"),
        ({"GRADIENTMAIL_LEASE_TTL_S": "0.1"}, "lease_ttl_s"),
        # the default job is found through the image's PYTHONPATH only: the library never imports it
        ({"PYTHONPATH": ""}, "entrypoint: cannot load 'demo.worker:node_main'"),
    ],
)
@pytest.mark.slow
def test_invalid_settings_stop_the_node_with_exit_2_naming_the_setting(settings, message, tmp_path):
    env = {**image_environment(tmp_path), "GRADIENTMAIL_MAILBOX": f"file://{tmp_path / 'box'}", **settings}
    ran = subprocess.run(image_command(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2 and message in ran.stderr, ran.stderr


@pytest.mark.slow
def test_the_apple_host_runner_joins_a_mixed_run_with_the_containers_settings(s3_run, tmp_path):
    """scripts/apple-learner's real path (env file, set-up check, launch) with MLX's CPU build,
    joining the run a PyTorch learner, started as the image starts it, has trained.

    One after the other, not side by side: an MLX step on a CI CPU takes longer than the
    PyTorch learner takes to commit a version, so a Mac learner training beside it would align
    to each new commit before it reached sync_every steps and never contribute.
    (tests/test_guide_examples.py trains PyTorch and MLX learners side by side.)"""
    url, credentials, mailbox = s3_run
    short = {"GRADIENTMAIL_STEPS": "4", "GRADIENTMAIL_SYNC_EVERY": "2", "GRADIENTMAIL_FRAGMENTS": "1"}
    container_env = {**compose_learner_env("learner-1", url, credentials, tmp_path), **short, "GRADIENTMAIL_STEPS": "30"}
    container, container_log = _start(image_command(), container_env, tmp_path, "learner-1")
    assert container.wait(timeout=120) == 0, container_log.read_text()[-3000:]
    mac_env = {
        "HOME": str(tmp_path),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **credentials,
        **short,
        "GRADIENTMAIL_METRICS_PORT": str(_free_port()),
        "GRADIENTMAIL_RUN_KEY_FILE": container_env["GRADIENTMAIL_RUN_KEY_FILE"],  # the run's key, copied to the Mac
    }
    runner = subprocess.run(
        [str(ROOT / "scripts/apple-learner"), "--mailbox", url, "--learner-id", "mac-ci", "--venv", sys.prefix],
        cwd=tmp_path,
        env=mac_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert runner.returncode == 0, runner.stderr[-3000:]
    assert "mac-ci joins s3://" in runner.stderr and "installing" not in runner.stderr  # the venv was ready: no install
    assert '"framework": "mlx"' in runner.stdout
    assert {"mac-ci", "learner-1"} <= _participants(mailbox, 1)
    manifest = json.loads(mailbox.get(keys.MANIFEST))
    assert manifest["algorithm"]["sync_every"] == 2


def test_the_apple_host_runner_takes_the_compose_run_settings(tmp_path):
    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    keys = tmp_path / "storage.env"  # what compose's minio-setup writes for the learners
    keys.write_text("AWS_ACCESS_KEY_ID=gradientmail-learner\nAWS_SECRET_ACCESS_KEY=scoped-secret\n")
    refused = subprocess.run(
        [str(ROOT / "scripts/apple-learner"), "--compose-host", "studio.local", "--print-config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2 and "no storage keys" in refused.stderr  # never MinIO's root keys
    shown = subprocess.run(
        [str(ROOT / "scripts/apple-learner"), "--compose-host", "studio.local", "--credentials", str(keys), "--print-config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    config = dict(line.split("=", 1) for line in shown.splitlines())
    learner = load_compose()["services"]["learner-1"]
    compose_env = learner_environment(learner)
    expected_url = compose_env["GRADIENTMAIL_MAILBOX"].replace("minio:9000", "studio.local:9000")
    assert config["GRADIENTMAIL_MAILBOX"] == expected_url
    assert config["GRADIENTMAIL_BACKEND"] == "mlx"
    for name, value in compose_env.items():
        if name.startswith("GRADIENTMAIL_") and name != "GRADIENTMAIL_MAILBOX" and name not in RUN_KEY_VARIABLES:
            assert config[name] == value, name  # the run key comes from the Mac's own file (docs/deploy.md)
    assert config["AWS_ACCESS_KEY_ID"] == "gradientmail-learner" and config["AWS_SECRET_ACCESS_KEY"] == "***"
    assert not any(name.startswith("MINIO_ROOT") for name in compose_env)


FAULT_SCRIPT = """
import json, resource
def faults(size):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = bytearray(size)  # written whole: every page touched
    del buffer
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print("FAULTS " + json.dumps([faults(64 << 20) for _ in range(4)]))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting applies to glibc only")
@pytest.mark.parametrize("setting", [None, "false"], ids=["default", "off"])
def test_the_node_keeps_the_memory_its_job_frees_unless_told_not_to(tmp_path, setting):
    """``gradientmail node`` applies ``gm.retain_freed_memory`` before its job starts
    (``GRADIENTMAIL_RETAIN_FREED_MEMORY``, on by default): a 64 MiB buffer freed and allocated
    again faults its pages in only once; with the setting off, every time."""
    script = tmp_path / "faults.py"
    script.write_text(FAULT_SCRIPT)
    env = {
        **image_environment(tmp_path),
        "GRADIENTMAIL_MAILBOX": f"file://{tmp_path / 'box'}",
        "GRADIENTMAIL_SCRIPT": str(script),
    }
    if setting is not None:
        env["GRADIENTMAIL_RETAIN_FREED_MEMORY"] = setting
    ran = subprocess.run(image_command(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    (line,) = [line for line in ran.stdout.splitlines() if line.startswith("FAULTS ")]
    faults = json.loads(line.removeprefix("FAULTS "))
    pages = (64 << 20) // 4096
    if setting is None:
        assert all(count < pages // 20 for count in faults[1:]), faults
    else:
        assert all(count >= pages // 2 for count in faults), faults
