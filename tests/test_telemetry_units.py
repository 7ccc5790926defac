"""Telemetry in one process: the catalogue, on/off, the Prometheus endpoint, and the counters the
syncer keeps for it (lease expirations, takeovers). No promtool needed here."""

from __future__ import annotations

import re
import time
import urllib.error

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import gradientmail as gm
from gradientmail.backends import get_backend
from gradientmail.records import keys
from gradientmail.session.join import RunProposal, join_run
from gradientmail.settings import NodeSettings
from gradientmail.store import RunStore
from gradientmail.store.leases import LearnerLease
from gradientmail.store.store_clock import StoreClock
from gradientmail.syncer import Election, SyncerRuntime
from gradientmail.telemetry import METRICS, hooks
from gradientmail.telemetry.catalogue import PHASES
from tests.fake_clock import FakeClock
from tests.telemetry_tools import ROOT, http_get, start_sessions

BOUNDED_LABELS = {"run", "fragment", "learner", "node", "holder", "reason", "phase", "kind", "operation", "outcome", "name"}
"""Labels whose values come from a fixed set or the run's own size (``operation`` and ``outcome``:
``mailbox.metered.OPERATIONS`` and its outcomes; ``name``: a session's reported scalars, at most
``session.events.REPORTED_NAMES_LIMIT``)."""


@pytest.fixture(autouse=True)
def no_telemetry(monkeypatch):
    """Each test starts with telemetry off and no OTLP variables, and leaves it off."""
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "GRADIENTMAIL_METRICS_PORT",
    ):
        monkeypatch.delenv(name, raising=False)
    gm.telemetry.shutdown()
    yield
    gm.telemetry.shutdown()


def test_the_catalogue_has_unique_bounded_helpful_names():
    names = [spec.name for spec in METRICS]
    exposed = [spec.prometheus_name for spec in METRICS]
    assert len(set(names)) == len(names) and len(set(exposed)) == len(exposed)
    for spec in METRICS:
        assert re.fullmatch(r"gradientmail(_[a-z]+)+", spec.prometheus_name), spec
        assert set(spec.labels) <= BOUNDED_LABELS, f"{spec.name}: unbounded label"
        assert spec.labels[0] == "run", f"{spec.name}: every series names its run"
        assert spec.help.strip().endswith("."), spec.name
        assert spec.prometheus_name.endswith("_total") == (spec.kind == "counter")
        if spec.unit == "s":
            assert "_seconds" in spec.prometheus_name
        if spec.unit == "By":
            assert "_bytes" in spec.prometheus_name


def test_every_metric_and_alert_is_documented():
    text = (ROOT / "docs" / "observability.md").read_text()
    for spec in METRICS:
        assert f"`{spec.prometheus_name}`" in text, spec.prometheus_name
    rules = (ROOT / "dashboards" / "prometheus" / "gradientmail.rules.yaml").read_text()
    for alert in re.findall(r"alert: (\w+)", rules):
        assert f"`{alert}`" in text, alert


def test_telemetry_is_off_until_configured_and_then_refuses_to_export_nothing():
    assert gm.telemetry.active() is None and hooks._recorder is None
    with pytest.raises(gm.InvalidConfig, match="nothing to export"):
        gm.telemetry.configure()


