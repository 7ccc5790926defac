"""Node settings from the environment (``GRADIENTMAIL_*``), so containers need no code.

Every algorithm knob defaults to :class:`~gradientmail.algorithms.diloco.DiLoCo`'s own
default and every session knob to :class:`~gradientmail.session.SessionOptions`'s, so the
defaults live in one place. Invalid values raise ``InvalidConfig`` naming the field.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from gradientmail._version import __version__
from gradientmail.algorithms.config_base import invalid_config
from gradientmail.algorithms.diloco import DiLoCo
from gradientmail.algorithms.merge import Rda, WeightedMean
from gradientmail.errors import InvalidConfig
from gradientmail.mailbox import Mailbox, open_mailbox
from gradientmail.records import default_learner_id
from gradientmail.records.auth import RunKey
from gradientmail.session import Session, SessionOptions
from gradientmail.store import Retention
from gradientmail.telemetry import Telemetry, active, otlp_requested
from gradientmail.telemetry import configure as configure_telemetry

__all__ = ["NodeSettings", "session_from_env"]

_ALGORITHM = DiLoCo.model_fields
_SESSION = SessionOptions()
_SESSION_FIELDS = tuple(f.name for f in fields(SessionOptions))
_RETENTION = Retention.model_fields


class NodeSettings(BaseSettings):
    """Everything a learner node needs, read from ``GRADIENTMAIL_<FIELD>`` variables."""

    model_config = SettingsConfigDict(env_prefix="GRADIENTMAIL_", extra="forbid", frozen=True)

    mailbox: str
    """Mailbox URL: ``s3://bucket/prefix?endpoint=…``, ``minio://…``, ``file:///path``."""
    learner_id: str | None = None
    """Stable id of this node; default: the host name."""
    backend: Literal["torch", "mlx", "numpy"] | None = None
    device: str = Field(default="auto", pattern=r"^(auto|cpu|mps|cuda(:\d+)?)$")
    """Where the node's trainer puts the model: ``auto`` (CUDA when present, else MPS, else CPU),
    ``cpu``, ``mps``, ``cuda`` or ``cuda:N``. Used by the default job and the examples."""

    sync_every: int = _ALGORITHM["sync_every"].default
    fragments: int = _ALGORITHM["fragments"].default
    merge: Literal["rda", "weighted_mean"] = "rda"
    direct_pattern: str | None = Rda.model_fields["direct_pattern"].default
    outer_lr: float = _ALGORITHM["outer_lr"].default
    outer_momentum: float = _ALGORITHM["outer_momentum"].default
    quorum_size: int = _ALGORITHM["quorum_size"].default
    in_flight: int | None = _ALGORITHM["in_flight"].default
    overlap_steps: int | None = _ALGORITHM["overlap_steps"].default
    mixing: float = _ALGORITHM["mixing"].default
    max_staleness: int = _ALGORITHM["max_staleness"].default
    carry_unmerged: bool = _ALGORITHM["carry_unmerged"].default
    max_carried_steps: int | None = _ALGORITHM["max_carried_steps"].default
    flush_on_close: bool = _ALGORITHM["flush_on_close"].default
    delta_dtype: str | None = _ALGORITHM["delta_dtype"].default
    grace_gamma: float = _ALGORITHM["grace_gamma"].default
    grace_tau: float = _ALGORITHM["grace_tau"].default
    grace_max_s: float = _ALGORITHM["grace_max_s"].default

    run_key: SecretStr | None = None
    """The run key (docs/security.md): every record is signed and checked with it. Never logged."""
    run_key_file: str | None = None
    """Instead of ``run_key``: a file holding it (a mounted secret)."""
    keep_versions: int = _RETENTION["keep_versions"].default
    audit_rounds: int = _RETENTION["audit_rounds"].default
    checkpoint_every: int = _RETENTION["checkpoint_every"].default
    keep_checkpoints: int = _RETENTION["keep_checkpoints"].default

    metrics_port: int | None = None
    """Serve Prometheus metrics on this port (off when unset). OTLP export is configured by
    the standard ``OTEL_EXPORTER_OTLP_*`` variables."""
    metrics_address: str = "0.0.0.0"
    """Address the Prometheus endpoint binds to."""

    lease_ttl_s: float = _SESSION.lease_ttl_s
    poll_interval_s: float = _SESSION.poll_interval_s
    run_syncer: bool = _SESSION.run_syncer
    commit_timeout_s: float = _SESSION.commit_timeout_s

    # What ``gradientmail node`` (the container images' command) runs; see gradientmail/node.py.
    script: str | None = None
    """Path of the user's training script (a Python file that calls ``gm.session_from_env(model)``),
    run as ``__main__``. With neither this nor ``entrypoint``, the node runs its default job,
    ``gradientmail.node.DEFAULT_JOB`` (the demo GPT on Shakespeare, the repository's ``demo/``)."""
    entrypoint: str | None = None
    """Instead of ``script``: ``package.module`` (run as ``__main__``) or ``package.module:function``
    (called without arguments) from an importable package. Unset (and no ``script``):
    ``gradientmail.node.DEFAULT_JOB``, ``demo.worker:node_main``."""
    steps: int | None = Field(default=None, ge=0)
    """Local steps to train. The default job (``demo.worker``) uses it (default: the demo's); a
    user's script may read it from ``NodeSettings.from_env().steps``."""

    @classmethod
    def from_env(cls, **overrides: object) -> NodeSettings:
        """Read the environment; errors become ``InvalidConfig`` naming the variable's field."""
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as error:
            raise invalid_config(error) from None

    def algorithm(self) -> DiLoCo:
        merge = Rda(direct_pattern=self.direct_pattern) if self.merge == "rda" else WeightedMean()
        knobs = {name: getattr(self, name) for name in _ALGORITHM if name != "merge"}
        return DiLoCo(merge=merge, **knobs)

    def key(self) -> RunKey | None:
        """The run key from ``run_key`` or ``run_key_file`` (setting both is an error)."""
        if self.run_key is not None and self.run_key_file is not None:
            raise InvalidConfig("run_key", "set GRADIENTMAIL_RUN_KEY or GRADIENTMAIL_RUN_KEY_FILE, not both")
        if self.run_key is not None:
            return RunKey(self.run_key.get_secret_value())
        return RunKey.from_file(self.run_key_file) if self.run_key_file is not None else None

    def retention(self) -> Retention:
        return Retention(**{name: getattr(self, name) for name in _RETENTION})

    def session_options(self) -> SessionOptions:
        return SessionOptions(**{name: getattr(self, name) for name in _SESSION_FIELDS if hasattr(self, name)})

    def open_mailbox(self) -> Mailbox:
        return open_mailbox(self.mailbox)

    def session(self, model: Any) -> Session:
        """A session for ``model`` configured by these settings; it opens the mailbox and closes
        it when it closes. Telemetry is turned on as configured unless the process already has it."""
        if active() is None:
            self.telemetry()
        return Session(
            model,
            algorithm=self.algorithm(),
            mailbox=self.mailbox,
            learner_id=self.learner_id,
            backend=self.backend,
            options=self.session_options(),
            run_key=self.key(),
            retention=self.retention(),
        )

    def telemetry(self) -> Telemetry | None:
        """Turn telemetry on as configured: the Prometheus endpoint when ``metrics_port`` is set,
        OTLP when ``OTEL_EXPORTER_OTLP_*`` ask for it. None (and nothing started) when neither."""
        if self.metrics_port is None and not (otlp_requested("metrics") or otlp_requested("traces")):
            return None
        return configure_telemetry(
            node=self.learner_id or default_learner_id(),
            version=__version__,
            prometheus_port=self.metrics_port,
            prometheus_address=self.metrics_address,
        )


def session_from_env(model: Any, **overrides: Any) -> Session:
    """A session configured only by ``GRADIENTMAIL_*`` variables: what a training script run by
    ``gradientmail node`` calls. ``overrides`` replace individual settings (``learner_id="gpu-3"``).

    Raises ``InvalidConfig`` naming the variable's field when a setting is invalid.
    """
    return NodeSettings.from_env(**overrides).session(model)
