"""Back-pressure from a thin link (issue 45): the share of each sync period a learner's transfers
take (``session.transfer_meter``), shown in its lease, and the line ``gradientmail status`` prints
with the setting that would fit (``regime.link_hint``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import gradientmail as gm
from gradientmail.backends import get_backend
from gradientmail.cli import main
from gradientmail.regime import (
    LINK_BUSY,
    WIRE_FORMS,
    contribution_bytes,
    link_hint,
    period_transfer_s,
    smallest_sync_every,
)
from gradientmail.session.join import RunProposal, join_run
from gradientmail.session.transfer_meter import LINK, LinkReading, TransferMeter
from gradientmail.store import LearnerLease, RunSpec, RunStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_meter_reads_what_a_period_of_each_fragments_transfers_needs_and_their_rates():
    clock = Clock()
    meter = TransferMeter(clock, fragments=2)
    assert meter.reading(1.0) is None  # nothing yet
    for seconds, size in ((0.2, 400_000), (0.4, 400_000)):
        up = meter.begin("up")
        clock.now += seconds
        meter.end(up, size)
    down = meter.begin("down")
    clock.now += 0.1
    meter.end(down, 1_000_000)
    reading = meter.reading(2.0)
    assert reading is not None and reading.period_s == 2.0
    # two fragments, each uploaded once a period: 2 × 0.3 s of a 2 s period, and 2 × 0.1 s of reads
    assert reading.up_share == pytest.approx(0.3) and reading.down_share == pytest.approx(0.1)
    assert reading.up_bytes_per_s == pytest.approx(800_000 / 0.6) and reading.down_bytes_per_s == pytest.approx(1e7)
    assert reading.busy_share == pytest.approx(0.4)
    for _ in range(4):  # the newest two periods' worth count: slower uploads replace the old ones
        up = meter.begin("up")
        clock.now += 1.0
        meter.end(up, 100_000)
    assert meter.reading(2.0).up_share == pytest.approx(1.0)  # type: ignore[union-attr]
    assert meter.reading(None) is None and meter.reading(0.0) is None


def test_an_upload_that_never_ends_shows_as_soon_as_it_outlasts_the_period():
    clock = Clock()
    meter = TransferMeter(clock, fragments=1)
    meter.begin("up")
    clock.now += 10.0
    reading = meter.reading(1.0)
    assert reading is not None and reading.up_share == pytest.approx(10.0) and reading.up_bytes_per_s is None
    assert reading.busy_share >= LINK_BUSY


@pytest.mark.parametrize(
    "value",
    [
        "0.9",
        {"up": "0.9", "down": 0, "period_s": 3},
        {"up": 0.9, "down": 0, "period_s": 0},
        {"up": float("nan"), "down": 0, "period_s": 3},
        {"up": 0.9, "down": 0, "period_s": 3, "up_Bps": -1},
        {"up": 0.9, "down": 0, "period_s": 3, "up_Bps": 1e20},
        {"up": 0.9, "down": 0, "period_s": 3, "surprise": 1},
        {"up": True, "down": 0, "period_s": 3},
    ],
)
def test_a_reading_another_node_wrote_is_believed_only_when_well_formed(value):
    assert LinkReading.from_info(value) is None


def test_a_reading_round_trips_through_the_lease_form():
    reading = LinkReading(0.9, 0.05, 1.25e6, None, 3.0)
    assert LinkReading.from_info(reading.as_info()) == LinkReading(0.9, 0.05, 1250000.0, None, 3.0)


def _spec(**algorithm: object) -> RunSpec:
    store = RunStore(gm.MemoryMailbox())
    params = {"w": np.zeros(1 << 20, np.float32), "b": np.zeros(4096, np.float32)}
    spec, _ = join_run(store, get_backend("numpy"), params, RunProposal(gm.DiLoCo(**algorithm), lease_ttl_s=10.0), "a")
    return spec


def test_a_link_bound_learner_is_told_the_lightest_form_that_fits_and_the_sync_every():
    spec = _spec(sync_every=20)
    hint = link_hint("a", LinkReading(0.95, 0.0, 1e6, None, 3.0), spec)
    assert hint is not None and "the link is the bottleneck" in hint and "95 %" in hint
    # int8 is about a quarter of fp32: 0.95 × 0.26 fits in half the period, so nothing lighter is named
    assert 'delta_quantization="int8"' in hint and "GRADIENTMAIL_DELTA_QUANTIZATION=int8" in hint and "int4" not in hint
    assert "sync_every=38 (GRADIENTMAIL_SYNC_EVERY=38)" in hint
    quantized = _spec(sync_every=20, delta_quantization="int8")
    lighter = link_hint("a", LinkReading(0.9, 0.0, 1e6, None, 3.0), quantized)
    assert lighter is not None and 'delta_quantization="int4"' in lighter and "0.52× the bytes" in lighter
    lightest = link_hint("a", LinkReading(0.99, 0.0, 1e6, None, 3.0), quantized)  # int4 would leave 0.51 of the period
    assert lightest is not None and 'delta_quantization="int2"' in lightest
    assert contribution_bytes(quantized, quantized.algorithm.delta_codec) < contribution_bytes(spec, None) / 3.8
    fetching = link_hint("a", LinkReading(0.2, 0.7, None, 1e6, 3.0), spec)
    assert fetching is not None and 'update_quantization="int4"' in fetching and "delta_quantization" not in fetching
    assert link_hint("a", LinkReading(LINK_BUSY - 0.01, 0.0, 1e6, None, 3.0), spec) is None


def test_status_shows_each_learners_link_and_says_when_it_is_the_bottleneck(tmp_path, capsys):
    box = gm.FileMailbox(tmp_path / "box")
    store = RunStore(box)
    join_run(store, get_backend("numpy"), {"w": np.zeros(1 << 16, np.float32)}, RunProposal(gm.DiLoCo(), lease_ttl_s=10.0), "a")
    LearnerLease(store, "thin", 10.0).renew({LINK: LinkReading(0.97, 0.01, 3.1e5, 2e6, 3.3).as_info()})
    LearnerLease(store, "fast", 10.0).renew({LINK: LinkReading(0.05, 0.01, 9e7, 9e7, 3.3).as_info()})
    LearnerLease(store, "garbled", 10.0).renew({LINK: {"up": "lots"}})
    assert main(["status", f"file://{tmp_path / 'box'}"]) == 0
    out = capsys.readouterr().out
    assert "link: a sync period's transfers need 98 % of its 3.3 s (97 % uploading, 1 % fetching); uploads at 0.31 MB/s" in out
    assert "link: unreadable" in out
    assert "thin: the link is the bottleneck" in out and "fast: the link" not in out


@pytest.mark.slow
@pytest.mark.s3
def test_a_learner_behind_a_thin_link_reads_its_transfers_as_the_bottleneck(
    make_s3_mailbox: Callable[..., gm.S3Mailbox], s3_server
):
    """A real session on SeaweedFS behind the delay proxy (16 KiB per 20 ms round trip: about
    0.8 MB/s per connection), a 1 MB fragment and about 50 ms periods: an upload needs more than
    a period, the lease says so and the hint names a lighter form."""
    from testing.delay_proxy import DelayLink

    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)
    with DelayLink.spawn("127.0.0.1", s3_server.port, rtt_ms=20, window_kib=16) as link:
        mailbox = make_s3_mailbox(endpoint_url=link.endpoint_url)
        options = gm.SessionOptions(lease_ttl_s=3.0, poll_interval_s=0.2, commit_timeout_s=30.0)
        with gm.Session(model, algorithm=gm.DiLoCo(sync_every=5), mailbox=mailbox, learner_id="thin", options=options) as session:
            deadline = time.monotonic() + 30.0
            found = None
            while time.monotonic() < deadline:
                time.sleep(0.01)
                with torch.no_grad():
                    model.weight.add_(0.001)
                session.step(samples=1)
                lease = RunStore(mailbox).leases.read_learner("thin") if session.stats.steps % 50 == 0 else None
                if lease is not None and lease.lease is not None and LINK in lease.lease.info:
                    found = LinkReading.from_info(lease.lease.info[LINK])
                    if found is not None and found.busy_share >= LINK_BUSY:
                        break
            reading = session.link_reading
            spec = RunStore(mailbox).read_spec()
    assert found is not None and found.busy_share >= LINK_BUSY, found
    assert reading is not None and reading.up_share > reading.down_share
    hint = link_hint("thin", found, spec)
    assert hint is not None and "delta_sparsity" in hint  # over 10× the period: only the sparse form fits


def _regime_table() -> list[list[str]]:
    text = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    section = text.split("### The regime map", 1)[1].split("\n\n| parameters |", 1)[1]
    lines = ("| parameters |" + section).split("\n\n", 1)[0].splitlines()
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_the_regime_map_in_the_docs_is_what_the_function_computes():
    sizes = {"100M": 10**8, "1B": 10**9, "7B": 7 * 10**9}
    links = {"1 Gbit/s": 1e9, "100 Mbit/s": 1e8, "10 Mbit/s": 1e7}
    rows = _regime_table()
    assert len(rows) == len(sizes) * len(links)
    for size, link, *cells in rows:
        assert len(cells) == len(WIRE_FORMS)
        for form, cell in zip(WIRE_FORMS, cells, strict=True):
            learner, syncer = (
                smallest_sync_every(period_transfer_s(form, sizes[size], links[link] / 8, 4, syncer=node), 1.0)
                for node in (False, True)
            )
            assert cell == f"{learner} / {syncer}", (size, link, form.name)


def test_the_defaults_node_with_the_syncer_moves_what_the_simulators_busiest_node_moves():
    from gradientmail.simulate import Model
    from gradientmail.simulate.bottleneck import busiest_node

    parameters, learners, rate = 10**9, 4, 1.25e7
    node = busiest_node(Model(model_bytes=4.0 * parameters, fragments=4), learners)
    defaults = WIRE_FORMS[0]
    predicted = period_transfer_s(defaults, parameters, rate, learners, syncer=True)
    assert predicted == pytest.approx((node.ingress_bytes + node.egress_bytes) / rate)
