"""Quantized pseudo-gradients and compact commits through the real store, syncer and sessions.

The codec's own arithmetic is tested in test_quantize.py; here: the wire form (what is refused
and why), a syncer merging quantized contributions in fp32 and replaying them to the committed
bytes, error feedback on the learner, and learners rebuilding commits from compact updates.
"""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np
import pytest

import gradientmail as gm
from gradientmail.audit import audit_run
from gradientmail.backends import get_backend, payload
from gradientmail.backends.quantize import Codec, dequantize, quantize
from gradientmail.backends.quantized_payload import SCALES_SUFFIX, decode_dequantized, decode_parts, encode_parts
from gradientmail.errors import CorruptPayload, IncompatiblePayload, InvalidConfig
from gradientmail.records import RoundRecord
from gradientmail.session.exchange import Exchange
from gradientmail.session.fragment import LearnerFragment
from gradientmail.session.join import RunProposal, join_run
from gradientmail.store import ContributionCounts, RunStore
from gradientmail.syncer.rounds import replay_round
from gradientmail.syncer.runtime import SyncerRuntime

NUMPY = get_backend("numpy")
INT4 = Codec("int4", 128)
SHAPES = {"tok_embed.weight": (40, 8), "mlp.weight": (3, 129), "mlp.bias": (7,)}


def model(value: float = 0.0, seed: int | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        n: (rng.standard_normal(s).astype(np.float32) if seed is not None else np.full(s, value, np.float32))
        for n, s in SHAPES.items()
    }


def parts_of(arrays: dict[str, np.ndarray], codec: Codec = INT4) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {n: quantize(a, codec) for n, a in arrays.items()}


# -- the wire form -----------------------------------------------------------------------------


def test_quantized_payload_round_trips_to_the_dequantized_tensors():
    delta = model(seed=1)
    data = encode_parts(parts_of(delta), INT4)
    tensors, metadata = payload.decode(data)
    assert metadata == {"gradientmail.quantization": "int4/128"}
    assert set(tensors) == set(SHAPES) | {n + SCALES_SUFFIX for n in SHAPES}
    assert len(data) < sum(INT4.nbytes(int(np.prod(s))) for s in SHAPES.values()) + 1024
    decoded = decode_dequantized(data, INT4, SHAPES)
    for name, value in delta.items():
        codes, scales = quantize(value, INT4)
        np.testing.assert_array_equal(decoded[name], dequantize(codes, scales, INT4, value.shape))
        assert np.abs(decoded[name] - value).max() <= np.abs(value).max() / 7 / 2 * 1.0001


def _tamper(data: bytes, change) -> bytes:
    tensors, metadata = payload.decode(data)
    tensors = {n: np.array(t) for n, t in tensors.items()}
    change(tensors, metadata)
    return payload.encode(tensors, metadata)


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        (lambda t, m: m.update({"gradientmail.quantization": "int8/128"}), IncompatiblePayload, "quantized as 'int8/128'"),
        (lambda t, m: m.clear(), IncompatiblePayload, "not quantized"),
        (lambda t, m: t.pop("mlp.bias" + SCALES_SUFFIX), IncompatiblePayload, "missing ['mlp.bias#scales']"),
        (lambda t, m: t.update({"extra": np.zeros(2, np.uint8)}), IncompatiblePayload, "unexpected ['extra']"),
        (lambda t, m: t.update({"mlp.weight": t["mlp.weight"][:-1]}), IncompatiblePayload, "mlp.weight: codes are uint8[193]"),
        (lambda t, m: t.update({"mlp.bias": t["mlp.bias"].view(np.int8)}), IncompatiblePayload, "codes are int8[4]"),
        (
            lambda t, m: t.update({"mlp.bias#scales": t["mlp.bias#scales"].astype(np.float64)}),
            IncompatiblePayload,
            "scales are float64[1]",
        ),
    ],
)
def test_bad_quantized_payloads_are_refused_with_the_reason(change, error, words):
    """INV-16, INV-7: another form, missing or extra entries, wrong sizes or dtypes are named."""
    data = _tamper(encode_parts(parts_of(model(seed=2)), INT4), change)
    with pytest.raises(error) as caught:
        decode_dequantized(data, INT4, SHAPES)
    assert words in str(caught.value)


