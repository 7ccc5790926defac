"""A round's merge summed as its contributions arrive (``merge_arithmetic="streamed"``, issue 25).

A sum built one contribution at a time is byte for byte the sum combined at once, on every
backend, so the live syncer (which adds each contribution as it accepts it) and replay (which
combines the record's participants in one pass) commit the same bytes (INV-4). Its results are
the normalized merge's to fp32 rounding; the backends agree; a sum that no longer holds the
round's participants (a weight capped at close, a delta dropped) is taken afresh; a run whose
manifest predates the field keeps the normalized factors and replays to its bytes.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.algorithms.merge import Merge, MergeSum, merge_tensors_scaled
from gradientmail.backends import get_backend, kernels, payload
from gradientmail.backends.numpy_backend import NumpyBackend
from gradientmail.session.join import RunProposal, join_run, proposed_manifest
from gradientmail.settings import NodeSettings
from gradientmail.store import RunStore
from gradientmail.syncer import SyncerRuntime, replay_round
from gradientmail.syncer.rounds import Accepted, close_round, outer_step
from tests.backend_params import BACKENDS, tensor, values
from tests.test_exchange_units import contribute, numpy_model, syncer_on

C = kernels.KERNEL_CHUNK
NUMPY = get_backend("numpy")
MERGES: dict[str, Merge] = {"rda": gm.Rda(), "weighted_mean": gm.WeightedMean(), "iso_c": gm.IsoC()}


def _deltas(backend, count: int = 4, seed: int = 3) -> list[dict]:
    rng = np.random.default_rng(seed)
    shapes = {"blocks.0.mlp.weight": (40, 30), "blocks.0.mlp.bias": (3 * C + 5,), "tok_embed.weight": (9, 4)}
    return [
        {name: tensor(backend, rng.standard_normal(shape) * (index + 1)) for name, shape in shapes.items()}
        for index in range(count)
    ]


def _bytes(backend, merged) -> dict[str, bytes]:
    return {name: backend.to_numpy(backend.to_fp32(merged[name])).tobytes() for name in merged}


@pytest.mark.parametrize("merge", list(MERGES), ids=list(MERGES))
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_sum_added_one_at_a_time_is_the_sum_combined_at_once(backend_name, merge):
    """INV-4: the live syncer's sum (one contribution at a time) is the bytes replay's sum (all at
    once) gives, and the normalized merge's result to fp32 rounding."""
    backend = get_backend(backend_name)
    deltas = _deltas(backend)
    weights = [786432.0, 393216.0, 0.0, 196608.0]  # a zero weight on the way is a term of zero
    streamed = MergeSum(MERGES[merge], backend)
    for delta, weight in zip(deltas, weights, strict=True):
        streamed.add(delta, weight)
    at_once = MergeSum.of(MERGES[merge], backend, deltas, weights)
    assert streamed.holds(deltas, weights) and at_once.holds(deltas, weights)
    assert _bytes(backend, streamed.merged()) == _bytes(backend, at_once.merged())
    normalized = merge_tensors_scaled(MERGES[merge], deltas, weights, backend)
    for name, value in streamed.merged().items():
        expected = values(backend, normalized[name])
        scale = float(np.abs(expected).max())
        np.testing.assert_allclose(values(backend, value), expected, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("merge", list(MERGES), ids=list(MERGES))
def test_the_backends_sum_a_round_to_the_same_bytes(merge):
    """NumPy and PyTorch share the host kernels: the same bytes; MLX's own arithmetic agrees closely."""
    results = {}
    for name in BACKENDS:
        backend = get_backend(name)
        summed = MergeSum(MERGES[merge], backend)
        for delta, weight in zip(_deltas(backend), [3.0, 1.0, 0.5, 2.0], strict=True):
            summed.add(delta, weight)
        merged = summed.merged()
        results[name] = {k: values(backend, merged[k]) for k in merged}
    for key, reference in results["numpy"].items():
        assert results["torch"][key].tobytes() == reference.tobytes()
        np.testing.assert_allclose(results["mlx"][key], reference, rtol=1e-5, atol=1e-5 * float(np.abs(reference).max()))


def test_the_sum_is_the_same_on_any_kernel_thread_count():
    deltas = _deltas(NUMPY)
    outcomes = []
    previous = kernels.set_kernel_threads(1)
    try:
        for threads in (1, 2, 3):
            kernels.set_kernel_threads(threads)
            summed = MergeSum(gm.Rda(), NUMPY)
            for delta, weight in zip(deltas, [1.0, 2.0, 3.0, 4.0], strict=True):
                summed.add(delta, weight)
            outcomes.append(_bytes(NUMPY, summed.merged()))
    finally:
        kernels.set_kernel_threads(previous)
    assert outcomes[0] == outcomes[1] == outcomes[2]


def test_a_sum_that_no_longer_holds_the_participants_is_taken_afresh():
    """close_round takes the live sum only when it holds exactly the capped participants; a cap
    that changes a weight, or another list, gives the bytes of a sum taken at close."""
    deltas = _deltas(NUMPY, count=3)
    anchor = {name: np.zeros_like(value) for name, value in deltas[0].items()}
    spec = types.SimpleNamespace(algorithm=gm.DiLoCo())
    base = types.SimpleNamespace(params=anchor, state=gm.OuterState.zeros(NUMPY, anchor))
    accepted = []
    for index, (delta, (steps, samples)) in enumerate(zip(deltas, [(10, 800), (10, 400), (10, 3000)], strict=True)):
        contribution = types.SimpleNamespace(
            final=False, steps=steps, samples=samples, carried_steps=0, learner=f"l{index}", realigned=False
        )
        key = types.SimpleNamespace(record=f"r{index}", learner=f"l{index}")
        norms = {name: NUMPY.finite_norm(value) for name, value in delta.items()}
        accepted.append(Accepted(key, contribution, delta, samples * samples / steps, tensor_norms=norms))  # type: ignore[arg-type]
    live = MergeSum(gm.Rda(), NUMPY)
    for a in accepted:
        live.add(a.delta, a.weight, a.tensor_norms)

    def committed(cap, summed) -> bytes:
        draft = close_round(NUMPY, spec, base, accepted, cap, summed=summed)  # type: ignore[arg-type]
        return payload.encode(draft.params)  # type: ignore[union-attr]

    assert committed(None, live) == committed(None, None)
    capped = committed(100.0, live)  # l2's 300 samples per step are capped at 100: its weight changes
    assert capped == committed(100.0, None) and capped != committed(None, None)
    stranger = MergeSum(gm.Rda(), NUMPY)
    stranger.add(accepted[0].delta, accepted[0].weight)
    assert committed(None, stranger) == committed(None, None)


def _three_learner_round(store: RunStore, spec) -> tuple[dict, dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    counts = {"l0": (12, 3072), "l1": (6, 1536), "l2": (12, 1536)}
    for learner, (steps, samples) in counts.items():
        params = {name: rng.standard_normal(value.shape).astype(np.float32) for name, value in numpy_model().items()}
        contribute(store, learner, 0, params, steps, samples)
    syncer_on(store, spec, "syncer-node").run_once()
    record = store.read_round(0, 1)
    return counts, store.blobs.read_tensors(record.params)


def _expected(store: RunStore, spec, arithmetic: str) -> bytes:
    """The committed parameters recomputed outside the syncer: each merge form by its own function."""
    record = store.read_round(0, 1)
    base = types.SimpleNamespace(
        params=store.load_version(spec, 0, 0).params, state=gm.OuterState.zeros(NUMPY, store.load_version(spec, 0, 0).params)
    )
    deltas, weights = [], []
    for participant in record.participants:
        contribution = store.read_contribution(gm.records.keys.parse_contribution_record(participant.contribution))
        deltas.append(store.read_delta(spec, contribution))
        weights.append(participant.weight)
    if arithmetic == "normalized":
        merged = merge_tensors_scaled(spec.algorithm.merge, deltas, weights, NUMPY)
    else:
        merged = MergeSum.of(spec.algorithm.merge, NUMPY, deltas, weights).merged()
    params, _ = outer_step(NUMPY, spec, base, merged, False, record.outer_momentum)  # type: ignore[arg-type]
    return payload.encode(params)


def test_a_new_run_streams_its_merge_and_replays_to_the_committed_bytes(tmp_path):
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    spec, _ = join_run(store, NUMPY, numpy_model(1.0), RunProposal(gm.DiLoCo(), lease_ttl_s=10.0), "creator")
    assert store.read_manifest().algorithm["merge_arithmetic"] == "streamed"
    _, committed = _three_learner_round(store, spec)
    assert payload.encode(committed) == _expected(store, spec, "streamed")
    assert payload.encode(replay_round(store, NUMPY, spec, 0, 1)) == payload.encode(committed)


def test_a_run_whose_manifest_predates_the_field_keeps_the_normalized_merge(tmp_path):
    """INV-4: a manifest without ``merge_arithmetic`` (written before it existed) reads as "normalized":
    a new node joins it without a mismatch, its syncer merges as the run always did, and the
    round replays to its bytes."""
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    proposal = RunProposal(gm.DiLoCo(), lease_ttl_s=10.0)
    manifest = proposed_manifest(NUMPY, numpy_model(1.0), proposal, "creator", None)
    older = {name: value for name, value in manifest.algorithm.items() if name != "merge_arithmetic"}
    assert store.create_manifest(manifest.model_copy(update={"algorithm": older}))
    assert gm.DiLoCo.from_manifest(older).merge_arithmetic == "normalized"
    spec, created = join_run(store, NUMPY, numpy_model(1.0), proposal, "creator")
    assert not created and spec.algorithm.merge_arithmetic == "normalized"
    _, committed = _three_learner_round(store, spec)
    assert payload.encode(committed) == _expected(store, spec, "normalized")
    assert payload.encode(replay_round(store, NUMPY, spec, 0, 1)) == payload.encode(committed)


def test_the_arithmetic_is_set_as_a_user_types_it_and_a_typo_names_the_field(monkeypatch, tmp_path):
    """``GRADIENTMAIL_MERGE_ARITHMETIC`` reaches a new run's manifest; an unknown value is refused
    naming the variable's field; joining the run with another value follows the manifest."""
    monkeypatch.setenv("GRADIENTMAIL_MAILBOX", f"file://{tmp_path / 'box'}")
    monkeypatch.setenv("GRADIENTMAIL_MERGE_ARITHMETIC", "normalized")
    algorithm = NodeSettings.from_env().algorithm()
    assert algorithm.merge_arithmetic == "normalized"
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    join_run(store, NUMPY, numpy_model(1.0), RunProposal(algorithm, lease_ttl_s=10.0), "creator")
    assert store.read_manifest().algorithm["merge_arithmetic"] == "normalized"
    spec, created = join_run(store, NUMPY, numpy_model(1.0), RunProposal(gm.DiLoCo(), lease_ttl_s=10.0), "second")
    assert not created and spec.algorithm.merge_arithmetic == "normalized"  # the manifest decides
    monkeypatch.setenv("GRADIENTMAIL_MERGE_ARITHMETIC", "streaming")
    with pytest.raises(gm.InvalidConfig, match="merge_arithmetic"):
        NodeSettings.from_env()


class _CountingBackend(NumpyBackend):
    """The NumPy backend, counting the combinations of several deltas at once (a merge taken at
    close) apart from single terms and additions (a sum built as contributions arrive)."""

    def __init__(self) -> None:
        super().__init__()
        self.combined_at_once = 0
        self.accumulated = 0

    def combine(self, tensors, factors):  # type: ignore[no-untyped-def]
        if len(tensors) > 1:
            self.combined_at_once += 1
        return super().combine(tensors, factors)

    def accumulate(self, total, tensor, factor):  # type: ignore[no-untyped-def]
        self.accumulated += 1
        return super().accumulate(total, tensor, factor)


def test_the_live_syncer_sums_contributions_as_it_accepts_them_and_takes_that_sum_at_close(tmp_path):
    """A streamed round is merged while it collects: the close combines nothing at once (every
    contribution after the first was added to the running sum), and the bytes are replay's."""
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    spec, _ = join_run(store, NUMPY, numpy_model(1.0), RunProposal(gm.DiLoCo(), lease_ttl_s=10.0), "creator")
    backend = _CountingBackend()
    rng = np.random.default_rng(9)
    for learner in ("l0", "l1", "l2"):
        params = {name: rng.standard_normal(value.shape).astype(np.float32) for name, value in numpy_model().items()}
        contribute(store, learner, 0, params, 10, 640)
    SyncerRuntime(store, backend, spec, "syncer-node", lease_ttl_s=10.0, poll_interval_s=0.2).run_once()
    record = store.read_round(0, 1)
    assert len(record.participants) == 3
    assert backend.combined_at_once == 0 and backend.accumulated == 2 * len(numpy_model())
    committed = store.blobs.read_tensors(record.params)
    assert payload.encode(replay_round(store, NUMPY, spec, 0, 1)) == payload.encode(committed)
