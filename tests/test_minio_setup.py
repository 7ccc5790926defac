"""gradientmail minio-setup: the bucket and lifecycle calls against SeaweedFS through the SDK code
path the command uses, the scoped policy by evaluating it, the admin steps against a recording
stand-in (no MinIO server runs here), the secrets it writes."""

from __future__ import annotations

import fnmatch
import json
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
from minio import Minio
from minio.error import MinioAdminException

from gradientmail import cli
from gradientmail.errors import InvalidConfig
from gradientmail.minio_setup import (
    LIFECYCLE_RULE_ID,
    Target,
    init_secrets,
    learner_policy,
    policy_name,
    root_credentials,
    setup,
    target_from_mailbox_url,
)
from tests.seaweedfs import S3Server

# -- the policy, evaluated ------------------------------------------------------------------


def _allowed(policy: dict[str, Any], action: str, resource: str, context: dict[str, str] | None = None) -> bool:
    """IAM-style evaluation for Allow statements (no Deny in the document): some statement
    names the action and the resource (``*`` wildcards) and all its StringLike conditions hold."""
    context = context or {}
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        if not any(fnmatch.fnmatchcase(action, pattern) for pattern in actions):
            continue
        if not any(fnmatch.fnmatchcase(resource, pattern) for pattern in resources):
            continue
        conditions = statement.get("Condition", {})
        assert set(conditions) <= {"StringLike"}, conditions
        if all(
            key in context and any(fnmatch.fnmatchcase(context[key], p) for p in (pats if isinstance(pats, list) else [pats]))
            for key, pats in conditions.get("StringLike", {}).items()
        ):
            return True
    return False


POLICY = learner_policy("gradientmail", "runs/compose")
OBJECT_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]


@pytest.mark.parametrize("action", [*OBJECT_ACTIONS, "s3:AbortMultipartUpload"])
@pytest.mark.parametrize("key", ["runs/compose/manifest.json", "runs/compose/fragments/0/v1/round.json"])
def test_the_policy_allows_the_nodes_object_actions_under_the_prefix(action, key):
    assert _allowed(POLICY, action, f"arn:aws:s3:::gradientmail/{key}")


@pytest.mark.parametrize("prefix", ["runs/compose/", "runs/compose/fragments/"])
def test_the_policy_allows_listing_with_the_prefix(prefix):
    assert _allowed(POLICY, "s3:ListBucket", "arn:aws:s3:::gradientmail", {"s3:prefix": prefix})


@pytest.mark.parametrize("action", OBJECT_ACTIONS)
@pytest.mark.parametrize(
    "resource",
    [
        "arn:aws:s3:::gradientmail/runs/other/manifest.json",
        "arn:aws:s3:::gradientmail/runs/compose-2/manifest.json",  # a neighbour sharing the name's start
        "arn:aws:s3:::gradientmail/runs/compose",  # the prefix itself, not under it
        "arn:aws:s3:::gradientmail/manifest.json",
        "arn:aws:s3:::other-bucket/runs/compose/manifest.json",
    ],
)
def test_the_policy_denies_other_prefixes_and_buckets(action, resource):
    assert not _allowed(POLICY, action, resource)


@pytest.mark.parametrize(
    "resource, context",
    [
        ("arn:aws:s3:::gradientmail", {}),  # no prefix: the whole bucket
        ("arn:aws:s3:::gradientmail", {"s3:prefix": ""}),
        ("arn:aws:s3:::gradientmail", {"s3:prefix": "runs/"}),
        ("arn:aws:s3:::gradientmail", {"s3:prefix": "runs/compose-2/"}),
        ("arn:aws:s3:::other-bucket", {"s3:prefix": "runs/compose/"}),
    ],
)
def test_the_policy_denies_listing_elsewhere(resource, context):
    assert not _allowed(POLICY, "s3:ListBucket", resource, context)