def test_truncated_quantized_payload_is_corrupt():
    data = encode_parts(parts_of(model(seed=3)), INT4)
    with pytest.raises(CorruptPayload):
        decode_parts(data[:-5], INT4, SHAPES)


def test_scales_entry_colliding_with_a_tensor_name_is_refused():
    with pytest.raises(ValueError, match="collide"):
        encode_parts({"w": quantize(np.ones(4, np.float32), INT4), "w#scales": quantize(np.ones(4, np.float32), INT4)}, INT4)


def test_quantization_settings_are_validated():
    with pytest.raises(InvalidConfig, match="delta_quantization"):
        gm.DiLoCo(delta_dtype="bfloat16", delta_quantization="int4")
    with pytest.raises(InvalidConfig, match="quantization_block"):
        gm.DiLoCo(delta_quantization="int4", quantization_block=100)
    with pytest.raises(InvalidConfig, match="delta_quantization"):
        gm.DiLoCo(delta_quantization="int3")
    assert gm.DiLoCo(delta_quantization="fp8_e4m3", quantization_block=64).delta_codec == Codec("fp8_e4m3", 64)


# -- the syncer: fp32 accumulation, rejection, replay, compact commits -------------------------


@pytest.fixture
def quantized_run(tmp_path):
    box = gm.FileMailbox(tmp_path / "box")
    store = RunStore(box)
    algorithm = gm.DiLoCo(
        sync_every=10, delta_quantization="int4", update_quantization="int8", quorum_size=2, merge=gm.WeightedMean()
    )
    spec, created = join_run(store, NUMPY, model(seed=0), RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    assert created
    syncer = SyncerRuntime(store, NUMPY, spec, "syncer-node", lease_ttl_s=10.0, poll_interval_s=0.2)
    return box, store, spec, syncer


def publish_quantized(store: RunStore, learner: str, base: int, delta: dict[str, np.ndarray], steps: int = 10) -> None:
    store.publish_contribution(learner, 0, base, encode_parts(parts_of(delta), INT4), ContributionCounts(steps, steps * 4))


def test_syncer_merges_dequantized_deltas_commits_a_compact_update_and_replays(quantized_run):
    """INV-16, INV-4: the merge takes the dequantized deltas in fp32; the commit is the base plus
    the dequantized update; replay reproduces its bytes."""
    box, store, spec, syncer = quantized_run
    base = store.load_version(spec, 0, 0).params
    deltas = {f"l{i}": {n: v * 0.01 for n, v in model(seed=10 + i).items()} for i in range(2)}
    for learner, delta in deltas.items():
        publish_quantized(store, learner, 0, delta)
    syncer.run_once()
    record: RoundRecord = store.read_round(0, 1)
    assert [p.learner for p in record.participants] == ["l0", "l1"]
    assert record.update is not None and record.update.size_bytes < record.params.size_bytes / 2  # int8 codes + scales + a header
    committed = store.load_version(spec, 0, 1)
    # The merge saw the dequantized deltas: their mean (equal weights), Nesterov from zero
    # momentum moves the exact (master) parameters by η(1 + β) = 1.33 times it.
    seen = [decode_dequantized(encode_parts(parts_of(d), INT4), INT4, SHAPES) for d in deltas.values()]
    master = {n[len("master/") :]: v for n, v in committed.outer_state.items() if n.startswith("master/")}
    assert set(master) == set(SHAPES), "every parameter keeps its exact fp32 value in the outer state"
    for name in SHAPES:
        np.testing.assert_allclose(base[name] - master[name], 1.33 * (seen[0][name] + seen[1][name]) / 2, rtol=1e-4, atol=1e-7)
    # The committed params are the base plus the dequantized update, and differ from the master
    # by at most half an int8 step of the update.
    rebuilt = store.rebuild_params(spec, record, base)
    assert payload.encode(rebuilt) == box.get(record.params.key)
    for name in SHAPES:
        step = np.abs(master[name] - base[name]).max() / 127
        assert np.abs(committed.params[name] - master[name]).max() <= step / 2 * 1.01 + 1e-7
    # INV-4: replay gives the committed bytes.
    assert payload.encode(replay_round(store, NUMPY, spec, 0, 1)) == box.get(record.params.key)


def test_rebuilding_from_the_wrong_base_is_caught_by_the_checksum(quantized_run):
    """INV-16: a rebuilt commit is used only when it matches the committed checksum."""
    box, store, spec, syncer = quantized_run
    base = store.load_version(spec, 0, 0).params
    for learner in ("l0", "l1"):
        publish_quantized(store, learner, 0, {n: v * 0.01 for n, v in model(seed=20).items()})
    syncer.run_once()
    record = store.read_round(0, 1)
    wrong = {n: v + np.float32(1e-3) for n, v in base.items()}
    with pytest.raises(CorruptPayload, match="rebuilt from its update differ"):
        store.rebuild_params(spec, record, wrong)


def test_hostile_quantized_contributions_are_rejected_and_the_round_goes_on(quantized_run):
    """INV-7, INV-16: quantized payloads that are not finite or not of the run's form are rejected with reasons."""
    box, store, spec, syncer = quantized_run
    good = {n: v * 0.01 for n, v in model(seed=30).items()}
    publish_quantized(store, "good0", 0, good)
    publish_quantized(store, "good1", 0, good)
    not_finite = {n: v.copy() for n, v in good.items()}
    not_finite["mlp.weight"][1, 5] = np.nan
    publish_quantized(store, "nan", 0, not_finite)
    floats = {n: v.copy() for n, v in good.items()}
    store.publish_contribution("floats", 0, 0, floats, ContributionCounts(10, 40))  # not quantized
    parts = parts_of(good)
    parts["mlp.bias"] = (parts["mlp.bias"][0], np.array([np.inf], np.float32))
    store.publish_contribution("inf_scale", 0, 0, encode_parts(parts, INT4), ContributionCounts(10, 40))
    syncer.run_once()
    record = store.read_round(0, 1)
    assert sorted(p.learner for p in record.participants) == ["good0", "good1"]
    reasons = {r.learner: r.reason for r in record.rejected}
    assert reasons == {"nan": "non_finite", "floats": "incompatible", "inf_scale": "non_finite"}


# -- learners: error feedback and compact fetches --------------------------------------------


def learners_in_step(algorithm: gm.DiLoCo, models: list[dict[str, np.ndarray]]) -> tuple[RunStore, list[int], list[gm.Session]]:
    """Two sessions of ``algorithm`` (two fragments, overlap 0, the guide's close) train 30 steps
    each on one mailbox and close; they must end holding exactly the committed parameters. The
    store, the newest version of each fragment and the sessions, for the caller's own checks."""
    box = gm.MemoryMailbox()
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
    sessions = [
        gm.Session(m, algorithm=algorithm, mailbox=box, learner_id=f"n{i}", options=options) for i, m in enumerate(models)
    ]
    for s in sessions:
        s.open()
    rng = np.random.default_rng(7)
    for _ in range(30):
        for model_, session in zip(models, sessions, strict=True):
            for value in model_.values():
                value -= (0.01 * rng.standard_normal(value.shape).astype(np.float32)).astype(value.dtype)
            session.step(samples=4)
    for s in sessions:
        s.close()
    store = RunStore(box)
    newest = [store.newest_version(f) or 0 for f in range(2)]
    assert all(v >= 4 for v in newest)
    spec = store.read_spec()
    for fragment in range(2):
        committed = store.load_version(spec, fragment, newest[fragment]).params
        for name, value in committed.items():
            for m in models:
                np.testing.assert_array_equal(m[name], value)  # overlap 0: both hold the commit exactly
    return store, newest, sessions


def learners_on_compact_commits(algorithm: gm.DiLoCo, models: list[dict[str, np.ndarray]]) -> tuple[RunStore, list[int]]:
    """``learners_in_step``, and they must have rebuilt commits from compact updates, never fallen back."""
    store, newest, sessions = learners_in_step(algorithm, models)
    assert sum(s.rebuilt_commits for s in sessions) >= 4
    assert sum(s.rebuild_fallbacks for s in sessions) == 0
    return store, newest


def test_learners_rebuild_commits_from_compact_updates_and_stay_in_step():
    """INV-16: learners one version behind rebuild commits from the compact update, never fall
    back, and end holding exactly the committed parameters."""
    algorithm = gm.DiLoCo(
        sync_every=5, fragments=2, overlap_steps=0, delta_quantization="int4", update_quantization="int8", flush_on_close=False
    )  # closed one after the other: both end on one version only with the guide's close
    learners_on_compact_commits(algorithm, [model(seed=5) for _ in range(2)])


def test_error_feedback_carries_what_the_codes_could_not_send():
    """One learner moving by the same step each round: with error feedback the committed
    parameters track the true path more closely than without (int2 drops most of each delta)."""

    def final_error(feedback: bool) -> float:
        box = gm.MemoryMailbox()
        params = {"w": np.zeros(4096, np.float32)}
        drift = np.random.default_rng(1).standard_normal(4096).astype(np.float32) * 1e-3
        algorithm = gm.DiLoCo(
            sync_every=1, overlap_steps=0, outer_lr=1.0, outer_momentum=0.0, delta_quantization="int2", error_feedback=feedback
        )
        options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.01)
        with gm.Session(params, algorithm=algorithm, mailbox=box, learner_id="solo", options=options) as session:
            for _ in range(30):
                params["w"] += drift
                session.step(samples=1)
        truth = 30 * drift
        return float(np.linalg.norm(params["w"] - truth) / np.linalg.norm(truth))

    with_feedback, without = final_error(True), final_error(False)
    assert with_feedback < 0.1 < without


