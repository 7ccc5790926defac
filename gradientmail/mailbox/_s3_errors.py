"""Translate botocore's exceptions into GradientMail's, at the S3 store's boundary.

Every message is one line naming the operation, the object or bucket and the endpoint, so
a user can tell a typo in the bucket from a dead server without reading a traceback.
botocore is imported only when a translation is needed (boto3 is an optional extra).
"""

from __future__ import annotations

from typing import Any

from gradientmail.errors import (
    KeyNotFound,
    MailboxError,
    MailboxMisconfigured,
    MailboxUnavailable,
    VersionConflict,
)

__all__ = ["error_code", "http_status", "is_transport_error", "translate", "stream_errors"]

_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
        "AccountProblem",
        "InvalidSecurity",
    }
)
_BUSY_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeoutException",
        "ServiceUnavailable",
        "InternalError",
        "ConditionalRequestConflict",
        "OperationAborted",
    }
)


def error_code(exc: Any) -> str:
    """The S3 error code of a botocore ``ClientError`` (``"NoSuchKey"``, ``"412"``, …)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def http_status(exc: Any) -> int:
    """The HTTP status of a botocore ``ClientError``, or 0 when unknown."""
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def is_transport_error(exc: BaseException) -> bool:
    """True for anything botocore, urllib3 or the socket layer may raise from a call."""
    from botocore.exceptions import BotoCoreError, ClientError
    from urllib3.exceptions import HTTPError

    return isinstance(exc, (BotoCoreError, ClientError, HTTPError, OSError))


def stream_errors() -> tuple[type[BaseException], ...]:
    """Errors raised while reading a response body that a fresh request may cure."""
    from botocore import exceptions as bx
    from urllib3.exceptions import HTTPError

    return (bx.HTTPClientError, bx.IncompleteReadError, bx.ChecksumError, HTTPError, OSError)


def translate(exc: BaseException, *, operation: str, bucket: str, object_key: str | None, endpoint: str) -> MailboxError:
    """Return the GradientMail error for a botocore (or transport) exception."""
    from botocore import exceptions as bx

    where = f"s3://{bucket}/{object_key}" if object_key else f"bucket {bucket!r}"
    context = f"S3 {operation} of {where} at {endpoint}"
    during = f"(S3 {operation} of {where})"
    if isinstance(exc, bx.ClientError):
        code = error_code(exc)
        status = http_status(exc)
        detail = _one_line(exc.response.get("Error", {}).get("Message", "")) or code
        if code == "NoSuchBucket":
            return MailboxMisconfigured(f"bucket {bucket!r} does not exist at {endpoint} {during}")
        if code in ("NoSuchKey", "NotFound") or (status == 404 and object_key and code == "404"):
            return KeyNotFound(f"{where} not found at {endpoint}")
        if code in _ACCESS_CODES or status == 403:
            return MailboxMisconfigured(
                f"{context} was denied ({code}): check the credentials and that they may read and write this bucket and prefix"
            )
        if code == "PreconditionFailed" or status == 412:
            return VersionConflict(f"{context}: a condition on the object no longer holds")
        if code == "NotImplemented" or status == 501:
            return MailboxMisconfigured(
                f"{context}: the store does not implement this request ({detail}); "
                f"GradientMail needs conditional writes (If-None-Match, If-Match)"
            )
        if code in ("PermanentRedirect", "AuthorizationHeaderMalformed") or status == 301:
            return MailboxMisconfigured(f"{context}: wrong region or endpoint for this bucket ({detail})")
        if code in _BUSY_CODES or status >= 500 or status == 429:
            return MailboxUnavailable(f"{context} kept failing after retries: {code or status} {detail}")
        return MailboxMisconfigured(f"{context} was refused: {code or status} {detail}")
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.CredentialRetrievalError)):
        return MailboxMisconfigured(
            f"no usable S3 credentials for bucket {bucket!r} at {endpoint}: "
            f"{_one_line(exc)} (set a profile, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or pass keys)"
        )
    if isinstance(exc, bx.SSLError):
        return MailboxMisconfigured(f"{context}: TLS failed ({_one_line(exc)})")
    if isinstance(exc, (bx.ConnectionError, bx.EndpointConnectionError)):
        return MailboxUnavailable(f"cannot reach the S3 endpoint {endpoint} for bucket {bucket!r}: {_one_line(exc)}")
    if isinstance(exc, (bx.HTTPClientError, bx.IncompleteReadError, bx.ChecksumError, bx.CapacityNotAvailableError)):
        return MailboxUnavailable(f"{context} kept failing after retries: {_one_line(exc)}")
    if isinstance(exc, bx.BotoCoreError):
        return MailboxMisconfigured(f"{context}: {_one_line(exc)}")
    return MailboxUnavailable(f"{context} failed: {type(exc).__name__}: {_one_line(exc)}")
