"""The run's leases as records: the syncer lease and each learner's own, named by what they are.

The roles (session, syncer) name a lease by what it is, never by its key, so the key layout
stays in ``records.keys`` and the store; the key-taking forms (``read``, ``put``, ``create``,
``swap``) remain for the entry points and tools (CLI, audit, benchmarks). Expiry is judged by
the reader (``store.leases.LeaseObserver``); this module only reads and writes, through the
one compare-and-swap record (``store.cas``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gradientmail.records import Lease, keys
from gradientmail.store.cas import CasRecords
from gradientmail.store.record_io import RecordIO
from gradientmail.store.store_clock import ClockSample

__all__ = ["LeaseRead", "LeaseRecords"]


@dataclass(frozen=True)
class LeaseRead:
    """A lease as found: ``lease`` is None when its bytes are not a valid (or not a signed)
    lease; such a lease counts as expired and is replaced by compare-and-swap on ``token``."""

    lease: Lease | None
    token: str
    problem: str = ""
    written_at: float | None = None
    """The store's stamp of this version's write (``ObjectInfo.modified_at``) from a store that
    reads it with the bytes (``StampedGet``); None otherwise."""
    written_resolution_s: float = 0.0


class LeaseRecords:
    """Every lease of one run (``RunStore.leases``)."""

    def __init__(self, io: RecordIO, cas: CasRecords) -> None:
        self._io = io
        self._cas = cas

    def read(self, key: str, *, need_token: bool = True) -> LeaseRead | None:
        """The lease at ``key`` and its version token; None if absent. A lease that is too
        large, does not parse or does not verify comes back with ``lease=None`` and the problem.
        Of an oversized lease only the syncer's needs its token (to be replaced by
        compare-and-swap); ``need_token=False`` skips that HEAD."""
        found = self._cas.read(Lease, key, need_token=need_token, stamped=True)
        if found is None:
            return None
        return LeaseRead(found.record, found.token, found.problem, found.written_at, found.written_resolution_s)

    def learner_keys(self) -> list[str]:
        """Every name under the learners' lease prefix (one LIST, unparsed)."""
        return self._io.mailbox.list(keys.LEARNER_LEASES)

    def put(self, key: str, lease: Lease) -> str:
        """Write a lease unconditionally (a learner's own); returns its token."""
        return self._cas.put(key, lease)

    def create(self, key: str, lease: Lease) -> str:
        """Create a lease once; raises ``RecordExists`` when someone holds it already."""
        return self._cas.create(key, lease)

    def swap(self, key: str, lease: Lease, expected_token: str) -> str:
        """Replace a lease by compare-and-swap; raises ``VersionConflict`` or ``KeyNotFound``."""
        return self._cas.swap(key, lease, expected_token)

    def read_syncer(self, *, need_token: bool = True) -> LeaseRead | None:
        """The run's syncer lease as :meth:`read` finds it; None while nobody holds it."""
        return self.read(keys.SYNCER_LEASE, need_token=need_token)

    def read_learner(self, learner: str, *, need_token: bool = True) -> LeaseRead | None:
        """One learner's own lease as :meth:`read` finds it; None if it has none.
        ``InvalidKey`` for an id that is not a valid learner id."""
        return self.read(keys.learner_lease(learner), need_token=need_token)

    def learners(self) -> list[str]:
        """The learners that have a lease in the mailbox, live or not (one LIST), sorted; objects
        under the learners' lease prefix that are not a learner's lease key are skipped."""
        found = (parsed for _, parsed in self._io.listed(keys.LEARNER_LEASES))
        return [parsed.learner for parsed in found if isinstance(parsed, keys.LearnerLeaseKey)]

    def put_learner(self, lease: Lease) -> str:
        """Write a learner's own lease (kind ``learner``) at its holder's key with a plain put
        (its id is its own; a restart takes it over); returns its token. ``ValueError`` for a
        lease of another kind."""
        if lease.kind != "learner":
            raise ValueError(f"put_learner needs a learner lease, got kind {lease.kind!r}")
        return self.put(keys.learner_lease(lease.holder), lease)

    def swap_learner(self, lease: Lease, expected_token: str) -> str:
        """Replace a learner's own lease by compare-and-swap against the token of its last write;
        raises ``VersionConflict`` (someone else wrote it) or ``KeyNotFound`` (it was deleted)."""
        if lease.kind != "learner":
            raise ValueError(f"swap_learner needs a learner lease, got kind {lease.kind!r}")
        return self.swap(keys.learner_lease(lease.holder), lease, expected_token)

    def create_syncer(self, lease: Lease) -> str:
        """Create the syncer lease once (the first election); raises ``RecordExists`` when
        another node holds it already."""
        return self.create(keys.SYNCER_LEASE, lease)

    def swap_syncer(self, lease: Lease, expected_token: str) -> str:
        """Replace the syncer lease by compare-and-swap (renew, take over, release); raises
        ``VersionConflict`` (someone else wrote it) or ``KeyNotFound`` (it was deleted)."""
        return self.swap(keys.SYNCER_LEASE, lease, expected_token)

    def write_sample(self, name: str, token: str, sent: float, returned: float) -> ClockSample | None:
        """The clock sample of a lease write this node made (``name``: the lease's key, as
        ``store.leases.LeaseName.key`` gives it; ``token``: what the write returned); one HEAD."""
        return self._io.clock_sample(name, sent, returned, token)
