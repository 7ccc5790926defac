"""OTLP push: metrics and round spans arrive at a loopback OTLP/HTTP receiver, configured only by
the standard ``OTEL_EXPORTER_OTLP_*`` variables."""

from __future__ import annotations

import pytest

import gradientmail as gm
from gradientmail.telemetry import METRICS, PHASES
from tests.telemetry_tools import OtlpReceiver, start_sessions


@pytest.fixture
def receiver(monkeypatch):
    server = OtlpReceiver().start()
    for name in (
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")  # ms: several exports during the run
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    gm.telemetry.shutdown()
    yield server
    gm.telemetry.shutdown()
    server.stop()


@pytest.mark.slow
def test_metrics_and_round_spans_arrive_over_otlp_http(receiver, tmp_path):
    telemetry = gm.telemetry.configure(node="otlp-node")
    assert telemetry.otlp_metrics and telemetry.otlp_traces and telemetry.prometheus_address is None
    run = start_sessions(gm.FileMailbox(tmp_path / "box"), ["a", "b", "c"], steps=120)
    run.join()
    gm.telemetry.shutdown()  # flushes what is buffered

    received: dict[str, set[str]] = {}
    phases_seen: set[str] = set()
    for request in receiver.metrics:
        for resource_metrics in request.resource_metrics:
            resource = {a.key: a.value.string_value for a in resource_metrics.resource.attributes}
            assert resource["service.name"] == "gradientmail" and resource["service.instance.id"] == "otlp-node"
            for scope in resource_metrics.scope_metrics:
                assert scope.scope.name == "gradientmail"
                for metric in scope.metrics:
                    received.setdefault(metric.name, set()).add(metric.WhichOneof("data"))
                    if metric.name == "gradientmail.round.phase.duration":
                        for point in metric.histogram.data_points:
                            phases_seen |= {a.value.string_value for a in point.attributes if a.key == "phase"}
    expected_data = {"counter": "sum", "gauge": "gauge", "histogram": "histogram"}
    for spec in METRICS:
        assert received.get(spec.name) == {expected_data[spec.kind]}, spec.name
    assert phases_seen == set(PHASES)

    spans = [span for request in receiver.spans for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    rounds = [s for s in spans if s.name == "gradientmail.round"]
    assert len(rounds) >= 4
    children: dict[bytes, list] = {}
    for span in spans:
        if span.name != "gradientmail.round":
            children.setdefault(span.parent_span_id, []).append(span)
    slack_ns = 1_000  # float rounding of the explicit times
    for root in rounds:
        attributes = {a.key: a.value for a in root.attributes}
        assert attributes["gradientmail.participants"].int_value >= 1
        assert attributes["gradientmail.version"].int_value >= 1
        kids = sorted(children[root.span_id], key=lambda s: s.start_time_unix_nano)
        assert [k.name for k in kids] == [f"gradientmail.round.{phase}" for phase in PHASES]
        assert all(k.trace_id == root.trace_id for k in kids)
        assert kids[0].start_time_unix_nano >= root.start_time_unix_nano - slack_ns
        assert kids[-1].end_time_unix_nano <= root.end_time_unix_nano + slack_ns
        for before, after in zip(kids, kids[1:]):
            assert before.end_time_unix_nano <= after.start_time_unix_nano + slack_ns
