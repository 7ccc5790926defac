"""``ForwardingMailbox`` keeps every capability of the store it wraps, so a metering or failing
wrapper never silently turns a hashing S3 read into a plain one (docs/STYLE: object_store's
"wrappers SHOULD implement every method").

Every public name of every concrete store is either an operation of the ``Mailbox`` protocol, an
optional capability (``OPTIONAL_CAPABILITIES``, forwarded when the inner store has it), or one of
the few names listed here as the store's own identity (never forwarded); a new public method fails
the completeness check until it is classified.
"""

from __future__ import annotations

import hashlib
import inspect
import pkgutil
from importlib import import_module

import pytest

import gradientmail.mailbox
from gradientmail.digests import DigestName
from gradientmail.errors import KeyNotFound, RecordExists, VersionConflict
from gradientmail.mailbox import FileMailbox, ForwardingMailbox, Mailbox, MemoryMailbox, MeteredMailbox, MinioMailbox, S3Mailbox
from gradientmail.mailbox.base import OPTIONAL_CAPABILITIES, HashingGet, HashingPut, StampedGet
from gradientmail.mailbox.metered import OPERATIONS

PROTOCOL = frozenset(name for name in vars(Mailbox) if not name.startswith("_"))
"""The operations every store has (``url`` included), which ``ForwardingMailbox`` always defines."""

OPTIONAL = {"get_hashed": HashingGet, "put_hashed": HashingPut, "get_stamped": StampedGet}
"""Each optional capability with the protocol callers probe it with; must name exactly
``OPTIONAL_CAPABILITIES``."""

IDENTITY = {
    "named": "MemoryMailbox's constructor of a shared in-process store: not an operation",
    "path": "FileMailbox's root directory: a wrapper is not that directory store; reach it as .inner.path",
    "bucket": "S3Mailbox's bucket: the wrapper's url names it; reach it as .inner.bucket",
    "prefix": "S3Mailbox's key prefix: as for bucket",
    "endpoint": "S3Mailbox's endpoint: as for bucket",
}
"""Public names of one store that describe or build that store rather than operate on a mailbox."""


def concrete_stores() -> list[type]:
    """Every class in the mailbox package that has all of the protocol's names (but the wrapper and
    the protocol itself)."""
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(gradientmail.mailbox.__path__, "gradientmail.mailbox."):
        for _, cls in inspect.getmembers(import_module(info.name), inspect.isclass):
            is_protocol = getattr(cls, "_is_protocol", False)
            if cls is not ForwardingMailbox and not is_protocol and cls.__module__ == info.name and set(dir(cls)) >= PROTOCOL:
                found[cls.__qualname__] = cls
    return sorted(found.values(), key=lambda cls: cls.__qualname__)


