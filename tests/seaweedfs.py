"""The tests' loopback SeaweedFS S3 server: the benchmarks' (``testing/seaweed.py``), with the
tests' bucket and credentials. It needs SIGKILL to stop promptly; ``stop`` sends it."""

from __future__ import annotations

from pathlib import Path

from testing.seaweed import S3Endpoint as S3Server
from testing.seaweed import Seaweed, find_weed

__all__ = ["S3Server", "SeaweedFS", "find_weed"]


class SeaweedFS(Seaweed):
    """A running ``weed mini`` for the tests; :meth:`start` returns once S3 accepts writes."""

    @classmethod
    def start(
        cls,
        workdir: Path,
        bucket: str = "gradientmail-test",
        name: str = "gm-test",
        *,
        s3_config: Path | None = None,
        netns: str | None = None,
        host: str = "127.0.0.1",
    ) -> Seaweed:
        return super().start(workdir, bucket, name, s3_config=s3_config, netns=netns, host=host)
