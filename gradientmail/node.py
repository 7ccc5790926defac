"""``gradientmail node``: one learner node, configured only by ``GRADIENTMAIL_*`` variables.

This is what the container images run (``docker/``), what the Helm chart's pods run and what
the Apple-host runner (``scripts/apple-learner``) starts. It reads
:class:`~gradientmail.settings.NodeSettings` from the environment, turns telemetry on as
configured (the Prometheus endpoint on ``GRADIENTMAIL_METRICS_PORT``, which is also the
images' health check), then runs one of:

* ``GRADIENTMAIL_SCRIPT=/path/train.py`` — the user's training script, run as ``__main__``
  (mounted into the container); it builds its model and calls ``gm.Session.from_env(model)``,
  which reads the same variables;
* ``GRADIENTMAIL_ENTRYPOINT=package.module`` (run as ``__main__``) or
  ``package.module:function`` (called without arguments) — a training script from an
  installed package;
* ``GRADIENTMAIL_ROLE=syncer`` — no training at all: the run's dedicated syncer
  (:class:`~gradientmail.SyncerNode`), until SIGTERM;
* neither — the default job, :data:`DEFAULT_JOB` (``demo.worker:node_main``): the demo GPT on
  Shakespeare for ``GRADIENTMAIL_STEPS`` steps, on the backend named by ``GRADIENTMAIL_BACKEND``
  (``torch`` by default, ``mlx``), with the run settings given. The demo is the repository's
  ``demo/`` folder, not part of this package: the images copy it and put it on ``PYTHONPATH``.

Health (``gradientmail health``, the images' ``HEALTHCHECK``): the node's own Prometheus
endpoint answers ``GET /metrics`` with 200 within a few seconds. It is served by a thread of
the node process, so a dead or wedged process fails it; it needs ``GRADIENTMAIL_METRICS_PORT``
(the images set 9464). Kubernetes probes the same endpoint with ``httpGet``.

Under ``torchrun`` (the chart's ``learners.torchrun`` for pods of several GPUs) every rank runs
``gradientmail node``: it initialises torch.distributed (NCCL on the rank's GPU, else gloo)
before the job, whose ``gm.Session`` around a DDP model then makes the ranks one learner
(``gradientmail/session/group.py``); only rank 0 serves the metrics endpoint.

SIGTERM (``docker stop``, a pod's termination) raises ``SystemExit(143)`` in the training
loop, so ``with gm.Session(...)`` closes without waiting and releases the learner's lease
instead of leaving it to expire.

A store that stays unreachable (a retryable error, ``MailboxUnavailable``, out of the job, e.g.
on joining) does not end the node: it logs a warning and runs the job again in the same process
after a pause (:data:`RETRY_DELAYS_S`, about 25 minutes in all), as a restart would, without
spending a container's restart budget. Only after the last try does it exit 1.

Exit codes (what compose's and Kubernetes' restart policies act on; ``docs/deploy.md``):

* 0 — done: the script or the default job finished (an entry point's return value, a
  script's ``sys.exit`` code, is passed on as it is);
* 1 — anything else: a crash, a store error, the store unreachable after the retries above.
  Retryable: a restart may help;
* 2 — bad settings (``InvalidConfig``): a variable is invalid, missing
  (``GRADIENTMAIL_MAILBOX is required``) or unknown (``GRADIENTMAIL_SYNC_EVRY is not a
  setting; did you mean GRADIENTMAIL_SYNC_EVERY?``). A restart does not help;
* 3 — the run does not match this node (``RunConfigMismatch``: an algorithm setting, the
  model, or the run key differs from the run's manifest). A restart does not help;
* 143 — stopped by SIGTERM.

Logging is at INFO on stderr, so the syncer's line per committed round (fragment, version,
merged, rejected and the round's timings) shows in ``docker compose logs`` and ``kubectl logs``.
"""

from __future__ import annotations

import importlib
import json
import logging
import runpy
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType

from gradientmail.errors import GradientMailError, InvalidConfig, RunConfigMismatch
from gradientmail.memory import retain_freed_memory
from gradientmail.records import default_learner_id
from gradientmail.session.group import finish_launched_group, init_launched_group
from gradientmail.settings import NodeSettings

__all__ = [
    "DEFAULT_JOB",
    "EXIT_DONE",
    "EXIT_INVALID_SETTINGS",
    "EXIT_RETRYABLE",
    "EXIT_RUN_MISMATCH",
    "RETRY_DELAYS_S",
    "check_health",
    "health_main",
    "main",
    "run_node",
]

log = logging.getLogger("gradientmail.node")

DEFAULT_JOB = "demo.worker:node_main"
"""The entry point run when neither ``GRADIENTMAIL_SCRIPT`` nor ``GRADIENTMAIL_ENTRYPOINT`` is set.

Named by its import string, not imported: the library does not depend on its demo, which
lives outside the package (the repository's ``demo/``; in the images, on ``PYTHONPATH``)."""
_DEFAULT_JOB_MISSING = (
    "; it is the repository's demo/ folder: put the folder holding it on PYTHONPATH (the images do),"
    " or set GRADIENTMAIL_SCRIPT or GRADIENTMAIL_ENTRYPOINT"
)

EXIT_DONE = 0
EXIT_RETRYABLE = 1
"""Anything else: a crash or a store error; a restart may help."""
EXIT_INVALID_SETTINGS = 2
"""``InvalidConfig``: fix the named variable; a restart does not help."""
EXIT_RUN_MISMATCH = 3
"""``RunConfigMismatch`` (algorithm, model or run key): a restart does not help."""

RETRY_DELAYS_S: tuple[float, ...] = (5, 10, 20, 40, 80, 160, 300, 300, 300, 300)
"""Pauses before running the job again after a retryable store error (about 25 minutes in all)."""

_SIGTERM_EXIT = 128 + signal.SIGTERM


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(_SIGTERM_EXIT)


def _run_script(path_text: str) -> None:
    path = Path(path_text)
    if not path.is_file():
        raise InvalidConfig("script", f"no file at {path_text!r} (mount the training script into the container)")
    sys.argv = [str(path)]
    sys.path.insert(0, str(path.resolve().parent))  # as `python train.py` would: its folder's modules import
    runpy.run_path(str(path), run_name="__main__")


def _run_entrypoint(entrypoint: str) -> object:
    module_name, _, function_name = entrypoint.partition(":")
    sys.argv = [entrypoint]
    try:
        if not function_name:
            runpy.run_module(module_name, run_name="__main__", alter_sys=True)
            return None
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        missing_demo = entrypoint == DEFAULT_JOB and isinstance(exc, ImportError) and exc.name == "demo"
        hint = _DEFAULT_JOB_MISSING if missing_demo else ""
        raise InvalidConfig("entrypoint", f"cannot load {entrypoint!r}: {exc}{hint}") from None
    return function()


def run_node(settings: NodeSettings) -> int:
    """Run the node's training script under these settings; return its exit code.

    Raises whatever the training script raises (``RunConfigMismatch``, ``MailboxError``, …) and
    ``InvalidConfig`` for settings that cannot work together. A retryable error
    (``MailboxUnavailable``) runs the job again after the next pause of :data:`RETRY_DELAYS_S`;
    the last try's error is raised.
    """
    if settings.script and settings.entrypoint:
        raise InvalidConfig("script", "set GRADIENTMAIL_SCRIPT or GRADIENTMAIL_ENTRYPOINT, not both")
    if settings.retain_freed_memory:
        retain_freed_memory()  # the node owns its process: a round's buffers are reused (docs/operations.md)
    launched = settings.role != "syncer" and init_launched_group()  # under torchrun: DDP finds its group ready
    telemetry = settings.telemetry()
    if telemetry is not None and telemetry.prometheus_address is not None:
        log.info("metrics on http://%s:%d/metrics", *telemetry.prometheus_address)
    try:
        for attempt, delay in enumerate(RETRY_DELAYS_S, start=1):
            try:
                return _run_job(settings)
            except GradientMailError as exc:
                if not exc.retryable:
                    raise
                tries = len(RETRY_DELAYS_S) + 1
                log.warning(
                    "%s: %s; running the job again in %gs (try %d of %d)", type(exc).__name__, exc, delay, attempt + 1, tries
                )
            time.sleep(delay)  # outside the handler: the failed try's frames are released first
        return _run_job(settings)
    finally:
        if telemetry is not None:
            telemetry.shutdown()
        if launched:
            finish_launched_group()


