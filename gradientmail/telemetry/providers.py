"""Building the OpenTelemetry SDK side: providers, the Prometheus reader and HTTP server, OTLP.

Imported only by ``configure()``, so the SDK and exporters are needed only when telemetry is on.
Nothing here touches OpenTelemetry's global providers: several configurations in one process
(tests) and an application's own global setup do not interfere.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client import CollectorRegistry, start_http_server

from gradientmail.errors import InvalidConfig
from gradientmail.telemetry.instruments import MetricsRecorder

SCOPE = "gradientmail"


@dataclass
class Built:
    recorder: MetricsRecorder
    meter_provider: Any
    tracer_provider: Any
    owned: tuple[Any, ...]
    """Providers made here, to flush and shut down."""
    prometheus_address: tuple[str, int] | None
    server: Any
    server_thread: threading.Thread | None


def resource(node: str, version: str) -> Resource:
    """``service.*`` attributes; ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` still apply."""
    attributes: dict[str, str] = {"service.instance.id": node, "service.version": version}
    named_elsewhere = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not named_elsewhere:
        attributes["service.name"] = "gradientmail"
    return Resource.create(attributes)


def build(
    *,
    node: str,
    version: str,
    prometheus_port: int | None,
    prometheus_address: str,
    otlp_metrics: bool,
    otlp_traces: bool,
    meter_provider: Any,
    tracer_provider: Any,
) -> Built:
    owned: list[Any] = []
    res = resource(node, version)
    server = thread = bound = None
    if meter_provider is None:
        readers: list[MetricReader] = []
        if prometheus_port is not None:
            registry = CollectorRegistry()
            # scope labels would repeat "gradientmail" on every series; target_info carries the resource
            readers.append(PrometheusMetricReader(scope_info_enabled=False, registry=registry))
            try:
                server, thread = start_http_server(prometheus_port, addr=prometheus_address, registry=registry)
            except OSError as exc:
                readers[0].shutdown()
                raise InvalidConfig(
                    "metrics_port", f"cannot serve metrics on {prometheus_address}:{prometheus_port}: {exc}"
                ) from None
            bound = (prometheus_address, int(server.server_address[1]))
        if otlp_metrics:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        meter_provider = MeterProvider(metric_readers=readers, resource=res, shutdown_on_exit=False)  # see setup.configure
        owned.append(meter_provider)
    elif prometheus_port is not None:
        raise InvalidConfig("prometheus_port", "add a Prometheus reader to your own meter_provider instead")
    if tracer_provider is None and otlp_traces:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        tracer_provider = TracerProvider(resource=res, shutdown_on_exit=False)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        owned.append(tracer_provider)
    tracer = tracer_provider.get_tracer(SCOPE, version) if tracer_provider is not None else None
    recorder = MetricsRecorder(meter_provider.get_meter(SCOPE, version), tracer)
    return Built(recorder, meter_provider, tracer_provider, tuple(owned), bound, server, thread)
