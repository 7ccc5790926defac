"""``gradientmail simulate``: a discrete-event simulator of the protocol at scale (issue 14).

Goodput of data-parallel, elastic data-parallel and Decoupled DiLoCo under chip failures, and the
S3 request rate and cost of the mailbox, without the hardware. The model and every assumption:
docs/simulator.md. ``model`` holds the parameters, ``engine`` the events, ``table`` the paper's
Table 1 side by side, ``sweep`` the sweeps and their plots, ``command`` the command line.
"""

from __future__ import annotations

from gradientmail.simulate.engine import Result, simulate
from gradientmail.simulate.model import Model

__all__ = ["Model", "Result", "simulate"]
