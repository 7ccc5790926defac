"""The fused kernels of issue 13 (combine, finite_norm, outer_update) and the zero-copy decoder.

Every kernel agrees with a plain float64 reference to 1e-6 on every backend, across block
boundaries, odd and non-contiguous shapes and bf16 inputs; results are the same bytes twice
and on any thread count; the merge and outer step through the kernels give the bytes of the
unfused path; ``payload.decode`` refuses every malformed header with ``CorruptPayload``.
"""

from __future__ import annotations

import json
import math
import types
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch

import gradientmail as gm
from gradientmail.algorithms.merge import MergedDelta, merge_tensors, merge_tensors_scaled, rda, weighted_mean
from gradientmail.backends import get_backend, kernels, payload
from gradientmail.backends.kernels import KERNEL_CHUNK
from gradientmail.syncer.rounds import Accepted, merge_round, outer_step
from tests.backend_params import BACKENDS, tensor, values

C = KERNEL_CHUNK
SIZES = [0, 1, C - 1, C, C + 1, 3 * C + 5]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return get_backend(request.param)


@pytest.fixture
def threads():
    """Restore the kernel thread count after a test that changes it."""
    previous = kernels.kernel_threads()
    yield kernels.set_kernel_threads
    kernels.set_kernel_threads(previous)


def _raw(count: int, size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(count)]


def _close(actual: np.ndarray, expected: np.ndarray) -> None:
    scale = float(np.abs(expected).max()) if expected.size else 1.0
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6 * scale)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_combine_matches_float64(backend, size, dtype):
    raw = _raw(3, size)
    tensors = [tensor(backend, r, dtype) for r in raw]
    exact = [values(backend, t) for t in tensors]  # the inputs as the backend holds them
    factors = [0.5, -1.25, 3e-3]
    combined, sumsq = backend.combine_sumsq(tensors, factors)
    expected = sum(f * e for f, e in zip(factors, exact, strict=True))
    assert backend.dtype_name(combined) == "float32" and backend.shape(combined) == (size,)
    _close(values(backend, combined), np.asarray(expected))
    result = values(backend, combined)
    assert sumsq == pytest.approx(float(np.dot(result, result)), rel=1e-9, abs=1e-30)
    _close(values(backend, backend.combine(tensors, factors)), np.asarray(expected))


@pytest.mark.parametrize("shape", [(3, 5, 7), (1,), (), (0, 4), (257, 1031)])
def test_combine_odd_and_strided_shapes(backend, shape):
    rng = np.random.default_rng(5)
    raw = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    if len(shape) >= 2:  # a transposed (non-contiguous) operand where the framework has views
        base = rng.standard_normal(shape[::-1]).astype(np.float32)
        raw.append(base.T)
    tensors = [tensor(backend, r) for r in raw]
    if backend.name == "torch" and len(shape) >= 2:
        tensors[-1] = torch.from_numpy(np.ascontiguousarray(base)).permute(*reversed(range(len(shape))))
    if backend.name == "numpy" and len(shape) >= 2:
        tensors[-1] = raw[-1]
    factors = [0.25, 2.0, -1.0][: len(tensors)]
    combined = backend.combine(tensors, factors)
    expected = sum(f * r.astype(np.float64) for f, r in zip(factors, raw, strict=True))
    assert backend.shape(combined) == shape
    _close(values(backend, combined), np.asarray(expected))


def test_combine_is_linear_combination_bytes():
    """NumPy (and torch on the host): the kernel's arithmetic is linear_combination's, bit for bit."""
    raw = _raw(4, 2 * C + 3, seed=7)
    factors = [0.1, 0.2, 0.3, 0.4]
    for name in ("numpy", "torch"):
        backend = get_backend(name)
        tensors = [backend.from_numpy(r) for r in raw]
        fused = backend.to_numpy(backend.combine(tensors, factors))
        assert fused.tobytes() == backend.to_numpy(backend.linear_combination(tensors, factors)).tobytes()


