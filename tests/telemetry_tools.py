"""Helpers for the telemetry tests: promtool and Prometheus, the dashboards' PromQL, a loopback OTLP receiver."""

from __future__ import annotations

import gzip
import json
import re
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.system_tools import require_tool

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"
RULES = DASHBOARDS / "prometheus" / "gradientmail.rules.yaml"
RULE_TESTS = DASHBOARDS / "prometheus" / "gradientmail.rules.test.yaml"
GENERATOR = DASHBOARDS / "generate.py"
GRAFANA = DASHBOARDS / "grafana"
PROVISIONING = DASHBOARDS / "provisioning"

GRAFANA_VARIABLES = {"$__rate_interval": "20s", "$__interval": "5s", "$__range": "5m"}
"""What Grafana's built-in variables become when a test runs a dashboard's query."""
RUN_VARIABLES = ("namespace", "job", "run")
"""The variables every dashboard query filters on (a run of a job in a namespace)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


# -- dashboards and rules ---------------------------------------------------------------------
def dashboards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(GRAFANA.glob("*.json"))}


def all_panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def dashboard_queries(board: dict, values: dict[str, str]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target, with Grafana and dashboard variables filled in."""
    found = []
    for panel in all_panels(board["panels"]):
        for target in panel.get("targets", []):
            if target.get("expr"):
                found.append((panel["title"], fill(target["expr"], values)))
    return found


def variable_queries(board: dict) -> list[tuple[str, str, str, str]]:
    """(variable, metric, series selector, label) of every ``label_values(selector, label)``
    variable (the ``datasource`` variable lists data sources, not label values)."""
    found = []
    for variable in board["templating"]["list"]:
        if variable["type"] == "datasource":
            continue
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        match = re.fullmatch(
            r"\s*label_values\(\s*(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*", text or ""
        )
        assert match, f"variable {variable['name']}: unsupported query {text!r}"
        found.append((variable["name"], match[2], match[1], match[4]))
    return found


def fill(expr: str, values: dict[str, str]) -> str:
    for name, value in {**GRAFANA_VARIABLES, **{f"${k}": v for k, v in values.items()}}.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unfilled variable in {expr!r}"
    return expr


def rule_expressions() -> list[tuple[str, str]]:
    """(rule name, PromQL) of every recording and alerting rule."""
    import yaml

    document = yaml.safe_load(RULES.read_text())
    return [(rule.get("record") or rule["alert"], rule["expr"]) for group in document["groups"] for rule in group["rules"]]


def recorded_names() -> set[str]:
    import yaml

    document = yaml.safe_load(RULES.read_text())
    return {rule["record"] for group in document["groups"] for rule in group["rules"] if "record" in rule}


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAMES = re.compile(r"(?<![A-Za-z0-9_:])(gradientmail[_:][A-Za-z0-9_:]*)")


def metric_names(expr: str) -> set[str]:
    """Metric (and recording-rule) names an expression selects. Ours all start with
    ``gradientmail_`` or ``gradientmail:``; label names never do, and quoted label values are
    removed first."""
    return set(_NAMES.findall(_STRINGS.sub('""', expr)))


def check_promql(expressions: list[str], workdir: Path) -> None:
    """Parse every expression with promtool, as recording rules in a scratch rule file."""
    import yaml

    promtool = require_tool("promtool")
    rules = [{"record": f"check:expression_{i}", "expr": expr} for i, expr in enumerate(expressions)]
    path = workdir / "expressions.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "expressions", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# -- a real Prometheus --------------------------------------------------------------------------
@dataclass
class Prometheus:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    @classmethod
    def start(cls, workdir: Path, targets: list[str], rule_files: list[Path]) -> Prometheus:
        binary = require_tool("prometheus")
        port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            json.dumps(
                {  # JSON is YAML
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
                    "rule_files": [str(p) for p in rule_files],
                    "scrape_configs": [{"job_name": "gradientmail", "static_configs": [{"targets": targets}]}],
                }
            )
        )
        log = workdir / "prometheus.log"
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        server = cls(process, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AssertionError(f"prometheus exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if "Ready" in http_get(f"{server.url}/-/ready", timeout=1):
                    return server
            except OSError:
                pass
            time.sleep(0.1)
        server.stop()
        raise AssertionError(f"prometheus did not become ready:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()

    def api(self, path: str, **params: str) -> object:
        body = json.loads(http_get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"))
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]  # type: ignore[index]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def names(self) -> set[str]:
        return set(self.api("label/__name__/values"))  # type: ignore[arg-type]


# -- a loopback OTLP/HTTP receiver -------------------------------------------------------------------
@dataclass
class OtlpReceiver:
    """Accepts OTLP/HTTP protobuf posts on 127.0.0.1 and keeps the decoded requests."""

    metrics: list = field(default_factory=list)
    spans: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        receiver = self
        kinds = {
            "/v1/metrics": (
                metrics_service_pb2.ExportMetricsServiceRequest,
                metrics_service_pb2.ExportMetricsServiceResponse,
                receiver.metrics,
            ),
            "/v1/traces": (
                trace_service_pb2.ExportTraceServiceRequest,
                trace_service_pb2.ExportTraceServiceResponse,
                receiver.spans,
            ),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                kind = kinds.get(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if kind is None or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                request_type, response_type, sink = kind
                request = request_type()
                request.ParseFromString(body)
                with receiver.lock:
                    sink.append(request)
                reply = response_type().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


# -- learners in this process -----------------------------------------------------------------------
@dataclass
class SessionRun:
    """Learners in threads of this process (what an in-process exporter sees)."""

    threads: list[threading.Thread]
    errors: list[BaseException]

    def join(self, timeout_s: float = 60.0) -> None:
        for thread in self.threads:
            thread.join(timeout_s)
            assert not thread.is_alive(), f"{thread.name} did not finish"
        assert not self.errors, self.errors


def start_sessions(mailbox: object, names: list[str], steps: int, *, quorum: int = 2, step_sleep_s: float = 0.01) -> SessionRun:
    import numpy as np

    import gradientmail as gm

    algorithm = gm.DiLoCo(sync_every=5, fragments=2, quorum_size=quorum)
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.05)
    run = SessionRun([], [])

    def learner(name: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        model = {"embed.weight": np.zeros((8, 4), np.float32), "layer.weight": np.zeros((4, 4), np.float32)}
        try:
            with gm.Session(model, algorithm=algorithm, mailbox=mailbox, learner_id=name, options=options) as session:
                for _ in range(steps):
                    for tensor in model.values():
                        tensor += 0.01 * rng.standard_normal(tensor.shape).astype(np.float32)
                    session.step(samples=4)
                    session.report(loss=float(np.mean([np.square(t).mean() for t in model.values()])))  # the loop's own scalar
                    time.sleep(step_sleep_s)
        except BaseException as exc:  # surfaced by join()
            run.errors.append(exc)

    run.threads = [threading.Thread(target=learner, args=(name, i), name=f"learner-{name}") for i, name in enumerate(names)]
    for thread in run.threads:
        thread.start()
    return run