@pytest.mark.parametrize(
    "action",
    [
        "admin:CreateUser",
        "admin:*",
        "s3:CreateBucket",
        "s3:DeleteBucket",
        "s3:PutBucketPolicy",
        "s3:PutLifecycleConfiguration",
        "s3:PutBucketVersioning",
        "s3:ListAllMyBuckets",
        "s3:*",
    ],
)
def test_the_policy_denies_admin_and_bucket_actions(action):
    for resource in ("arn:aws:s3:::gradientmail", "arn:aws:s3:::gradientmail/runs/compose/x", "arn:aws:s3:::*", "*"):
        assert not _allowed(POLICY, action, resource, {"s3:prefix": "runs/compose/"})


def test_the_policy_is_the_documented_node_policy():
    # docs/security.md, "node": Get/Put/Delete on prefix/*, ListBucket with s3:prefix = prefix/*
    statements = POLICY["Statement"]
    assert statements[0]["Resource"] == ["arn:aws:s3:::gradientmail/runs/compose/*"]
    assert statements[1]["Condition"] == {"StringLike": {"s3:prefix": ["runs/compose/*"]}}
    assert json.loads(json.dumps(POLICY)) == POLICY
    whole = learner_policy("b", "")
    assert _allowed(whole, "s3:GetObject", "arn:aws:s3:::b/anything")
    assert not _allowed(whole, "s3:GetObject", "arn:aws:s3:::c/anything")


# -- URLs and root credentials --------------------------------------------------------------


def test_the_target_comes_from_the_mailbox_url():
    assert target_from_mailbox_url(
        "s3://gradientmail/runs/compose?endpoint=http://minio:9000&region=us-east-1&addressing=path"
    ) == Target("http://minio:9000", "gradientmail", "runs/compose")
    target = target_from_mailbox_url("minio://minio.local:9000/bucket/runs/a/?secure=false")
    assert target == Target("http://minio.local:9000", "bucket", "runs/a")
    assert (target.host, target.secure) == ("minio.local:9000", False)
    assert policy_name(target) == "gradientmail-bucket-runs-a"
    for bad in ("s3://bucket/x", "file:///x", "minio://k:s@host:9000/b/x", "s3://b/x?endpoint=ftp://h"):
        with pytest.raises(InvalidConfig):
            target_from_mailbox_url(bad)


def test_root_credentials_from_variables_or_files(tmp_path):
    assert root_credentials({"MINIO_ROOT_USER": "u", "MINIO_ROOT_PASSWORD": "p"}) == ("u", "p")
    (tmp_path / "user").write_text("file-user\n")
    (tmp_path / "password").write_text("file-password\n")
    env = {"MINIO_ROOT_USER_FILE": str(tmp_path / "user"), "MINIO_ROOT_PASSWORD_FILE": str(tmp_path / "password")}
    assert root_credentials(env) == ("file-user", "file-password")
    with pytest.raises(InvalidConfig, match="MINIO_ROOT_PASSWORD"):
        root_credentials({"MINIO_ROOT_USER": "u"})


# -- the setup against SeaweedFS -------------------------------------------------------------


