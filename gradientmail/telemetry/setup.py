"""Turning telemetry on and off: the meter and tracer providers, the Prometheus endpoint, OTLP."""

from __future__ import annotations

import atexit
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from gradientmail._version import __version__
from gradientmail.errors import InvalidConfig, install_hint
from gradientmail.records import default_learner_id
from gradientmail.telemetry import hooks

log = logging.getLogger(__name__)

_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
_SIGNAL_ENDPOINT = {"metrics": "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "traces": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}
_PROTOCOLS = ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")


def otlp_requested(signal: str) -> bool:
    """Whether the standard variables ask for OTLP export of ``signal`` ("metrics" or "traces")."""
    return bool(os.environ.get(_OTLP_ENDPOINT) or os.environ.get(_SIGNAL_ENDPOINT[signal]))


@dataclass
class Telemetry:
    """Handle on the running telemetry; :func:`shutdown` (or ``.shutdown()``) flushes and stops it."""

    prometheus_address: tuple[str, int] | None
    """Where the Prometheus endpoint listens (the real port when 0 was asked for), or None."""
    otlp_metrics: bool
    """Metrics are pushed over OTLP by a reader made here."""
    otlp_traces: bool
    """Round spans are pushed over OTLP by a processor made here."""
    _meter_provider: Any = field(repr=False, default=None)
    _tracer_provider: Any = field(repr=False, default=None)
    _owned: tuple[Any, ...] = field(repr=False, default=())
    _server: Any = field(repr=False, default=None)
    _server_thread: threading.Thread | None = field(repr=False, default=None)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Push what OTLP has buffered now (metrics and finished spans); True if all went out."""
        done = True
        for provider in self._owned:
            done = bool(provider.force_flush(int(timeout_s * 1000))) and done
        return done

    def shutdown(self) -> None:
        """Flush OTLP, stop the Prometheus endpoint and detach from the library. Idempotent."""
        global _active
        if _active is self:
            hooks.set_recorder(None)
            _active = None
        for provider in self._owned:
            try:
                provider.shutdown()
            except Exception:  # flushing to a dead collector must not fail a clean exit
                log.warning("telemetry provider did not shut down cleanly", exc_info=True)
        self._owned = ()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._server_thread is not None:
            self._server_thread.join(timeout=5)
            self._server_thread = None


_active: Telemetry | None = None
_configure_lock = threading.Lock()
_exit_hook = False


def configure(
    *,
    node: str | None = None,
    version: str | None = None,
    prometheus_port: int | None = None,
    prometheus_address: str = "0.0.0.0",
    otlp: bool | None = None,
    meter_provider: Any = None,
    tracer_provider: Any = None,
) -> Telemetry:
    """Turn telemetry on for this process (it is off until this is called); replaces an earlier call.

    * ``prometheus_port`` — serve ``/metrics`` on ``prometheus_address:prometheus_port``
      (0 picks a free port, see :attr:`Telemetry.prometheus_address`).
    * ``otlp`` — push metrics and round spans over OTLP/HTTP, configured by the standard
      ``OTEL_EXPORTER_OTLP_*`` variables (endpoint, headers, timeout, compression) and
      ``OTEL_METRIC_EXPORT_INTERVAL``. ``None`` (default): on for each signal whose endpoint
      variable is set; ``True``: on for both (the exporter's default endpoint otherwise).
    * ``meter_provider`` / ``tracer_provider`` — an application's own OpenTelemetry SDK
      providers to record into instead of ones made here (their readers and exporters apply).
    * ``node`` — ``service.instance.id`` of the resource (default: this host's learner id);
      ``version`` — ``service.version`` and the instrumentation scope's (default: this package's).

    Raises ``InvalidConfig`` when the ``telemetry`` extra is not installed, the port cannot be
    bound, an OTLP protocol other than ``http/protobuf`` is asked for, or nothing would be
    exported. Sessions and syncers opened before or after this call are both covered.
    """
    global _active, _exit_hook
    with _configure_lock:
        if _active is not None:
            _active.shutdown()
        if not _exit_hook:  # one hook for the process, not one per provider: flush OTLP on exit
            atexit.register(shutdown)
            _exit_hook = True
        try:
            from gradientmail.telemetry import providers
        except ImportError as exc:
            raise InvalidConfig("telemetry", f"needs the telemetry extra ({install_hint('telemetry')}): {exc}") from None
        want_metrics = otlp if otlp is not None else otlp_requested("metrics")
        want_traces = otlp if otlp is not None else otlp_requested("traces")
        if want_metrics or want_traces:
            for name in _PROTOCOLS:
                if os.environ.get(name, "http/protobuf") != "http/protobuf":
                    raise InvalidConfig("telemetry", f"{name}={os.environ[name]!r}: only http/protobuf is supported")
        if meter_provider is None and prometheus_port is None and not want_metrics:
            raise InvalidConfig(
                "telemetry", "nothing to export: give prometheus_port, set OTEL_EXPORTER_OTLP_ENDPOINT or pass a meter_provider"
            )
        otlp_metrics = bool(want_metrics) and meter_provider is None
        otlp_traces = bool(want_traces) and tracer_provider is None
        built = providers.build(
            node=node or default_learner_id(),
            version=version or __version__,
            prometheus_port=prometheus_port,
            prometheus_address=prometheus_address,
            otlp_metrics=otlp_metrics,
            otlp_traces=otlp_traces,
            meter_provider=meter_provider,
            tracer_provider=tracer_provider,
        )
        telemetry = Telemetry(
            prometheus_address=built.prometheus_address,
            otlp_metrics=otlp_metrics,
            otlp_traces=otlp_traces,
            _meter_provider=built.meter_provider,
            _tracer_provider=built.tracer_provider,
            _owned=built.owned,
            _server=built.server,
            _server_thread=built.server_thread,
        )
        for runtime in hooks.syncers():
            built.recorder.syncer_attached(runtime)
        hooks.set_recorder(built.recorder)
        _active = telemetry
        return telemetry


def shutdown() -> None:
    """Stop telemetry if it is on (flushes OTLP); the library goes back to recording nothing."""
    with _configure_lock:
        if _active is not None:
            _active.shutdown()


def active() -> Telemetry | None:
    """The running telemetry, or None when it is off."""
    return _active
