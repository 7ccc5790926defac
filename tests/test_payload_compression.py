"""Lossless payload compression (``DiLoCo.payload_compression = "zstd"``, ``backends/lossless.py``):
the codec's round trips and refusals, blobs stored compressed while their records pin the raw bytes
(INV-13's bound on what a reader decompresses, INV-16's replay and repair on raw bytes), and real
sessions training through compressed contributions and commits."""

from __future__ import annotations

import os
import struct

import ml_dtypes
import numpy as np
import pytest

import gradientmail as gm
from gradientmail.algorithms.diloco import RUN_FIELDS
from gradientmail.audit import audit_run
from gradientmail.backends import get_backend, payload
from gradientmail.backends.lossless import FRAME_BYTES, LosslessError, compress, decompress, stored_bound
from gradientmail.errors import CorruptPayload
from gradientmail.records import Contribution
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import ContributionCounts, RunStore
from gradientmail.syncer.repair import restore_version
from gradientmail.syncer.rounds import replay_round
from gradientmail.syncer.runtime import SyncerRuntime
from tests.run_procs import check_history, start_learner, unique_prefix
from tests.test_quantized_exchange import learners_in_step

NUMPY = get_backend("numpy")
SHAPES = {"embed.weight": (64, 32), "mlp.weight": (32, 65), "mlp.bias": (7,)}


def arrays(seed: int, dtype: type = np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: (0.02 * rng.standard_normal(shape)).astype(dtype) for name, shape in SHAPES.items()}


# -- the codec ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "most"), [(np.float32, 0.97), (ml_dtypes.bfloat16, 0.85)])
def test_round_trips_and_saves_bytes(dtype, most) -> None:  # type: ignore[no-untyped-def]
    raw = (0.02 * np.random.default_rng(0).standard_normal(200_000)).astype(dtype).tobytes()
    stored = compress(raw, np.dtype(dtype).itemsize)
    assert decompress(stored, len(raw)) == raw
    assert len(stored) < most * len(raw)  # bf16's exponent bytes shuffle together and compress
    assert len(stored) <= stored_bound(len(raw))
    assert decompress(compress(b"", 4), 0) == b""
    odd = raw[:4001]  # a tail shorter than one element travels in a frame of its own
    assert decompress(compress(odd, 4), len(odd)) == odd


def _frame_header(stored: bytes) -> tuple[int, ...]:
    return struct.unpack_from("<BBBBIII", stored, 0)


def test_frames_that_claim_more_than_the_record_are_refused_before_decoding() -> None:
    """INV-13: a reader walks the frame headers first; a frame that would decode past the declared
    size (a decompression bomb) or past what this codec writes is refused, naming why."""
    raw = np.arange(10_000, dtype=np.float32).tobytes()
    stored = compress(raw, 4)
    with pytest.raises(LosslessError, match="more than the 39999 bytes"):
        decompress(stored, len(raw) - 1)
    with pytest.raises(LosslessError, match="decode to 40000 bytes, the record declares 40001"):
        decompress(stored, len(raw) + 1)
    version, codec, flags, typesize, _, blocksize, cbytes = _frame_header(stored)
    bomb = struct.pack("<BBBBIII", version, codec, flags, typesize, FRAME_BYTES + 1, blocksize, cbytes) + stored[16:]
    with pytest.raises(LosslessError, match="not one this codec writes"):
        decompress(bomb, FRAME_BYTES + 1)
    with pytest.raises(LosslessError, match="cut short"):
        decompress(stored[:10], len(raw))
    with pytest.raises(LosslessError, match=r"claims \d+ bytes, \d+ are left"):
        decompress(stored[:-5], len(raw))
    garbled = stored[:16] + bytes(len(stored) - 16)
    with pytest.raises(LosslessError, match="does not decode"):
        decompress(garbled, len(raw))