class RecordingAdmin:
    """What MinioAdmin does for the calls minio-setup makes, kept in memory."""

    def __init__(self) -> None:
        self.policies: dict[str, dict[str, Any]] = {}
        self.users: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []

    def policy_add(self, policy_name: str, policy_file: str | None = None, policy: dict[str, Any] | None = None) -> str:
        self.calls.append(f"policy_add {policy_name}")
        assert policy is not None
        self.policies[policy_name] = policy
        return ""

    def user_info(self, access_key: str) -> str:
        if access_key not in self.users:
            raise MinioAdminException("404", '{"Code":"XMinioAdminNoSuchUser"}')
        user = self.users[access_key]
        return json.dumps({"status": "enabled", "policyName": ",".join(user["policies"])})

    def user_add(self, access_key: str, secret_key: str) -> str:
        self.calls.append(f"user_add {access_key}")
        self.users.setdefault(access_key, {"policies": []})["secret"] = secret_key
        return ""

    def attach_policy(self, policies: list[str], user: str | None = None, group: str | None = None) -> str:
        self.calls.append(f"attach_policy {policies} {user}")
        assert user is not None and not set(policies) & set(self.users[user]["policies"]), "already in effect"
        self.users[user]["policies"] += policies
        return ""


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_setup_against_seaweedfs_is_idempotent(s3_server: S3Server, tmp_path, caplog):
    host = s3_server.endpoint_url.removeprefix("http://")
    bucket = f"setup-{uuid.uuid4().hex[:12]}"
    target = Target(s3_server.endpoint_url, bucket, "runs/compose")
    # the SDK client the command builds from the root keys, pointed at SeaweedFS
    client = Minio(host, s3_server.access_key, s3_server.secret_key, secure=False, region=s3_server.region)
    admin = RecordingAdmin()
    out = tmp_path / "creds"
    first = setup(target, s3_server.access_key, s3_server.secret_key, user="gm-learner", out_dir=out, client=client, admin=admin)
    assert first.bucket_created and client.bucket_exists(bucket)
    assert first.lifecycle in ("set", "unsupported")
    if first.lifecycle == "set":
        (rule,) = [r for r in client.get_bucket_lifecycle(bucket).rules if r.rule_id == LIFECYCLE_RULE_ID]
        assert rule.rule_filter.prefix == "runs/compose/"
        assert rule.expiration is None  # current objects are the protocol's to delete
    else:
        assert "does not support bucket lifecycle" in caplog.text
    assert first.user_created
    name = policy_name(target)
    assert admin.policies == {name: learner_policy(bucket, "runs/compose")}
    assert admin.users["gm-learner"]["policies"] == [name]
    secret = admin.users["gm-learner"]["secret"]
    assert len(secret) >= 32 and secret != s3_server.secret_key
    env_file, credentials_file = first.files
    for path in first.files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _env(env_file) == {"AWS_ACCESS_KEY_ID": "gm-learner", "AWS_SECRET_ACCESS_KEY": secret}
    assert f"aws_secret_access_key = {secret}" in credentials_file.read_text()
    assert s3_server.secret_key not in env_file.read_text() + credentials_file.read_text()

    calls = len(admin.calls)
    second = setup(target, s3_server.access_key, s3_server.secret_key, user="gm-learner", out_dir=out, client=client, admin=admin)
    assert not second.bucket_created and not second.user_created
    assert second.lifecycle in ("unchanged", "unsupported")
    assert admin.calls[calls:] == [f"policy_add {name}"]  # the policy refreshed; the user and its secret kept
    assert _env(env_file)["AWS_SECRET_ACCESS_KEY"] == secret

    # the keys file lost: the user gets a new secret, written again
    env_file.unlink()
    third = setup(target, s3_server.access_key, s3_server.secret_key, user="gm-learner", out_dir=out, client=client, admin=admin)
    assert not third.user_created and _env(env_file)["AWS_SECRET_ACCESS_KEY"] == admin.users["gm-learner"]["secret"] != secret


@pytest.mark.s3
def test_setup_gives_the_user_the_secret_of_a_keys_file_every_time(s3_server: S3Server, tmp_path):
    """The chart's setup Job: the user's secret is the one in the mounted Secret (--keys), set
    again on each run, so a regenerated Secret is followed; a file without it is refused."""
    host = s3_server.endpoint_url.removeprefix("http://")
    target = Target(s3_server.endpoint_url, f"keys-{uuid.uuid4().hex[:12]}", "runs/chart")
    client = Minio(host, s3_server.access_key, s3_server.secret_key, secure=False, region=s3_server.region)
    admin = RecordingAdmin()
    keys = tmp_path / "storage.env"
    for secret in ("first-secret-0123456789abcdef", "second-secret-0123456789abcdef"):
        keys.write_text(f"AWS_ACCESS_KEY_ID=gm-learner\nAWS_SECRET_ACCESS_KEY={secret}\n")
        result = setup(
            target, s3_server.access_key, s3_server.secret_key, user="gm-learner", out_dir=tmp_path / "out", client=client,
            admin=admin, keys_file=keys,
        )  # fmt: skip
        assert admin.users["gm-learner"]["secret"] == secret == _env(result.files[0])["AWS_SECRET_ACCESS_KEY"]
    keys.write_text("AWS_ACCESS_KEY_ID=someone-else\nAWS_SECRET_ACCESS_KEY=x\n")
    with pytest.raises(InvalidConfig, match="--keys"):
        setup(
            target,
            s3_server.access_key,
            s3_server.secret_key,
            user="gm-learner",
            out_dir=tmp_path,
            admin=admin,
            client=client,
            keys_file=keys,
        )


