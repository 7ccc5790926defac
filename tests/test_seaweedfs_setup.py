"""gradientmail seaweedfs-setup against a real SeaweedFS that serves the identities it wrote: the
learners' keys train a run under the prefix and are refused everywhere else; reruns keep them."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import boto3
import numpy as np
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

import gradientmail as gm
from gradientmail import cli
from gradientmail.errors import InvalidConfig
from gradientmail.seaweedfs_setup import learner_actions
from tests.seaweedfs import SeaweedFS

BUCKET, PREFIX = "gradientmail", "runs/compose"
ROOT_USER, ROOT_PASSWORD = "root-admin", "root-password-for-the-test"


def _url(endpoint: str, prefix: str = PREFIX) -> str:
    return f"s3://{BUCKET}/{prefix}?endpoint={endpoint}&region=us-east-1&addressing=path"


def _keys(out: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (out / "storage.env").read_text().splitlines())


def _client(endpoint: str, keys: dict[str, str]):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


@pytest.fixture
def root_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIO_ROOT_USER", ROOT_USER)
    monkeypatch.setenv("MINIO_ROOT_PASSWORD", ROOT_PASSWORD)


@pytest.fixture
def prepared(tmp_path: Path, root_env: None) -> Iterator[tuple[SeaweedFS, Path]]:
    """Step 1 before the server (the endpoint is not known yet and not needed), the server
    started on the file it wrote, then step 2 against it: as compose runs them."""
    out, identities = tmp_path / "run-key", tmp_path / "seaweedfs" / "s3.json"
    code = cli.main(
        ["seaweedfs-setup", "--mailbox", _url("http://127.0.0.1:1"), "--identities", str(identities), "--out", str(out)]
    )
    assert code == 0
    server = SeaweedFS.start(tmp_path / "server", bucket="ready-probe", name="root", s3_config=identities)
    try:
        assert cli.main(["seaweedfs-setup", "--mailbox", _url(server.server.endpoint_url), "--bucket"]) == 0
        yield server, out
    finally:
        server.stop()


def test_the_learners_user_trains_under_the_prefix_and_nowhere_else(prepared, monkeypatch):
    """A two-step Session with the learners' keys commits rounds; the same keys are refused
    outside the prefix, in another bucket and for bucket administration."""
    server, out = prepared
    endpoint, keys = server.server.endpoint_url, _keys(out)
    assert keys["AWS_ACCESS_KEY_ID"] == "gradientmail-learner"
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    model = {"w": np.zeros((64, 8), np.float32)}
    with gm.Session(
        model,
        algorithm=gm.DiLoCo(sync_every=2),
        mailbox=_url(endpoint),
        learner_id="learner-1",
        options=gm.SessionOptions(lease_ttl_s=2.0, poll_interval_s=0.05),
    ) as session:
        for _ in range(6):
            model["w"] += 0.01
            session.step(samples=4)
    learner = _client(endpoint, keys)
    listed = learner.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/")
    assert any("/rounds/" in item["Key"] for item in listed.get("Contents", [])), listed

    def refused(call) -> str:
        with pytest.raises(ClientError) as error:
            call()
        return error.value.response["Error"]["Code"]

    assert refused(lambda: learner.put_object(Bucket=BUCKET, Key="runs/other/x", Body=b"x")) == "AccessDenied"
    assert refused(lambda: learner.get_object(Bucket=BUCKET, Key="outside")) == "AccessDenied"
    assert refused(lambda: learner.list_objects_v2(Bucket=BUCKET, Prefix="")) == "AccessDenied"
    assert refused(lambda: learner.create_bucket(Bucket="another-bucket")) == "AccessDenied"
    root = _client(endpoint, {"AWS_ACCESS_KEY_ID": ROOT_USER, "AWS_SECRET_ACCESS_KEY": ROOT_PASSWORD})
    root.create_bucket(Bucket="another-bucket")
    assert refused(lambda: learner.put_object(Bucket="another-bucket", Key=f"{PREFIX}/x", Body=b"x")) == "AccessDenied"
    rules = root.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]
    assert [rule["ID"] for rule in rules] == ["gradientmail-run-cleanup"]


def test_a_rerun_keeps_the_learners_secret_and_writes_private_files(prepared, capsys):
    server, out = prepared
    before = _keys(out)
    identities = Path(
        server.command_line[[a.startswith("-s3.config=") for a in server.command_line].index(True)].split("=", 1)[1]
    )
    assert (
        cli.main(["seaweedfs-setup", "--mailbox", _url("http://127.0.0.1:1"), "--identities", str(identities), "--out", str(out)])
        == 0
    )
    assert _keys(out) == before
    document = json.loads(identities.read_text())
    learner = [identity for identity in document["identities"] if identity["name"] == "gradientmail-learner"]
    assert learner[0]["credentials"] == [{"accessKey": before["AWS_ACCESS_KEY_ID"], "secretKey": before["AWS_SECRET_ACCESS_KEY"]}]
    assert learner[0]["actions"] == [f"Read:{BUCKET}/{PREFIX}/*", f"Write:{BUCKET}/{PREFIX}/*", f"List:{BUCKET}/{PREFIX}/*"]
    for path in (identities, out / "storage.env", out / "storage.credentials"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert cli.main(["seaweedfs-setup", "--mailbox", _url(server.server.endpoint_url), "--bucket"]) == 0
    assert "bucket gradientmail: exists; lifecycle on runs/compose/: unchanged" in capsys.readouterr().out


def test_learner_actions_cover_the_whole_bucket_only_without_a_prefix():
    assert learner_actions("b", "") == ["Read:b", "Write:b", "List:b"]
    assert learner_actions("b", "/p/q/") == ["Read:b/p/q/*", "Write:b/p/q/*", "List:b/p/q/*"]


def test_bad_invocations_name_what_is_wrong(tmp_path, root_env, capsys):
    url = _url("http://127.0.0.1:1")
    assert cli.main(["seaweedfs-setup", "--mailbox", url, "--identities", str(tmp_path / "s3.json")]) == 2
    assert "--out" in capsys.readouterr().err
    assert (
        cli.main(
            [
                "seaweedfs-setup",
                "--mailbox",
                url,
                "--identities",
                str(tmp_path / "s.json"),
                "--out",
                str(tmp_path),
                "--user",
                ROOT_USER,
            ]
        )
        == 2
    )
    assert "root user" in capsys.readouterr().err
    assert (
        cli.main(["seaweedfs-setup", "--mailbox", "s3://gradientmail/p?endpoint=http://127.0.0.1:9", "--bucket", "--wait", "0"])
        == 2
    )
    assert "SeaweedFS at http://127.0.0.1:9" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["seaweedfs-setup", "--mailbox", url])  # neither step
    with pytest.raises(InvalidConfig, match="--keys"):
        from gradientmail.minio_setup import Target
        from gradientmail.seaweedfs_setup import write_identities

        keys = tmp_path / "keys.env"
        keys.write_text("AWS_ACCESS_KEY_ID=someone-else\nAWS_SECRET_ACCESS_KEY=x\n")
        write_identities(
            Target("http://127.0.0.1:1", BUCKET, PREFIX), ROOT_USER, ROOT_PASSWORD,
            user="gradientmail-learner", out_dir=tmp_path, identities_file=tmp_path / "s3.json", keys_file=keys,
        )  # fmt: skip
