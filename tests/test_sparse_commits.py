"""Sparse commits (``update_sparsity``): a commit's compact change carries each chunk's largest
changes; the committed parameters are defined as the base plus that change, so learners one
version behind rebuild the very bytes committed; what did not travel stays in the syncer's
fp32 master. With sparse deltas and the plain outer step the change is the union of the
merged deltas, and ``update_sparsity = M × delta_sparsity`` carries all of it."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gradientmail as gm
from gradientmail.algorithms.diloco import RUN_FIELDS
from gradientmail.audit import audit_run
from gradientmail.backends import get_backend, payload
from gradientmail.backends.compact import apply_update, compact_update, decode_update, encode_update
from gradientmail.backends.quantize import Codec
from gradientmail.backends.quantized_payload import OFFSETS_SUFFIX, encode_sparse_parts
from gradientmail.backends.sparse import SparseCodec, densify, sparsify
from gradientmail.errors import CorruptPayload, IncompatiblePayload, InvalidConfig
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import ContributionCounts, RunStore
from gradientmail.syncer.rounds import replay_round
from gradientmail.syncer.runtime import SyncerRuntime
from tests.test_quantized_exchange import learners_on_compact_commits

NUMPY = get_backend("numpy")
SHAPES = {"tok_embed.weight": (40, 8), "mlp.weight": (3, 129), "mlp.bias": (7,)}
CHUNK = 64


def _random(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- the codec ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("values", ["int8", "int4", "int2"])
def test_a_sparse_update_is_what_a_learner_rebuilds_and_changes_at_most_k_per_chunk(dtype, values) -> None:  # type: ignore[no-untyped-def]
    codec = SparseCodec(16, 256, values)
    old = _random(1, (5, 300)).astype(dtype)
    target = old.astype(np.float32) + _random(2, old.shape) * np.float32(0.01)
    parts, committed = compact_update(old, target, codec)
    assert committed.dtype == old.dtype and committed.shape == old.shape
    assert apply_update(old, parts, codec).tobytes() == committed.tobytes()
    change = densify(*parts, codec, old.shape)
    assert (old.astype(np.float32) + change).astype(dtype).tobytes() == committed.tobytes()
    moved = (committed != old).reshape(-1)
    for start in range(0, moved.size, codec.chunk):
        assert moved[start : start + codec.chunk].sum() <= codec.k
    blob = encode_update({"w": parts}, codec)
    for got, want in zip(decode_update(blob, codec, {"w": old.shape})["w"], parts, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_change_sparser_than_k_travels_whole_and_nothing_else_moves() -> None:
    """The union case: at most k changed elements per chunk arrive exactly where they are, up to
    the value format's rounding (int8 and int4 have a zero code: elements that did not change stay as they were)."""
    codec = SparseCodec(16, 256, "int8")
    old = _random(3, (1024,))
    change = np.zeros(1024, np.float32)
    rng = np.random.default_rng(4)
    for start in range(0, 1024, 256):
        change[start + rng.choice(256, 11, replace=False)] = rng.standard_normal(11).astype(np.float32) * 0.01
    _, committed = compact_update(old, old + change, codec)
    assert not ((committed != old) & (change == 0)).any()
    np.testing.assert_allclose(committed - old, change, atol=np.abs(change).max() / 254 + 1e-6)  # half an int8 step


def test_malformed_sparse_updates_are_refused_with_the_reason() -> None:
    """INV-16: an update whose offsets leave their chunk, repeat, are out of order or miscounted,
    or that is of another form, is refused with the reason before any arithmetic."""
    codec = SparseCodec(8, 64, "int4")
    shapes = {"w": (200,)}
    offsets, codes, scales = sparsify(_random(5, (200,)), codec)
    unsorted = offsets.copy()
    unsorted[[0, 1]] = unsorted[[1, 0]]
    past = offsets.copy()
    past[3] = 64
    for bad, words in [(unsorted, "not strictly ascending"), (past, "past its chunk"), (offsets[:-1], "need uint16")]:
        with pytest.raises(IncompatiblePayload, match=words):
            decode_update(encode_sparse_parts({"w": (bad, codes, scales)}, codec), codec, shapes)
    with pytest.raises(IncompatiblePayload, match="quantized as 'int4/128'"):
        decode_update(encode_update({"w": (codes, scales)}, Codec("int4")), codec, shapes)
    data = payload.encode({"w": codes, "w#scales": scales}, {"gradientmail.quantization": codec.name})
    with pytest.raises(IncompatiblePayload, match=f"missing \\['w{OFFSETS_SUFFIX}'\\]"):
        decode_update(data, codec, shapes)


