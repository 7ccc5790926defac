"""``payload.encode`` writes exactly the bytes of ``safetensors.serialize``, with one copy.

Committed blobs are compared by sha256 on replay and when a learner rebuilds parameters from a
compact update, so the encoder may not change a single byte of what earlier versions wrote:
every dtype, names in every order (digits, capitals, non-ASCII), scalars, empty tensors,
strided input, metadata, and the cases it leaves to ``serialize`` itself.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from safetensors import TensorSpec, serialize

from gradientmail.backends import payload
from gradientmail.backends.payload import DTYPES, SERIALIZE_RANK


def _reference(arrays: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    """What ``safetensors.serialize`` writes for these arrays."""
    kept = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    specs = {
        name: TensorSpec(
            dtype=payload.dtype_name_of(array),
            shape=list(array.shape),
            data_ptr=array.ctypes.data if array.nbytes else 0,
            data_len=array.nbytes,
        )
        for name, array in kept.items()
    }
    return bytes(serialize(specs, metadata))


def _array(rng: np.random.Generator, dtype_name: str, shape: tuple[int, ...]) -> np.ndarray:
    values = rng.integers(0, 2 if dtype_name == "bool" else 100, size=shape)
    return values.astype(DTYPES[dtype_name][1])


def test_every_dtype_the_payload_carries_has_a_rank_in_safetensors_order():
    assert {code for code, _ in DTYPES.values()} == set(SERIALIZE_RANK)


@pytest.mark.parametrize("seed", range(12))
def test_random_fragments_encode_to_the_bytes_of_safetensors(seed):
    rng = np.random.default_rng(seed)
    names = ["a", "b.weight", "B.bias", "layers.10.w", "layers.2.w", "é.embed", "z", "_x", "emb€d", "0"]
    shapes = [(), (0,), (1,), (3, 5), (2, 0, 4), (7,), (4, 4, 2)]
    arrays = {}
    for name in rng.choice(names, size=int(rng.integers(1, len(names) + 1)), replace=False):
        dtype_name = str(rng.choice(sorted(DTYPES)))
        arrays[str(name)] = _array(rng, dtype_name, shapes[int(rng.integers(len(shapes)))])
    metadata = [None, {"gradientmail.quantization": "int4/128"}, {"k": "vé"}][seed % 3]
    assert payload.encode(arrays, metadata) == _reference(arrays, metadata)


def test_each_pair_of_dtypes_orders_as_safetensors_does():
    rng = np.random.default_rng(0)
    for first, second in itertools.combinations(sorted(DTYPES), 2):
        arrays = {"m": _array(rng, first, (3,)), "n": _array(rng, second, (2,))}
        assert payload.encode(arrays) == _reference(arrays), (first, second)


def test_strided_input_encodes_as_its_contiguous_form():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    arrays = {"t": base[:, ::2], "s": np.float32(3.0) * np.ones((3, 2), np.float32).T}
    expected = _reference({name: np.ascontiguousarray(array) for name, array in arrays.items()})
    assert payload.encode(arrays) == expected
    decoded, _ = payload.decode(payload.encode(arrays))
    np.testing.assert_array_equal(decoded["t"], base[:, ::2])


def test_what_the_fast_path_leaves_to_serialize_still_round_trips():
    """Several metadata entries (serialize's map has no fixed order) and control characters
    (its escapes) take serialize's own path: whatever it writes decodes to the same arrays."""
    arrays = {"tab\there": np.ones(3, np.float32), "w": np.zeros(2, np.int8)}
    for metadata in (None, {"a": "1", "b": "2"}, {"line": "one\ntwo"}):
        decoded, meta = payload.decode(payload.encode(arrays, metadata))
        assert set(decoded) == set(arrays) and meta == (metadata or {})
        for name, array in arrays.items():
            np.testing.assert_array_equal(decoded[name], array)
