"""``gradientmail minio-setup``: prepare an on-prem MinIO for a run, with its root keys, so that
the learners never hold them.

With MinIO's root credentials (``MINIO_ROOT_USER``/``MINIO_ROOT_PASSWORD``, or the files that
``MINIO_ROOT_USER_FILE``/``MINIO_ROOT_PASSWORD_FILE`` name, as MinIO itself reads them) it

1. creates the run's bucket if it is missing;
2. puts a lifecycle rule on the run's prefix that expires non-current versions after
   :data:`NONCURRENT_DAYS` days and aborts multipart uploads left incomplete for
   :data:`MULTIPART_DAYS` day (never current objects: the syncer's retention deletes old rounds
   itself, and the manifest and leases must live as long as the run); a server without
   lifecycle support (``NotImplemented``) gets a warning, not a failure;
3. adds (or replaces) a policy limited to the prefix (:func:`learner_policy`: get, put, delete
   under ``prefix/``, list with ``s3:prefix`` = ``prefix/*``) and a user holding only it,
   through MinIO's admin API (:class:`minio.MinioAdmin`);
4. writes that user's keys for the learners: ``storage.env`` (``AWS_ACCESS_KEY_ID``,
   ``AWS_SECRET_ACCESS_KEY``) and ``storage.credentials`` (the same keys as boto3's shared
   credentials file, read through ``AWS_SHARED_CREDENTIALS_FILE``), both mode 0600.

A second run changes nothing that is already right: the bucket is kept, the rule replaced by
its id, the user keeps the secret found in ``storage.env``. With ``--keys FILE`` (an env file
like ``storage.env``, e.g. mounted from a Kubernetes Secret) the user gets exactly the secret
in that file, set again on every run.

``gradientmail minio-setup --init-secrets`` is the step before MinIO starts (compose's
``credentials`` service): it writes MinIO's root user and password (and Grafana's admin
password) into files, from the environment when set there (compose passes ``.env``), else
keeping what an earlier start wrote, else random.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

from gradientmail.errors import GradientMailError, InvalidConfig

if TYPE_CHECKING:
    from minio import Minio

__all__ = [
    "LIFECYCLE_RULE_ID",
    "MULTIPART_DAYS",
    "NONCURRENT_DAYS",
    "SetupResult",
    "Target",
    "init_secrets",
    "learner_policy",
    "main",
    "policy_name",
    "root_credentials",
    "setup",
    "target_from_mailbox_url",
]

log = logging.getLogger("gradientmail.minio_setup")

NONCURRENT_DAYS = 3
"""Days a non-current version (what retention deleted, on a versioned bucket) is kept."""
MULTIPART_DAYS = 1
"""Days before an incomplete multipart upload (a crashed writer's parts) is aborted."""
LIFECYCLE_RULE_ID = "gradientmail-run-cleanup"
DEFAULT_WAIT_S = 60.0
"""Seconds a setup waits for its server to answer (compose and the chart start them together)."""
ENV_FILE = "storage.env"
CREDENTIALS_FILE = "storage.credentials"
_ADMIN_ACTIONS_NOTE = "no admin:*, no bucket configuration, nothing outside the prefix"


@dataclass(frozen=True)
class Target:
    """Where the run lives: ``endpoint`` is ``http(s)://host:port``."""

    endpoint: str
    bucket: str
    prefix: str

    @property
    def host(self) -> str:
        return urlsplit(self.endpoint).netloc

    @property
    def secure(self) -> bool:
        return urlsplit(self.endpoint).scheme == "https"


@dataclass(frozen=True)
class SetupResult:
    bucket_created: bool
    lifecycle: str  # "set", "unchanged" or "unsupported"
    user: str
    user_created: bool
    files: tuple[Path, ...]


class _Admin(Protocol):
    """The part of :class:`minio.MinioAdmin` this module uses."""

    def policy_add(self, policy_name: str, policy_file: str | None = None, policy: dict[str, Any] | None = None) -> str: ...
    def user_info(self, access_key: str) -> str: ...
    def user_add(self, access_key: str, secret_key: str) -> str: ...
    def attach_policy(self, policies: list[str], user: str | None = None, group: str | None = None) -> str: ...


def target_from_mailbox_url(url: str) -> Target:
    """The endpoint, bucket and prefix of an ``s3://bucket/prefix?endpoint=…`` or
    ``minio://host:port/bucket/prefix[?secure=false]`` mailbox URL."""
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query))
    if "@" in parts.netloc:
        raise InvalidConfig(
            "mailbox url", "takes no credentials; MinIO's root keys come from MINIO_ROOT_USER/MINIO_ROOT_PASSWORD"
        )
    if parts.scheme == "s3":
        endpoint = params.get("endpoint")
        if not endpoint or not parts.netloc:
            raise InvalidConfig("mailbox url", "an s3:// URL for minio-setup needs a bucket and endpoint=http(s)://host:port")
        bucket, prefix = parts.netloc, unquote(parts.path)
    elif parts.scheme == "minio":
        secure = params.get("secure", "true").lower() not in ("0", "false", "no", "off")
        endpoint = f"{'https' if secure else 'http'}://{parts.netloc}"
        bucket, _, prefix = unquote(parts.path).lstrip("/").partition("/")
        if not parts.netloc or not bucket:
            raise InvalidConfig("mailbox url", "a minio:// URL is minio://host:port/bucket/prefix")
    else:
        raise InvalidConfig("mailbox url", f"minio-setup needs an s3:// or minio:// URL, not {parts.scheme}://")
    endpoint_parts = urlsplit(endpoint)
    if endpoint_parts.scheme not in ("http", "https") or not endpoint_parts.netloc:
        raise InvalidConfig("endpoint", f"{endpoint!r} is not http(s)://host:port")
    return Target(f"{endpoint_parts.scheme}://{endpoint_parts.netloc}", bucket, prefix.strip("/"))