@pytest.mark.parametrize("backend_name", ["torch", "mlx"])
def test_other_backends_replay_a_quantized_round_like_numpy(quantized_run, backend_name):
    """Dequantization and the compact update are NumPy whatever the backend; the merge and outer
    step between them agree across backends (bytes on PyTorch's host kernels, 1e-6 on MLX)."""
    box, store, spec, syncer = quantized_run
    for learner in ("l0", "l1"):
        publish_quantized(store, learner, 0, {n: v * 0.01 for n, v in model(seed=40 + len(learner)).items()})
    publish_quantized(store, "l2", 0, {n: v * 0.02 for n, v in model(seed=41).items()})
    syncer.run_once()
    record = store.read_round(0, 1)
    committed = store.load_version(spec, 0, 1).params
    other = get_backend(backend_name)
    replayed = {n: np.asarray(other.to_numpy(t)) for n, t in replay_round(store, other, spec, 0, 1).items()}
    if backend_name == "torch":
        assert payload.encode(replayed) == box.get(record.params.key)
    for name, value in committed.items():
        # MLX's outer step may differ in the last bit, which can move a code by one step
        step = float(np.abs(value).max()) / 127
        np.testing.assert_allclose(replayed[name], value, rtol=0, atol=step * 0.51 + 1e-6)


