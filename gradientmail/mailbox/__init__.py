"""The mailbox layer: the only storage GradientMail needs, and its stores.

``Mailbox`` is the contract (``base``); each store is one module: ``memory``,
``directory`` (``FileMailbox``), ``s3`` (``S3Mailbox``, with ``MinioMailbox`` on top).
``open_mailbox`` turns a URL into one of them. boto3 is imported only when an S3 store
is first used.
"""

from gradientmail.mailbox.base import ForwardingMailbox, Gathered, Mailbox, ObjectInfo
from gradientmail.mailbox.directory import FileMailbox
from gradientmail.mailbox.keys import validate_key
from gradientmail.mailbox.memory import MemoryMailbox
from gradientmail.mailbox.metered import MeteredMailbox, RequestCounts
from gradientmail.mailbox.minio import MinioMailbox
from gradientmail.mailbox.s3 import S3Mailbox, S3Tuning
from gradientmail.mailbox.url import open_mailbox

__all__ = [
    "Mailbox",
    "ObjectInfo",
    "ForwardingMailbox",
    "Gathered",
    "MeteredMailbox",
    "RequestCounts",
    "MemoryMailbox",
    "FileMailbox",
    "S3Mailbox",
    "S3Tuning",
    "MinioMailbox",
    "open_mailbox",
    "validate_key",
]