def test_kernels_same_bytes_on_any_thread_count(threads):
    raw = _raw(3, 5 * C + 17, seed=9)
    numpy = get_backend("numpy")
    results = []
    for count in (1, 2, 3, 8):
        threads(count)
        combined, sumsq = numpy.combine_sumsq(raw, [0.3, 0.3, 0.4])
        theta, momentum = numpy.outer_update(raw[0], raw[1], raw[2], lr=0.7, beta=0.9, delta_scale=1.7)
        norm = numpy.finite_norm(raw[0])
        results.append((combined.tobytes(), sumsq, theta.tobytes(), momentum.tobytes(), norm))
    assert all(r == results[0] for r in results)
    torch_backend = get_backend("torch")
    tensors = [torch.from_numpy(r) for r in raw]
    combined, sumsq = torch_backend.combine_sumsq(tensors, [0.3, 0.3, 0.4])
    assert (combined.numpy().tobytes(), sumsq) == results[0][:2]  # torch on the host: the same kernels


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_finite_norm_finds_non_finite_anywhere(backend, where, bad, dtype):
    raw = _raw(1, 2 * C + 9)[0]
    index = {"first": 0, "middle": C + 1, "last": raw.size - 1}[where]
    raw[index] = bad
    assert not math.isfinite(backend.finite_norm(tensor(backend, raw, dtype)))


@pytest.mark.parametrize("size", SIZES)
def test_finite_norm_matches_float64(backend, size):
    raw = _raw(1, size, seed=3)[0] * np.float32(1e3)
    t = tensor(backend, raw)
    expected = float(np.linalg.norm(raw.astype(np.float64)))
    assert backend.finite_norm(t) == pytest.approx(expected, rel=1e-12, abs=1e-300)
    assert backend.norm(t) == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_finite_norm_huge_finite_values_and_integers():
    numpy = get_backend("numpy")
    huge = np.full(10, 3e38, np.float32)  # squares overflow fp32, not the fp64 accumulator
    assert numpy.finite_norm(huge) == pytest.approx(3e38 * math.sqrt(10), rel=1e-6)
    assert numpy.finite_norm(np.arange(5, dtype=np.int32)) == pytest.approx(math.sqrt(30))
    assert not math.isfinite(numpy.finite_norm(np.full(4, 1e300, np.float64)))  # fp64 overflow: reject


@pytest.mark.parametrize("size", [0, 1, C + 1, 2 * C])
@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_outer_update_matches_float64(backend, size, final, scale):
    theta_raw, momentum_raw, delta_raw = _raw(3, size, seed=11)
    theta, momentum, delta = (tensor(backend, r) for r in (theta_raw, momentum_raw, delta_raw))
    new_theta, new_momentum = backend.outer_update(theta, momentum, delta, lr=0.7, beta=0.9, delta_scale=scale, final=final)
    t, m, d = (r.astype(np.float64) for r in (theta_raw, momentum_raw, delta_raw))
    g = scale * d
    if final:
        expected_theta, expected_momentum = t - g, m
    else:
        expected_momentum = 0.9 * m + g
        expected_theta = t - 0.7 * (g + 0.9 * expected_momentum)
    _close(values(backend, new_theta), expected_theta)
    _close(values(backend, new_momentum), expected_momentum)
    # the inputs are untouched and the new θ never aliases them
    assert values(backend, theta).tobytes() == theta_raw.astype(np.float64).tobytes()
    assert values(backend, momentum).tobytes() == momentum_raw.astype(np.float64).tobytes()
    if backend.name == "numpy" and size:
        assert not np.shares_memory(new_theta, theta_raw) and not np.shares_memory(new_theta, delta_raw)
        if not final:
            assert not np.shares_memory(new_momentum, momentum_raw)


def test_outer_update_bf16_theta_and_delta(backend):
    theta_raw, momentum_raw, delta_raw = _raw(3, C + 3, seed=12)
    theta, delta = tensor(backend, theta_raw, "bfloat16"), tensor(backend, delta_raw, "bfloat16")
    momentum = tensor(backend, momentum_raw)
    new_theta, new_momentum = backend.outer_update(theta, momentum, delta, lr=0.7, beta=0.9)
    t, d, m = values(backend, theta), values(backend, delta), momentum_raw.astype(np.float64)
    expected_momentum = 0.9 * m + d
    _close(values(backend, new_momentum), expected_momentum)
    _close(values(backend, new_theta), t - 0.7 * (d + 0.9 * expected_momentum))


