"""A run names its blob digest (``Manifest.blob_digest``): BLAKE3 for new runs, sha256 for runs
from before manifests named one, and both stay readable, replayable and auditable.

The records below were written and signed by the code from before ``blob_digest`` existed: they
must parse, verify under the run key and dump to the very bytes that were signed.
"""

from __future__ import annotations

import blake3
import numpy as np
import pytest

import gradientmail as gm
from gradientmail.audit import audit_run
from gradientmail.backends import payload
from gradientmail.digests import DIGESTS, DigestName, hex_digest
from gradientmail.errors import CorruptPayload, GradientMailError
from gradientmail.mailbox import FileMailbox, MemoryMailbox
from gradientmail.records import Contribution, Manifest, PayloadRef
from gradientmail.records.auth import RunKey
from gradientmail.store import RunStore
from gradientmail.syncer import replay_round
from testing.mailbox_run import FRAGMENT, NUMPY, create_run

OLD_KEY = RunKey("k" * 48)
OLD_MANIFEST = (
    b'{"schema_version":1,"mac":"9b7b41c3cce64fa7e3ab36283e5456aa866a230beb962aedfd6637447fc8c41c","run_id":"r1",'
    b'"algorithm":{"sync_every":10},"parameters":[{"name":"w","shape":[2],"dtype":"float32"}],"plan":[["w"]],'
    b'"created_by":"node-1","created_at":"2026-12-01T00:00:00.000+00:00","key_id":"59990e77c7ed9134",'
    b'"lease_ttl_s":10.0,"retention":null}'
)
OLD_CONTRIBUTION_AT = "fragments/0000/contributions/0000000003/node-1-0000000001.json"
OLD_CONTRIBUTION = (
    b'{"schema_version":1,"mac":"7895e6f701c3f21c968b6abe2ab86071ad30cea77071658abb04af5be36e8121",'
    b'"learner":"node-1","fragment":0,"anchor_version":3,"steps":10,"samples":640,"carried_steps":0,"realigned":[],'
    b'"payload":{"key":"fragments/0000/contributions/0000000003/node-1-0000000001.safetensors",'
    b'"sha256":"abababababababababababababababababababababababababababababababab","size_bytes":1234,'
    b'"encoding":null,"stored_bytes":null},"final":false,"step_time_s":null,"saved_state":null,'
    b'"created_at":"2026-12-01T00:00:00.000+00:00"}'
)


def test_records_signed_before_blob_digests_verify_and_dump_to_the_bytes_that_were_signed() -> None:
    manifest = OLD_KEY.verify("manifest.json", Manifest.from_json(OLD_MANIFEST))
    assert manifest.blob_digest is None and manifest.blobs_pinned_by == "sha256"
    assert manifest.to_json() == OLD_MANIFEST
    contribution = OLD_KEY.verify(OLD_CONTRIBUTION_AT, Contribution.from_json(OLD_CONTRIBUTION))
    assert contribution.payload.digest_name == "sha256" and contribution.payload.hexdigest == "ab" * 32
    assert contribution.to_json() == OLD_CONTRIBUTION


def test_a_reference_carries_exactly_one_known_digest() -> None:
    blake = OLD_CONTRIBUTION.replace(b'"sha256":', b'"blake3":')
    assert Contribution.from_json(blake).payload.digest_name == "blake3"
    both = OLD_CONTRIBUTION.replace(b'"size_bytes":1234', b'"blake3":"' + b"cd" * 32 + b'","size_bytes":1234')
    neither = OLD_CONTRIBUTION.replace(b'"sha256":"' + b"ab" * 32 + b'",', b"")
    for data in (both, neither):
        with pytest.raises(gm.InvalidRecord, match="exactly one digest"):
            Contribution.from_json(data)
    with pytest.raises(gm.InvalidRecord, match="blob_digest"):
        Manifest.from_json(OLD_MANIFEST.replace(b',"retention":null}', b',"retention":null,"blob_digest":"md5"}'))
    with pytest.raises(gm.InvalidRecord, match="blake3"):
        Contribution.from_json(blake.replace(b'"blake3":"ab', b'"blake3":"AB'))


