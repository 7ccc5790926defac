"""MinIO, the on-prem mailbox of the deployment kit: an :class:`S3Mailbox` with MinIO's
conventions (path-style addressing, ``host:port`` endpoints, region ``us-east-1``)."""

from __future__ import annotations

import os
from urllib.parse import quote, urlsplit

from gradientmail.errors import InvalidConfig
from gradientmail.mailbox.s3 import S3Mailbox, S3Tuning

__all__ = ["MinioMailbox"]


class MinioMailbox(S3Mailbox):
    """S3 mailbox on a MinIO server.

    Args:
        endpoint: ``host:port`` (scheme from ``secure``) or a full ``http(s)://`` URL.
        access_key, secret_key: MinIO credentials; both None to take them from the
            environment: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (and the rest of
            boto3's chain: ``AWS_SHARED_CREDENTIALS_FILE``, profiles), else
            ``MINIO_ACCESS_KEY``/``MINIO_SECRET_KEY``. Never MinIO's root keys: give a user
            scoped to the run (``gradientmail minio-setup``, docs/security.md). A mailbox URL
            never carries credentials.
        bucket, prefix: as for :class:`S3Mailbox`.
        secure: use https when ``endpoint`` has no scheme.

    Raises:
        InvalidConfig: a malformed endpoint, or only one of the two keys.
    """

    def __init__(
        self,
        endpoint: str,
        access_key: str | None,
        secret_key: str | None,
        bucket: str,
        prefix: str = "",
        *,
        secure: bool = True,
        region: str = "us-east-1",
        tuning: S3Tuning | None = None,
    ) -> None:
        if access_key is None and secret_key is None and not os.environ.get("AWS_ACCESS_KEY_ID"):
            access_key = os.environ.get("MINIO_ACCESS_KEY") or None
            secret_key = os.environ.get("MINIO_SECRET_KEY") or None
            if (access_key is None) != (secret_key is None):
                raise InvalidConfig("MINIO_ACCESS_KEY", "set both MINIO_ACCESS_KEY and MINIO_SECRET_KEY, or neither")
        if "://" not in endpoint:
            endpoint = f"{'https' if secure else 'http'}://{endpoint}"
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
            raise InvalidConfig("endpoint", f"{endpoint!r} is not host:port or http(s)://host:port")
        self._host = parts.netloc
        self._secure = parts.scheme == "https"
        super().__init__(
            bucket,
            prefix,
            endpoint_url=f"{parts.scheme}://{parts.netloc}",
            region=region,
            access_key_id=access_key,
            secret_access_key=secret_key,
            addressing_style="path",
            tuning=tuning,
        )

    @property
    def url(self) -> str:
        """``minio://host:port/bucket/prefix``, without the keys."""
        suffix = "" if self._secure else "?secure=false"
        return f"minio://{self._host}/{self.bucket}/{quote(self.prefix)}{suffix}"
