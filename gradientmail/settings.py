"""Node settings from the environment (``GRADIENTMAIL_*``), so containers need no code.

Every algorithm knob defaults to :class:`~gradientmail.algorithms.diloco.DiLoCo`'s own
default and every session knob to :class:`~gradientmail.session.SessionOptions`'s, so the
defaults live in one place. Invalid values raise ``InvalidConfig`` naming the field; so does a
``GRADIENTMAIL_*`` variable that is not a setting (a misspelt one would otherwise be ignored
silently), with the nearest setting's name, unless :data:`ALLOWED_VARIABLES` or a Kubernetes
service link excuses it. Each field's docstring is its description (``gradientmail node --help``
lists them: :func:`describe_variables`).
"""

from __future__ import annotations

import difflib
import os
import re
import textwrap
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gradientmail._version import __version__
from gradientmail.algorithms.config_base import invalid_config
from gradientmail.algorithms.diloco import DiLoCo, GraceRule, PayloadCompression, SyncerLayout
from gradientmail.algorithms.fragments import FragmentLayout
from gradientmail.algorithms.merge import IsoC, Merge, MergeArithmetic, Rda, WeightedMean
from gradientmail.algorithms.outer import MomentumRule
from gradientmail.backends.quantize import QuantFormat
from gradientmail.digests import DEFAULT_BLOB_DIGEST, DigestName
from gradientmail.errors import InvalidConfig
from gradientmail.mailbox import Mailbox, open_mailbox
from gradientmail.records import default_learner_id
from gradientmail.records.auth import RunKey
from gradientmail.session import Session, SessionOptions, SyncerNode
from gradientmail.session.group import launched_rank
from gradientmail.store import Retention
from gradientmail.telemetry import Telemetry, active, otlp_requested
from gradientmail.telemetry import configure as configure_telemetry

__all__ = [
    "ALLOWED_VARIABLES",
    "PREFIX",
    "NodeSettings",
    "check_environment",
    "describe_variables",
    "session_from_env",
    "variable_name",
]

PREFIX = "GRADIENTMAIL_"

ALLOWED_VARIABLES: Mapping[str, str] = {
    "GRADIENTMAIL_VENV": "scripts/bootstrap.sh's virtual environment (scripts/train, scripts/test); not a node setting",
}
"""``GRADIENTMAIL_*`` variables that are legitimately set without being settings, and why.

Besides these, Kubernetes' service links are excused: for every Service of the pod's namespace
with a cluster IP, the kubelet sets ``<NAME>_SERVICE_HOST``, ``<NAME>_SERVICE_PORT[_<PORT>]``,
``<NAME>_PORT`` and ``<NAME>_PORT_<N>_<PROTO>[_PROTO|_PORT|_ADDR]``, so a Service named
``gradientmail-minio`` (the chart's MinIO in a release named ``gradientmail``) sets
``GRADIENTMAIL_MINIO_SERVICE_HOST`` and its siblings. A name is excused as a link only when its
``<NAME>_SERVICE_HOST`` is set too, so a typo such as ``GRADIENTMAIL_METRIC_PORT`` is still
refused."""

_ALGORITHM = DiLoCo.model_fields
_SESSION = SessionOptions()
_SESSION_FIELDS = tuple(f.name for f in fields(SessionOptions))
_RETENTION = Retention.model_fields


