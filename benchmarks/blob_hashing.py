"""CPU of one blob's write and read through the S3 mailbox, against plain boto3 in the same run.

    python -m benchmarks.blob_hashing [--sizes-mb 8 64] [--repeats 7]

What a node spends on a blob besides moving its bytes is hashing: the record needs the blob's
sha256, and botocore by default hashes every body again (a CRC32 on every PutObject and, over
http, the sha256 of SigV4 payload signing; a CRC32 check of every GetObject). The mailbox hashes
each byte once per side (``put_hashed``/``get_hashed``; docs/protocol.md, "Integrity").

The reference is plain boto3 with its default configuration doing the same job: ``put_object``
plus ``hashlib.sha256`` of the body for the record (the writer), ``get_object`` plus the sha256
to check it (the reader), against the mailbox with sha256 blobs (a run from before manifests
named a digest) and with BLAKE3 blobs (a new run's; no server-side checksum, docs/protocol.md),
single requests, on the same loopback SeaweedFS (http, so botocore signs payloads, as on an
on-prem MinIO). Printed: median process CPU per blob of each side and
the ratio mailbox / boto3 (below 1: the mailbox spends less). CPU, not wall time: the server
shares the machine, and the question is what the node's own cores spend.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gradientmail.mailbox import S3Mailbox, S3Tuning
from testing.seaweed import Seaweed

MiB = 1 << 20


def cpu_median(repeats: int, run: Callable[[int], None]) -> float:
    samples = []
    for i in range(repeats):
        started = time.process_time()
        run(i)
        samples.append(time.process_time() - started)
    return statistics.median(samples)


def measure(server: Seaweed, size_mb: int, repeats: int) -> dict[str, float]:
    endpoint = server.server
    data = os.urandom(size_mb * MiB)
    tuning = S3Tuning(multipart_threshold_bytes=max(16, size_mb + 1) * MiB)  # single requests, as boto3's put_object
    mailbox = S3Mailbox(
        endpoint.bucket,
        f"bench-hashing/{size_mb}",
        endpoint_url=endpoint.endpoint_url,
        region=endpoint.region,
        access_key_id=endpoint.access_key,
        secret_access_key=endpoint.secret_key,
        addressing_style="path",
        tuning=tuning,
    )
    client = server.client()
    prefix = f"bench-hashing-boto3/{size_mb}"
    try:
        figures = {
            "mailbox write": cpu_median(repeats, lambda i: mailbox.put_hashed(f"m{i}", data, "sha256")),
            "mailbox read": cpu_median(repeats, lambda i: mailbox.get_hashed(f"m{i}", "sha256")),
            "mailbox write, blake3 blobs": cpu_median(repeats, lambda i: mailbox.put_hashed(f"b{i}", data, "blake3")),
            "mailbox read, blake3 blobs": cpu_median(repeats, lambda i: mailbox.get_hashed(f"b{i}", "blake3")),
            "boto3 write": cpu_median(
                repeats,
                lambda i: (
                    client.put_object(Bucket=endpoint.bucket, Key=f"{prefix}/b{i}", Body=data),
                    hashlib.sha256(data).hexdigest(),
                ),
            ),
            "boto3 read": cpu_median(
                repeats,
                lambda i: hashlib.sha256(
                    client.get_object(Bucket=endpoint.bucket, Key=f"{prefix}/b{i}")["Body"].read()
                ).hexdigest(),
            ),
        }
    finally:
        mailbox.close()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        server = Seaweed.start(Path(workdir))
        try:
            for size_mb in args.sizes_mb:
                f = measure(server, size_mb, args.repeats)
                for side in ("write", "read"):
                    reference = max(f[f"boto3 {side}"], 1e-6)  # process_time's resolution
                    for arm, label in ((f"mailbox {side}", ""), (f"mailbox {side}, blake3 blobs", ", blake3 blobs")):
                        ours = f[arm]
                        print(
                            f"{size_mb} MB {side}{label}: mailbox {ours * 1e3:.0f} ms CPU, boto3 {reference * 1e3:.0f} ms CPU, "
                            f"ratio {ours / reference:.2f}x"
                        )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