def test_only_otlp_over_http_protobuf(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(gm.InvalidConfig, match="http/protobuf"):
        gm.telemetry.configure()


def test_rounds_commit_with_telemetry_off(tmp_path):
    run = start_sessions(gm.FileMailbox(tmp_path / "box"), ["a", "b"], steps=30, step_sleep_s=0.0)
    run.join()
    assert gm.FileMailbox(tmp_path / "box").list(keys.rounds_prefix(0))


@pytest.mark.slow
def test_the_prometheus_endpoint_serves_every_metric_with_help(tmp_path):
    telemetry = gm.telemetry.configure(prometheus_port=0, prometheus_address="127.0.0.1", node="test-node")
    assert telemetry.prometheus_address is not None
    url = f"http://127.0.0.1:{telemetry.prometheus_address[1]}/metrics"
    run = start_sessions(gm.FileMailbox(tmp_path / "box"), ["a", "b", "c"], steps=150)
    wanted = {spec.prometheus_name.removesuffix("_total"): spec for spec in METRICS}
    families: dict = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # leader-only gauges appear once a round has committed
        families = {f.name: f for f in text_string_to_metric_families(http_get(url))}
        if wanted.keys() <= families.keys() and any(s.value > 0 for s in families["gradientmail_rounds_committed"].samples):
            break
        time.sleep(0.1)
    run.join()
    missing = wanted.keys() - families.keys()
    assert not missing, missing
    for name, spec in wanted.items():
        assert families[name].type == spec.kind and families[name].documentation == spec.help
    target = next(f for f in families.values() if f.name.startswith("target")).samples[0].labels
    assert target["service_name"] == "gradientmail" and target["service_instance_id"] == "test-node"
    gm.telemetry.shutdown()
    with pytest.raises(urllib.error.URLError):
        http_get(url, timeout=1)


def test_settings_turn_telemetry_on_only_when_asked():
    assert NodeSettings(mailbox="memory://x").telemetry() is None
    assert gm.telemetry.active() is None
    telemetry = NodeSettings(mailbox="memory://x", metrics_port=0, metrics_address="127.0.0.1", learner_id="n1").telemetry()
    assert telemetry is not None and telemetry is gm.telemetry.active()
    assert telemetry.prometheus_address is not None
    # a live session gives the exposition data (an exporter with no data points serves nothing)
    session = gm.Session(
        {"w": np.zeros(2, np.float32)}, mailbox=gm.MemoryMailbox(), learner_id="n1", options=gm.SessionOptions(run_syncer=False)
    )
    session.open()
    try:
        assert 'service_instance_id="n1"' in http_get(f"http://127.0.0.1:{telemetry.prometheus_address[1]}/metrics")
    finally:
        session.close(wait=False)


def test_the_syncer_counts_learner_leases_that_expire_but_not_those_released(tmp_path):
    """INV-6: a learner stops counting as live once its lease stood still for the run's TTL on the syncer's clock."""
    box = gm.FileMailbox(tmp_path / "box")
    store = RunStore(box)
    spec, _ = join_run(
        store, get_backend("numpy"), {"w": np.zeros(3, np.float32)}, RunProposal(gm.DiLoCo(), lease_ttl_s=10.0), "creator"
    )
    clock = FakeClock()
    syncer = SyncerRuntime(store, get_backend("numpy"), spec, "node", lease_ttl_s=2.0, poll_interval_s=0.2, clock=clock)
    dying, leaving = LearnerLease(store, "dying", 2.0), LearnerLease(store, "leaving", 2.0)
    dying.renew({})
    leaving.renew({})
    syncer.run_once()
    assert set(syncer.live) == {"dying", "leaving"}
    clock.now += 1.0
    leaving.release()
    syncer.run_once()
    assert set(syncer.live) == {"dying"} and syncer.learners.expired == 0
    clock.now += 1.5
    syncer.run_once()
    assert syncer.live == {} and syncer.learners.expired == 1


def test_a_learner_lease_already_dead_at_the_first_read_is_counted_once():
    """INV-6: judged by its stamp, a lease that stopped a TTL before this node's first read of it
    (a holder killed before a takeover) never enters the live set, and still counts as expired,
    once per version, not once per read."""
    clock = FakeClock(100.0)
    box = gm.MemoryMailbox(clock=clock)  # the store's clock: the same fake time
    store = RunStore(box)
    proposal = RunProposal(gm.DiLoCo(), lease_ttl_s=10.0)
    spec, _ = join_run(store, get_backend("numpy"), {"w": np.zeros(3, np.float32)}, proposal, "creator")
    LearnerLease(store, "killed", 10.0).renew({})
    clock.now += 30.0
    store_clock = StoreClock()
    LearnerLease(store, "node", 10.0, clock=clock, store_clock=store_clock).renew({})  # pins the store's clock
    syncer = SyncerRuntime(store, get_backend("numpy"), spec, "node", poll_interval_s=0.2, clock=clock, store_clock=store_clock)
    syncer.run_once()
    syncer.run_once()
    assert "killed" not in syncer.live and syncer.learners.expired == 1


def test_a_takeover_counts_an_expired_syncer_lease_but_not_a_released_one():
    """INV-6: a dead syncer's lease is taken over after a TTL of the observer's own clock."""
    box = gm.MemoryMailbox()
    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = Election(RunStore(box), "a", ttl_s=3.0, clock=clock_a), Election(RunStore(box), "b", ttl_s=3.0, clock=clock_b)
    assert a.poll() and not b.poll()
    clock_b.now += 3.1  # a died without a word
    assert b.poll() and b.takeovers == 1 and b.leases_expired == 1
    b.resign()
    clock_a.now += 1.1
    assert not a.poll()  # its renewal fails: deposed
    assert a.poll()  # and it takes the released lease over
    assert a.takeovers == 1 and a.leases_expired == 0


def test_lease_ages_are_judged_on_the_observers_clock(tmp_path):
    """The lease-age gauge's readings: a learner lease's age since it last changed, the syncer
    lease's since its holder renewed it (on the holder) or since it last changed (on the others)."""
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    spec, _ = join_run(
        store, get_backend("numpy"), {"w": np.zeros(3, np.float32)}, RunProposal(gm.DiLoCo(), lease_ttl_s=10.0), "creator"
    )
    clock_a, clock_b = FakeClock(), FakeClock()
    a = SyncerRuntime(store, get_backend("numpy"), spec, "a", poll_interval_s=0.2, clock=clock_a)
    b = SyncerRuntime(store, get_backend("numpy"), spec, "b", poll_interval_s=0.2, clock=clock_b)
    assert a.election.lease_age() is None and b.learners.ages() == {}
    a.run_once()
    clock_a.now += 0.2
    a.run_once()  # the renewal that announces the version it loaded (the bulletin)
    lease = LearnerLease(store, "l0", 10.0)
    lease.renew({})
    a.run_once()
    b.run_once()
    assert a.election.is_leader and a.election.lease_age() == 0.0 and b.election.lease_age() == 0.0
    clock_a.now += 2.0
    clock_b.now += 3.0
    assert a.election.lease_age() == 2.0 and b.election.lease_age() == 3.0
    assert a.learners.ages() == {"l0": 2.0} and b.learners.ages() == {"l0": 3.0}
    lease.renew({})
    b.run_once()
    assert b.learners.ages() == {"l0": 0.0} and b.election.lease_age() == 3.0  # a has not renewed yet
    a.run_once()  # 2 s is not yet a third of the TTL: no renewal
    clock_a.now += 2.0
    a.run_once()  # renews: a's age restarts, and b sees the new token on its next poll
    b.run_once()
    assert a.election.lease_age() == 0.0 and b.election.lease_age() == 0.0 and a.election.ttl_s == 10.0


@pytest.mark.slow
def test_every_series_carries_its_run_and_lease_ages_are_exported(tmp_path):
    telemetry = gm.telemetry.configure(prometheus_port=0, prometheus_address="127.0.0.1", node="test-node")
    assert telemetry.prometheus_address is not None
    url = f"http://127.0.0.1:{telemetry.prometheus_address[1]}/metrics"
    store = RunStore(gm.FileMailbox(tmp_path / "box"))
    run = start_sessions(gm.FileMailbox(tmp_path / "box"), ["a", "b"], steps=150)
    samples: list = []
    ours = ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # sessions of earlier tests may linger in this process: their own runs
        manifest = store.read_manifest()
        ours = manifest.run_id if manifest is not None else ""
        samples = [
            s for f in text_string_to_metric_families(http_get(url)) if f.name.startswith("gradientmail_") for s in f.samples
        ]
        kinds = {s.labels["kind"] for s in samples if s.name == "gradientmail_lease_age_seconds" and s.labels["run"] == ours}
        if {"learner", "syncer"} <= kinds:
            break
        time.sleep(0.1)
    run.join()
    runs = {s.labels.get("run") for s in samples}
    assert ours in runs and None not in runs and "" not in runs
    ages = [s for s in samples if s.name == "gradientmail_lease_age_seconds" and s.labels["run"] == ours]
    assert {s.labels["kind"] for s in ages} == {"learner", "syncer"}
    assert {s.labels["holder"] for s in ages} <= {"a", "b"} and all(0 <= s.value < 1.0 for s in ages)
    assert {s.value for s in samples if s.name == "gradientmail_lease_ttl_seconds" and s.labels["run"] == ours} == {1.0}


def test_round_phases_partition_the_round():
    phases = hooks.RoundPhases(
        opened_at=10.0,
        first_seen_at=12.0,
        quorum_at=12.5,
        closing_at=13.0,
        merged_at=13.25,
        stepped_at=13.5,
        committed_at=14.0,
        now=20.0,
        grace_window_s=0.5,
        grace_contributions=1,
        fetch_s=0.1,
        fetched_bytes=100,
    )
    durations = phases.durations()
    assert list(durations) == list(PHASES)
    assert durations == {"collect": 2.0, "quorum_wait": 0.5, "grace": 0.5, "merge": 0.25, "outer_step": 0.25, "commit": 0.5}
    assert sum(durations.values()) == phases.committed_at - phases.opened_at


def test_an_applications_own_providers_receive_the_metrics_and_spans(tmp_path):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry = gm.telemetry.configure(meter_provider=MeterProvider(metric_readers=[reader]), tracer_provider=tracer_provider)
    assert not telemetry.otlp_metrics and not telemetry.otlp_traces and telemetry.prometheus_address is None
    start_sessions(gm.FileMailbox(tmp_path / "box"), ["a", "b"], steps=60).join()
    data = reader.get_metrics_data()
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"gradientmail.rounds.committed", "gradientmail.learner.steps", "gradientmail.round.phase.duration"} <= names
    finished = spans.get_finished_spans()
    assert any(s.name == "gradientmail.round" for s in finished)
    assert {s.name for s in finished} >= {f"gradientmail.round.{phase}" for phase in PHASES}