class NodeSettings(BaseSettings):
    """Everything a learner node needs, read from ``GRADIENTMAIL_<FIELD>`` variables."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid", frozen=True, use_attribute_docstrings=True)

    mailbox: str
    """Mailbox URL: ``s3://bucket/prefix?endpoint=…``, ``minio://…``, ``file:///path``."""
    learner_id: str | None = None
    """Stable id of this node; default: the host name."""
    backend: Literal["torch", "mlx", "numpy"] | None = None
    """Tensor backend: ``torch``, ``mlx`` or ``numpy``; default: the model's (the default job: ``torch``)."""
    device: str = Field(default="auto", pattern=r"^(auto|cpu|mps|cuda(:\d+)?)$")
    """Where the node's trainer puts the model: ``auto`` (CUDA when present, else MPS, else CPU),
    ``cpu``, ``mps``, ``cuda`` or ``cuda:N``. Used by the default job and the examples."""

    sync_every: int = _ALGORITHM["sync_every"].default
    """Local steps between two exchanges of the same fragment (H). Run-wide."""
    fragments: int = _ALGORITHM["fragments"].default
    """Fragments the model is split into (P), exchanged staggered across ``sync_every``. Run-wide."""
    global_batch_size: int | None = _ALGORITHM["global_batch_size"].default
    """A batch the live learners share (each reads its part from ``Session.batch_size``). Run-wide."""
    fragment_layout: FragmentLayout = _ALGORITHM["fragment_layout"].default
    """``by_bytes`` (balanced) or ``strided`` (numbered blocks dealt round the fragments). Run-wide."""
    merge: Literal["rda", "weighted_mean", "iso_c"] = "rda"
    """How the syncer merges accepted deltas: ``rda``, ``weighted_mean`` or ``iso_c``. Run-wide."""
    direct_pattern: str | None = Rda.model_fields["direct_pattern"].default
    """With ``merge=rda`` (default ``embed``) or ``iso_c`` (default unset: Iso-C on every matrix):
    tensors whose name contains this take the weighted mean."""
    iso_c_form: Literal["exact", "fast"] = IsoC.model_fields["form"].default
    """With ``merge=iso_c``: ``exact`` (SVD) or ``fast`` (Newton–Schulz). Run-wide."""
    merge_arithmetic: MergeArithmetic = _ALGORITHM["merge_arithmetic"].default
    """How the syncer sums a round: ``streamed`` (as contributions arrive) or ``normalized``.
    Taken from the run's manifest once the run exists; this sets it for a new run."""
    outer_lr: float = _ALGORITHM["outer_lr"].default
    """Nesterov outer learning rate. Run-wide."""
    outer_momentum: float = _ALGORITHM["outer_momentum"].default
    """Nesterov outer momentum; 0 disables it. Run-wide."""
    syncer_layout: SyncerLayout = _ALGORITHM["syncer_layout"].default
    """Which nodes close rounds: ``one`` (the elected syncer) or ``spread`` (fragments assigned over the nodes). Run-wide."""
    momentum_rule: MomentumRule = _ALGORITHM["momentum_rule"].default
    """β of each round: ``damped`` (scaled by the share of merged work trained on the round's base) or ``fixed``. Run-wide."""
    quorum_size: int = _ALGORITHM["quorum_size"].default
    """Accepted contributions a round waits for before its grace window (K). Run-wide."""
    in_flight: int | None = _ALGORITHM["in_flight"].default
    """Most fragments this learner has published and not yet aligned; unset: no bound."""
    overlap_steps: int | None = _ALGORITHM["overlap_steps"].default
    """Most steps this learner trains past a publish before waiting for the commit; unset: never waits."""
    mixing: float = _ALGORITHM["mixing"].default
    """Share of the local parameters kept when aligning (needs ``carry_unmerged=false``); 0 replaces."""
    max_staleness: int = _ALGORITHM["max_staleness"].default
    """Versions a contribution's base may lag and still be merged, down-weighted. Run-wide."""
    carry_unmerged: bool = _ALGORITHM["carry_unmerged"].default
    """Carry work a commit did not merge across the alignment (docs/session.md)."""
    max_carried_steps: int | None = _ALGORITHM["max_carried_steps"].default
    """Most steps of unmerged work carried before it is dropped; unset: 4 × ``sync_every``."""
    flush_on_close: bool = _ALGORITHM["flush_on_close"].default
    """Publish the steps trained since the last contribution when the session closes."""
    delta_dtype: str | None = _ALGORITHM["delta_dtype"].default
    """dtype deltas travel in (e.g. ``bfloat16``); unset: each parameter's own. Run-wide."""
    delta_quantization: QuantFormat | None = _ALGORITHM["delta_quantization"].default
    """Blockwise quantization of published deltas: ``int8``, ``fp8_e4m3``, ``int4`` or ``int2``. Run-wide."""
    update_quantization: QuantFormat | None = _ALGORITHM["update_quantization"].default
    """Commits also publish their change in this form; learners one version behind fetch it. Run-wide."""
    quantization_block: int = _ALGORITHM["quantization_block"].default
    """Elements per fp32 scale in the quantized forms. Run-wide."""
    delta_sparsity: float | None = _ALGORITHM["delta_sparsity"].default
    """Share of each chunk a published delta carries (its largest magnitudes, e.g. 0.015625);
    unset: dense. Run-wide."""
    update_sparsity: float | None = _ALGORITHM["update_sparsity"].default
    """Share of each chunk a commit's compact change carries (its largest changes); unset: no
    sparse update. Run-wide."""
    sparsity_chunk: int = _ALGORITHM["sparsity_chunk"].default
    """Elements per chunk of ``delta_sparsity`` and ``update_sparsity`` (a power of two, at most 65536). Run-wide."""
    payload_compression: PayloadCompression = _ALGORITHM["payload_compression"].default
    """``zstd``: contributions and commits stored compressed (byte-shuffled zstd); ``none``: as is. Run-wide."""
    error_feedback: bool = _ALGORITHM["error_feedback"].default
    """With ``delta_quantization`` or ``delta_sparsity``: carry what did not travel into the next contribution."""
    grace_gamma: float = _ALGORITHM["grace_gamma"].default
    """Share of the slack a round's grace window may spend (γ). Run-wide."""
    grace_tau: float = _ALGORITHM["grace_tau"].default
    """Learner steps of slack a round may use (τ). Run-wide."""
    grace_max_s: float = _ALGORITHM["grace_max_s"].default
    """Upper bound on one grace window, in seconds. Run-wide."""
    grace_rule: GraceRule = _ALGORITHM["grace_rule"].default
    """How a round's wait after quorum is sized: ``slack``, ``arrivals`` or ``live`` (docs/protocol.md). Run-wide."""
    grace_periods: float = _ALGORITHM["grace_periods"].default
    """With ``grace_rule`` ``arrivals`` or ``live``: the longest wait, in round periods. Run-wide."""

    run_key: SecretStr | None = None
    """The run key (docs/security.md): every record is signed and checked with it. Never logged."""
    run_key_file: str | None = None
    """Instead of ``run_key``: a file holding it (a mounted secret)."""
    keep_versions: int = _RETENTION["keep_versions"].default
    """Retention of a new run: newest versions kept whole (docs/operations.md)."""
    audit_rounds: int = _RETENTION["audit_rounds"].default
    """Retention of a new run: newest rounds whose inputs are kept for ``gradientmail audit``."""
    checkpoint_every: int = _RETENTION["checkpoint_every"].default
    """Retention of a new run: every version divisible by this is a checkpoint."""
    keep_checkpoints: int = _RETENTION["keep_checkpoints"].default
    """Retention of a new run: newest checkpoints kept beyond the newest versions."""
    blob_digest: DigestName = DEFAULT_BLOB_DIGEST
    """What a new run pins its blobs by: ``blake3`` or ``sha256`` (docs/protocol.md, "Integrity"). Run-wide."""

    metrics_port: int | None = None
    """Serve Prometheus metrics on this port (off when unset). OTLP export is configured by
    the standard ``OTEL_EXPORTER_OTLP_*`` variables."""
    metrics_address: str = "0.0.0.0"
    """Address the Prometheus endpoint binds to."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Lowest level ``gradientmail node`` logs (any case: ``debug`` is ``DEBUG``)."""
    log_format: Literal["text", "json"] = "text"
    """``text``: a line per event for people; ``json``: one JSON object per line (``time``,
    ``level``, ``logger``, ``message``, and ``exception`` with its traceback) for log pipelines."""
    retain_freed_memory: bool = True
    """Keep the memory the node's process frees for its next allocations (glibc; elsewhere
    nothing changes): a round's buffers of the same sizes are reused instead of faulted in and
    zeroed again, and the process stays at its peak (``gm.retain_freed_memory``; docs/operations.md,
    "Memory")."""

    lease_ttl_s: float = _SESSION.lease_ttl_s
    """Seconds without renewal after which a learner or the syncer counts as dead (the run's first
    learner records it; every node then uses the run's value)."""
    poll_interval_s: float = _SESSION.poll_interval_s
    """Seconds between two passes of the background exchange and of the syncer while a commit or
    a round is expected."""
    idle_poll_interval_s: float | None = _SESSION.idle_poll_interval_s
    """Seconds between the passes that only look for news while nothing is expected (and between
    lease reads); unset: a third of the lease TTL (docs/session.md, "Polling")."""
    role: Literal["both", "learner", "either", "syncer"] = "both"
    """``both``: train and take part in the syncer election; ``learner``: only train; ``either``:
    like ``both``, but stop training while elected and another node trains; ``syncer``: only
    close rounds, as the run's dedicated syncer (``gm.SyncerNode``: no model, no training
    script; it outranks training nodes in the election and one of them takes over when it dies)."""
    run_syncer: bool = _SESSION.run_syncer
    """False is the same as ``role=learner`` (kept from before roles)."""
    commit_timeout_s: float = _SESSION.commit_timeout_s
    """Longest a step waits for a commit under ``overlap_steps``, and closing for the rounds in flight."""
    state_dir: str | None = _SESSION.state_dir
    """Directory the learner saves what a restart needs to (its optimizer and scheduler states as
    the script registers them, its step count, random generators, work-queue position) and
    resumes from; a volume that outlives the container or pod, or ``mailbox``: the learner's own
    prefix in the run's mailbox. Unset: a restarted learner starts over."""
    save_state_every: int = Field(default=_SESSION.save_state_every, ge=1)
    """Steps between two saves of the learner state (and one at a clean close)."""

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

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """pydantic-settings' sources, after a check that refuses unknown ``GRADIENTMAIL_*`` variables."""
        return (_RefuseUnknownVariables(settings_cls), init_settings, env_settings, dotenv_settings, file_secret_settings)

    @classmethod
    def from_env(cls, **overrides: object) -> NodeSettings:
        """Read the environment; errors become ``InvalidConfig`` naming the variable's field.

        A ``GRADIENTMAIL_*`` variable that is not a setting is an error naming the nearest one
        (:func:`check_environment`); a missing mailbox says ``GRADIENTMAIL_MAILBOX is required``.
        """
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as error:
            missing = [item for item in error.errors() if item["type"] == "missing" and item["loc"]]
            if missing:
                name = str(missing[0]["loc"][0])
                description = _description(cls.model_fields[name]).rstrip(".")
                raise _invalid(name, f"{variable_name(name)} is required ({description})") from None
            raise invalid_config(error) from None

    def algorithm(self) -> DiLoCo:
        merge: Merge
        given = self.model_fields_set
        if self.merge == "rda":
            merge = Rda(direct_pattern=self.direct_pattern)
        elif self.merge == "iso_c":  # Iso-C's own defaults (embeddings, outer step) unless set
            pattern = self.direct_pattern if "direct_pattern" in given else IsoC.model_fields["direct_pattern"].default
            merge = IsoC(form=self.iso_c_form, direct_pattern=pattern)
        else:
            merge = WeightedMean()
        merge_defaults = ("outer_lr", "outer_momentum") if self.merge == "iso_c" else ()
        knobs = {
            name: getattr(self, name) for name in _ALGORITHM if name != "merge" and (name in given or name not in merge_defaults)
        }
        return DiLoCo(merge=merge, **knobs)

    def key(self) -> RunKey | None:
        """The run key from ``run_key`` or ``run_key_file`` (setting both is an error)."""
        secret = self.run_key.get_secret_value() if self.run_key is not None else None
        return RunKey.from_settings(secret, self.run_key_file)

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
            blob_digest=self.blob_digest,
        )

    def syncer_node(self) -> SyncerNode:
        """The dedicated syncer these settings describe (``role=syncer``)."""
        if active() is None:
            self.telemetry()
        return SyncerNode(
            mailbox=self.mailbox,
            node_id=self.learner_id,
            run_key=self.key(),
            backend="torch" if self.backend == "torch" else "numpy",  # MLX tensors stay on their training thread
            poll_interval_s=self.poll_interval_s,
            idle_poll_interval_s=self.idle_poll_interval_s,
        )

    def telemetry(self) -> Telemetry | None:
        """Turn telemetry on as configured: the Prometheus endpoint when ``metrics_port`` is set,
        OTLP when ``OTEL_EXPORTER_OTLP_*`` ask for it. None (and nothing started) when neither."""
        if self.metrics_port is None and not (otlp_requested("metrics") or otlp_requested("traces")):
            return None
        if (launched_rank() or 0) > 0:
            return None  # under torchrun only rank 0 serves the node's endpoint (the pod's probes ask it)
        return configure_telemetry(
            node=self.learner_id or default_learner_id(),
            version=__version__,
            prometheus_port=self.metrics_port,
            prometheus_address=self.metrics_address,
        )


