"""Metrics and round traces, exported as Prometheus and OTLP. Off until :func:`configure` is called.

::

    import gradientmail as gm

    gm.telemetry.configure(prometheus_port=9464)  # /metrics for Prometheus
    gm.telemetry.configure(otlp=True)  # OTLP/HTTP, from OTEL_EXPORTER_OTLP_*

The library records through the OpenTelemetry metrics API; learners' step counters are read by
observable instruments at collection time, so ``session.step()`` costs the same on or off.
Every metric is listed in :data:`METRICS` (``catalogue.py``) and in ``docs/observability.md``.
Needs the ``telemetry`` extra only once configured.
"""

from gradientmail.telemetry.catalogue import METRICS, PHASES, MetricSpec
from gradientmail.telemetry.setup import Telemetry, active, configure, otlp_requested, shutdown

__all__ = ["configure", "shutdown", "active", "otlp_requested", "Telemetry", "METRICS", "MetricSpec", "PHASES"]