def test_the_audit_checks_compact_updates_and_replays_a_quantized_run(quantized_run):
    """INV-15, INV-16: `gradientmail audit` replays quantized rounds and rebuilds each commit from
    its update; a damaged update blob fails it."""
    box, store, spec, syncer = quantized_run
    for version in range(3):
        for learner in ("l0", "l1"):
            publish_quantized(store, learner, version, {n: v * 0.01 for n, v in model(seed=50 + version).items()})
        syncer.run_once()
    assert store.newest_version(0) == 3
    report = audit_run(store, spec)
    assert report.clean, report.failures
    update = store.read_round(0, 2).update
    assert update is not None
    data = bytearray(box.get(update.key))
    data[-1] ^= 0xFF
    box.put(update.key, bytes(data))
    report = audit_run(store, spec)
    assert any("version 2: referenced blob bad" in line for line in report.failures), report.failures


def test_bfloat16_parameters_commit_compactly_and_rebuild_exactly(tmp_path):
    """INV-16 for parameters stored in bf16: the master stays fp32, the commit is bf16(base + update)."""
    box = gm.FileMailbox(tmp_path / "box")
    store = RunStore(box)
    params = {n: v.astype(ml_dtypes.bfloat16) for n, v in model(seed=60).items()}
    algorithm = gm.DiLoCo(sync_every=10, delta_quantization="int8", update_quantization="int4", merge=gm.WeightedMean())
    spec, _ = join_run(store, NUMPY, params, RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    syncer = SyncerRuntime(store, NUMPY, spec, "syncer-node", lease_ttl_s=10.0, poll_interval_s=0.2)
    delta = {n: v * 0.01 for n, v in model(seed=61).items()}
    int8 = Codec("int8")
    store.publish_contribution("l0", 0, 0, encode_parts(parts_of(delta, int8), int8), ContributionCounts(10, 40))
    syncer.run_once()
    record = store.read_round(0, 1)
    base = store.load_version(spec, 0, 0).params
    rebuilt = store.rebuild_params(spec, record, base)
    assert all(v.dtype == ml_dtypes.bfloat16 for v in rebuilt.values())
    assert payload.encode(rebuilt) == box.get(record.params.key)
    assert payload.encode(replay_round(store, NUMPY, spec, 0, 1)) == box.get(record.params.key)


def test_a_learner_versions_behind_rebuilds_through_the_chain_of_updates(tmp_path):
    """INV-16: a learner three versions behind applies the three compact updates in turn (each
    checked against its version's checksum); a damaged one sends it to the full parameters."""
    box = gm.FileMailbox(tmp_path / "box")
    store = RunStore(box)
    rng = np.random.default_rng(70)
    base = {"w": rng.standard_normal((256, 256)).astype(np.float32)}  # int8 updates: a quarter of the parameters
    algorithm = gm.DiLoCo(sync_every=10, update_quantization="int8")
    spec, _ = join_run(store, NUMPY, base, RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    syncer = SyncerRuntime(store, NUMPY, spec, "syncer-node", lease_ttl_s=10.0, poll_interval_s=0.2)
    for version in range(3):
        delta = {"w": rng.standard_normal((256, 256)).astype(np.float32) * 0.01}
        store.publish_contribution("l0", 0, version, delta, ContributionCounts(10, 40))
        syncer.run_once()
    records = [store.read_round(0, v) for v in (1, 2, 3)]

    def late_learner() -> Exchange:
        return Exchange(
            store, spec, "late", [LearnerFragment.joined(0, ["w"], base, 0)], lease_ttl_s=10.0, poll_interval_s=1.0,
            on_change=lambda: None, lease_info=dict, clock=time.monotonic,
        )  # fmt: skip

    late = late_learner()
    late.exchange_pass()
    rebuilt = late.take_ready()[0].params
    assert payload.encode(rebuilt) == box.get(records[-1].params.key)
    assert (late.commits.compact_fetches, late.commits.compact_fallbacks) == (1, 0)
    assert late.commits.bytes_fetched == sum(r.update.size_bytes for r in records if r.update is not None)
    middle = records[1].update
    assert middle is not None
    box.put(middle.key, b"not the update")
    late = late_learner()
    late.exchange_pass()
    again = late.take_ready()[0].params
    assert payload.encode(again) == box.get(records[-1].params.key)
    assert late.commits.compact_fallbacks == 1