def test_setup_refuses_the_root_user_as_the_learners(tmp_path):
    with pytest.raises(InvalidConfig, match="root"):
        setup(Target("http://127.0.0.1:1", "b", "p"), "root", "pw", user="root", out_dir=tmp_path, admin=RecordingAdmin())


def test_the_cli_reports_missing_root_credentials(monkeypatch, capsys, tmp_path):
    for name in ("MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD", "MINIO_ROOT_USER_FILE", "MINIO_ROOT_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)
    code = cli.main(["minio-setup", "--mailbox", "minio://127.0.0.1:1/b/p?secure=false", "--out", str(tmp_path)])
    assert code == 2 and "MINIO_ROOT_USER" in capsys.readouterr().err


def test_the_cli_reports_an_unreachable_minio(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("MINIO_ROOT_USER", "root")
    monkeypatch.setenv("MINIO_ROOT_PASSWORD", "password")
    code = cli.main(
        ["minio-setup", "--mailbox", "s3://bucket/p?endpoint=http://127.0.0.1:9", "--out", str(tmp_path), "--wait", "0"]
    )
    assert code == 2 and "MinIO at http://127.0.0.1:9" in capsys.readouterr().err


def test_the_cli_waits_for_the_server_before_it_gives_up(monkeypatch, capsys, caplog, tmp_path):
    """--wait: a setup started beside its server (compose, a Job) polls until it answers."""
    monkeypatch.setenv("MINIO_ROOT_USER", "root")
    monkeypatch.setenv("MINIO_ROOT_PASSWORD", "password")
    caplog.set_level("INFO", logger="gradientmail.minio_setup")
    url = "s3://bucket/p?endpoint=http://127.0.0.1:9"
    assert cli.main(["minio-setup", "--mailbox", url, "--out", str(tmp_path), "--wait", "1"]) == 2
    assert "MinIO at http://127.0.0.1:9" in capsys.readouterr().err
    assert any("waiting for the S3 server" in record.getMessage() for record in caplog.records)


# -- the secrets compose generates -------------------------------------------------------------


def test_init_secrets_takes_the_environment_else_keeps_else_generates(tmp_path):
    minio, grafana = tmp_path / "minio", tmp_path / "grafana"
    init_secrets(minio, grafana, env={})
    user, password = (minio / "root-user").read_text().strip(), (minio / "root-password").read_text().strip()
    admin = (grafana / "admin-password").read_text().strip()
    assert len(password) >= 32 and len(admin) >= 24 and user.startswith("admin-")
    for path in (minio / "root-user", minio / "root-password", grafana / "admin-password"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    init_secrets(minio, grafana, env={})  # a second start keeps them
    assert (minio / "root-password").read_text().strip() == password
    assert (grafana / "admin-password").read_text().strip() == admin
    init_secrets(minio, None, env={"MINIO_ROOT_USER": "from-env", "MINIO_ROOT_PASSWORD": "from-env-password"})
    assert root_credentials(
        {"MINIO_ROOT_USER_FILE": str(minio / "root-user"), "MINIO_ROOT_PASSWORD_FILE": str(minio / "root-password")}
    ) == ("from-env", "from-env-password")
    other = tmp_path / "other"
    init_secrets(other, None, env={})
    assert (other / "root-password").read_text() != (minio / "root-password").read_text()