def _run_job(settings: NodeSettings) -> int:
    if settings.role == "syncer":
        if settings.script or settings.entrypoint:
            raise InvalidConfig("role", "a syncer node runs no training job: unset GRADIENTMAIL_SCRIPT / GRADIENTMAIL_ENTRYPOINT")
        log.info("running as the run's dedicated syncer (GRADIENTMAIL_ROLE=syncer)")
        with settings.syncer_node() as node:
            node.wait()  # until SIGTERM (SystemExit(143) leaves the with: the lease is released)
        return EXIT_DONE
    if settings.script:
        log.info("running the training script %s", settings.script)
        _run_script(settings.script)
        return EXIT_DONE
    entrypoint = settings.entrypoint or DEFAULT_JOB
    log.info("running the entry point %s", entrypoint)
    result = _run_entrypoint(entrypoint)
    return result if isinstance(result, int) and not isinstance(result, bool) else EXIT_DONE


def check_health(settings: NodeSettings, timeout_s: float = 3.0) -> tuple[bool, str]:
    """Whether this node's metrics endpoint answers; and a line saying what was seen."""
    import urllib.error
    import urllib.request

    if settings.metrics_port is None:
        return False, "GRADIENTMAIL_METRICS_PORT is not set: the health check asks the node's metrics endpoint"
    host = settings.metrics_address if settings.metrics_address not in ("0.0.0.0", "::", "") else "127.0.0.1"
    url = f"http://{host if ':' not in host else f'[{host}]'}:{settings.metrics_port}/metrics"
    try:
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an HTTP(S)_PROXY
        with direct.open(url, timeout=timeout_s) as response:
            response.read()
            return response.status == 200, f"{url} answered {response.status}"
    except (urllib.error.URLError, OSError) as exc:
        return False, f"{url} did not answer: {exc}"


def health_main() -> int:
    """``gradientmail health``: exit 0 when the node's metrics endpoint answers, else 1."""
    try:
        healthy, line = check_health(NodeSettings.from_env())
    except InvalidConfig as exc:
        healthy, line = False, f"invalid settings: {exc}"
    print(line)
    return 0 if healthy else 1


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record (``GRADIENTMAIL_LOG_FORMAT=json``), for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "INFO", log_format: str = "text") -> None:
    """The node's logging: ``level`` for the ``gradientmail`` loggers (even where something
    configured logging first), text or JSON lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("gradientmail").setLevel(level)


def main() -> int:
    """``gradientmail node``: settings from the environment, then :func:`run_node`; the exit code
    says what happened (see the module's docstring)."""
    configure_logging()
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        settings = NodeSettings.from_env()
        configure_logging(settings.log_level, settings.log_format)
        if settings.learner_id is None:  # the session would pick the same; the metrics' node label needs it now
            settings = NodeSettings.from_env(learner_id=default_learner_id())
        return run_node(settings)
    except InvalidConfig as exc:
        print(f"gradientmail node: invalid settings: {exc}", file=sys.stderr)
        return EXIT_INVALID_SETTINGS
    except RunConfigMismatch as exc:
        print(f"gradientmail node: {exc} (use the run's settings, model and key, or a new mailbox prefix)", file=sys.stderr)
        return EXIT_RUN_MISMATCH
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or EXIT_DONE
        print(exc.code, file=sys.stderr)
        return EXIT_RETRYABLE
    except GradientMailError as exc:
        print(f"gradientmail node: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_RETRYABLE