def test_blobs_of_more_than_one_frame_round_trip(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gradientmail.backends import lossless

    monkeypatch.setattr(lossless, "FRAME_BYTES", 4096)
    raw = np.random.default_rng(3).standard_normal(5000).astype(np.float32).tobytes()  # 20 000 bytes: five frames
    stored = lossless.compress(raw, 4)
    assert lossless.decompress(stored, len(raw)) == raw
    assert len(stored) <= lossless.stored_bound(len(raw))


# -- the store ---------------------------------------------------------------------------------


@pytest.fixture
def compressed_run():  # type: ignore[no-untyped-def]
    box = gm.MemoryMailbox()
    store = RunStore(box)
    algorithm = gm.DiLoCo(sync_every=10, quorum_size=2, payload_compression="zstd")
    initial = arrays(1)
    spec, _ = join_run(store, NUMPY, initial, RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    syncer = SyncerRuntime(store, NUMPY, spec, "syncer-node", lease_ttl_s=10.0, poll_interval_s=0.2)
    syncer.run_once()
    return box, store, spec, syncer


def test_contributions_and_commits_are_stored_compressed_and_pinned_raw(compressed_run) -> None:  # type: ignore[no-untyped-def]
    """INV-16: the records' sha256 and size are the raw blob's; the objects hold zstd frames; the
    syncer merges compressed contributions, replay reproduces the committed raw bytes, the audit agrees."""
    box, store, spec, syncer = compressed_run
    deltas = [arrays(10 + j) for j in range(2)]
    published = [
        store.publish_contribution(f"l{j}", 0, 0, delta, ContributionCounts(10, 40), compress=True)
        for j, delta in enumerate(deltas)
    ]
    for item in published:
        ref = item.record.payload
        assert ref.encoding == "zstd-shuffle" and ref.stored_bytes == len(box.get(ref.key)) == item.size_bytes
        assert ref.stored_bytes < ref.size_bytes
    np.testing.assert_array_equal(store.read_delta(spec, published[0].record)["mlp.weight"], deltas[0]["mlp.weight"])
    syncer.run_once()
    record = store.read_round(0, 1)
    assert sorted(p.learner for p in record.participants) == ["l0", "l1"]
    for ref in (record.params, record.outer_state):
        assert ref.encoding == "zstd-shuffle" and len(box.get(ref.key)) == ref.stored_bytes < ref.size_bytes
    raw = store.blobs.read(record.params)
    assert len(raw) == record.params.size_bytes
    assert payload.encode(replay_round(store, NUMPY, spec, 0, 1)) == raw
    assert audit_run(store, spec).failures == []


def test_a_damaged_or_swapped_compressed_object_is_refused_and_restored_from_replay(compressed_run) -> None:  # type: ignore[no-untyped-def]
    box, store, spec, syncer = compressed_run
    for j in range(2):
        store.publish_contribution(f"l{j}", 0, 0, arrays(20 + j), ContributionCounts(10, 40), compress=True)
    syncer.run_once()
    record = store.read_round(0, 1)
    ref = record.params
    intact = store.blobs.read(ref)
    box.put(ref.key, compress(intact[:-4] + b"\x00\x00\x00\x01", 4))  # frames that decode to other bytes
    with pytest.raises(CorruptPayload, match="checksum mismatch"):
        store.blobs.read(ref)
    box.put(ref.key, intact)  # the raw bytes where frames belong
    with pytest.raises(CorruptPayload, match=ref.key):
        store.blobs.read(ref)
    box.put(ref.key, bytes(stored_bound(ref.size_bytes) + 1))  # more than any frames of it
    with pytest.raises(CorruptPayload, match="the most .* compress to"):
        store.blobs.read(ref)
    assert restore_version(store, NUMPY, spec, 0, 1) == [ref.key]
    assert store.blobs.read(ref) == intact


def test_quantized_payloads_are_stored_as_they_are() -> None:
    """An int4 contribution is already compact: compressing it is skipped even when asked."""
    box = gm.MemoryMailbox()
    store = RunStore(box)
    algorithm = gm.DiLoCo(sync_every=10, payload_compression="zstd", delta_quantization="int4")
    join_run(store, NUMPY, arrays(1), RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    item = store.publish_contribution("l0", 0, 0, b"already encoded", ContributionCounts(10, 40), compress=True)
    assert item.record.payload.encoding is None and box.get(item.record.payload.key) == b"already encoded"


def test_the_field_is_a_run_field_and_refuses_other_names() -> None:
    assert "payload_compression" in RUN_FIELDS
    assert gm.DiLoCo().payload_compression == "none"
    with pytest.raises(ValueError, match="payload_compression"):
        gm.DiLoCo(payload_compression="lz4")  # type: ignore[arg-type]


def test_learners_train_through_compressed_contributions_and_commits() -> None:
    """Two real sessions exchange compressed blobs: every commit's blobs are compressed, both end
    holding the committed parameters, and the audit replays every round to the raw bytes."""
    algorithm = gm.DiLoCo(sync_every=5, fragments=2, overlap_steps=0, flush_on_close=False, payload_compression="zstd")
    store, newest, _ = learners_in_step(algorithm, [arrays(5, ml_dtypes.bfloat16) for _ in range(2)])
    spec = store.read_spec()
    for fragment in range(2):
        record = store.read_round(fragment, newest[fragment])
        assert record.params.encoding == "zstd-shuffle" and record.params.wire_bytes < record.params.size_bytes
    assert audit_run(store, spec).failures == []


@pytest.mark.slow
@pytest.mark.s3
def test_learner_processes_on_s3_exchange_compressed_blobs(s3_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Three learner processes on the loopback S3 server with ``payload_compression="zstd"``: every
    version is committed once, its blobs and the contributions it merged are compressed, every
    learner ends on the same parameters, and the audit replays the rounds to the raw bytes."""
    url = f"s3://{s3_server.bucket}/{unique_prefix()}?endpoint={s3_server.endpoint_url}&region={s3_server.region}&addressing=path"
    env = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    args = ["--steps", "80", "--step-sleep", "0.02", "--wait-for", "3", "--end-together", "3", "--ttl", "1.0", "--poll", "0.05"]
    learners = [start_learner(url, f"n{i}", tmp_path, "--seed", str(i), "--compress", *args, env=env) for i in range(3)]
    for learner in learners:
        assert learner.wait() == 0
    os.environ.update(env)
    box = gm.open_mailbox(url)
    history = check_history(box, fragments=2)
    assert all(len(records) >= 3 for records in history)
    store = RunStore(box)
    for records in history:
        for record in records[1:]:
            assert record.params.encoding == record.outer_state.encoding == "zstd-shuffle"
            for participant in record.participants:
                contribution = participant.contribution
                if box.exists(contribution):  # retention may have collected it
                    assert Contribution.from_json(box.get(contribution)).payload.encoding == "zstd-shuffle"
    results = [learner.result() for learner in learners]
    assert all(result["params"] == results[0]["params"] for result in results)
    assert audit_run(store, store.read_spec()).failures == []
