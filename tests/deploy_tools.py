"""What the deployment-kit tests share: the repository's deploy files, read the way their tools read them."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from gradientmail.settings import NodeSettings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose.yaml"
RUN_ENV = ROOT / "docker" / "run.env"
DOCKERFILES = {"cpu": ROOT / "docker" / "cpu.Dockerfile", "cuda": ROOT / "docker" / "cuda.Dockerfile"}
CHART = ROOT / "helm" / "gradientmail"
SETTINGS_FIELDS = frozenset(NodeSettings.model_fields)
STANDARD_VARIABLES = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SHARED_CREDENTIALS_FILE", "HOME"})
"""Variables a learner may be given besides GRADIENTMAIL_*: boto3's credentials (or the file holding them), HOME."""
RUN_KEY_VARIABLES = frozenset({"GRADIENTMAIL_RUN_KEY", "GRADIENTMAIL_RUN_KEY_FILE"})
"""The run key (the secret records are signed with) or the path of a file holding it: a secret,
not a run setting, so the kit gives it from a Secret or a volume, never as a literal value."""


def tool(name: str) -> str:
    """A command-line tool installed beside this Python (the dev extra), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[dev]'"
    return found


def read_env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines, as compose's env_file and scripts/apple-learner read them."""
    values = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, value = line.partition("=")
        values[name] = value
    return values


def load_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # resolves the x-learner anchors and merge keys


def learner_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services that run a learner node: a learner image (built from one of docker/*.Dockerfile)
    with its own command, ``node`` (not a one-shot job of that image such as ``keygen``), its
    entrypoint the image's or torchrun's around it (``… --no-python gradientmail``)."""
    return {
        name: service
        for name, service in compose["services"].items()
        if str(service.get("build", {}).get("dockerfile", "")).startswith("docker/")
        and service.get("command", ["node"]) == ["node"]
        and ("entrypoint" not in service or service["entrypoint"][-2:] == ["--no-python", "gradientmail"])
    }


def image_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every service built from one of docker/*.Dockerfile: the learners and the image's one-shot jobs."""
    return {
        name: service
        for name, service in compose["services"].items()
        if str(service.get("build", {}).get("dockerfile", "")).startswith("docker/")
    }


def learner_environment(service: dict[str, Any]) -> dict[str, str]:
    """What compose gives the learner: env_file entries, then ``environment`` (which wins)."""
    env: dict[str, str] = {}
    for entry in service.get("env_file", []):
        env.update(read_env_file(ROOT / (entry if isinstance(entry, str) else entry["path"])))
    environment = service.get("environment", {})
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    env.update({k: str(v) for k, v in environment.items()})
    return env


def interpolate(text: str) -> str:
    """Compose's ``${NAME:-default}`` with nothing set: the default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        current += raw.rstrip("\\").strip() + " "
        if not raw.rstrip().endswith("\\"):
            lines.append(current.strip())
            current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def dockerfile_env(path: Path) -> dict[str, str]:
    """The final stage's ENV (``NAME=value`` pairs)."""
    instructions = dockerfile_instructions(path)
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    env: dict[str, str] = {}
    for op, args in instructions[last_from:]:
        if op == "ENV":
            for pair in args.split():
                name, _, value = pair.partition("=")
                env[name] = value
    return env


# -- Kubernetes-shaped blocks of the chart's values ------------------------------------------------

KUBERNETES_SCHEMA_VERSION = "v1.37.0"
"""The Kubernetes API the chart's schema copies its Kubernetes-shaped blocks from: the newest one
kubernetes-validate (pinned in pyproject.toml) carries, a superset of the fields older ones know."""
KUBERNETES_TYPES = (
    "io.k8s.api.core.v1.Affinity",
    "io.k8s.api.core.v1.EnvVar",
    "io.k8s.api.core.v1.PodSecurityContext",
    "io.k8s.api.core.v1.ResourceRequirements",
    "io.k8s.api.core.v1.SecurityContext",
    "io.k8s.api.core.v1.Toleration",
    "io.k8s.api.core.v1.TopologySpreadConstraint",
    "io.k8s.api.core.v1.Volume",
    "io.k8s.api.core.v1.VolumeMount",
    "io.k8s.api.networking.v1.NetworkPolicyEgressRule",
    "io.k8s.api.networking.v1.NetworkPolicyPeer",
)
"""The types values.schema.json's ``definitions`` hold, with every type they refer to."""
_DROPPED_KEYWORDS = {"description", "format", "x-kubernetes-list-map-keys", "x-kubernetes-list-type"}
_DROPPED_KEYWORDS |= {"x-kubernetes-map-type", "x-kubernetes-patch-merge-key", "x-kubernetes-patch-strategy"}
_DROPPED_KEYWORDS |= {"x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields"}


def kubernetes_definitions(types: tuple[str, ...] = KUBERNETES_TYPES) -> dict[str, Any]:
    """``types`` and what they refer to, from kubernetes-validate's strict schemas (every object
    ``additionalProperties: false``, so a misspelt field is refused), as JSON-schema definitions
    for values.schema.json: descriptions and Kubernetes' own annotations dropped, references
    pointing into ``#/definitions``."""
    import kubernetes_validate

    folder = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"{KUBERNETES_SCHEMA_VERSION}-local-strict"
    source = json.loads((folder / "_definitions.json").read_text())["$defs"]

    def clean(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key in _DROPPED_KEYWORDS:
                    continue
                if key == "$ref":
                    value = "#/definitions/" + value.rsplit("/", 1)[1]
                out[key] = clean(value)
            return out
        if isinstance(node, list):
            return [clean(item) for item in node]
        return node

    found: dict[str, Any] = {}
    pending = list(types)
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found[name] = clean(source[name])
        pending.extend(re.findall(r'"#/definitions/([^"]+)"', json.dumps(found[name])))
    return dict(sorted(found.items()))


if __name__ == "__main__":
    # Rewrites values.schema.json's definitions from kubernetes-validate: python -m tests.deploy_tools
    schema_path = CHART / "values.schema.json"
    schema = json.loads(schema_path.read_text())
    # the chart's own definitions stay; the Kubernetes ones (io.k8s.*) are replaced
    own = {k: v for k, v in schema.get("definitions", {}).items() if not k.startswith("io.k8s.")}
    schema["definitions"] = {**own, **kubernetes_definitions()}
    schema_path.write_text(json.dumps(schema, indent=2, ensure_ascii=False) + "\n")