def public_names(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_the_list_of_optional_capabilities_is_the_librarys() -> None:
    assert set(OPTIONAL) == set(OPTIONAL_CAPABILITIES)
    assert set(OPTIONAL).isdisjoint(PROTOCOL) and set(IDENTITY).isdisjoint(PROTOCOL | set(OPTIONAL))


def test_every_public_name_of_every_store_is_classified() -> None:
    """A store's new public method must be added to OPTIONAL_CAPABILITIES (and forwarded) or be
    listed here as identity, never silently dropped by the wrapper."""
    stores = concrete_stores()
    assert {MemoryMailbox, FileMailbox, S3Mailbox, MinioMailbox} <= set(stores)
    unclassified = {
        f"{cls.__qualname__}.{name}" for cls in stores for name in public_names(cls) - PROTOCOL - set(OPTIONAL) - set(IDENTITY)
    }
    assert not unclassified, "public store names neither in Mailbox, OPTIONAL_CAPABILITIES nor IDENTITY: " + ", ".join(
        sorted(unclassified)
    )


def test_the_wrapper_defines_every_protocol_operation_itself() -> None:
    assert {name for name in PROTOCOL if name in vars(ForwardingMailbox)} == PROTOCOL


def test_a_wrapped_store_keeps_each_capability_its_inner_has(mailbox: Mailbox) -> None:
    """Against every real store (memory, directory, S3 on the test server)."""
    wrapped = ForwardingMailbox(mailbox)
    for name, protocol in OPTIONAL.items():
        assert hasattr(wrapped, name) == hasattr(mailbox, name), name
        assert isinstance(wrapped, protocol) == isinstance(mailbox, protocol), name
    mailbox.put("blobs/one", b"forwarded bytes")
    if isinstance(mailbox, HashingPut):
        assert isinstance(wrapped, HashingPut)
        assert wrapped.put_hashed("blobs/two", b"two", "sha256")[1] == hashlib.sha256(b"two").hexdigest()
        assert mailbox.get("blobs/two") == b"two"
    if isinstance(mailbox, HashingGet):
        assert isinstance(wrapped, HashingGet)
        expected = (b"forwarded bytes", hashlib.sha256(b"forwarded bytes").hexdigest())
        assert (
            wrapped.get_hashed("blobs/one", "sha256", max_bytes=64)
            == mailbox.get_hashed("blobs/one", "sha256", max_bytes=64)
            == expected
        )
    if isinstance(mailbox, StampedGet):
        assert wrapped.get_stamped("blobs/one", max_bytes=64) == mailbox.get_stamped("blobs/one", max_bytes=64)  # type: ignore[attr-defined]
    assert wrapped.get("blobs/one") == b"forwarded bytes" and wrapped.url == mailbox.url


class _FailingVersionedReads(ForwardingMailbox):
    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        raise KeyNotFound(f"{key}: this wrapper loses every versioned read")


def test_a_wrapper_that_overrides_get_versioned_sees_stamped_reads_too() -> None:
    """A fault in ``get_versioned`` is not bypassed by the forwarded stamped read; a read through
    the wrapper's own ``get_versioned`` carries no stamp."""
    inner = MemoryMailbox()
    inner.put("k", b"abc")
    failing = _FailingVersionedReads(inner)
    assert isinstance(failing, StampedGet)
    with pytest.raises(KeyNotFound, match="loses every"):
        failing.get_stamped("k")

    class Plain(ForwardingMailbox):
        def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
            return self.inner.get_versioned(key, max_bytes=max_bytes)

    data, info = Plain(inner).get_stamped("k")
    assert (data, info.token, info.modified_at) == (b"abc", inner.head("k").token, None)  # type: ignore[union-attr]


class _Hashing(MemoryMailbox):
    """A memory store with the hashing capability, counting the hashed reads it serves."""

    def __init__(self) -> None:
        super().__init__()
        self.hashed_gets = 0

    def get_hashed(self, key: str, digest: DigestName, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        self.hashed_gets += 1
        data = self.get(key, max_bytes=max_bytes)
        return data, hashlib.sha256(data).hexdigest()


class _CountingGets(ForwardingMailbox):
    def __init__(self, inner: Mailbox) -> None:
        super().__init__(inner)
        self.gets = 0

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        self.gets += 1
        return self.inner.get(key, max_bytes=max_bytes)


def test_a_plain_wrapper_forwards_the_hashed_read_to_the_inner_store() -> None:
    inner = _Hashing()
    inner.put("k", b"abc")
    wrapped = ForwardingMailbox(inner)
    assert isinstance(wrapped, HashingGet)
    assert wrapped.get_hashed("k", "sha256") == (b"abc", hashlib.sha256(b"abc").hexdigest()) and inner.hashed_gets == 1


def test_a_wrapper_that_overrides_get_sees_hashed_reads_too() -> None:
    """Metering or fault injection in ``get`` is not bypassed by the forwarded capability."""
    inner = _Hashing()
    inner.put("k", b"abc")
    wrapped = _CountingGets(inner)
    assert isinstance(wrapped, HashingGet)
    assert wrapped.get_hashed("k", "sha256", max_bytes=3) == (b"abc", hashlib.sha256(b"abc").hexdigest())
    assert wrapped.gets == 1 and inner.hashed_gets == 0


class _CountingPuts(ForwardingMailbox):
    def __init__(self, inner: Mailbox) -> None:
        super().__init__(inner)
        self.puts = 0

    def put(self, key: str, data: bytes) -> str:
        self.puts += 1
        return self.inner.put(key, data)


class _HashingWrites(MemoryMailbox):
    """A memory store with the hashed write, counting the ones it serves."""

    def __init__(self) -> None:
        super().__init__()
        self.hashed_puts = 0

    def put_hashed(self, key: str, data: bytes, digest: DigestName) -> tuple[str, str]:
        self.hashed_puts += 1
        return self.put(key, data), hashlib.sha256(data).hexdigest()


def test_the_hashed_write_is_forwarded_and_a_wrapper_that_overrides_put_sees_it() -> None:
    inner = _HashingWrites()
    plain = ForwardingMailbox(inner)
    assert isinstance(plain, HashingPut)
    assert plain.put_hashed("k", b"abc", "sha256")[1] == hashlib.sha256(b"abc").hexdigest() and inner.hashed_puts == 1
    counting = _CountingPuts(inner)
    assert counting.put_hashed("k2", b"xyz", "sha256")[1] == hashlib.sha256(b"xyz").hexdigest()
    assert counting.puts == 1 and inner.hashed_puts == 1 and inner.get("k2") == b"xyz"


def test_a_subclass_keeps_its_own_capability_and_a_plain_store_gets_none() -> None:
    class Own(ForwardingMailbox):
        def get_hashed(self, key: str, digest: DigestName, *, max_bytes: int | None = None) -> tuple[bytes, str]:
            return b"", "own"

    assert Own(_Hashing()).get_hashed("k", "sha256") == (b"", "own")
    assert not isinstance(ForwardingMailbox(MemoryMailbox()), HashingGet)
    assert not hasattr(ForwardingMailbox(MemoryMailbox()), "get_hashed")


def test_the_metered_wrapper_counts_every_request_by_operation_and_outcome(mailbox: Mailbox) -> None:
    """``MeteredMailbox`` (every node's request metrics) against every real store: what each
    request was and how it ended, the inner store's hashed read kept (and counted as a get)."""
    metered = MeteredMailbox(mailbox)
    assert isinstance(metered, HashingGet) == isinstance(mailbox, HashingGet)
    token = metered.create("m/record", b"first")
    with pytest.raises(RecordExists):
        metered.create("m/record", b"again")
    with pytest.raises(VersionConflict):
        metered.swap("m/record", b"second", token + "0" if not token.endswith("0") else token + "1")
    metered.swap("m/record", b"second", token)
    with pytest.raises(KeyNotFound):
        metered.get("m/missing")
    assert metered.get("m/record") == b"second" and metered.list("m/") == ["m/record"]
    if isinstance(metered, HashingGet):
        assert metered.get_hashed("m/record", "sha256")[1] == hashlib.sha256(b"second").hexdigest()
    assert isinstance(metered, StampedGet) == isinstance(mailbox, StampedGet)
    if isinstance(metered, StampedGet):
        assert metered.get_stamped("m/record")[0] == b"second"
    assert isinstance(metered, HashingPut) == isinstance(mailbox, HashingPut)
    if isinstance(metered, HashingPut):
        assert metered.put_hashed("m/blob", b"blob", "sha256") == (
            metered.head("m/blob").token,
            hashlib.sha256(b"blob").hexdigest(),
        )  # type: ignore[union-attr]
        metered.delete("m/blob")
    metered.delete("m/record")
    counts = {key: value for key, value in metered.counts.requests().items() if value}
    if isinstance(mailbox, HashingPut):  # the blob's put (counted as one), its head and delete
        assert (counts.pop(("put", "ok")), counts.pop(("head", "ok"))) == (1, 1)
        counts[("delete", "ok")] -= 1
    assert set(metered.counts.requests()) >= {(op, outcome) for op in OPERATIONS for outcome in ("ok", "error")}  # zeros first
    expected_gets = 2 if isinstance(mailbox, HashingGet) else 1
    assert counts == {
        ("create", "ok"): 1,
        ("create", "exists"): 1,
        ("swap", "conflict"): 1,
        ("swap", "ok"): 1,
        ("get", "not_found"): 1,
        ("get", "ok"): expected_gets,
        ("list", "ok"): 1,
        ("delete", "ok"): 1,
        **({("get_versioned", "ok"): 1} if isinstance(mailbox, StampedGet) else {}),
    }
    seconds = metered.counts.seconds()
    assert set(seconds) == set(metered.counts.requests()) and all(value >= 0 for value in seconds.values())
