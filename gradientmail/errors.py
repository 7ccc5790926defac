"""The one exception tree of GradientMail.

Every error the library raises on purpose derives from :class:`GradientMailError`; no
botocore, ``OSError`` or pydantic type escapes a public call. Each docstring says whether
retrying the same call can help.
"""

from __future__ import annotations

__all__ = [
    "GradientMailError",
    "InvalidConfig",
    "RunConfigMismatch",
    "MailboxError",
    "InvalidKey",
    "KeyNotFound",
    "RecordExists",
    "VersionConflict",
    "MailboxUnavailable",
    "MailboxMisconfigured",
    "CorruptPayload",
    "InvalidRecord",
    "Unauthenticated",
    "ObjectTooLarge",
    "ContributionRejected",
    "DuplicateLearner",
    "IncompatiblePayload",
    "BackendUnavailable",
]


class GradientMailError(Exception):
    """Root of every error GradientMail raises. ``retryable`` says whether the same call may
    succeed later without anything being changed; it is False unless a subclass says so."""

    retryable: bool = False


class InvalidConfig(GradientMailError, ValueError):
    """A setting is out of range or inconsistent. Not retryable: fix the named field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class RunConfigMismatch(GradientMailError):
    """This node's algorithm or model differs from the run's manifest. Not retryable."""

    def __init__(self, differences: list[str]) -> None:
        self.differences = list(differences)
        super().__init__("run configuration mismatch: " + "; ".join(self.differences))


class MailboxError(GradientMailError):
    """Base of the errors a mailbox raises. Retryable only where the subclass says so."""


class InvalidKey(MailboxError, ValueError):
    """A key or id is malformed or could escape the run's prefix; nothing was read or written.
    Not retryable: fix the key (or the learner id it was built from)."""


class KeyNotFound(MailboxError, KeyError):
    """The key does not exist. Retryable only if another writer is expected to create it."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the plain message
        return str(self.args[0]) if self.args else "key not found"


class RecordExists(MailboxError):
    """A create-once write found the key already taken by another writer: the race is lost.
    Not retryable: the key is taken for good (create-once objects are never replaced)."""


class VersionConflict(MailboxError):
    """A compare-and-swap found a different version token: someone else wrote first.
    Not retryable with the same token: read the object again and decide anew."""


class MailboxUnavailable(MailboxError):
    """The store could not be reached or kept failing after retries. Retryable later."""

    retryable = True


class MailboxMisconfigured(MailboxError):
    """The store refuses us for a reason the user must fix (bucket, credentials, features).
    Not retryable."""


class DuplicateLearner(GradientMailError):
    """Another process writes this learner's lease: two processes share one learner id, and
    their contributions would reject each other's as duplicates. Not retryable: give each
    process its own ``learner_id``."""

    def __init__(self, learner: str) -> None:
        self.learner = learner
        super().__init__(
            f"learner id {learner!r} is used by another process too (a newer lease of the id, renewed by someone "
            "else, replaced ours; that process trains on, this one stops); give each process "
            "its own id: gm.Session(learner_id=...) or GRADIENTMAIL_LEARNER_ID, e.g. the host name and the GPU index"
        )


class CorruptPayload(GradientMailError):
    """A tensor payload failed its checksum or could not be decoded. Not retryable."""


class InvalidRecord(GradientMailError, ValueError):
    """A JSON record is malformed or has an unknown schema version. Not retryable."""


class Unauthenticated(InvalidRecord):
    """A record's MAC is missing or does not verify under the run key (a writer without the
    key, or a node configured with another key). Never acted on. Not retryable."""


class ObjectTooLarge(MailboxError):
    """A stored object is larger than the reader allows; nothing beyond the allowance was read.
    Not retryable: the object is refused as it is."""


class ContributionRejected(GradientMailError, ValueError):
    """A contribution cannot enter a merge; ``reason`` is the code the round record lists.

    Reasons are ``gradientmail.records.REJECTION_REASONS`` (the one list). Not retryable with
    the same contribution.
    """

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {message}")


class IncompatiblePayload(GradientMailError, ValueError):
    """A payload's tensor names, shapes or dtypes differ from the run's. Not retryable."""


class BackendUnavailable(GradientMailError, ImportError):
    """The named backend's framework (PyTorch, MLX) is not installed. Not retryable: install
    the extra the message names."""


def install_hint(extra: str) -> str:
    """How to install an optional extra of this project: from a checkout of its repository, since
    the package index's ``gradientmail`` is another project (one wording for every message)."""
    return f'pip install ".[{extra}]" in a checkout of GradientMail (not the package index\'s "gradientmail")'
