"""The simulator's round bottlenecks (issue 26, part 3) against hand-computed closed-form cases: bytes
per node for each syncer layout, the busiest node's share, egress cost, learners per round when steps
are short, the largest run a layout sustains, and the capacity sweep's command line."""

from __future__ import annotations

import json
import math

import pytest

from gradientmail.cli import main
from gradientmail.simulate import Model
from gradientmail.simulate.bottleneck import (
    busiest_node,
    busiest_share,
    carried_per_round,
    contributions_per_round,
    egress_bytes_per_period,
    egress_usd_per_day,
    largest_learners,
    mean_node,
    round_window_s,
)
from gradientmail.simulate.capacity import run_capacity

GB = 1e9


def bare(**changes) -> Model:
    """Only the bytes cost: no fixed round cost, an instant merge and write, 1 GB/s everywhere, T = 100 s."""
    base = dict(
        model_bytes=4 * GB,
        fragments=4,
        syncer_round_overhead_s=0.0,
        merge_bytes_per_s=1e30,
        syncer_write_bps=1e30,
        syncer_bandwidth_bps=GB,
        learner_bandwidth_bps=GB,
        store_latency_s=0.0,
        syncer_state_copies=1.0,
    )
    return Model(**{**base, **changes})


def test_bytes_per_node_for_each_layout():
    """M = 4, P = 4, a 4 GB model: one syncer reads all 16 GB of contributions and writes 4 commits ×
    (parameters + momentum); spread deals one fragment to each node. Every node's learner publishes
    4 GB and reads 4 GB of commits."""
    one, spread = bare(), bare(syncer_layout="spread")
    assert busiest_node(one, 4).ingress_bytes == pytest.approx(4 * GB + 16 * GB)
    assert busiest_node(one, 4).egress_bytes == pytest.approx(4 * GB + 4 * 2 * GB)
    assert busiest_node(spread, 4).ingress_bytes == pytest.approx(4 * GB + 4 * GB)
    assert busiest_node(spread, 4).egress_bytes == pytest.approx(4 * GB + 2 * GB)
    # the run moves the same bytes either way: only who moves them changes
    assert mean_node(one, 4) == mean_node(spread, 4)
    assert busiest_node(spread, 4) == mean_node(spread, 4)
    # closing time: each closed fragment reads 4 × 1 GB at 1 GB/s
    assert busiest_node(one, 4).closing_s == pytest.approx(16.0)
    assert busiest_node(spread, 4).closing_s == pytest.approx(4.0)


def test_busiest_share_is_what_the_spread_benchmark_measures():
    assert busiest_share(Model(fragments=8), 8) == 8  # one syncer: all of it, M× the mean
    assert busiest_share(Model(fragments=8, syncer_layout="spread"), 8) == 1
    assert busiest_share(Model(fragments=8, syncer_layout="spread"), 6) == pytest.approx(2 * 6 / 8)  # ⌈8/6⌉ on one node
    assert busiest_share(Model(fragments=4, syncer_layout="spread"), 8) == pytest.approx(2)  # 4 closers of 8 nodes


def test_syncer_load_caps_the_learners_rate():
    model = bare(model_bytes=40 * GB)  # one syncer: 4 × 10 GB per fragment at 1 GB/s, 4 fragments: 160 s per 100 s
    assert model.syncer_load(4) == pytest.approx(1.6)
    assert model.sync_efficiency(4) <= 1 / 1.6 + 1e-12
    spread = model.with_(syncer_layout="spread")
    assert spread.syncer_load(4) == pytest.approx(0.4)


def test_rounds_of_fewer_learners_mean_more_commits():
    """Two learners per round of four: each fragment closes two rounds a period; the commits double."""
    model = bare()
    whole, halves = busiest_node(model, 4), busiest_node(model, 4, contributions=2)
    assert halves.ingress_bytes - 4 * GB == pytest.approx(whole.ingress_bytes)  # learner reads 2× the commits
    assert halves.egress_bytes == pytest.approx(4 * GB + 8 * 2 * GB)
    assert egress_bytes_per_period(model, 4) == pytest.approx(16 * GB + 4 * 4 * GB)
    assert egress_bytes_per_period(model, 4, contributions=2) == pytest.approx(16 * GB + 4 * 8 * GB)


def test_egress_cost_is_bytes_read_times_the_price():
    model = bare(egress_usd_per_gb=0.02)
    periods = 86400 / 100
    assert egress_usd_per_day(model, 4) == pytest.approx(periods * 32 * 0.02)
    assert egress_usd_per_day(bare(), 4) == 0


