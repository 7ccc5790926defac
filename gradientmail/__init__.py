"""GradientMail: the exchange of Decoupled DiLoCo around a PyTorch or MLX training loop.

``import gradientmail as gm``; the names below are the public API (a test keeps them so).
"""

from gradientmail import telemetry
from gradientmail._version import __version__
from gradientmail.algorithms import (
    DiLoCo,
    FragmentPlan,
    IsoC,
    NesterovOuter,
    OuterState,
    Rda,
    WeightedMean,
    plan_fragments,
)
from gradientmail.backends import Backend, backend_for, get_backend
from gradientmail.errors import (
    BackendUnavailable,
    ContributionRejected,
    CorruptPayload,
    DuplicateLearner,
    GradientMailError,
    IncompatiblePayload,
    InvalidConfig,
    InvalidKey,
    InvalidRecord,
    KeyNotFound,
    MailboxError,
    MailboxMisconfigured,
    MailboxUnavailable,
    ObjectTooLarge,
    RecordExists,
    RunConfigMismatch,
    Unauthenticated,
    VersionConflict,
)
from gradientmail.mailbox import FileMailbox, Mailbox, MemoryMailbox, MinioMailbox, S3Mailbox, open_mailbox
from gradientmail.memory import retain_freed_memory
from gradientmail.records.auth import RunKey
from gradientmail.session import Barrier, BarrierRelease, LedgerView, Session, SessionEvent, SessionOptions, SyncerNode, align
from gradientmail.settings import NodeSettings, session_from_env
from gradientmail.store import Retention

__all__ = [
    "Session",
    "align",
    "Barrier",
    "BarrierRelease",
    "SessionEvent",
    "SessionOptions",
    "LedgerView",
    "SyncerNode",
    "RunKey",
    "Retention",
    "NodeSettings",
    "session_from_env",
    "retain_freed_memory",
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
    "IsoC",
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
    "Unauthenticated",
    "ObjectTooLarge",
    "BackendUnavailable",
    "ContributionRejected",
    "DuplicateLearner",
    "IncompatiblePayload",
    "__version__",
]
