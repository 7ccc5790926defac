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
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from gradientmail.errors import InvalidConfig, Unauthenticated
from gradientmail.records.models import Record

__all__ = ["ENV_KEY", "ENV_KEY_FILE", "MIN_KEY_BYTES", "RunKey", "generate_run_key"]

ENV_KEY, ENV_KEY_FILE = "GRADIENTMAIL_RUN_KEY", "GRADIENTMAIL_RUN_KEY_FILE"
"""The environment variables every way to start a node reads the run key from."""

MIN_KEY_BYTES = 32
"""A key shorter than this is refused: HMAC-SHA256 wants at least 256 bits of secret."""

RecordT = TypeVar("RecordT", bound=Record)


def generate_run_key() -> str:
    """A fresh key: 48 random bytes, URL-safe base64 (64 characters)."""
    return secrets.token_urlsafe(48)


class RunKey:
    """A run's shared secret. Build it from the secret string, or with :meth:`from_env`."""

    __slots__ = ("_secret", "key_id")

    def __init__(self, secret: str | bytes, *, source: str | None = None) -> None:
        """``source`` names where the secret came from (an environment variable) in errors."""
        raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        if len(raw) < MIN_KEY_BYTES:
            given = f"{source} " if source else ""
            raise InvalidConfig(
                "run_key",
                f"{given}must be at least {MIN_KEY_BYTES} bytes (got {len(raw)}); make one with `gradientmail keygen`",
            )
        self._secret = raw
        self.key_id: str = hmac.new(raw, b"gradientmail run key id", hashlib.sha256).hexdigest()[:16]
        """Non-secret fingerprint, recorded in the manifest to tell keys apart."""

    def __repr__(self) -> str:
        return f"RunKey(id={self.key_id})"

    __str__ = __repr__

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, source: str | None = None) -> RunKey:
        """The key stored in a file (trailing whitespace ignored); ``source`` names the setting
        that gave the path, in errors."""
        given = f"{source} " if source else ""
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise InvalidConfig("run_key_file", f"{given}cannot read {os.fspath(path)!r}: {exc.strerror}") from None
        return cls(text, source=f"the file {given}names ({os.fspath(path)!r})")

    @classmethod
    def from_settings(
        cls, secret: str | None, file: str | os.PathLike[str] | None, *, names: tuple[str, str] = (ENV_KEY, ENV_KEY_FILE)
    ) -> RunKey | None:
        """The one rule for a key given as a secret or as a file that holds it (the
        ``run_key`` / ``run_key_file`` pair of every way to configure a node): both is an
        error, either builds the key, neither is None (an unsigned run). A setting that is
        present but empty is a key too short, never an unsigned run. ``names`` are the two
        settings as the user set them, for errors."""
        if secret is not None and file is not None:
            raise InvalidConfig("run_key", f"set {names[0]} or {names[1]}, not both")
        if secret is not None:
            return cls(secret, source=names[0])
        return cls.from_file(file, source=names[1]) if file is not None else None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RunKey | None:
        """``GRADIENTMAIL_RUN_KEY`` or the file ``GRADIENTMAIL_RUN_KEY_FILE`` names (not both),
        else None; a bad key (an empty variable included) is an ``InvalidConfig`` that names
        the variable."""
        env = os.environ if environ is None else environ
        return cls.from_settings(env.get(ENV_KEY), env.get(ENV_KEY_FILE))

    @classmethod
    def given(cls, run_key: str | RunKey | None) -> RunKey | None:
        """The key a node was given (a secret string or a key), else :meth:`from_env`'s: how every
        way to open a run (a session, a dedicated syncer, ``gm.align``) resolves ``run_key=``."""
        if isinstance(run_key, RunKey):
            return run_key
        return cls(run_key) if run_key is not None else cls.from_env()

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