def _fragment(backend, seed: int = 13):
    rng = np.random.default_rng(seed)
    shapes = {"blocks.0.mlp.weight": (300, 1000), "blocks.0.mlp.bias": (7,), "tok_embed.weight": (50, 16)}
    deltas = [{k: tensor(backend, rng.standard_normal(s)) for k, s in shapes.items()} for _ in range(3)]
    anchor = {k: tensor(backend, rng.standard_normal(s)) for k, s in shapes.items()}
    return deltas, anchor


def test_folded_scale_gives_the_unfused_bytes(backend):
    """The outer step on a MergedDelta (scale folded in) commits the bytes of stepping on the
    materialised merge; norms given or measured give the same merge."""
    deltas, anchor = _fragment(backend)
    weights = [3.0, 1.0, 0.5]
    outer = gm.NesterovOuter()
    state = gm.OuterState.zeros(backend, anchor)
    scaled = merge_tensors_scaled(gm.Rda(), deltas, weights, backend)
    norms = [{k: backend.finite_norm(v) for k, v in d.items()} for d in deltas]
    given = merge_tensors_scaled(gm.Rda(), deltas, weights, backend, norms=norms)
    plain = merge_tensors(gm.Rda(), deltas, weights, backend)
    for name in plain:
        assert backend.encode({"x": scaled[name]}) == backend.encode({"x": plain[name]})
        assert backend.encode({"x": given[name]}) == backend.encode({"x": plain[name]})
    folded, folded_state = outer.step(backend, anchor, state, scaled)
    unfused, unfused_state = outer.step(backend, anchor, state, plain)
    assert backend.encode(folded) == backend.encode(unfused)
    assert backend.encode(folded_state.momentum) == backend.encode(unfused_state.momentum)
    assert isinstance(scaled, MergedDelta) and set(scaled) == set(plain) and len(scaled) == len(plain)


def test_merge_round_reuses_validation_norms(backend):
    deltas, anchor = _fragment(backend, seed=14)
    spec = types.SimpleNamespace(algorithm=gm.DiLoCo(merge=gm.Rda()))
    base = types.SimpleNamespace(params=anchor, state=gm.OuterState.zeros(backend, anchor))

    def accepted(with_norms: bool) -> list[Accepted]:
        out = []
        for index, delta in enumerate(deltas):
            norms = {k: backend.finite_norm(v) for k, v in delta.items()} if with_norms else {}
            contribution = types.SimpleNamespace(final=False)
            out.append(Accepted(None, contribution, delta, float(index + 1), tensor_norms=norms))  # type: ignore[arg-type]
        return out

    committed = []
    for with_norms in (True, False):
        merged, final = merge_round(backend, spec, accepted(with_norms))  # type: ignore[arg-type]
        params, _ = outer_step(backend, spec, base, merged, final, spec.algorithm.outer_momentum)  # type: ignore[arg-type]
        committed.append(backend.encode(params))
    assert committed[0] == committed[1]


def test_public_merges_keep_their_results(backend):
    raw = _raw(4, 3 * C + 1, seed=15)
    tensors = [tensor(backend, r) for r in raw]
    weights = [1.0, 2.0, 3.0, 4.0]
    shares = np.array(weights) / sum(weights)
    ref = [r.astype(np.float64) for r in raw]
    _close(values(backend, weighted_mean(tensors, weights, backend)), sum(s * r for s, r in zip(shares, ref, strict=True)))
    norms = [np.linalg.norm(r) for r in ref]
    u = sum(s * r / n for s, r, n in zip(shares, ref, norms, strict=True))
    expected = float(np.dot(shares, norms)) * u / np.linalg.norm(u)
    _close(values(backend, rda(tensors, weights, backend)), expected)


# -- zero-copy decode ----------------------------------------------------------------------
def _payload(header: object, data: bytes, *, length: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return (len(raw) if length is None else length).to_bytes(8, "little") + raw + data


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_decode_is_zero_copy_and_read_only():
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, ml_dtypes.bfloat16)}
    data = payload.encode(arrays, {"k": "v"})
    decoded, metadata = payload.decode(data)
    assert metadata == {"k": "v"}
    buffer = np.frombuffer(data, np.uint8)
    for name, array in decoded.items():
        assert not array.flags.writeable
        assert np.shares_memory(array, buffer)
        assert array.tobytes() == arrays[name].tobytes() and array.dtype == arrays[name].dtype