def test_learners_per_round_from_lock_step_to_short_steps():
    model = Model(model_bytes=4e6, step_s=0.013, sync_every=20)
    assert contributions_per_round(model, 4, 0.0) == 4  # lock-step: every learner in one round
    window = round_window_s(model, 1)
    assert contributions_per_round(model, 4, 300 * window) == pytest.approx(1.0, abs=0.02)  # far apart: alone
    # between the two: 1 + W / g with the gap g = S / (M − 1), evaluated at its own answer
    spread = 3 * window
    carried = contributions_per_round(model, 4, spread)
    assert 1 < carried < 4
    assert carried == pytest.approx(1 + round_window_s(model, carried) / (spread / 3), rel=1e-6)
    # by default the phases spread evenly round the period: 13 ms steps and H = 20 make a 0.26 s
    # period, a gap of 65 ms, shorter than one poll: every learner in a round even by the slack rule
    assert contributions_per_round(model, 4) == 4
    slow = model.with_(step_s=0.5)  # a 10 s period, a gap of 2.5 s: the slack window (about 1 s) and a poll
    carried = contributions_per_round(slow, 4)
    assert 1 < carried < 2 and carried == pytest.approx(1 + round_window_s(slow, carried) / 2.5, rel=1e-6)
    # the form: sparse publishes 1 + W/g; dense ones (W + ξ_sync)/g; at most M
    assert carried_per_round(4, 3.0, 0.5, 0.1) == pytest.approx(1.5)
    assert carried_per_round(4, 3.0, 0.5, 2.0) == pytest.approx(2.5)
    assert carried_per_round(4, 0.3, 0.5, 0.0) == 4
    assert carried_per_round(1, 3.0, 0.5, 0.0) == 1


def test_largest_learners_closed_form():
    """Only bytes cost: one syncer keeps up while (M + 2) × model ≤ T × bandwidth (its closing
    plus its own learner's upload and download); spread over P = 16 divides the closing by 16."""
    one = bare(model_bytes=1 * GB, fragments=16)
    assert largest_learners(one) == math.floor(100 * GB / GB) - 2
    spread = one.with_(syncer_layout="spread")
    assert largest_learners(spread) == 16 * 98
    assert largest_learners(bare(model_bytes=60 * GB)) == 0  # one learner cannot even move its own model


def test_bad_layout_and_prices_are_refused():
    with pytest.raises(ValueError, match="syncer_layout"):
        Model(syncer_layout="many")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="egress_usd_per_gb"):
        Model(egress_usd_per_gb=-1)
    with pytest.raises(ValueError, match="syncer_write_bps"):
        Model(syncer_write_bps=0)


def test_capacity_sweep_writes_its_points_and_a_png(tmp_path, capsys):
    data = run_capacity(tmp_path, params=(1e9, 8e9))
    assert (tmp_path / "sweep_capacity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for point in data["points"]:
        assert point["spread"]["largest_learners"] >= point["one"]["largest_learners"]
    assert data["points"][0]["one"]["largest_learners"] > data["points"][1]["one"]["largest_learners"]
    assert main(["simulate", "--sweep", "capacity", "--out", str(tmp_path / "cli"), "--nic-gbps", "100"]) == 0
    assert json.loads(capsys.readouterr().out)["nic_gbit_s"] == 100
    assert main(["simulate", "--sweep", "capacity", "--nic-gbps", "0"]) == 2


def test_a_collect_is_bound_by_the_link_or_by_its_cores_whichever_is_slower():
    """4 contributions of 1 GB at 1 GB/s take 4 s on the link; at 8 core-s per GB they take
    4 × 8 / cores of CPU: 16 s on 2 cores (CPU-bound), 1 s on 32 (the link's 4 s)."""
    assert bare(fragments=1, model_bytes=GB).collect_s(4) == pytest.approx(4.0)  # no CPU figure: the link alone
    cpu_bound = bare(fragments=1, model_bytes=GB, collect_core_s_per_gb=8.0, syncer_cores=2)
    assert cpu_bound.collect_s(4) == pytest.approx(16.0)
    assert cpu_bound.sync_s(4) == pytest.approx(16.0)  # nothing else costs anything in ``bare``
    assert cpu_bound.with_(syncer_cores=32).collect_s(4) == pytest.approx(4.0)
    assert cpu_bound.with_(syncer_contribution_s=0.5).collect_s(4) == pytest.approx(18.0)  # + 4 × 0.5 s whatever the bytes
    with pytest.raises(ValueError, match="syncer_cores"):
        Model(syncer_cores=0)
    with pytest.raises(ValueError, match="collect_core_s_per_gb"):
        Model(collect_core_s_per_gb=0)