@pytest.mark.parametrize("digest", [*DIGESTS, None])
def test_a_run_of_either_digest_commits_replays_and_audits_by_it(tmp_path, digest: DigestName | None) -> None:
    """None: a manifest that names no digest (a run from before), whose blobs are sha256. A signed
    run on the directory store, whose own tokens are BLAKE3 either way."""
    run = create_run(FileMailbox(tmp_path), key=RunKey("s" * 48), blob_digest=digest)
    expected = digest or "sha256"
    assert run.spec.blob_digest == expected and run.store.blobs.digest == expected
    published = run.store.read_contribution(run.publish("alice"))
    assert published.payload.digest_name == expected
    run.publish_honest()
    stored = run.commit_next()
    record = stored.record
    for ref in (record.params, record.outer_state):
        data = run.store.mailbox.get(ref.key)
        assert ref.digest_name == expected and ref.hexdigest == hex_digest(expected, data)
    replayed = replay_round(run.store, NUMPY, run.spec, FRAGMENT, record.version)
    assert payload.encode({n: NUMPY.to_numpy(t) for n, t in replayed.items()}) == run.store.blobs.read(record.params)
    assert audit_run(run.store, run.spec).clean

    # a blob changed in the bucket is caught by the digest its reference names
    damaged = bytearray(run.store.mailbox.get(record.params.key))
    damaged[-1] ^= 0x01
    run.store.mailbox.put(record.params.key, bytes(damaged))
    with pytest.raises(CorruptPayload, match="checksum mismatch"):
        run.store.blobs.read(record.params)
    report = audit_run(run.store, run.spec)
    assert not report.clean and any(record.params.key in line for line in report.failures)


def test_a_store_writes_under_the_digest_of_the_manifest_it_read() -> None:
    """A node that joins a run (reads its manifest) writes blobs by the run's digest, whatever it
    would have named for a run of its own."""
    mailbox = MemoryMailbox()
    old = create_run(mailbox, blob_digest=None)
    joined = RunStore(old.box)
    assert joined.read_spec().blob_digest == joined.blobs.digest == "sha256"
    ref = joined.blobs.put("blobs/x", b"abc")
    assert (ref.sha256, ref.blake3) == (hex_digest("sha256", b"abc"), None)
    new = create_run(MemoryMailbox())
    assert new.store.blobs.put("blobs/y", b"abc") == PayloadRef.pinned("blobs/y", "blake3", blake3.blake3(b"abc").hexdigest(), 3)
    assert np.array_equal(new.params(0)["mlp.bias"], old.params(0)["mlp.bias"])  # the same model either way


def test_a_store_that_has_not_read_the_manifest_writes_no_blob() -> None:
    """The writer's digest is the run's: a store that neither read nor created the manifest
    does not guess one (it would pin blobs by sha256 in a BLAKE3 run)."""
    run = create_run(MemoryMailbox())
    stranger = RunStore(run.store.mailbox)
    with pytest.raises(GradientMailError, match="blob digest is not known yet"):
        stranger.blobs.put("blobs/x", b"payload")
    assert not run.store.mailbox.exists("blobs/x")
    stranger.read_spec()
    assert stranger.blobs.put("blobs/x", b"payload").digest_name == "blake3"


def test_a_session_names_the_digest_of_the_run_it_creates_and_a_joiner_keeps_the_runs(monkeypatch) -> None:
    """``gm.Session(blob_digest=...)`` and ``GRADIENTMAIL_BLOB_DIGEST`` choose a new run's digest;
    a learner that joins writes by the run's, whatever it names; an unknown name is refused."""
    from gradientmail.settings import NodeSettings

    mailbox = MemoryMailbox()
    model = {"w": np.zeros(8, np.float32)}
    with gm.Session(dict(model), mailbox=mailbox, learner_id="a", blob_digest="sha256") as first:
        first.step()
    with gm.Session(dict(model), mailbox=mailbox, learner_id="b", blob_digest="blake3") as joiner:
        joiner.step()
    store = RunStore(mailbox)
    assert store.read_spec().blob_digest == "sha256" == store.blobs.digest
    with pytest.raises(gm.InvalidConfig, match="blob_digest.*unknown blob digest 'md5'"):
        gm.Session(dict(model), mailbox=MemoryMailbox(), blob_digest="md5")
    monkeypatch.setenv("GRADIENTMAIL_MAILBOX", "memory://")
    monkeypatch.setenv("GRADIENTMAIL_BLOB_DIGEST", "sha256")
    assert NodeSettings.from_env().session(dict(model)).blob_digest == "sha256"
    monkeypatch.setenv("GRADIENTMAIL_BLOB_DIGEST", "md5")
    with pytest.raises(gm.InvalidConfig, match="blob_digest: Input should be 'sha256' or 'blake3'"):
        NodeSettings.from_env()
