"""The run key: HMAC-SHA256 over every record, so a bucket writer without it cannot steer a run.

A record's MAC covers its mailbox key and its canonical JSON (every field but ``mac``, which
includes the sha256 of every blob it references), so a signed record cannot be moved to
another key, edited, or made to point at other bytes. The key itself never leaves this
object: ``repr`` and ``str`` show only its id, a non-secret fingerprint the manifest records.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import TypeVar

from gradientmail.errors import InvalidConfig, Unauthenticated
from gradientmail.records.models import Record

__all__ = ["MIN_KEY_BYTES", "RunKey", "generate_run_key"]

MIN_KEY_BYTES = 32
"""A key shorter than this is refused: HMAC-SHA256 wants at least 256 bits of secret."""

RecordT = TypeVar("RecordT", bound=Record)


def generate_run_key() -> str:
    """A fresh key: 48 random bytes, URL-safe base64 (64 characters)."""
    return secrets.token_urlsafe(48)


class RunKey:
    """A run's shared secret. Build it from the secret string, or with :meth:`from_env`."""

    __slots__ = ("_secret", "key_id")

    def __init__(self, secret: str | bytes) -> None:
        raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        if len(raw) < MIN_KEY_BYTES:
            raise InvalidConfig(
                "run_key", f"must be at least {MIN_KEY_BYTES} bytes (got {len(raw)}); make one with `gradientmail keygen`"
            )
        self._secret = raw
        self.key_id: str = hmac.new(raw, b"gradientmail run key id", hashlib.sha256).hexdigest()[:16]
        """Non-secret fingerprint, recorded in the manifest to tell keys apart."""

    def __repr__(self) -> str:
        return f"RunKey(id={self.key_id})"

    __str__ = __repr__

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> RunKey:
        """The key stored in a file (trailing whitespace ignored)."""
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise InvalidConfig("run_key_file", f"cannot read {os.fspath(path)!r}: {exc.strerror}") from None
        return cls(text)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> RunKey | None:
        """``GRADIENTMAIL_RUN_KEY``, else the file ``GRADIENTMAIL_RUN_KEY_FILE`` names, else None."""
        env = os.environ if environ is None else environ
        if env.get("GRADIENTMAIL_RUN_KEY"):
            return cls(env["GRADIENTMAIL_RUN_KEY"])
        if env.get("GRADIENTMAIL_RUN_KEY_FILE"):
            return cls.from_file(env["GRADIENTMAIL_RUN_KEY_FILE"])
        return None

    def mac(self, location: str, record: Record) -> str:
        """The MAC of ``record`` stored at mailbox key ``location``."""
        message = location.encode("utf-8") + b"\n" + record.signed_content()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def sign(self, location: str, record: RecordT) -> RecordT:
        """A copy of ``record`` carrying its MAC for ``location``."""
        return record.model_copy(update={"mac": self.mac(location, record)})

    def verify(self, location: str, record: RecordT) -> RecordT:
        """``record`` if its MAC is right for ``location``; else ``Unauthenticated``."""
        if record.mac is None:
            raise Unauthenticated(f"{record.record_type} record at {location} is not signed; this run requires the run key")
        if not hmac.compare_digest(record.mac, self.mac(location, record)):
            raise Unauthenticated(f"{record.record_type} record at {location} has a wrong MAC (written without this run's key)")
        return record
