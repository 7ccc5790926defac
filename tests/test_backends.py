"""Backends: Safetensors payloads for every dtype, cross-framework bytes, model read/write."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as mnn
import numpy as np
import pytest
import torch

import gradientmail as gm
from gradientmail.backends import backend_for, get_backend
from gradientmail.backends.kernels import KERNEL_CHUNK, set_kernel_threads
from gradientmail.backends.payload import DTYPES
from tests.backend_params import BACKENDS, values

MLX_LACKS = {"float8_e4m3fn", "float8_e5m2"}


def sample(dtype: str) -> np.ndarray:
    base = np.array([[0.0, 1.5, -2.25], [3.0, -0.5, 7.0]])
    if dtype == "bool":
        return base > 0
    if dtype.startswith("uint"):
        base = np.abs(base)
    return base.astype(DTYPES[dtype][1])


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_payload_round_trip_every_dtype(name, dtype):
    backend = get_backend(name)
    if name == "mlx" and dtype in MLX_LACKS:
        with pytest.raises(TypeError):
            backend.from_numpy(sample(dtype))
        return
    original = backend.from_numpy(sample(dtype))
    assert backend.dtype_name(original) == dtype
    decoded, metadata = backend.decode(
        backend.encode({"w": original, "scalar": backend.from_numpy(sample(dtype)[0, :1])}, {"fragment": "3"})
    )
    assert metadata == {"fragment": "3"}
    assert backend.dtype_name(decoded["w"]) == dtype
    assert backend.shape(decoded["w"]) == (2, 3)
    assert backend.to_numpy(decoded["w"]).tobytes() == sample(dtype).tobytes()


@pytest.mark.parametrize("writer", BACKENDS)
@pytest.mark.parametrize("reader", BACKENDS)
def test_bf16_payload_crosses_frameworks(writer, reader):
    source = get_backend(writer).cast(get_backend(writer).from_numpy(np.array([1.0, -3.5, 1e-3], dtype=np.float32)), "bfloat16")
    data = get_backend(writer).encode({"p": source})
    decoded, _ = get_backend(reader).decode(data)
    assert get_backend(reader).dtype_name(decoded["p"]) == "bfloat16"
    np.testing.assert_array_equal(values(get_backend(reader), decoded["p"]), values(get_backend(writer), source))


def test_torch_payload_is_standard_safetensors():
    from safetensors.torch import load

    tensors = {"a": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)}
    assert torch.equal(load(get_backend("torch").encode(tensors))["a"], tensors["a"])


@pytest.mark.parametrize("garbage", [b"", b"\x00" * 7, b"\xff" * 64, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}....."])
def test_corrupt_payload_raises_corrupt_payload(garbage):
    """INV-7: a corrupt payload is refused as CorruptPayload."""
    with pytest.raises(gm.CorruptPayload):
        get_backend("numpy").decode(garbage)


def test_truncated_payload_is_corrupt():
    """INV-7: a truncated payload is refused as CorruptPayload."""
    data = get_backend("numpy").encode({"w": np.ones(100, dtype=np.float32)})
    with pytest.raises(gm.CorruptPayload):
        get_backend("numpy").decode(data[:-10])


def test_torch_model_read_write():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2).to(torch.bfloat16))
    backend = backend_for(model)
    assert backend.name == "torch"
    names = [n for n, _ in backend.named_parameters(model)]
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias"]
    copies = backend.read_parameters(model, ["0.bias", "1.weight"])
    copies["0.bias"] += 1  # a copy, not the live parameter
    assert not torch.equal(copies["0.bias"], model[0].bias)
    backend.write_parameters(model, {"1.weight": torch.full((2, 4), 0.5)})
    assert model[1].weight.dtype == torch.bfloat16 and torch.all(model[1].weight == 0.5)


def test_mlx_model_read_write():
    model = mnn.Sequential(mnn.Linear(3, 4), mnn.Linear(4, 2))
    backend = backend_for(model)
    assert backend.name == "mlx"
    assert [n for n, _ in backend.named_parameters(model)] == [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.bias",
    ]
    backend.write_parameters(model, {"layers.1.bias": mx.array([2.0, 3.0])})
    assert model.layers[1].bias.tolist() == [2.0, 3.0]
    assert backend.read_parameters(model, ["layers.1.bias"])["layers.1.bias"].tolist() == [2.0, 3.0]


def test_numpy_model_read_write():
    model = {"w": np.zeros(3, dtype=np.float16), "b": np.zeros(1, dtype=np.float32)}
    backend = backend_for(model)
    assert backend.name == "numpy"
    backend.write_parameters(model, {"w": np.array([1, 2, 3], dtype=np.float32)})
    assert model["w"].dtype == np.float16 and model["w"].tolist() == [1, 2, 3]
    with pytest.raises(KeyError, match="nope"):
        backend.read_parameters(model, ["nope"])


@pytest.mark.parametrize("name", BACKENDS)
def test_all_finite(name):
    backend = get_backend(name)
    assert backend.all_finite(backend.from_numpy(np.array([1.0, 2.0], dtype=np.float32)))
    assert not backend.all_finite(backend.from_numpy(np.array([1.0, np.nan], dtype=np.float32)))
    assert not backend.all_finite(backend.cast(backend.from_numpy(np.array([np.inf], dtype=np.float32)), "bfloat16"))
    assert backend.all_finite(backend.from_numpy(np.array([1, 2], dtype=np.int32)))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_all_finite_finds_one_bad_element_in_any_block(name: str, dtype: str) -> None:
    """Tensors of several kernel blocks (the last one partial), on one thread and on two: a
    single NaN or infinity anywhere is found, and a finite tensor passes."""
    backend = get_backend(name)
    size = 2 * KERNEL_CHUNK + 1234
    clean = backend.cast(backend.from_numpy(np.ones(size, dtype=np.float32)), dtype)
    previous = set_kernel_threads(1)
    try:
        for threads in (1, 2):
            set_kernel_threads(threads)
            assert backend.all_finite(clean)
            for where in (0, KERNEL_CHUNK - 1, KERNEL_CHUNK, size - 1):
                for bad in (np.nan, np.inf, -np.inf):
                    values = np.ones(size, dtype=np.float32)
                    values[where] = bad
                    assert not backend.all_finite(backend.cast(backend.from_numpy(values), dtype)), (threads, where, bad)
    finally:
        set_kernel_threads(previous)


def test_unknown_objects_and_names():
    with pytest.raises(gm.InvalidConfig, match="no backend recognises") as caught:
        backend_for(object())
    assert caught.value.field == "backend"
    with pytest.raises(gm.InvalidConfig, match="unknown backend"):
        get_backend("jax")