def variable_name(field: str) -> str:
    """The environment variable of a ``NodeSettings`` field: ``sync_every`` → ``GRADIENTMAIL_SYNC_EVERY``."""
    return PREFIX + field.upper()


def _invalid(field: str, message: str) -> InvalidConfig:
    """``InvalidConfig`` for ``field`` whose text is ``message`` alone (it names the variable)."""
    error = InvalidConfig(field, message)
    error.args = (message,)
    return error


_SERVICE_LINK_SUFFIX = re.compile(r"_SERVICE_PORT(_[A-Z0-9_]+)?|_PORT(_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?")


def _service_link(name: str, environ: Mapping[str, str]) -> bool:
    """Whether ``name`` is one of a Kubernetes Service's link variables (its ``_SERVICE_HOST`` is set too)."""
    if name.endswith("_SERVICE_HOST"):
        return True
    return any(
        _SERVICE_LINK_SUFFIX.fullmatch(name[at:]) is not None and f"{name[:at]}_SERVICE_HOST" in environ
        for at, char in enumerate(name)
        if char == "_"
    )


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse ``GRADIENTMAIL_*`` variables that are not settings, naming the nearest setting.

    Raises ``InvalidConfig`` (``.field``: the first unknown variable), e.g.
    ``GRADIENTMAIL_SYNC_EVRY is not a setting; did you mean GRADIENTMAIL_SYNC_EVERY?``. Names are
    compared without regard to case, as pydantic-settings reads them. Excused:
    :data:`ALLOWED_VARIABLES` and Kubernetes service links (see there).
    """
    environ = os.environ if environ is None else environ
    upper = {name.upper(): name for name in environ}
    known = {variable_name(field) for field in NodeSettings.model_fields}
    problems = []
    first = None
    for name in sorted(upper):
        if not name.startswith(PREFIX) or name in known or name in ALLOWED_VARIABLES or _service_link(name, upper):
            continue
        first = first or upper[name]
        suffixes = [field.upper() for field in NodeSettings.model_fields]
        nearest = difflib.get_close_matches(name[len(PREFIX) :], suffixes, n=1, cutoff=0.6)
        hint = f"; did you mean {PREFIX}{nearest[0]}?" if nearest else " (`gradientmail node --help` lists the settings)"
        problems.append(f"{upper[name]} is not a setting{hint}")
    if first is not None:
        raise _invalid(first, "; ".join(problems))


class _RefuseUnknownVariables(PydanticBaseSettingsSource):
    """A settings source that contributes nothing and runs :func:`check_environment` first."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        check_environment()
        return {}


def _description(field: FieldInfo) -> str:
    """A field's docstring on one line, without reST markup."""
    text = " ".join((field.description or "").split()).replace("``", "")
    return text or "(no description)"


def _default(field: FieldInfo) -> str:
    default = field.default
    if default is PydanticUndefined:
        return "required"
    if default is None:
        return "default: unset"
    return f"default: {str(default).lower() if isinstance(default, bool) else default}"


def describe_variables(width: int = 100) -> str:
    """Every ``GRADIENTMAIL_*`` setting with its default and description: ``gradientmail node --help``."""
    lines = []
    for name, field in NodeSettings.model_fields.items():
        lines.append(f"  {variable_name(name)}  ({_default(field)})")
        lines.extend(textwrap.wrap(_description(field), width=width, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines)


def session_from_env(model: Any, **overrides: Any) -> Session:
    """A session configured only by ``GRADIENTMAIL_*`` variables: what a training script run by
    ``gradientmail node`` calls. ``overrides`` replace individual settings (``learner_id="gpu-3"``).

    Raises ``InvalidConfig`` naming the variable's field when a setting is invalid.
    """
    return NodeSettings.from_env(**overrides).session(model)
