"""``gradientmail seaweedfs-setup``: prepare a SeaweedFS S3 server for a run, the way
``gradientmail minio-setup`` prepares MinIO, so that the learners never hold the root keys.

SeaweedFS has no admin API for users: its S3 gateway reads its identities from a JSON file
(``weed … -s3.config FILE``) when it starts. So the setup has two steps, one on each side of
the server's start:

1. ``--identities FILE`` (before the server): writes that file with two identities, the root
   user (MinIO's ``MINIO_ROOT_USER``/``MINIO_ROOT_PASSWORD`` or their ``_FILE`` variables, as
   ``minio-setup`` reads them) and the learners' user, whose actions are scoped to the run's
   prefix (:func:`learner_actions`: ``Read``, ``Write`` and ``List`` on ``bucket/prefix/*``;
   SeaweedFS refuses the learners anything else, other prefixes and buckets included), and
   writes that user's keys for the learners (``storage.env``, ``storage.credentials``, mode
   0600). A rerun keeps the learners' secret found in ``storage.env`` (or takes the one in
   ``--keys FILE``), so restarting the server does not change the learners' keys.
2. ``--bucket`` (once the server answers): with the root keys, creates the run's bucket and
   puts ``minio-setup``'s lifecycle rule on the prefix (the same calls: MinIO's SDK speaks S3).

Both are idempotent. compose runs them as ``seaweedfs-identities`` and ``minio-setup`` in
``compose.seaweedfs.yaml``; the chart with ``minio.server=seaweedfs`` runs step 1 in the
server's init container and step 2 in its setup Job.
"""

from __future__ import annotations

import argparse
import json
import secrets
from pathlib import Path
from typing import Any

from gradientmail import minio_setup
from gradientmail.errors import GradientMailError, InvalidConfig
from gradientmail.minio_setup import Target

__all__ = ["identities", "learner_actions", "prepare_bucket", "write_identities"]

ROOT_ACTIONS = ("Admin", "Read", "Write", "List", "Tagging")


def learner_actions(bucket: str, prefix: str) -> list[str]:
    """The learners' SeaweedFS actions: read, write (put, delete, multipart) and list, only under
    ``prefix/`` of ``bucket`` (the whole bucket when the prefix is empty). The same grant as
    :func:`gradientmail.minio_setup.learner_policy`, in SeaweedFS's ``Action:resource`` form."""
    prefix = prefix.strip("/")
    resource = f"{bucket}/{prefix}/*" if prefix else bucket
    return [f"{action}:{resource}" for action in ("Read", "Write", "List")]


def identities(target: Target, root_user: str, root_password: str, user: str, secret: str) -> dict[str, Any]:
    """The ``-s3.config`` document: the root identity and the learners' scoped one."""
    return {
        "identities": [
            {
                "name": "root",
                "credentials": [{"accessKey": root_user, "secretKey": root_password}],
                "actions": list(ROOT_ACTIONS),
            },
            {
                "name": user,
                "credentials": [{"accessKey": user, "secretKey": secret}],
                "actions": learner_actions(target.bucket, target.prefix),
            },
        ]
    }


def write_identities(
    target: Target,
    root_user: str,
    root_password: str,
    *,
    user: str,
    out_dir: Path,
    identities_file: Path,
    owner: tuple[int, int] | None = None,
    keys_file: Path | None = None,
) -> tuple[Path, ...]:
    """Step 1 of the module's description; the files written."""
    minio_setup.check_learner_user(user, root_user)
    secret = minio_setup.known_secret(user, out_dir, keys_file) or secrets.token_hex(20)
    document = json.dumps(identities(target, root_user, root_password, user, secret), indent=2) + "\n"
    minio_setup.write_private(identities_file, document, owner)
    return (identities_file, *minio_setup.write_learner_keys(out_dir, user, secret, owner))


def prepare_bucket(target: Target, root_user: str, root_password: str, wait_s: float = 0.0) -> tuple[bool, str]:
    """Step 2, once the server answers (waiting up to ``wait_s``): whether the bucket was
    created now, and the lifecycle rule's outcome."""
    from minio import Minio

    minio_setup.wait_until_answering(target, root_user, root_password, wait_s)
    client = Minio(target.host, root_user, root_password, secure=target.secure)
    return minio_setup.ensure_bucket(client, target.bucket), minio_setup.ensure_lifecycle(client, target)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    minio_setup.add_mailbox_argument(parser)
    step = parser.add_mutually_exclusive_group(required=True)
    step.add_argument("--identities", type=Path, help="before the server starts: write its -s3.config file here")
    step.add_argument("--bucket", action="store_true", help="once the server answers: create the bucket, set the lifecycle")
    parser.add_argument("--user", default="gradientmail-learner", help="the learners' access key")
    parser.add_argument("--out", type=Path, help="with --identities: directory for storage.env and storage.credentials")
    parser.add_argument("--owner", help="UID:GID to own the written files (when run as root)")
    parser.add_argument("--keys", type=Path, help="with --identities: an env file like storage.env whose secret the user gets")
    minio_setup.add_wait_argument(parser)


def run(args: argparse.Namespace) -> int:
    if not args.mailbox:
        raise InvalidConfig("--mailbox", "give the run's mailbox URL (or set GRADIENTMAIL_MAILBOX)")
    target = minio_setup.target_from_mailbox_url(args.mailbox)
    root_user, root_password = minio_setup.root_credentials()
    if args.identities is not None:
        if args.out is None:
            raise InvalidConfig("--out", "give the directory the learners read their keys from")
        files = write_identities(
            target,
            root_user,
            root_password,
            user=args.user,
            out_dir=args.out,
            identities_file=args.identities,
            owner=minio_setup.parse_owner(args.owner),
            keys_file=args.keys,
        )
        print(
            f"identities for SeaweedFS: root and {args.user} ({', '.join(learner_actions(target.bucket, target.prefix))}); "
            f"written: {', '.join(str(path) for path in files)}"
        )
        return 0
    from minio.error import MinioException
    from urllib3.exceptions import HTTPError

    try:
        created, lifecycle = prepare_bucket(target, root_user, root_password, args.wait)
    except (MinioException, HTTPError, OSError, ValueError) as exc:
        raise GradientMailError(f"SeaweedFS at {target.endpoint}: {exc}") from exc
    print(f"bucket {target.bucket}: {'created' if created else 'exists'}; lifecycle on {target.prefix}/: {lifecycle}")
    return 0
