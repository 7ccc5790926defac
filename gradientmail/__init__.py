"""GradientMail: the exchange of Decoupled DiLoCo around a PyTorch or MLX training loop.

``import gradientmail as gm``; the names below are the public API (a test keeps them so).
"""

from gradientmail.algorithms import (
    DiLoCo,
    FragmentPlan,
    NesterovOuter,
    OuterState,
    Rda,
    WeightedMean,
    plan_fragments,
)
from gradientmail.backends import Backend, backend_for, get_backend
from gradientmail.mailbox import FileMailbox, Mailbox, MemoryMailbox, MinioMailbox, S3Mailbox, open_mailbox
from gradientmail.session import Session, SessionOptions
from gradientmail import telemetry
from gradientmail.errors import (
    ContributionRejected,
    CorruptPayload,
    IncompatiblePayload,
    GradientMailError,
    InvalidConfig,
    InvalidKey,
    InvalidRecord,
    KeyNotFound,
    MailboxError,
    MailboxMisconfigured,
    MailboxUnavailable,
    RecordExists,
    RunConfigMismatch,
    StaleBase,
    VersionConflict,
)

__version__ = "0.1.0"

__all__ = [
    "Session",
    "SessionOptions",
    "telemetry",
    "Mailbox",
    "MemoryMailbox",
    "FileMailbox",
    "S3Mailbox",
    "MinioMailbox",
    "open_mailbox",
    "DiLoCo",
    "Rda",
    "WeightedMean",
    "NesterovOuter",
    "OuterState",
    "FragmentPlan",
    "plan_fragments",
    "Backend",
    "backend_for",
    "get_backend",
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
    "StaleBase",
    "ContributionRejected",
    "IncompatiblePayload",
    "__version__",
]