def learner_policy(bucket: str, prefix: str) -> dict[str, Any]:
    """The policy a learner node needs (docs/security.md, "node"): read, write and delete the
    objects under ``prefix/`` and list the bucket only with an ``s3:prefix`` under it; plus
    aborting its own multipart uploads there. An empty prefix grants the whole bucket."""
    prefix = prefix.strip("/")
    objects = f"arn:aws:s3:::{bucket}/{prefix}/*" if prefix else f"arn:aws:s3:::{bucket}/*"
    listing: dict[str, Any] = {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{bucket}"]}
    if prefix:
        listing["Condition"] = {"StringLike": {"s3:prefix": [f"{prefix}/*"]}}
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": [objects],
            },
            listing,
        ],
    }


def policy_name(target: Target) -> str:
    """``gradientmail-<bucket>-<prefix>``, in the characters MinIO accepts in a policy name."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{target.bucket}-{target.prefix}".strip("-")).strip("-")
    return f"gradientmail-{slug}"[:128]


def root_credentials(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """MinIO's root user and password: ``MINIO_ROOT_USER``/``MINIO_ROOT_PASSWORD``, else the
    files named by ``MINIO_ROOT_USER_FILE``/``MINIO_ROOT_PASSWORD_FILE``."""
    env = os.environ if env is None else env
    values = []
    for name in ("MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"):
        value = env.get(name, "")
        if not value and env.get(f"{name}_FILE"):
            try:
                value = Path(env[f"{name}_FILE"]).read_text().strip()
            except OSError as exc:
                raise InvalidConfig(f"{name}_FILE", f"cannot read {env[f'{name}_FILE']!r}: {exc.strerror}") from exc
        if not value:
            raise InvalidConfig(name, f"set {name} or {name}_FILE (MinIO's root credentials, for setup only)")
        values.append(value)
    return values[0], values[1]


def wait_until_answering(target: Target, root_user: str, root_password: str, seconds: float) -> None:
    """Return once the server at ``target`` answers an S3 request (any answer but a 5xx),
    probing once a second for up to ``seconds`` without the SDK's own retries: a setup
    started beside its server (compose, a Job) waits for it to listen. The last error is
    raised when it never does; a refusal (bad keys) is left to the calls that follow."""
    import urllib3
    from minio import Minio
    from minio.error import S3Error, ServerError

    probe = Minio(
        target.host,
        root_user,
        root_password,
        secure=target.secure,
        http_client=urllib3.PoolManager(timeout=urllib3.Timeout(connect=2.0, read=5.0), retries=False),
    )
    deadline = time.monotonic() + seconds
    while True:
        try:
            probe.list_buckets()
            return
        except S3Error:
            return  # it answered
        except (ServerError, urllib3.exceptions.HTTPError, OSError) as exc:
            if time.monotonic() >= deadline:
                raise
            log.info("waiting for the S3 server at %s: %s", target.endpoint, exc)
            time.sleep(1.0)


def ensure_bucket(client: Minio, bucket: str) -> bool:
    if client.bucket_exists(bucket):
        return False
    client.make_bucket(bucket)
    return True


def ensure_lifecycle(client: Minio, target: Target) -> str:
    from minio.commonconfig import ENABLED, Filter
    from minio.error import S3Error
    from minio.lifecycleconfig import AbortIncompleteMultipartUpload, LifecycleConfig, NoncurrentVersionExpiration, Rule

    ours = Rule(
        ENABLED,
        rule_filter=Filter(prefix=f"{target.prefix}/" if target.prefix else ""),
        rule_id=LIFECYCLE_RULE_ID,
        noncurrent_version_expiration=NoncurrentVersionExpiration(noncurrent_days=NONCURRENT_DAYS),
        abort_incomplete_multipart_upload=AbortIncompleteMultipartUpload(days_after_initiation=MULTIPART_DAYS),
    )
    try:
        current = client.get_bucket_lifecycle(target.bucket)
        others = [rule for rule in (current.rules if current else []) if rule.rule_id != LIFECYCLE_RULE_ID]
        mine = [rule for rule in (current.rules if current else []) if rule.rule_id == LIFECYCLE_RULE_ID]
        if mine and _xml(LifecycleConfig([mine[0]])) == _xml(LifecycleConfig([ours])):
            return "unchanged"
        client.set_bucket_lifecycle(target.bucket, LifecycleConfig([*others, ours]))
    except S3Error as exc:
        if exc.code in ("NotImplemented", "NotImplementedError"):
            log.warning(
                "the server does not support bucket lifecycle (%s): set one by hand that expires non-current "
                "versions and aborts incomplete multipart uploads under %s/ (docs/deploy.md)",
                exc.code,
                target.prefix,
            )
            return "unsupported"
        raise
    return "set"


def _xml(config: Any) -> bytes:
    from xml.etree import ElementTree

    return ElementTree.tostring(config.toxml(None))


def read_env_file(path: Path) -> dict[str, str]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def write_private(path: Path, text: str, owner: tuple[int, int] | None = None) -> None:
    """Write ``text`` to ``path`` atomically, mode 0600 (and owner ``uid, gid`` when given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.chmod(temporary, 0o600)
        if owner is not None:
            os.chown(temporary, *owner)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def known_secret(user: str, out_dir: Path, keys_file: Path | None = None) -> str:
    """The learners' secret an earlier setup wrote to ``out_dir/storage.env`` for ``user`` ("" if
    none), or the one in ``keys_file`` (which must hold it): a rerun keeps the learners' keys."""
    known = read_env_file(out_dir / ENV_FILE if keys_file is None else keys_file)
    secret = known.get("AWS_SECRET_ACCESS_KEY", "").strip() if known.get("AWS_ACCESS_KEY_ID", "").strip() == user else ""
    if keys_file is not None and not secret:
        raise InvalidConfig("--keys", f"{keys_file} holds no AWS_SECRET_ACCESS_KEY for AWS_ACCESS_KEY_ID={user}")
    return secret


def write_learner_keys(out_dir: Path, user: str, secret: str, owner: tuple[int, int] | None = None) -> tuple[Path, Path]:
    """The learners' keys as ``storage.env`` and boto3's ``storage.credentials``, mode 0600."""
    env_file, credentials_file = out_dir / ENV_FILE, out_dir / CREDENTIALS_FILE
    write_private(env_file, f"AWS_ACCESS_KEY_ID={user}\nAWS_SECRET_ACCESS_KEY={secret}\n", owner)
    write_private(credentials_file, f"[default]\naws_access_key_id = {user}\naws_secret_access_key = {secret}\n", owner)
    return env_file, credentials_file


def _ensure_user(admin: _Admin, target: Target, user: str, out_dir: Path, keys_file: Path | None = None) -> tuple[str, bool]:
    """The scoped user's secret (kept from ``storage.env`` when it is this user's; from
    ``keys_file`` when given, always set then) and whether the user was created now."""
    from minio.error import MinioAdminException

    name = policy_name(target)
    admin.policy_add(name, policy=learner_policy(target.bucket, target.prefix))
    secret = known_secret(user, out_dir, keys_file)
    try:
        info = json.loads(admin.user_info(user))
        exists = True
    except MinioAdminException:
        info, exists = {}, False
    if not exists or not secret or keys_file is not None:
        secret = secret or secrets.token_hex(20)
        admin.user_add(user, secret)  # creates the user, or sets a new secret when storage.env was lost
    attached = [p for p in str(info.get("policyName", "")).split(",") if p]
    if name not in attached:
        admin.attach_policy([name], user=user)
    return secret, not exists


def check_learner_user(user: str, root_user: str) -> None:
    """The learners' access key: one a server accepts, and never the root user's."""
    if len(user) < 3 or not re.fullmatch(r"[A-Za-z0-9_.@=,+-]+", user):
        raise InvalidConfig("user", f"{user!r} is not an access key (3+ of letters, digits, _.@=,+-)")
    if user == root_user:
        raise InvalidConfig("user", "the learners' user must not be the server's root user")


def setup(
    target: Target,
    root_user: str,
    root_password: str,
    *,
    user: str,
    out_dir: Path,
    owner: tuple[int, int] | None = None,
    client: Minio | None = None,
    admin: _Admin | None = None,
    keys_file: Path | None = None,
    wait_s: float = 0.0,
) -> SetupResult:
    """Steps 1-4 of the module's description against ``target``, once the server answers
    (waiting up to ``wait_s``); ``client`` and ``admin`` default to the SDK's, made from the
    root credentials."""
    from minio import Minio, MinioAdmin
    from minio.credentials.providers import StaticProvider

    check_learner_user(user, root_user)
    client = client or Minio(target.host, root_user, root_password, secure=target.secure)
    if admin is None:
        admin = MinioAdmin(endpoint=target.host, credentials=StaticProvider(root_user, root_password), secure=target.secure)
    wait_until_answering(target, root_user, root_password, wait_s)
    created = ensure_bucket(client, target.bucket)
    lifecycle = ensure_lifecycle(client, target)
    secret, user_created = _ensure_user(admin, target, user, out_dir, keys_file)
    files = write_learner_keys(out_dir, user, secret, owner)
    return SetupResult(created, lifecycle, user, user_created, files)


def _secret_value(path: Path, given: str | None, make: str) -> str:
    if given:
        return given
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    return kept or make


def init_secrets(
    minio_dir: Path | None,
    grafana_dir: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    minio_owner: tuple[int, int] | None = None,
    grafana_owner: tuple[int, int] | None = None,
) -> list[Path]:
    """Write ``minio_dir/root-user``, ``minio_dir/root-password`` (for ``MINIO_ROOT_*_FILE``)
    and ``grafana_dir/admin-password`` (for ``GF_SECURITY_ADMIN_PASSWORD__FILE``), mode 0600:
    from ``MINIO_ROOT_USER``/``MINIO_ROOT_PASSWORD``/``GRAFANA_ADMIN_PASSWORD`` when set, else
    what an earlier call wrote, else random."""
    env = os.environ if env is None else env
    written: list[Path] = []
    if minio_dir is not None:
        for name, variable, fresh in (
            ("root-user", "MINIO_ROOT_USER", f"admin-{secrets.token_hex(6)}"),
            ("root-password", "MINIO_ROOT_PASSWORD", secrets.token_urlsafe(30)),
        ):
            path = minio_dir / name
            write_private(path, _secret_value(path, env.get(variable), fresh) + "\n", minio_owner)
            written.append(path)
    if grafana_dir is not None:
        path = grafana_dir / "admin-password"
        write_private(
            path, _secret_value(path, env.get("GRAFANA_ADMIN_PASSWORD"), secrets.token_urlsafe(24)) + "\n", grafana_owner
        )
        written.append(path)
    return written


def parse_owner(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    match = re.fullmatch(r"(\d+):(\d+)", text)
    if not match:
        raise InvalidConfig("owner", f"{text!r} is not UID:GID")
    return int(match.group(1)), int(match.group(2))


def add_wait_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"how long to wait for the server to answer (default {DEFAULT_WAIT_S:g})",
    )


def add_mailbox_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mailbox",
        default=os.environ.get("GRADIENTMAIL_MAILBOX"),
        help="the run's mailbox URL, s3://bucket/prefix?endpoint=http://host:9000 or minio://host:9000/bucket/prefix "
        "(default: GRADIENTMAIL_MAILBOX)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_mailbox_argument(parser)
    parser.add_argument("--user", default="gradientmail-learner", help="the learners' MinIO user (access key)")
    parser.add_argument("--out", type=Path, help=f"directory for {ENV_FILE} and {CREDENTIALS_FILE} (mode 0600)")
    parser.add_argument("--owner", help="UID:GID to own the written files (when run as root)")
    parser.add_argument(
        "--keys",
        type=Path,
        help=f"an env file like {ENV_FILE} (e.g. from a Kubernetes Secret) whose AWS_SECRET_ACCESS_KEY the user gets",
    )
    add_wait_argument(parser)
    parser.add_argument(
        "--init-secrets",
        action="store_true",
        help="only write MinIO's root user/password (and Grafana's admin password) files and exit",
    )
    parser.add_argument("--minio-secrets", type=Path, help="with --init-secrets: directory for root-user, root-password")
    parser.add_argument("--grafana-secrets", type=Path, help="with --init-secrets: directory for admin-password")
    parser.add_argument("--grafana-owner", help="with --init-secrets: UID:GID to own admin-password")


def run(args: argparse.Namespace) -> int:
    if args.init_secrets:
        if args.minio_secrets is None and args.grafana_secrets is None:
            raise InvalidConfig("--init-secrets", "give --minio-secrets DIR and/or --grafana-secrets DIR")
        for path in init_secrets(
            args.minio_secrets,
            args.grafana_secrets,
            minio_owner=parse_owner(args.owner),
            grafana_owner=parse_owner(args.grafana_owner),
        ):
            print(f"ready: {path}")
        return 0
    if not args.mailbox:
        raise InvalidConfig("--mailbox", "give the run's mailbox URL (or set GRADIENTMAIL_MAILBOX)")
    if args.out is None:
        raise InvalidConfig("--out", "give the directory the learners read their keys from")
    target = target_from_mailbox_url(args.mailbox)
    root_user, root_password = root_credentials()
    from minio.error import MinioAdminException, MinioException
    from urllib3.exceptions import HTTPError

    try:
        result = setup(
            target,
            root_user,
            root_password,
            user=args.user,
            out_dir=args.out,
            owner=parse_owner(args.owner),
            keys_file=args.keys,
            wait_s=args.wait,
        )
    except GradientMailError:
        raise
    except (MinioException, MinioAdminException, HTTPError, OSError, ValueError) as exc:
        raise GradientMailError(f"MinIO at {target.endpoint}: {exc}") from exc
    print(
        f"bucket {target.bucket}: {'created' if result.bucket_created else 'exists'}; lifecycle on {target.prefix}/: "
        f"{result.lifecycle}; user {result.user} ({'created' if result.user_created else 'exists'}) with policy "
        f"{policy_name(target)} ({_ADMIN_ACTIONS_NOTE}); keys in {', '.join(str(p) for p in result.files)}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gradientmail minio-setup", description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except GradientMailError as exc:
        print(f"minio-setup: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
