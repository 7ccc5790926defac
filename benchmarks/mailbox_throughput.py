"""S3 mailbox throughput against plain boto3 on the same loopback SeaweedFS, side by side.

Uploads and downloads one payload (default 256 MB) through ``gm.S3Mailbox`` (parallel
multipart, ranged reads, writer nonce) and through a single boto3 ``put_object`` /
``get_object``, in one run against one server, and prints MB/s and the ratio. The baseline
is what a naive client gets from the same store. On loopback the server and the CPU, not a
link, are the limit, so parallel parts cannot win here (measured on 2 cores, 128 MB: upload
0.90x, download 0.67x); over a real network, where one connection is latency-bound, they do.
What this guards is the mailbox's own overhead (writer nonce, part bookkeeping, ranges).

Run from the repository root: python -m benchmarks.mailbox_throughput [--mb 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import gradientmail as gm
from benchmarks.seaweed import Seaweed


def best_of(repeat: int, action) -> float:
    """The fastest of ``repeat`` runs, in seconds (the least disturbed by the machine)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    payload = os.urandom(args.mb * 1024 * 1024)
    with tempfile.TemporaryDirectory() as workdir:
        server = Seaweed.start(Path(workdir))
        try:
            s3 = server.server
            client = server.client()
            mailbox = gm.S3Mailbox(
                s3.bucket,
                "bench",
                endpoint_url=s3.endpoint_url,
                region=s3.region,
                access_key_id=s3.access_key,
                secret_access_key=s3.secret_key,
                addressing_style="path",
            )
            rows = [
                (
                    "boto3 put_object",
                    best_of(args.repeat, lambda: client.put_object(Bucket=s3.bucket, Key="bench/plain", Body=payload)),
                ),
                ("gm.S3Mailbox.put", best_of(args.repeat, lambda: mailbox.put("blob", payload))),
                (
                    "boto3 get_object",
                    best_of(args.repeat, lambda: client.get_object(Bucket=s3.bucket, Key="bench/plain")["Body"].read()),
                ),
                ("gm.S3Mailbox.get", best_of(args.repeat, lambda: mailbox.get("blob"))),
            ]
            assert mailbox.get("blob") == payload
            mailbox.close()
        finally:
            server.stop()
    speeds = {name: args.mb / seconds for name, seconds in rows}
    for name, seconds in rows:
        print(f"{name:<18} {seconds:7.2f} s  {speeds[name]:8.1f} MB/s")
    print(f"upload   mailbox / boto3 single request: {speeds['gm.S3Mailbox.put'] / speeds['boto3 put_object']:.2f}x")
    print(f"download mailbox / boto3 single request: {speeds['gm.S3Mailbox.get'] / speeds['boto3 get_object']:.2f}x")


if __name__ == "__main__":
    main()