def test_the_run_setting_builds_the_update_codec_and_refuses_what_it_cannot_carry() -> None:
    algorithm = gm.DiLoCo(delta_sparsity=1 / 64, update_sparsity=1 / 16)
    assert algorithm.update_codec == SparseCodec(256, 4096, "int4")
    assert gm.DiLoCo(update_sparsity=1 / 16, update_quantization="int8").update_codec == SparseCodec(256, 4096, "int8")
    assert gm.DiLoCo.from_manifest(algorithm.to_manifest()).update_codec == algorithm.update_codec
    assert "update_sparsity" in RUN_FIELDS  # every node of a run shares it
    for settings, words in [
        ({"update_sparsity": 0.01}, r"update_sparsity × sparsity_chunk must be a whole number of elements, got 40.96"),
        ({"update_sparsity": 3 / 4096}, r"update_sparsity=0.000732422 with sparsity_chunk=4096: top-k must be a power of two"),
        ({"update_sparsity": 1 / 64, "sparsity_chunk": 3072}, "power of two"),
    ]:
        with pytest.raises(InvalidConfig, match=words):
            gm.DiLoCo(**settings)


# -- through the store, the syncer and the sessions ------------------------------------------------


@pytest.fixture
def sparse_run(tmp_path):  # type: ignore[no-untyped-def]
    box = gm.FileMailbox(tmp_path / "box")
    store = RunStore(box)
    algorithm = gm.DiLoCo(
        sync_every=10,
        delta_sparsity=1 / 8,
        update_sparsity=1 / 4,  # M × delta_sparsity for M = 2: the whole union
        update_quantization="int8",
        sparsity_chunk=CHUNK,
        delta_quantization="int4",
        outer_lr=1.0,
        outer_momentum=0.0,
        quorum_size=2,
        merge=gm.WeightedMean(),
    )
    initial = {name: _random(i, shape) for i, (name, shape) in enumerate(SHAPES.items())}
    spec, _ = join_run(store, NUMPY, initial, RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    syncer = SyncerRuntime(store, NUMPY, spec, "syncer-node", lease_ttl_s=10.0, poll_interval_s=0.2)
    return box, store, spec, syncer, initial


def _publish_sparse(store: RunStore, spec, learner: str, seed: int, base: int = 0) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    codec = spec.algorithm.delta_codec
    parts = {name: sparsify(_random(seed + i, shape) * 0.01, codec) for i, (name, shape) in enumerate(SHAPES.items())}
    store.publish_contribution(learner, 0, base, encode_sparse_parts(parts, codec), ContributionCounts(10, 40))
    return {name: densify(*arrays, codec, SHAPES[name]) for name, arrays in parts.items()}


def test_a_commit_of_sparse_deltas_changes_only_their_union_and_rebuilds_to_the_committed_bytes(sparse_run) -> None:  # type: ignore[no-untyped-def]
    """INV-16 with a sparse update, INV-4: the plain outer step moves the parameters by the merged
    deltas, whose support is the union of theirs; the update carries all of it; a learner holding
    the base rebuilds the committed bytes; replay reproduces them; the audit agrees."""
    box, store, spec, syncer, initial = sparse_run
    sent = [_publish_sparse(store, spec, f"l{j}", 20 + 3 * j) for j in range(2)]
    syncer.run_once()
    record = store.read_round(0, 1)
    assert sorted(p.learner for p in record.participants) == ["l0", "l1"]
    assert record.update is not None and record.update.size_bytes < record.params.size_bytes / 2
    committed = store.load_version(spec, 0, 1)
    master = {n[len("master/") :]: v for n, v in committed.outer_state.items() if n.startswith("master/")}
    for name in SHAPES:
        union = (sent[0][name] != 0) | (sent[1][name] != 0)
        moved = committed.params[name] != initial[name]
        assert not (moved & ~union).any(), "nothing outside the merged deltas' union moved"
        np.testing.assert_allclose(master[name], initial[name] - (sent[0][name] + sent[1][name]) / 2, atol=1e-6)
        step = np.abs(master[name] - initial[name]).max() / 127
        assert np.abs(committed.params[name] - master[name]).max() <= step / 2 * 1.01 + 1e-7
    rebuilt = store.rebuild_params(spec, record, initial)
    assert payload.encode(rebuilt) == box.get(record.params.key)
    assert payload.encode(replay_round(store, NUMPY, spec, 0, 1)) == box.get(record.params.key)
    wrong = {n: v + np.float32(1e-3) for n, v in initial.items()}
    with pytest.raises(CorruptPayload, match="rebuilt from its update differ"):
        store.rebuild_params(spec, record, wrong)
    assert audit_run(store, spec).failures == []


def test_what_a_smaller_update_leaves_out_joins_the_next_commit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """INV-16, syncer-side error feedback: with fewer elements than the union, the committed parameters
    lag the master; the next commit's change includes the lag, so over rounds they catch up."""
    box = gm.FileMailbox(tmp_path / "box")
    store = RunStore(box)
    algorithm = gm.DiLoCo(
        sync_every=10, update_sparsity=1 / 8, update_quantization="int8", sparsity_chunk=CHUNK,
        outer_lr=1.0, outer_momentum=0.0, quorum_size=1,
    )  # fmt: skip
    initial = {name: np.zeros(shape, np.float32) for name, shape in SHAPES.items()}
    spec, _ = join_run(store, NUMPY, initial, RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    syncer = SyncerRuntime(store, NUMPY, spec, "syncer-node", lease_ttl_s=10.0, poll_interval_s=0.2)
    delta = {name: _random(40 + i, shape) * 0.01 for i, (name, shape) in enumerate(SHAPES.items())}
    lags = []
    for version in range(10):  # k = 8 of 64: eight commits send every element once
        store.publish_contribution("solo", 0, version, delta if version == 0 else {n: np.zeros_like(v) for n, v in delta.items()},
                                   ContributionCounts(10, 40))  # fmt: skip
        syncer.run_once()
        committed = store.load_version(spec, 0, version + 1)
        master = {n[len("master/") :]: v for n, v in committed.outer_state.items() if n.startswith("master/")}
        lags.append(sum(float(np.abs(committed.params[n] - master[n]).sum()) for n in SHAPES))
        np.testing.assert_allclose(master["mlp.bias"], -delta["mlp.bias"], atol=1e-6)  # the master moved once, exactly
    assert lags[0] > 0 and lags[-1] < 0.01 * lags[0], lags
    assert audit_run(store, spec).failures == []


def test_learners_rebuild_sparse_commits_and_stay_in_step() -> None:
    """INV-16 with real sessions: learners one version behind rebuild every commit from its sparse
    update, never fall back, fetch fewer bytes than the parameters, and end holding exactly the
    committed parameters."""
    algorithm = gm.DiLoCo(
        sync_every=5, fragments=2, overlap_steps=0, delta_sparsity=1 / 8, update_sparsity=1 / 4, sparsity_chunk=CHUNK,
        outer_lr=1.0, outer_momentum=0.0, flush_on_close=False,
    )  # fmt: skip
    store, newest = learners_on_compact_commits(algorithm, [{n: _random(5, s) for n, s in SHAPES.items()} for _ in range(2)])
    for fragment in range(2):
        record = store.read_round(fragment, newest[fragment])
        assert record.update is not None and record.update.size_bytes < record.params.size_bytes  # headers weigh on tiny tensors
    assert audit_run(store, store.read_spec()).failures == []
