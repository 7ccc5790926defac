"""GRADIENTMAIL_DEVICE: resolving it, the node's default job and the torch backend across
devices, and scripts/gpu-check's logic run on the CPU (the GPU paths run where a GPU exists)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from demo import worker
from demo.device import DEVICE_PATTERN, resolve_device
from gradientmail.backends import get_backend
from gradientmail.errors import InvalidConfig
from gradientmail.settings import NodeSettings

ROOT = Path(__file__).resolve().parent.parent
GPU_CHECK = ROOT / "scripts" / "gpu-check"
HAS_CUDA = torch.cuda.is_available()
HAS_MPS = torch.backends.mps.is_available()
no_cuda = pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA")


# -- resolving the setting ---------------------------------------------------------------
def test_auto_is_cuda_else_mps_else_cpu():
    assert resolve_device() == resolve_device("auto") == ("cuda" if HAS_CUDA else "mps" if HAS_MPS else "cpu")
    assert resolve_device("cpu") == "cpu"


def test_auto_prefers_cuda_and_checks_the_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda") == "cuda" and resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(InvalidConfig, match=r"GRADIENTMAIL_DEVICE='cuda:2' but only 2 CUDA GPU\(s\) are visible"):
        resolve_device("cuda:2")


@no_cuda
@pytest.mark.parametrize("requested", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_is_a_clear_error_naming_the_variable(requested):
    with pytest.raises(InvalidConfig) as caught:
        resolve_device(requested)
    assert caught.value.field == "device"
    message = str(caught.value)
    assert f"GRADIENTMAIL_DEVICE={requested!r}" in message and "CUDA" in message
    assert "GRADIENTMAIL_DEVICE=auto" in message  # and what to do instead


def test_cuda_with_a_cuda_build_but_no_gpu_says_the_container_got_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    with pytest.raises(InvalidConfig, match="no CUDA GPU is visible"):
        resolve_device("cuda")


@pytest.mark.skipif(HAS_MPS, reason="this machine has MPS")
def test_mps_without_mps_is_an_error():
    with pytest.raises(InvalidConfig, match="GRADIENTMAIL_DEVICE='mps' but this PyTorch sees no Apple MPS device"):
        resolve_device("mps")


@pytest.mark.parametrize("value", ["gpu", "CUDA", "cuda:", "cuda:x", "cuda0", " cpu", "", "tpu", "cuda:0,1"])
def test_bad_values_are_rejected_by_the_settings_and_the_resolver(value, monkeypatch):
    with pytest.raises(InvalidConfig, match="GRADIENTMAIL_DEVICE") as caught:
        resolve_device(value)
    assert caught.value.field == "device"
    monkeypatch.setenv("GRADIENTMAIL_DEVICE", value)
    with pytest.raises(InvalidConfig) as from_env:
        NodeSettings.from_env(mailbox="memory://")
    assert from_env.value.field == "device"


@pytest.mark.parametrize("value", ["auto", "cpu", "mps", "cuda", "cuda:0", "cuda:12"])
def test_good_values_pass_both(value, monkeypatch):
    monkeypatch.setenv("GRADIENTMAIL_DEVICE", value)
    assert NodeSettings.from_env(mailbox="memory://").device == value
    assert DEVICE_PATTERN.match(value)


# -- the node's default job ----------------------------------------------------------------
def test_the_node_passes_its_device_to_the_default_job(monkeypatch):
    assert worker.node_worker_config(NodeSettings.from_env(mailbox="memory://")).device == "auto"
    monkeypatch.setenv("GRADIENTMAIL_DEVICE", "cpu")
    assert worker.node_worker_config(NodeSettings.from_env(mailbox="memory://")).device == "cpu"
    assert worker.parse_args(["--mailbox", "memory://", "--learner-id", "a", "--steps", "0", "--seed", "0"]).device == "cpu"


@no_cuda
def test_a_default_job_asked_for_cuda_stops_before_joining(tmp_path):
    mailbox = tmp_path / "mailbox"
    config = worker.WorkerConfig(mailbox=mailbox.as_uri(), learner_id="a", steps=1, seed=0, device="cuda")
    with pytest.raises(InvalidConfig, match="GRADIENTMAIL_DEVICE='cuda'"):
        worker.run(config)
    assert not mailbox.exists()  # nothing was written: the run is not created by a learner that cannot train
    mlx = worker.WorkerConfig(mailbox=mailbox.as_uri(), learner_id="a", steps=1, seed=0, framework="mlx", device="cuda")
    with pytest.raises(InvalidConfig, match="applies to PyTorch"):
        worker.run(mlx)


# -- the torch backend across devices --------------------------------------------------------
def test_mixed_device_arithmetic_runs_on_the_accelerators_device():
    """A learner's host anchor (decoded from the mailbox) against its live parameters on a GPU:
    shown with the meta device, which stands in for any non-CPU device here."""
    backend = get_backend("torch")
    host = torch.ones(4, dtype=torch.bfloat16)
    other = torch.ones(4, device="meta")
    for result in (backend.sub(host, other), backend.add(other, host), backend.linear_combination([host, other], [0.5, 0.5])):
        assert result.device.type == "meta" and result.dtype == torch.float32
    same = backend.sub(torch.full((3,), 3.0), torch.ones(3))
    assert same.device.type == "cpu" and same.tolist() == [2.0, 2.0, 2.0]


def test_parameters_round_trip_through_host_arrays():
    backend = get_backend("torch")
    model = torch.nn.Linear(3, 2).to(torch.bfloat16)
    values = {name: backend.from_numpy(backend.to_numpy(p) * 0 + 1) for name, p in backend.named_parameters(model)}
    backend.write_parameters(model, values)
    assert all(p.dtype == torch.bfloat16 and bool((p == 1).all()) for p in model.parameters())
    assert all(isinstance(backend.to_numpy(p), np.ndarray) for p in model.parameters())


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (scripts/gpu-check runs the rest there)")
def test_a_cuda_model_publishes_and_aligns():
    backend = get_backend("torch")
    model = torch.nn.Linear(8, 4).cuda()
    anchor = {name: backend.from_numpy(backend.to_numpy(p)) for name, p in backend.named_parameters(model)}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    local = backend.read_parameters(model, anchor)
    delta = {name: backend.sub(anchor[name], local[name]) for name in anchor}
    assert all(t.is_cuda and bool(torch.allclose(t, torch.full_like(t, -1.0))) for t in delta.values())
    backend.write_parameters(model, anchor)
    assert all(p.is_cuda for p in model.parameters())


# -- scripts/gpu-check -------------------------------------------------------------------------
def _gpu_check(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(GPU_CHECK), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHON": sys.executable},
    )


@pytest.mark.slow
@no_cuda
def test_gpu_check_skips_without_cuda():
    result = _gpu_check()
    assert result.returncode == 0 and "gpu-check: skipped" in result.stdout and "CUDA" in result.stdout, result
    strict = _gpu_check("--strict")
    assert strict.returncode == 77 and "skipped" in strict.stdout, strict


def test_gpu_check_refuses_a_bad_device():
    result = _gpu_check("--device", "gpu")
    assert result.returncode == 2 and "--device 'gpu'" in result.stderr


@pytest.mark.slow
def test_gpu_check_logic_on_the_cpu():
    result = _gpu_check("--device", "cpu", "--steps", "12", "--merge-elements", "65536", timeout=600)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "gpu-check: passed on cpu" in out and "FAIL" not in out
    assert "cpu-learner" in out and "device-learner" in out
    assert "rounds merged again with torch on cpu and with NumPy" in out and "val loss cpu/cpu = 1.00000000" in out
    assert "DDP, 2 ranks (gloo) as one learner: leases ['pair']" in out
    assert "FSDP2, 2 ranks (gloo) as one learner: leases ['pair']" in out
