"""The command line against a real run, node settings from the environment, and `gradientmail node`'s
help and exit codes."""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import gradientmail as gm
from gradientmail import node
from gradientmail._version import __version__
from gradientmail.cli import main
from gradientmail.records.auth import generate_run_key
from gradientmail.settings import ALLOWED_VARIABLES, NodeSettings, check_environment, variable_name
from gradientmail.store import RunStore
from tests.run_procs import ROOT, start_learner


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cli")
    url = f"file://{workdir / 'box'}"
    learners = [
        start_learner(
            url,
            f"n{i}",
            workdir,
            "--seed",
            str(i),
            "--steps",
            "40",
            "--wait-for",
            "2",
            "--end-together",
            "2",
            "--ttl",
            "1.0",
            "--poll",
            "0.05",
        )
        for i in range(2)
    ]
    for learner in learners:
        learner.wait()
    return url, workdir, learners


@pytest.mark.slow
def test_status_shows_fragments_rounds_learners_and_syncer(finished_run, capsys):
    url, _, _ = finished_run
    assert main(["status", url, "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "merge={'kind': 'rda', 'direct_pattern': 'embed'}" in out
    assert "fragment 0:" in out and "fragment 1:" in out and "newest version" in out
    assert "syncer: n" in out and "learners:" in out and "n0" in out and "n1" in out
    assert " w=" in out


def test_export_writes_the_newest_committed_model(finished_run, tmp_path):
    """INV-3: the newest model is rebuilt from the mailbox alone and equals the learners' final weights."""
    url, _, learners = finished_run
    target = tmp_path / "model.safetensors"
    result = subprocess.run(
        [sys.executable, "-m", "gradientmail.cli", "export", url, str(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "wrote 3 tensors" in result.stdout
    exported = load_file(str(target))
    final = learners[0].result()["params"]
    for name, value in final.items():
        np.testing.assert_array_equal(exported[name], np.asarray(value, dtype=np.float32))


def test_replay_matches_the_committed_bytes(finished_run, capsys):
    """INV-4: `gradientmail replay` reproduces a committed round's bytes."""
    url, _, _ = finished_run
    assert main(["replay", url, "--fragment", "1"]) == 0
    assert "matches the committed bytes" in capsys.readouterr().out


def test_status_of_a_missing_run_says_so(tmp_path, capsys):
    assert main(["status", f"file://{tmp_path / 'empty'}"]) == 2
    assert "no run at" in capsys.readouterr().err


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("GRADIENTMAIL_MAILBOX", "memory://settings-test")
    monkeypatch.setenv("GRADIENTMAIL_LEARNER_ID", "gpu-7")
    monkeypatch.setenv("GRADIENTMAIL_SYNC_EVERY", "24")
    monkeypatch.setenv("GRADIENTMAIL_FRAGMENTS", "4")
    monkeypatch.setenv("GRADIENTMAIL_MERGE", "weighted_mean")
    monkeypatch.setenv("GRADIENTMAIL_LEASE_TTL_S", "5")
    settings = NodeSettings.from_env()
    assert settings.algorithm() == gm.DiLoCo(sync_every=24, fragments=4, merge=gm.WeightedMean())
    assert settings.session_options().lease_ttl_s == 5.0
    assert isinstance(settings.open_mailbox(), gm.MemoryMailbox)
    monkeypatch.setenv("GRADIENTMAIL_MERGE", "median")
    with pytest.raises(gm.InvalidConfig, match="merge"):
        NodeSettings.from_env()
    monkeypatch.setenv("GRADIENTMAIL_MERGE", "rda")
    monkeypatch.setenv("GRADIENTMAIL_SYNC_EVERY", "-3")
    with pytest.raises(gm.InvalidConfig, match="sync_every"):
        NodeSettings.from_env().algorithm()


def test_default_settings_match_the_algorithm_defaults(monkeypatch):
    monkeypatch.setenv("GRADIENTMAIL_MAILBOX", "memory://")
    assert NodeSettings.from_env().algorithm() == gm.DiLoCo()
    assert NodeSettings.from_env().session_options() == gm.SessionOptions()


def test_a_session_configured_only_by_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADIENTMAIL_MAILBOX", f"file://{tmp_path / 'box'}")
    monkeypatch.setenv("GRADIENTMAIL_LEARNER_ID", "env-node")
    monkeypatch.setenv("GRADIENTMAIL_SYNC_EVERY", "3")
    monkeypatch.setenv("GRADIENTMAIL_MERGE", "weighted_mean")
    monkeypatch.setenv("GRADIENTMAIL_POLL_INTERVAL_S", "0.02")
    model = {"w": np.zeros(3, np.float32)}
    with gm.session_from_env(model) as session:
        assert session.learner_id == "env-node"
        assert session.algorithm == gm.DiLoCo(sync_every=3, merge=gm.WeightedMean())
        for _ in range(3):
            model["w"] += 1
            session.step(samples=1)
    manifest = gm.FileMailbox(tmp_path / "box").get("manifest.json")
    assert b'"weighted_mean"' in manifest


# -- settings: unknown variables, the allow-list, a missing mailbox ---------------------------


def test_a_misspelt_variable_is_refused_naming_the_nearest_setting(monkeypatch):
    monkeypatch.setenv("GRADIENTMAIL_MAILBOX", "memory://")
    monkeypatch.setenv("GRADIENTMAIL_SYNC_EVRY", "30")
    with pytest.raises(gm.InvalidConfig) as raised:
        NodeSettings.from_env()
    assert str(raised.value) == "GRADIENTMAIL_SYNC_EVRY is not a setting; did you mean GRADIENTMAIL_SYNC_EVERY?"
    assert raised.value.field == "GRADIENTMAIL_SYNC_EVRY"
    monkeypatch.delenv("GRADIENTMAIL_SYNC_EVRY")
    monkeypatch.setenv("gradientmail_outer_lrate", "0.5")  # read without regard to case, so checked so too
    with pytest.raises(gm.InvalidConfig, match="gradientmail_outer_lrate is not a setting; did you mean GRADIENTMAIL_OUTER_LR"):
        NodeSettings.from_env()
    monkeypatch.delenv("gradientmail_outer_lrate")
    monkeypatch.setenv("GRADIENTMAIL_BANANA", "1")  # nothing near: the help is named instead
    with pytest.raises(gm.InvalidConfig, match=r"GRADIENTMAIL_BANANA is not a setting \(`gradientmail node --help`"):
        gm.session_from_env({"w": np.zeros(1, np.float32)})
    monkeypatch.delenv("GRADIENTMAIL_BANANA")
    assert NodeSettings.from_env().sync_every == gm.DiLoCo().sync_every


def test_the_allow_list_and_kubernetes_service_links_pass(monkeypatch):
    monkeypatch.setenv("GRADIENTMAIL_MAILBOX", "memory://")
    for name in ALLOWED_VARIABLES:
        monkeypatch.setenv(name, "/somewhere")
    # what the kubelet sets for a Service "gradientmail-minio" (ports 9000 "s3" and 9001)
    links = {
        "GRADIENTMAIL_MINIO_SERVICE_HOST": "10.0.0.7",
        "GRADIENTMAIL_MINIO_SERVICE_PORT": "9000",
        "GRADIENTMAIL_MINIO_SERVICE_PORT_S3": "9000",
        "GRADIENTMAIL_MINIO_PORT": "tcp://10.0.0.7:9000",
        "GRADIENTMAIL_MINIO_PORT_9000_TCP": "tcp://10.0.0.7:9000",
        "GRADIENTMAIL_MINIO_PORT_9000_TCP_PROTO": "tcp",
        "GRADIENTMAIL_MINIO_PORT_9000_TCP_PORT": "9000",
        "GRADIENTMAIL_MINIO_PORT_9001_TCP_ADDR": "10.0.0.7",
    }
    for name, value in links.items():
        monkeypatch.setenv(name, value)
    assert NodeSettings.from_env().mailbox == "memory://"
    check_environment({**links, **dict.fromkeys(ALLOWED_VARIABLES, "x")})
    # a link's siblings pass only beside its _SERVICE_HOST: a typo ending in _PORT is still a typo
    with pytest.raises(
        gm.InvalidConfig, match="GRADIENTMAIL_METRIC_PORT is not a setting; did you mean GRADIENTMAIL_METRICS_PORT"
    ):
        check_environment({"GRADIENTMAIL_METRIC_PORT": "9464"})
    assert all(reason for reason in ALLOWED_VARIABLES.values()), "each allowed name says why it is there"


def test_every_gradientmail_variable_the_repository_sets_is_a_setting_or_allowed():
    """compose, the images, the chart, the scripts, the demo, the examples, the benchmarks and the
    tests set only known names (this file, which sets typos on purpose, aside)."""
    known = {variable_name(field) for field in NodeSettings.model_fields} | set(ALLOWED_VARIABLES)
    found: dict[str, str] = {}
    places = [
        ROOT / "compose.yaml",
        *(ROOT / d for d in ("docker", "helm", "scripts", "demo", "examples", "benchmarks", "tests")),
    ]
    for place in places:
        for path in [place] if place.is_file() else sorted(place.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.resolve() == Path(__file__).resolve():
                continue
            for name in re.findall(r"\bGRADIENTMAIL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="ignore")):
                found.setdefault(name, str(path.relative_to(ROOT)))
    unknown = {name: where for name, where in found.items() if name not in known}
    assert not unknown, f"not NodeSettings fields nor in ALLOWED_VARIABLES: {unknown}"
    assert "GRADIENTMAIL_VENV" in found, "the allow-list names a variable still in use"


def test_a_missing_mailbox_names_its_variable(monkeypatch):
    monkeypatch.delenv("GRADIENTMAIL_MAILBOX", raising=False)
    with pytest.raises(gm.InvalidConfig) as raised:
        NodeSettings.from_env()
    assert str(raised.value).startswith("GRADIENTMAIL_MAILBOX is required (")
    assert raised.value.field == "mailbox"


# -- the command line: --help, --version ------------------------------------------------------


def _shown_default(field) -> str:
    if field.is_required():
        return "(required)"
    default = field.default
    shown = "unset" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
    return f"(default: {shown})"


def test_node_help_lists_every_variable_with_its_default_and_a_description(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["node", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for name, field in NodeSettings.model_fields.items():
        assert field.description, f"{name} has no docstring"
        entry = f"  {variable_name(name)}  {_shown_default(field)}"
        assert entry in lines, entry
        description = lines[lines.index(entry) + 1]
        assert description.startswith("      ") and description.strip() and "(no description)" not in description
    assert "GRADIENTMAIL_SYNC_EVERY  (default: 100)" in out and "GRADIENTMAIL_MAILBOX  (required)" in out
    for code in ("0 ", "1 ", "2 ", "3 ", "143 "):
        assert f"\n  {code}" in out, f"exit code {code} is listed"


def test_version_prints_the_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"gradientmail {__version__}"


# -- gradientmail node's exit codes, from real processes ---------------------------------------

NODE_SCRIPT = """
import numpy as np
import gradientmail as gm

model = {"w": np.zeros(4, np.float32)}
with gm.session_from_env(model) as session:
    for _ in range(3):
        model["w"] += 1.0
        session.step(samples=1)
"""


def _node(tmp_path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GRADIENTMAIL_")}
    env.update(settings)
    command = [sys.executable, "-m", "gradientmail.cli", "node"]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def existing_run(tmp_path):
    """A file:// run created with sync_every=3, no run key, and the model NODE_SCRIPT trains."""
    url = f"file://{tmp_path / 'box'}"
    with gm.Session({"w": np.zeros(4, np.float32)}, algorithm=gm.DiLoCo(sync_every=3), mailbox=url, learner_id="creator"):
        pass
    script = tmp_path / "train.py"
    script.write_text(NODE_SCRIPT)
    return {"GRADIENTMAIL_MAILBOX": url, "GRADIENTMAIL_SCRIPT": str(script), "GRADIENTMAIL_LEARNER_ID": "n1"}


@pytest.mark.slow
def test_node_exits_2_on_bad_settings(tmp_path):
    ran = _node(tmp_path, GRADIENTMAIL_MAILBOX=f"file://{tmp_path / 'box'}", GRADIENTMAIL_SYNC_EVRY="30")
    assert ran.returncode == 2, ran.stderr
    assert "GRADIENTMAIL_SYNC_EVRY is not a setting; did you mean GRADIENTMAIL_SYNC_EVERY?" in ran.stderr
    ran = _node(tmp_path)
    assert ran.returncode == 2 and "GRADIENTMAIL_MAILBOX is required" in ran.stderr, ran.stderr


@pytest.mark.slow
def test_node_exits_3_when_the_run_has_other_settings_or_another_key(existing_run, tmp_path):
    ran = _node(tmp_path, **existing_run, GRADIENTMAIL_SYNC_EVERY="5")
    assert ran.returncode == 3, ran.stderr
    assert "run configuration mismatch: sync_every: the run uses 3, this node 5" in ran.stderr
    ran = _node(tmp_path, **existing_run, GRADIENTMAIL_SYNC_EVERY="3", GRADIENTMAIL_RUN_KEY=generate_run_key())
    assert ran.returncode == 3, ran.stderr
    assert "run configuration mismatch: run key: the run is not signed" in ran.stderr
    ran = _node(tmp_path, **existing_run, GRADIENTMAIL_SYNC_EVERY="3")
    assert ran.returncode == 0, ran.stderr  # the same node with the run's settings joins


FLAKY_JOB = """
import gradientmail as gm

calls = 0


def main():
    global calls
    calls += 1
    if calls <= FAILURES:
        raise ERROR
    return 0
"""


@pytest.mark.parametrize(
    ("failures", "error", "calls", "outcome"),
    [
        (2, "gm.MailboxUnavailable('the store is down')", 3, 0),  # retryable: the job runs again
        (99, "gm.MailboxUnavailable('the store is down')", 3, gm.MailboxUnavailable),  # until the tries run out
        (1, "gm.MailboxMisconfigured('no such bucket')", 1, gm.MailboxMisconfigured),  # not retryable: at once
        (1, "gm.RunConfigMismatch(['sync_every'])", 1, gm.RunConfigMismatch),
    ],
)
def test_the_node_runs_its_job_again_after_a_retryable_store_error(
    failures, error, calls, outcome, tmp_path, monkeypatch, caplog
):
    """A store outage does not end the node (so it uses up no container restarts); other errors do."""
    name = f"flaky_job_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(FLAKY_JOB.replace("FAILURES", str(failures)).replace("ERROR", error))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(node, "RETRY_DELAYS_S", (0.0, 0.0))
    settings = NodeSettings.from_env(mailbox="memory://", entrypoint=f"{name}:main")
    with caplog.at_level(logging.WARNING, logger="gradientmail.node"):
        if isinstance(outcome, int):
            assert node.run_node(settings) == outcome
        else:
            with pytest.raises(outcome):
                node.run_node(settings)
    assert importlib.import_module(name).calls == calls
    retries = [r.getMessage() for r in caplog.records if "running the job again" in r.getMessage()]
    assert len(retries) == (min(failures, 2) if "Unavailable" in error else 0)


# -- the small things a stranger meets first ------------------------------------------------------


@pytest.mark.slow
def test_the_node_logs_json_lines_at_the_level_asked(existing_run, tmp_path):
    """GRADIENTMAIL_LOG_FORMAT=json: every line on stderr is one JSON object; GRADIENTMAIL_LOG_LEVEL
    takes any case, and WARNING leaves out the node's INFO lines."""
    ran = _node(
        tmp_path, **existing_run, GRADIENTMAIL_SYNC_EVERY="3", GRADIENTMAIL_LOG_FORMAT="json", GRADIENTMAIL_LOG_LEVEL="info"
    )
    assert ran.returncode == 0, ran.stderr
    entries = [json.loads(line) for line in ran.stderr.splitlines() if line.strip()]
    assert entries and all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    assert any(e["logger"].startswith("gradientmail") and e["level"] == "INFO" for e in entries)
    quiet = _node(tmp_path, **existing_run, GRADIENTMAIL_SYNC_EVERY="3", GRADIENTMAIL_LOG_LEVEL="warning")
    assert quiet.returncode == 0 and " INFO " not in quiet.stderr, quiet.stderr
    wrong = _node(tmp_path, **existing_run, GRADIENTMAIL_LOG_LEVEL="loud")
    assert wrong.returncode == 2 and "log_level" in wrong.stderr, wrong.stderr


def test_status_into_a_pipe_that_closes_early_says_nothing_more(finished_run):
    """`gradientmail status URL | head -1`: no traceback, exit 141 (a tool stopped by SIGPIPE)."""
    url, _, _ = finished_run
    ran = subprocess.run(
        f"{shlex.quote(sys.executable)} -m gradientmail.cli status {shlex.quote(url)} --rounds 50 | head -c 1; "
        'echo " ${PIPESTATUS[0]}"',
        shell=True, executable="/bin/bash", cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in ran.stderr and "BrokenPipe" not in ran.stderr, ran.stderr
    assert ran.stdout.split()[-1] in ("141", "0")  # 0 when the whole status fitted the pipe's buffer


def test_export_refuses_a_directory_and_exports_a_chosen_version(finished_run, tmp_path, capsys):
    url, _, _ = finished_run
    assert main(["export", url, str(tmp_path)]) == 2
    assert "is a directory; give a file to write" in capsys.readouterr().err
    target = tmp_path / "v2.safetensors"
    assert main(["export", url, str(target), "--version", "2"]) == 0
    assert "'0': '2'" in capsys.readouterr().out
    store = RunStore(gm.FileMailbox(Path(url.removeprefix("file://"))))
    spec = store.read_spec()
    exported = load_file(str(target))
    for fragment in range(len(spec.fragments)):
        for name, array in store.load_version(spec, fragment, 2).params.items():
            np.testing.assert_array_equal(exported[name], array)
    assert main(["export", url, str(target), "--version", "100000"]) == 2
    assert "has no version 100000: its newest is" in capsys.readouterr().err


@pytest.fixture(scope="module")
def collected_run(tmp_path_factory):
    """A finished run whose retention kept 3 versions (audit window 2): early rounds are gone."""
    workdir = tmp_path_factory.mktemp("collected")
    url = f"file://{workdir / 'box'}"
    args = ["--steps", "80", "--wait-for", "2", "--end-together", "2", "--ttl", "1.0", "--poll", "0.05", "--keep-versions", "3"]
    learners = [start_learner(url, f"n{i}", workdir, "--seed", str(i), *args) for i in range(2)]
    for learner in learners:
        learner.wait()
    return url


@pytest.mark.slow
def test_replay_and_export_of_a_collected_round_say_retention_collected_it(collected_run, capsys):
    assert main(["replay", collected_run, "--fragment", "0", "--version", "1"]) == 2
    err = capsys.readouterr().err
    assert "retention collected round 1 of fragment 0" in err and "still held:" in err, err
    assert main(["export", collected_run, "/dev/null", "--version", "1"]) == 2
    assert "retention collected version 1 of fragment 0" in capsys.readouterr().err
    assert main(["replay", collected_run, "--fragment", "0"]) == 0  # the newest round still replays
