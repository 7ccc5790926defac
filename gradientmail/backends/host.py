"""Host copies of a fragment's parameters: what the training thread hands the exchange.

A contribution costs the training thread one device→host copy into a :class:`HostBuffer`; the
delta, its encoding and the upload happen on the exchange's thread from those arrays. Each
backend says how it fills one (:meth:`Backend.new_host_buffer`, :meth:`Backend.fill_host_buffer`)
and whether a buffer is worth keeping from publish to publish (``reuses_host_buffers``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["HostBuffer"]


@dataclass(eq=False)
class HostBuffer:
    """Host arrays holding one snapshot of a fragment's parameters, reused from publish to
    publish. ``held`` is True while the exchange may still read it (from the publication until
    the next one of the fragment, or until its round is over); the training thread refills
    only a buffer that is neither held nor the one its outstanding publication names."""

    arrays: dict[str, np.ndarray]
    targets: dict[str, object] = field(default_factory=dict)
    """Framework views of ``arrays`` the training thread copies into (PyTorch: CPU tensors
    sharing their memory); empty where the arrays are filled directly."""
    held: bool = False
