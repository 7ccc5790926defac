"""Sparse pseudo-gradients (``delta_sparsity``, SparseLoCo's wire form): the chunked top-k codec,
its payload and what it refuses, error feedback, and a syncer merging sparse contributions in fp32
and replaying them to the committed bytes."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.backends import get_backend, payload
from gradientmail.backends.kernels import KERNEL_CHUNK, set_kernel_threads
from gradientmail.backends.quantized_payload import OFFSETS_SUFFIX, decode_dequantized, encode_sparse_parts
from gradientmail.backends.sparse import SparseCodec, densify, sparsify, sparsify_with_feedback
from gradientmail.errors import IncompatiblePayload, InvalidConfig
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import ContributionCounts, RunStore
from gradientmail.syncer.rounds import replay_round
from gradientmail.syncer.runtime import SyncerRuntime

NUMPY = get_backend("numpy")
TOP8 = SparseCodec(8, 64, "int4")
SHAPES = {"tok_embed.weight": (40, 8), "mlp.weight": (3, 129), "mlp.bias": (7,)}


def _random(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("numel", [1, 7, 8, 9, 64, 100, 4096 * 3, KERNEL_CHUNK * 2 + 4096 * 5 + 300])
def test_each_chunk_sends_its_largest_magnitudes_and_the_rest_arrives_as_zero(numel: int) -> None:
    codec = SparseCodec(64)
    x = _random(numel, (numel,))
    offsets, codes, scales = sparsify(x, codec)
    assert offsets.size == codec.chosen(numel) and scales.size == codec.chunks(numel)
    dense = densify(offsets, codes, scales, codec, x.shape)
    for start in range(0, numel, codec.chunk):
        chunk, sent = np.abs(x[start : start + codec.chunk]), dense[start : start + codec.chunk] != 0
        k = min(codec.k, chunk.size)
        assert sent.sum() == k  # int2 has no zero code: every chosen value arrives non-zero
        assert chunk[sent].min() >= np.sort(chunk)[-k]  # the k largest of the chunk
    chosen = dense != 0
    assert (np.sign(dense[chosen]) == np.sign(x[chosen])).all()


def test_the_bytes_do_not_depend_on_the_kernel_threads() -> None:
    codec = SparseCodec(128, 4096, "int2")
    x = _random(3, (KERNEL_CHUNK * 3 + 777,))
    previous = set_kernel_threads(1)
    try:
        one = sparsify(x, codec)
    finally:
        set_kernel_threads(previous)
    many = sparsify(x, codec)
    for a, b in zip(one, many, strict=True):
        np.testing.assert_array_equal(a, b)


def test_error_feedback_loses_nothing_only_delays_it() -> None:
    codec = SparseCodec(8, 256, "int2")
    deltas = [_random(10 + i, (1000,)) * 0.01 for i in range(40)]
    sent_total, residual = np.zeros(1000, np.float32), None
    for delta in deltas:
        offsets, codes, scales, residual = sparsify_with_feedback(delta, residual, codec)
        sent_total += densify(offsets, codes, scales, codec, delta.shape)
    assert residual is not None
    np.testing.assert_allclose(sent_total + residual, np.sum(deltas, axis=0), atol=1e-5)
    assert np.linalg.norm(residual) < 0.5 * np.linalg.norm(np.sum(deltas, axis=0))


def test_the_codec_names_and_sizes_itself_and_refuses_what_it_cannot_carry() -> None:
    codec = SparseCodec(64, 4096, "int2")
    assert codec.name == "top64of4096/int2" and SparseCodec.parse(codec.name) == codec and codec.density == 1 / 64
    assert codec.nbytes(4096 * 10) == 2 * 640 + 640 // 4 + 4 * 10  # offsets, 2-bit codes, a scale per chunk
    for bad, words in [((12,), "power of two"), ((64, 3000), "power of two"), ((64, 64), "above k"), ((64, 131072), "65536")]:
        with pytest.raises(ValueError, match=words):
            SparseCodec(*bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top<k>of<chunk>"):
        SparseCodec.parse("int4/128")


def test_the_run_setting_builds_the_codec_and_refuses_inconsistent_pairs() -> None:
    algorithm = gm.DiLoCo(delta_sparsity=1 / 32, delta_quantization="int4")
    assert algorithm.delta_codec == SparseCodec(128, 4096, "int4")
    assert gm.DiLoCo(delta_sparsity=1 / 64).delta_codec == SparseCodec(64, 4096, "int2")
    assert gm.DiLoCo.from_manifest(algorithm.to_manifest()).delta_codec == algorithm.delta_codec
    assert (
        gm.DiLoCo.from_manifest({k: v for k, v in gm.DiLoCo().to_manifest().items() if "sparsity" not in k}).delta_codec is None
    )
    for settings, words in [
        ({"delta_sparsity": 0.01}, r"whole number of elements, got 40.96; with sparsity_chunk=4096, e.g. 0.015625"),
        ({"delta_sparsity": 3 / 4096}, "power of two"),
        ({"delta_sparsity": 1 / 64, "delta_dtype": "bfloat16"}, "alternatives"),
        ({"delta_sparsity": 1 / 64, "sparsity_chunk": 3072}, "power of two"),
    ]:
        with pytest.raises(InvalidConfig, match=words):
            gm.DiLoCo(**settings)


# -- the wire form -----------------------------------------------------------------------------


def _parts(seed: int, codec: SparseCodec = TOP8) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return {name: sparsify(_random(seed + i, shape), codec) for i, (name, shape) in enumerate(SHAPES.items())}


def test_a_sparse_payload_round_trips_to_the_dense_tensors() -> None:
    parts = _parts(1)
    data = encode_sparse_parts(parts, TOP8)
    tensors, metadata = payload.decode(data)
    assert metadata == {"gradientmail.quantization": "top8of64/int4"}
    decoded = decode_dequantized(data, TOP8, SHAPES)
    for name, arrays in parts.items():
        np.testing.assert_array_equal(decoded[name], densify(*arrays, TOP8, SHAPES[name]))
    assert len(data) < sum(TOP8.nbytes(int(np.prod(s))) for s in SHAPES.values()) + 1024


def _with(change: Callable[[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]], None]) -> bytes:
    parts = _parts(2)
    change(parts)
    return encode_sparse_parts(parts, TOP8)


def _offsets(name: str, edit: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict], None]:  # type: ignore[type-arg]
    def change(parts: dict) -> None:  # type: ignore[type-arg]
        offsets, codes, scales = parts[name]
        parts[name] = (edit(offsets.copy()), codes, scales)

    return change


def _swap_first_two(offsets: np.ndarray) -> np.ndarray:
    offsets[[0, 1]] = offsets[[1, 0]]
    return offsets


def _repeat_first(offsets: np.ndarray) -> np.ndarray:
    offsets[1] = offsets[0]
    return offsets


def _past_chunk(offsets: np.ndarray) -> np.ndarray:
    offsets[7] = 64
    return offsets


def _past_tail(offsets: np.ndarray) -> np.ndarray:
    offsets[-1] = 200  # mlp.bias has 7 elements: one short chunk
    return offsets


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (_with(_offsets("mlp.weight", _swap_first_two)), "mlp.weight: offsets within a chunk are not strictly ascending"),
        (_with(_offsets("mlp.weight", _repeat_first)), "not strictly ascending (unsorted or repeated)"),
        (_with(_offsets("mlp.weight", _past_chunk)), "mlp.weight: an offset is past its chunk of 64"),
        (_with(_offsets("mlp.bias", _past_tail)), "mlp.bias: an offset is past the last chunk of 7"),
        (_with(_offsets("tok_embed.weight", lambda o: o[:-1])), "offsets are uint16[39], 320 elements need uint16[40]"),
        (_with(_offsets("tok_embed.weight", lambda o: o.astype(np.int32))), "offsets are int32"),
        (_with(lambda p: p.update({"mlp.bias": (p["mlp.bias"][0], p["mlp.bias"][1][:-1], p["mlp.bias"][2])})), "codes are"),
        (_with(lambda p: p.update({"mlp.bias": (*p["mlp.bias"][:2], np.zeros(2, np.float32))})), "scales are"),
        (
            encode_sparse_parts(_parts(3, SparseCodec(16, 64, "int4")), SparseCodec(16, 64, "int4")),
            "quantizes as 'top8of64/int4'",
        ),
        (payload.encode({"mlp.bias": np.zeros(7, np.float32)}), "not quantized"),
    ],
)
def test_malformed_sparse_payloads_are_refused_with_the_reason(data: bytes, words: str) -> None:
    with pytest.raises(IncompatiblePayload, match=re.escape(words)):
        decode_dequantized(data, TOP8, SHAPES)


def test_a_payload_missing_its_offsets_is_refused() -> None:
    tensors, metadata = payload.decode(encode_sparse_parts(_parts(4), TOP8))
    del tensors["mlp.bias" + OFFSETS_SUFFIX]
    with pytest.raises(IncompatiblePayload, match=r"missing \['mlp.bias#offsets'\]"):
        decode_dequantized(payload.encode(tensors, metadata), TOP8, SHAPES)


# -- through the store and the syncer ----------------------------------------------------------


def test_a_syncer_merges_sparse_deltas_dense_in_fp32_and_replays_the_committed_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    box = gm.FileMailbox(tmp_path / "box")
    store = RunStore(box)
    algorithm = gm.DiLoCo(sync_every=10, delta_sparsity=1 / 8, sparsity_chunk=64, delta_quantization="int4", quorum_size=2)
    initial = {name: _random(i, shape) for i, (name, shape) in enumerate(SHAPES.items())}
    spec, _ = join_run(store, NUMPY, initial, RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    codec = algorithm.delta_codec
    assert codec == TOP8
    deltas = [{name: _random(20 + 3 * j + i, shape) * 0.01 for i, (name, shape) in enumerate(SHAPES.items())} for j in range(2)]
    sent = []
    for j, delta in enumerate(deltas):
        parts = {name: sparsify(value, codec) for name, value in delta.items()}
        sent.append({name: densify(*arrays, codec, SHAPES[name]) for name, arrays in parts.items()})
        store.publish_contribution(f"l{j}", 0, 0, encode_sparse_parts(parts, codec), ContributionCounts(10, 40))
    store.publish_contribution("dense", 0, 0, deltas[0], ContributionCounts(10, 40))  # not the run's form
    syncer = SyncerRuntime(store, NUMPY, spec, "syncer-node", lease_ttl_s=10.0, poll_interval_s=0.2)
    syncer.run_once()
    record = store.read_round(0, 1)
    assert sorted(p.learner for p in record.participants) == ["l0", "l1"]
    assert {r.learner: r.reason for r in record.rejected} == {"dense": "incompatible"}
    committed = store.load_version(spec, 0, 1).params
    for name in SHAPES:  # RDA of the dense-zero-filled deltas, Nesterov from zero momentum
        moved = initial[name] - committed[name]
        assert np.count_nonzero(moved) <= np.count_nonzero(sent[0][name] + sent[1][name])
    assert payload.encode(replay_round(store, NUMPY, spec, 0, 1)) == box.get(record.params.key)


def test_learners_publishing_sparse_deltas_commit_and_carry_what_did_not_travel() -> None:
    """Real sessions: one learner moving by the same drift each round; with error feedback the
    committed parameters track the true path (what was left out goes out later), without it
    they do not."""

    def final_error(feedback: bool) -> tuple[float, int]:
        box = gm.MemoryMailbox()
        params = {"w": np.zeros(4096, np.float32)}
        drift = np.random.default_rng(1).standard_normal(4096).astype(np.float32) * 1e-3
        algorithm = gm.DiLoCo(
            sync_every=1,
            overlap_steps=0,
            outer_lr=1.0,
            outer_momentum=0.0,
            delta_sparsity=1 / 16,
            sparsity_chunk=256,
            delta_quantization="int4",
            error_feedback=feedback,
        )
        options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
        with gm.Session(params, algorithm=algorithm, mailbox=box, learner_id="solo", options=options) as session:
            for _ in range(40):
                params["w"] += drift
                session.step(samples=1)
            published = session.bytes_published
        truth = 40 * drift
        return float(np.linalg.norm(params["w"] - truth) / np.linalg.norm(truth)), published

    (with_feedback, published), (without, _) = final_error(True), final_error(False)
    assert with_feedback < 0.5 * without
    assert published < 41 * (0.25 * 4 * 4096)  # each contribution under a quarter of fp32
