"""The run key end to end: who may join, a signed run of real processes, where the key never goes,
and a closing learner that does not wait for commits nobody can make."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.cli import main as cli_main
from gradientmail.records.auth import RunKey, generate_run_key
from tests.run_procs import ROOT, check_history, start_learner

KEY = "k" * 40
OTHER = "o" * 40
FAST = ["--ttl", "1.0", "--poll", "0.05"]


def model() -> dict[str, np.ndarray]:
    return {"embed.weight": np.zeros((4, 2), np.float32), "layer.weight": np.ones((2, 2), np.float32)}


def session(box: gm.Mailbox, learner: str, key: str | None, **options: object) -> gm.Session:
    return gm.Session(
        model(),
        algorithm=gm.DiLoCo(sync_every=2),
        mailbox=box,
        learner_id=learner,
        run_key=key,
        options=gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.05, **options),  # type: ignore[arg-type]
    )


def test_nodes_with_another_key_or_none_cannot_join_a_signed_run():
    """INV-10: a signed run refuses a node with another key or none, naming the key ids, and a
    keyed node refuses an unsigned run; nothing is written by the refused node."""
    signed, unsigned = gm.MemoryMailbox(), gm.MemoryMailbox()
    with session(signed, "creator", KEY), session(unsigned, "creator", None):
        before = set(signed.list())
        with pytest.raises(gm.RunConfigMismatch, match=f"key id {RunKey(KEY).key_id}.*key has id {RunKey(OTHER).key_id}"):
            session(signed, "other-key", OTHER).open()
        with pytest.raises(gm.RunConfigMismatch, match="the run is signed .*set GRADIENTMAIL_RUN_KEY"):
            session(signed, "no-key", None).open()
        with pytest.raises(gm.RunConfigMismatch, match="is not signed"):
            session(unsigned, "keyed", KEY).open()
        assert set(signed.list()) == before  # the refused nodes wrote nothing, not even a lease


def test_the_key_never_appears_in_records_logs_or_reprs(caplog):
    """INV-10: the key is in no stored byte, no log line and no repr; only its id is shown."""
    box = gm.MemoryMailbox()
    caplog.set_level(logging.DEBUG, logger="gradientmail")
    with session(box, "creator", KEY) as learner:
        for _ in range(6):
            learner.step(samples=4)
    secret = KEY.encode()
    assert not [key for key in box.list() if secret in box.get(key)]
    assert KEY not in caplog.text
    assert KEY not in repr(RunKey(KEY)) and RunKey(KEY).key_id in repr(RunKey(KEY))
    settings = gm.NodeSettings.from_env(mailbox="memory://x", run_key=KEY)
    assert KEY not in repr(settings) and KEY not in str(settings.model_dump())
    assert settings.key() is not None and settings.key().key_id == RunKey(KEY).key_id  # type: ignore[union-attr]


def test_run_key_settings_and_keygen(tmp_path, monkeypatch):
    """INV-10: the key comes from GRADIENTMAIL_RUN_KEY or a file; short keys and both at once are
    refused naming the setting; keygen writes a fresh key once (mode 0600) and keeps it."""
    path = tmp_path / "run.key"
    assert cli_main(["keygen", "--out", str(path)]) == 0
    first = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(first.strip()) == 64
    assert cli_main(["keygen", "--out", str(path)]) == 0 and path.read_text() == first  # kept, not replaced
    monkeypatch.setenv("GRADIENTMAIL_MAILBOX", "memory://settings")
    monkeypatch.setenv("GRADIENTMAIL_RUN_KEY_FILE", str(path))
    assert gm.NodeSettings.from_env().key().key_id == RunKey(first.strip()).key_id  # type: ignore[union-attr]
    monkeypatch.setenv("GRADIENTMAIL_RUN_KEY", KEY)
    with pytest.raises(gm.InvalidConfig, match="run_key: set GRADIENTMAIL_RUN_KEY or GRADIENTMAIL_RUN_KEY_FILE, not both"):
        gm.NodeSettings.from_env().key()
    monkeypatch.delenv("GRADIENTMAIL_RUN_KEY_FILE")
    monkeypatch.setenv("GRADIENTMAIL_RUN_KEY", "short")
    with pytest.raises(gm.InvalidConfig, match="run_key: GRADIENTMAIL_RUN_KEY must be at least 32 bytes"):
        gm.NodeSettings.from_env().key()
    with pytest.raises(gm.InvalidConfig, match="run_key: GRADIENTMAIL_RUN_KEY must be at least 32 bytes"):
        RunKey.from_env()  # what gm.Session reads: the same rule, the same message
    monkeypatch.setenv("GRADIENTMAIL_RUN_KEY", "")
    with pytest.raises(gm.InvalidConfig, match=r"GRADIENTMAIL_RUN_KEY must be at least 32 bytes \(got 0\)"):
        RunKey.from_env()  # set but empty (an unset compose variable): an error, never an unsigned run
    with pytest.raises(gm.InvalidConfig, match="run_key_file: cannot read"):
        RunKey.from_file(tmp_path / "missing.key")
    assert generate_run_key() != generate_run_key()


@pytest.mark.slow
def test_a_signed_run_of_real_learners_commits_and_passes_the_audit_only_with_its_key(tmp_path):
    """INV-10, INV-11: learner processes sharing a key commit a chained history; `gradientmail
    audit` passes with the key and fails without it (it cannot check a signed run's MACs)."""
    url = f"file://{tmp_path / 'box'}"
    args = ["--steps", "60", "--step-sleep", "0.01", "--wait-for", "2", "--run-key", KEY, *FAST]
    learners = [start_learner(url, f"n{i}", tmp_path, "--seed", str(i), *args) for i in range(2)]
    for learner in learners:
        learner.wait()
    history = check_history(gm.FileMailbox(tmp_path / "box"), fragments=2)
    assert all(len(records) > 1 for records in history)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADIENTMAIL_RUN_KEY")}
    audit = [sys.executable, "-m", "gradientmail.cli", "audit", url]
    keyed = subprocess.run(audit, cwd=ROOT, env={**env, "GRADIENTMAIL_RUN_KEY": KEY}, capture_output=True, text=True)
    assert keyed.returncode == 0, keyed.stdout + keyed.stderr
    assert "0 failures" in keyed.stdout and "hash chain checked" in keyed.stdout
    keyless = subprocess.run(audit, cwd=ROOT, env=env, capture_output=True, text=True)
    assert keyless.returncode == 1 and "signatures cannot be checked" in keyless.stdout


def test_close_does_not_wait_for_commits_no_syncer_can_make(tmp_path):
    """INV-14: a learner whose run has no live syncer stops waiting for its rounds once the syncer
    lease has been dead for a further TTL, well before commit_timeout_s."""
    box = gm.FileMailbox(Path(tmp_path) / "box")
    learner = gm.Session(
        model(),
        algorithm=gm.DiLoCo(sync_every=2, flush_on_close=True),
        mailbox=box,
        learner_id="alone",
        options=gm.SessionOptions(lease_ttl_s=0.5, poll_interval_s=0.05, run_syncer=False, commit_timeout_s=120.0),
    )
    with learner:
        for _ in range(3):
            learner.step(samples=4)
        assert learner.wait_published(timeout_s=30)
        started = time.monotonic()
    waited = time.monotonic() - started
    assert waited < 60, f"close waited {waited:.1f} s for a commit no syncer could make"
    assert learner.versions == {0: 0}  # nothing committed; the model is back on version 0


README_PRELUDE = """
import torch
model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(4)))  # 8 tensors, one per fragment
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
dataloader = [torch.randn(8, 4) for _ in range(3)]

def train_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss
"""


def readme_snippet() -> str:
    """The README's "Connecting a training loop" code, as a user copies it."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Connecting a training loop", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["GRADIENTMAIL_RUN_KEY", "GRADIENTMAIL_RUN_KEY_FILE"])
def test_the_readmes_snippet_with_only_the_variable_set_signs_the_run(s3_server, tmp_path, variable):
    """INV-10: the README's snippet, run unchanged against a loopback S3 bucket with the run key
    given only as the environment variable the README names, creates a signed run (its manifest
    records the key's id), which a node without the key cannot join."""
    import boto3

    client = boto3.client(
        "s3", endpoint_url=s3_server.endpoint_url, region_name=s3_server.region,
        aws_access_key_id=s3_server.access_key, aws_secret_access_key=s3_server.secret_key,
    )  # fmt: skip
    if "my-training" not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket="my-training")
    prefix = f"runs/example-{variable.lower()}"
    snippet = readme_snippet()
    assert 'prefix="runs/example"' in snippet
    key_file = tmp_path / "run.key"
    key_file.write_text(KEY + "\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GRADIENTMAIL_", "AWS_"))},
        **s3_server.env,
        "AWS_ENDPOINT_URL": s3_server.endpoint_url,
        "AWS_DEFAULT_REGION": s3_server.region,
        "PYTHONPATH": str(ROOT),
        variable: KEY if variable == "GRADIENTMAIL_RUN_KEY" else str(key_file),
    }
    code = README_PRELUDE + snippet.replace('prefix="runs/example"', f'prefix="{prefix}"')
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    box = gm.S3Mailbox(
        "my-training", prefix, endpoint_url=s3_server.endpoint_url, region=s3_server.region,
        access_key_id=s3_server.access_key, secret_access_key=s3_server.secret_key,
    )  # fmt: skip
    manifest = gm.records.Manifest.model_validate_json(box.get("manifest.json"))
    assert manifest.key_id == RunKey(KEY).key_id
    import torch

    intruder = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(4)))
    with pytest.raises(gm.RunConfigMismatch, match="the run is signed"):
        gm.Session(intruder, algorithm=gm.DiLoCo(sync_every=100, fragments=8), mailbox=box, learner_id="intruder").open()