def test_decode_accepts_a_hand_made_payload_in_any_header_order():
    data = np.arange(4, dtype=np.float32).tobytes() + bytes([1, 2])
    header = {"b": _entry("U8", [2], 16, 18), "a": _entry("F32", [2, 2], 0, 16), "z": _entry("F32", [0, 3], 18, 18)}
    decoded, metadata = payload.decode(_payload(header, data))
    assert list(decoded) == ["a", "b", "z"] and metadata == {}
    assert decoded["a"].tolist() == [[0, 1], [2, 3]] and decoded["b"].tolist() == [1, 2] and decoded["z"].shape == (0, 3)


F32x2 = np.ones(2, np.float32).tobytes()


@pytest.mark.parametrize(
    "data, fault",
    [
        (b"\x01\x00", "shorter than the 8-byte"),
        (_payload({}, b"", length=10**9), "exceeds"),
        (_payload({}, b"", length=50), "runs past the end"),
        (_payload([1, 2], b""), "not an object"),
        (b"\x05\x00\x00\x00\x00\x00\x00\x00{abc}", "not JSON"),
        (b"\x04\x00\x00\x00\x00\x00\x00\x00\xff\xfe{}", "not JSON"),
        (b'\x18\x00\x00\x00\x00\x00\x00\x00{"a": 1, "a": 2, "b": 3}', "duplicate"),
        (_payload({"w": _entry("F33", [2], 0, 8)}, F32x2), "unsupported dtype"),
        (_payload({"w": _entry("F32", [-2], 0, 8)}, F32x2), "non-negative integers"),
        (_payload({"w": _entry("F32", [True, 2], 0, 8)}, F32x2), "non-negative integers"),
        (_payload({"w": _entry("F32", [2.0], 0, 8)}, F32x2), "non-negative integers"),
        (_payload({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, F32x2), "two non-negative"),
        (_payload({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": 1}}, F32x2), "exactly"),
        (_payload({"w": "F32"}, F32x2), "exactly"),
        (_payload({"w": _entry("F32", [2], 0, 12)}, F32x2 + b"\0" * 4), "needs 8"),
        (_payload({"w": _entry("F32", [2], 4, 12)}, b"\0" * 4 + F32x2), "gap"),
        (_payload({"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [1], 4, 8)}, F32x2), "overlaps"),
        (_payload({"w": _entry("F32", [2], 0, 8)}, F32x2 + b"x"), "trailing"),
        (_payload({"w": _entry("F32", [2], 0, 8)}, F32x2[:5]), "past the"),
        (_payload({"__metadata__": {"k": 1}}, b""), "__metadata__"),
        (_payload({"w": _entry("F32", [2**40, 2**40], 0, 2**82)}, F32x2), "past the"),
    ],
)
def test_decode_refuses_malformed_headers(data, fault):
    with pytest.raises(gm.CorruptPayload, match=fault):
        payload.decode(data)


def test_borrowed_tensors_share_the_payload_without_warnings():
    data = payload.encode({"w": np.arange(8, dtype=np.float32), "h": np.ones(4, ml_dtypes.bfloat16)})
    arrays, _ = payload.decode(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        borrowed = {name: get_backend("torch").borrow_numpy(a) for name, a in arrays.items()}
    assert borrowed["w"].data_ptr() == arrays["w"].ctypes.data
    assert borrowed["h"].dtype == torch.bfloat16 and borrowed["h"].tolist() == [1.0] * 4
    assert get_backend("numpy").borrow_numpy(arrays["w"]) is arrays["w"]
    copied = get_backend("numpy").from_numpy(arrays["w"])  # from_numpy still gives writable memory
    copied[0] = 5
    assert arrays["w"][0] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        writable = get_backend("torch").from_numpy(arrays["w"])
    writable[0] = 7
    assert arrays["w"][0] == 0


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_kernels_work_in_a_forked_child(threads):
    """The parent's pool threads do not survive a fork: a child starts its own pool."""
    import os

    threads(2)
    raw = _raw(1, 3 * C, seed=21)[0]
    expected = kernels.finite_norm_array(raw)  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        os._exit(0 if kernels.finite_norm_array(raw) == expected else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
