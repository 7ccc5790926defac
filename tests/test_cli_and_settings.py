"""The command line against a real run, and node settings from the environment."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

import gradientmail as gm
from gradientmail.cli import main
from gradientmail.settings import NodeSettings
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
