"""Framework backends behind one interface, chosen from a model or tensor, or by name."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from gradientmail.backends.base import Backend, Tensor
from gradientmail.errors import BackendUnavailable, InvalidConfig, install_hint

__all__ = ["Backend", "Tensor", "get_backend", "backend_for", "BACKEND_NAMES"]

_MODULES = {
    "numpy": ("gradientmail.backends.numpy_backend", "NumpyBackend"),
    "torch": ("gradientmail.backends.torch_backend", "TorchBackend"),
    "mlx": ("gradientmail.backends.mlx_backend", "MlxBackend"),
}
BACKEND_NAMES = tuple(_MODULES)
_instances: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (``"torch"``, ``"mlx"`` or ``"numpy"``).

    Raises:
        InvalidConfig: (field ``backend``) for an unknown name.
        BackendUnavailable: when the backend's framework is not installed.
    """
    if name not in _MODULES:
        raise InvalidConfig("backend", f"unknown backend {name!r}; choose one of {list(_MODULES)}")
    if name not in _instances:
        module_name, class_name = _MODULES[name]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise BackendUnavailable(f"the {name} backend needs its framework: {install_hint(name)} ({exc})") from exc
        _instances[name] = getattr(module, class_name)()
    return _instances[name]


def backend_for(obj: Any) -> Backend:
    """The backend whose framework ``obj`` (a model or tensor) belongs to.

    Only frameworks that are already imported are considered, so picking a backend never
    imports torch or MLX on its own.

    Raises:
        InvalidConfig: (field ``backend``) when no backend recognises ``obj``.
    """
    candidates = ["numpy"]
    if "torch" in sys.modules:
        candidates.insert(0, "torch")
    if "mlx.core" in sys.modules:
        candidates.insert(0, "mlx")
    for name in candidates:
        backend = get_backend(name)
        if backend.owns(obj):
            return backend
    raise InvalidConfig("backend", f"no backend recognises {type(obj).__name__}; pass backend= explicitly")
