"""Where a PyTorch learner trains: the node's ``GRADIENTMAIL_DEVICE`` setting made a torch device.

``auto`` (the default) is CUDA when PyTorch sees a CUDA GPU, else Apple's MPS when present,
else the CPU. An explicit ``cpu``, ``mps``, ``cuda`` or ``cuda:N`` is used as given, and one
this machine cannot serve is an error that names the setting, instead of a silent CPU run.
The demo worker (``gradientmail node``'s default job) and ``examples/`` call
:func:`resolve_device`; the library itself takes the model on whatever device it lives on.
"""

from __future__ import annotations

import re

from gradientmail.errors import InvalidConfig

__all__ = ["DEVICE_VARIABLE", "DEVICE_PATTERN", "resolve_device", "describe_device"]

DEVICE_VARIABLE = "GRADIENTMAIL_DEVICE"
DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
"""The values ``NodeSettings.device`` accepts (the same pattern as the setting's)."""


def _unavailable(requested: str, why: str) -> InvalidConfig:
    return InvalidConfig(
        "device",
        f"{DEVICE_VARIABLE}={requested!r} but {why}; set {DEVICE_VARIABLE}=auto (the default) or cpu to train without it",
    )


def resolve_device(requested: str = "auto") -> str:
    """The torch device string to put the model (and its batches) on.

    Raises:
        InvalidConfig: (field ``device``, naming ``GRADIENTMAIL_DEVICE``) for a value outside
            ``auto|cpu|mps|cuda[:N]`` or a device this machine's PyTorch cannot use.
    """
    value = requested
    if not DEVICE_PATTERN.match(value):
        raise InvalidConfig(
            "device", f"{DEVICE_VARIABLE}={requested!r} is not a device: use auto, cpu, mps, cuda or cuda:N (N = 0, 1, …)"
        )
    import torch

    if value == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if _mps_available(torch):
            return "mps"
        return "cpu"
    if value == "cpu":
        return "cpu"
    if value == "mps":
        if not _mps_available(torch):
            raise _unavailable(requested, "this PyTorch sees no Apple MPS device (torch.backends.mps.is_available() is False)")
        return "mps"
    # cuda or cuda:N (ROCm builds answer to "cuda" too)
    if not torch.cuda.is_available():
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise _unavailable(requested, f"this PyTorch ({torch.__version__}) is built without CUDA (install a CUDA wheel)")
        raise _unavailable(
            requested,
            "no CUDA GPU is visible (no driver, or the container was given no GPU: NVIDIA container toolkit, "
            "compose's deploy.resources.reservations.devices, the chart's nvidia.com/gpu request)",
        )
    index = int(value.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise _unavailable(requested, f"only {count} CUDA GPU(s) are visible (cuda:0 … cuda:{count - 1})")
    return value


def describe_device(device: str) -> str:
    """``device`` with its hardware name where there is one (for the learner's first log line)."""
    if device.startswith("cuda"):
        import torch

        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return device


def _mps_available(torch: object) -> bool:
    backends = getattr(torch, "backends", None)
    mps = getattr(backends, "mps", None)
    return bool(mps is not None and mps.is_available())
