"""The deployment kit checked by the real tools, and cross-checked against the settings model.

hadolint lints both Dockerfiles; check-jsonschema validates compose.yaml against the
compose-spec schema it vendors; Helm itself (helm-python-sdk) lints and renders the chart for
several value sets and kubernetes-validate --strict checks every rendered manifest. Then the
files are cross-checked: every variable a learner is given is a setting the model knows, every
path a service mounts exists, every name a scrape config or dependency uses is a service.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from gradientmail._version import __version__
from gradientmail.mailbox import open_mailbox
from gradientmail.settings import NodeSettings
from tests.deploy_tools import (
    CHART,
    COMPOSE,
    DOCKERFILES,
    ROOT,
    RUN_ENV,
    RUN_KEY_VARIABLES,
    SETTINGS_FIELDS,
    STANDARD_VARIABLES,
    dockerfile_env,
    dockerfile_instructions,
    image_services,
    interpolate,
    kubernetes_definitions,
    learner_environment,
    learner_services,
    load_compose,
    read_env_file,
    tool,
)
from tests.system_tools import require_tool

# -- images ---------------------------------------------------------------------------------


ALL_DOCKERFILES = {
    **{name: path for name, path in DOCKERFILES.items()},
    "seaweedfs-check": ROOT / "docker/check/seaweedfs.Dockerfile",
}


@pytest.mark.parametrize("image", sorted(ALL_DOCKERFILES))
def test_hadolint_passes_the_dockerfile_at_warning_threshold(image):
    result = subprocess.run(
        [tool("hadolint"), "--failure-threshold", "warning", str(ALL_DOCKERFILES[image])], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_really_linting(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install curl\n")
    result = subprocess.run([tool("hadolint"), "--failure-threshold", "warning", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3008" in result.stdout


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_the_image_is_multi_stage_non_root_and_runs_the_node(image):
    instructions = dockerfile_instructions(DOCKERFILES[image])
    froms = [args for op, args in instructions if op == "FROM"]
    assert len(froms) == 2 and all(args.startswith("${BASE_IMAGE}") for args in froms), froms
    assert instructions[0] == ("ARG", instructions[0][1]) and instructions[0][1].startswith("BASE_IMAGE=")
    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    ops = dict(final)
    assert ops["USER"].split(":")[0] not in ("0", "root") and int(ops["USER"].split(":")[0]) >= 1000
    assert json.loads(ops["ENTRYPOINT"]) == ["gradientmail"] and json.loads(ops["CMD"]) == ["node"]
    assert ops["HEALTHCHECK"].endswith('CMD ["gradientmail", "health"]')
    assert "COPY --from=build /opt/gradientmail /opt/gradientmail" in [f"{op} {args}" for op, args in final]
    assert not [args for op, args in final if op == "RUN" and ("pip" in args or "apt-get" in args)], (
        "no installs in the runtime stage"
    )
    env = dockerfile_env(DOCKERFILES[image])
    assert {name for name in env if name.startswith("GRADIENTMAIL_")} <= SETTINGS_FIELDS_ENV
    assert env["GRADIENTMAIL_METRICS_PORT"] == "9464"
    assert ops["EXPOSE"] == env["GRADIENTMAIL_METRICS_PORT"]


SETTINGS_FIELDS_ENV = {f"GRADIENTMAIL_{name.upper()}" for name in SETTINGS_FIELDS}


def _runtime_user_dirs(dockerfile: Path) -> dict[str, str]:
    """Directories the final stage makes with ``install -d -o UID -g GID -m MODE DIR``: DIR -> MODE,
    for those owned by the stage's USER (uid and gid)."""
    instructions = dockerfile_instructions(dockerfile)
    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    user = dict(final)["USER"]
    uid, gid = user.split(":")
    dirs = {}
    for op, args in final:
        if op != "RUN":
            continue
        for owner, group, mode, path in re.findall(r"install -d -o (\S+) -g (\S+) -m (\S+) (\S+)", args):
            if (owner, group) == (uid, gid):
                dirs[path] = mode
    return dirs


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_the_image_has_the_run_key_mount_point_owned_by_its_user(image):
    # A fresh named volume takes the owner and mode of the image's directory it is mounted on
    # (Docker: copyExistingContents -> fs.CopyDir; Podman: the volume's chown on first mount),
    # so keygen, running as this user, can write the key there and the learners can read it.
    assert _runtime_user_dirs(DOCKERFILES[image]) == {"/run-key": "0700"}


def test_the_build_context_holds_only_what_the_images_copy():
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[0].startswith("#") and "*" in ignore
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for path in DOCKERFILES.values():
        for op, args in dockerfile_instructions(path):
            if op == "COPY" and not args.startswith("--from"):
                assert set(args.split()[:-1]) <= allowed, args


# -- compose --------------------------------------------------------------------------------


def _settings_from(env: dict[str, str]) -> NodeSettings:
    """The run settings in ``env`` (the run key is not one: its file lives in a container's volume)."""
    names = {
        k[len("GRADIENTMAIL_") :].lower(): v
        for k, v in env.items()
        if k.startswith("GRADIENTMAIL_") and k not in RUN_KEY_VARIABLES
    }
    return NodeSettings(**names)


SEAWEEDFS_COMPOSE = ROOT / "compose.seaweedfs.yaml"
CHECK_COMPOSE = ROOT / "docker/check/compose.check.yaml"


@pytest.mark.parametrize("compose_file", [COMPOSE, SEAWEEDFS_COMPOSE, CHECK_COMPOSE], ids=lambda path: path.name)
def test_compose_validates_against_the_compose_spec(compose_file):
    result = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(compose_file)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_compose_spec_check_refuses_a_broken_file(tmp_path):
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("    hostname: learner-1", "    hostnam: learner-1"))
    result = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(broken)], capture_output=True, text=True
    )
    assert result.returncode != 0 and "hostnam" in result.stdout


def test_every_depends_on_target_is_a_service():
    services = load_compose()["services"]
    alternative = yaml.safe_load(SEAWEEDFS_COMPOSE.read_text())["services"]
    check = yaml.safe_load(CHECK_COMPOSE.read_text())["services"]
    assert set(check) <= set(services), "the podman check only overrides compose.yaml's services"
    services = {**services, **{name: {**services.get(name, {}), **service} for name, service in alternative.items()}}
    for name, service in services.items():
        targets = service.get("depends_on", [])
        for target in targets if isinstance(targets, list) else targets.keys():
            assert target in services, f"{name} depends on {target}, which is not a service"


def test_the_server_images_are_pinned_by_digest():
    """Every image compose pulls (not the ones it builds) names a release and its digest, so a
    deleted or moved tag cannot change what runs; MinIO's comes from MinIO's own registry."""
    pulled = {
        name: service["image"]
        for file in (COMPOSE, SEAWEEDFS_COMPOSE)
        for name, service in yaml.safe_load(file.read_text())["services"].items()
        if "image" in service and "build" not in service and not str(service["image"]).startswith("*")
    }
    assert {"minio", "prometheus", "grafana"} <= set(pulled), pulled
    for name, image in pulled.items():
        default = interpolate(image)
        assert re.fullmatch(r"[a-z0-9./-]+:[\w.-]+@sha256:[0-9a-f]{64}", default), f"{name}: {default}"
    assert interpolate(load_compose()["services"]["minio"]["image"]).startswith("quay.io/minio/minio:")


def test_the_seaweedfs_alternative_scopes_the_learners_and_keeps_the_run():
    """compose.seaweedfs.yaml: the identity file seaweedfs-identities writes is the one the server
    reads, before it starts; the setup makes the bucket; the run (mailbox URL, learners) is
    compose.yaml's, and the server's data lives in its own volume."""
    base = load_compose()
    override = yaml.safe_load(SEAWEEDFS_COMPOSE.read_text())
    identities, server, setup = (override["services"][name] for name in ("seaweedfs-identities", "minio", "minio-setup"))
    learner = base["services"]["learner-1"]
    assert identities["environment"]["GRADIENTMAIL_MAILBOX"] == learner["environment"]["GRADIENTMAIL_MAILBOX"]
    assert identities["command"][0] == "seaweedfs-setup" and "--out=/run-key" in identities["command"]
    written = next(a.split("=", 1)[1] for a in identities["command"] if a.startswith("--identities="))
    read = next(a.split("=", 1)[1] for a in server["command"] if a.startswith("-s3.config="))
    assert written == read
    volume_of = {target: source for source, (target, _) in _volume_mounts(server).items()}
    assert _volume_mounts(identities)[volume_of[str(Path(read).parent)]][1] == "rw"
    assert server["depends_on"] == {"seaweedfs-identities": {"condition": "service_completed_successfully"}}
    assert "-s3.port=9000" in server["command"] and volume_of["/data"] == "seaweedfs-data"
    assert setup["command"] == ["seaweedfs-setup", "--bucket"]
    assert set(override["services"]) - set(base["services"]) == {"seaweedfs-identities"}
    assert set(override["volumes"]) == {"seaweedfs-data", "seaweedfs-config"}


def test_learners_get_only_known_settings_with_stable_ids():
    compose = load_compose()
    learners = learner_services(compose)
    assert {"learner-1", "learner-2", "learner-3", "gpu-learner-1"} <= set(learners)
    for name, service in learners.items():
        env = learner_environment(service)
        for variable in env:
            if variable in RUN_KEY_VARIABLES:
                continue
            if variable.startswith("GRADIENTMAIL_"):
                assert variable in SETTINGS_FIELDS_ENV, f"{name}: {variable} is not a NodeSettings field"
            else:
                assert variable in STANDARD_VARIABLES, f"{name}: unexpected variable {variable}"
        env = {k: interpolate(v) for k, v in env.items()}
        settings = _settings_from(env)
        settings.algorithm()
        open_mailbox(settings.mailbox).close()
        if "profiles" not in service:  # the default learners: a stable id, the container's host name
            assert service["hostname"] == name
    gpu = learners["gpu-learner-1"]
    assert gpu["build"]["dockerfile"] == "docker/cuda.Dockerfile" and gpu["profiles"] == ["gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    pair = learners["gpu-pair-learner"]  # one learner of two GPUs: torchrun, a rank per GPU
    assert pair["entrypoint"][:1] == ["torchrun"] and pair["entrypoint"][-2:] == ["--no-python", "gradientmail"]
    nproc = int(pair["entrypoint"][pair["entrypoint"].index("--nproc-per-node") + 1])
    assert len(pair["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]) == nproc == 2
    script = learner_environment(pair)["GRADIENTMAIL_SCRIPT"]
    assert script == "/opt/gradientmail-jobs/examples/torchrun_learner.py" and (ROOT / "examples/torchrun_learner.py").is_file()


def test_run_env_holds_only_settings():
    env = read_env_file(RUN_ENV)
    assert env and set(env) <= SETTINGS_FIELDS_ENV
    _settings_from({"GRADIENTMAIL_MAILBOX": "memory://", **env}).algorithm()


def test_minio_setup_prepares_the_learners_run_and_writes_their_scoped_keys():
    compose = load_compose()
    services = compose["services"]
    setup = services["minio-setup"]
    learners = learner_services(compose)
    assert setup["image"] == services["learner-1"]["image"] and setup["command"][0] == "minio-setup"
    assert "entrypoint" not in setup and setup["restart"] == "no"
    assert setup["depends_on"]["minio"] == {"condition": "service_healthy"}
    out = setup["command"][setup["command"].index("--out") + 1]
    (run_key_volume,) = [v for v, (target, _) in _volume_mounts(setup).items() if target == out]
    assert _volume_mounts(setup)[run_key_volume] == (out, "rw")
    # the root keys: files MinIO itself reads (MINIO_ROOT_*_FILE), in a volume the learners never mount
    root_files = {name: setup["environment"][name] for name in ("MINIO_ROOT_USER_FILE", "MINIO_ROOT_PASSWORD_FILE")}
    assert root_files == {name: services["minio"]["environment"][name] for name in root_files}
    (root_volume,) = [v for v, (target, _) in _volume_mounts(setup).items() if target == "/secrets/minio"]
    assert _volume_mounts(services["minio"])[root_volume] == ("/secrets/minio", "ro")
    for name, service in learners.items():
        env = learner_environment(service)
        assert env["GRADIENTMAIL_MAILBOX"] == setup["environment"]["GRADIENTMAIL_MAILBOX"], name
        assert service["depends_on"]["minio-setup"] == {"condition": "service_completed_successfully"}, name
        # only the scoped user's keys, from the file minio-setup writes; never MinIO's root keys
        assert env["AWS_SHARED_CREDENTIALS_FILE"] == f"{out}/storage.credentials", name
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(env), name
        assert not [k for k, v in env.items() if "MINIO_ROOT" in k or "MINIO_ROOT" in v], name
        assert root_volume not in _volume_mounts(service), name
        assert _volume_mounts(service)[run_key_volume] == (out, "ro"), name


def test_compose_has_no_literal_password():
    text = COMPOSE.read_text()
    assert "gradientmail-secret" not in text
    # every ${NAME:-default} of a secret has an empty default: the value comes from .env or nowhere
    for name, default in re.findall(r"\$\{([A-Z_]+):-([^}]*)\}", text):
        if re.search(r"PASSWORD|SECRET|ROOT_USER|_KEY", name):
            assert default == "", f"{name} has a default {default!r}"
    for service_name, service in load_compose()["services"].items():
        environment = service.get("environment", {})
        for name, value in environment.items():
            if re.search(r"PASSWORD|SECRET|ROOT_USER|ACCESS_KEY", name):
                value = str(value)
                assert name.endswith("_FILE") or (value.startswith("${") and value.endswith(":-}")), (service_name, name)
                assert value.startswith(("/", "${")), (service_name, name)


def test_compose_generates_the_root_and_grafana_credentials_unless_dotenv_gives_them():
    services = load_compose()["services"]
    credentials = services["credentials"]
    command = " ".join(credentials["command"])
    assert credentials["command"][:2] == ["minio-setup", "--init-secrets"] and credentials["restart"] == "no"
    assert credentials["network_mode"] == "none"
    assert "--minio-secrets=/secrets/minio" in command and "--grafana-secrets=/secrets/grafana" in command
    assert credentials["environment"] == {
        "MINIO_ROOT_USER": "${MINIO_ROOT_USER:-}",
        "MINIO_ROOT_PASSWORD": "${MINIO_ROOT_PASSWORD:-}",
        "GRAFANA_ADMIN_PASSWORD": "${GRAFANA_ADMIN_PASSWORD:-}",
    }
    for reader in ("minio", "grafana"):
        assert services[reader]["depends_on"]["credentials"] == {"condition": "service_completed_successfully"}
    assert services["minio"]["environment"]["MINIO_ROOT_PASSWORD_FILE"] == "/secrets/minio/root-password"
    grafana = services["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/secrets/grafana/admin-password"
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and "GF_SECURITY_ADMIN_PASSWORD" not in grafana
    # the files the one shot writes (gradientmail/minio_setup.py), where MinIO and Grafana read them
    assert _volume_mounts(services["grafana"])["grafana-admin"] == ("/secrets/grafana", "ro")
    assert _volume_mounts(credentials) == {"minio-root": ("/secrets/minio", "rw"), "grafana-admin": ("/secrets/grafana", "rw")}


PUBLISHED_ON_ALL_INTERFACES = {("minio", "9000")}
"""MinIO's S3 port, for learners on other machines; every other port is bound to 127.0.0.1."""


def test_published_ports_are_bound_to_loopback_except_s3():
    for name, service in load_compose()["services"].items():
        for port in service.get("ports", []):
            parts = str(port).split(":")
            if (name, parts[-2]) in PUBLISHED_ON_ALL_INTERFACES:
                continue
            assert len(parts) == 3 and parts[0] == "127.0.0.1", f"{name} publishes {port} on every interface"


def _volume_mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Named volume -> (container path, mode) for the service's named-volume mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *options = volume.split(":")
        if not source.startswith(("./", "/")):
            mounts[source] = (target, options[0] if options else "rw")
    return mounts


def test_the_run_key_is_generated_once_and_every_learner_reads_it():
    compose = load_compose()
    services = compose["services"]
    keygen = services["keygen"]
    learners = learner_services(compose)
    # the one shot runs the learners' own image, as its user, and writes the key into a named volume
    assert keygen["image"] == services["learner-1"]["image"] and keygen["build"] == services["learner-1"]["build"]
    assert keygen["command"][:2] == ["keygen", "--out"] and "entrypoint" not in keygen
    key_file = keygen["command"][2]
    ((volume, (target, mode)),) = _volume_mounts(keygen).items()
    assert key_file.rsplit("/", 1)[0] == target and mode == "rw"
    assert volume in compose["volumes"] and keygen["restart"] == "no"
    assert keygen["network_mode"] == "none", "the one shot needs no network"
    assert set(image_services(compose)) == set(learners) | {"keygen", "minio-setup", "credentials"}
    for name, service in learners.items():
        env = learner_environment(service)
        assert env["GRADIENTMAIL_RUN_KEY_FILE"] == key_file, name
        assert "GRADIENTMAIL_RUN_KEY" not in env, f"{name}: the key comes from the volume, never a literal"
        assert _volume_mounts(service)[volume] == (target, "ro"), f"{name} mounts the run key read-only"
        assert service["depends_on"]["keygen"] == {"condition": "service_completed_successfully"}, name
        # the key file is written by and read as the image's user: the mount point is that user's
        dockerfile = ROOT / service["build"]["dockerfile"]
        assert target in _runtime_user_dirs(dockerfile), f"{name}: {dockerfile.name} lacks {target}"
    for name, service in services.items():
        if name not in ("keygen", "minio-setup") and name not in learners:  # minio-setup writes the storage keys there
            assert volume not in _volume_mounts(service), f"{name} has no business with the run key"


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> repository path, for the service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts[target] = ROOT / source
    return mounts


def _resolve(mounts: dict[str, Path], container_path: str) -> Path:
    for target, source in sorted(mounts.items(), key=lambda item: -len(item[0])):
        if container_path == target or container_path.startswith(target + "/"):
            return source / container_path[len(target) :].lstrip("/")
    raise AssertionError(f"{container_path} is not mounted from the repository")


def test_prometheus_scrapes_the_learners_with_the_projects_rules():
    compose = load_compose()
    prometheus = compose["services"]["prometheus"]
    mounts = _mounts(prometheus)
    for source in mounts.values():
        assert source.exists(), f"prometheus mounts {source}, which is missing"
    config = yaml.safe_load(_resolve(mounts, "/etc/prometheus/prometheus.yml").read_text())
    for rule_file in config["rule_files"]:
        rules = yaml.safe_load(_resolve(mounts, rule_file).read_text())
        assert rules["groups"], rule_file
    assert _resolve(mounts, config["rule_files"][0]) == ROOT / "dashboards/prometheus/gradientmail.rules.yaml"
    port = dockerfile_env(DOCKERFILES["cpu"])["GRADIENTMAIL_METRICS_PORT"]
    learners = learner_services(compose)
    scraped = set()
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            assert str(sd["port"]) == port
            scraped |= set(sd["names"])
    assert scraped == set(learners), "every learner service is scraped, and only those"


def test_promtool_accepts_the_prometheus_config(tmp_path):
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(ROOT / "docker/prometheus.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_provisions_the_projects_datasource_and_dashboards():
    compose = load_compose()
    grafana = compose["services"]["grafana"]
    mounts = _mounts(grafana)
    for source in mounts.values():
        assert source.is_dir(), f"grafana mounts {source}, which is missing"
    datasources = yaml.safe_load(next(_resolve(mounts, "/etc/grafana/provisioning/datasources").glob("*.yaml")).read_text())
    url = datasources["datasources"][0]["url"]
    host, port = url.split("://")[1].split(":")
    assert host in compose["services"] and any(str(p).endswith(f":{port}") for p in compose["services"][host]["ports"])
    providers = yaml.safe_load(next(_resolve(mounts, "/etc/grafana/provisioning/dashboards").glob("*.yaml")).read_text())
    dashboards = _resolve(mounts, providers["providers"][0]["options"]["path"])
    assert dashboards == ROOT / "dashboards/grafana" and sorted(dashboards.glob("*.json"))
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _resolve(mounts, home).is_file()


def test_the_compose_header_documents_ports_and_credentials():
    compose = load_compose()
    header = COMPOSE.read_text().split("x-learner")[0]
    for service in compose["services"].values():
        for port in service.get("ports", []):
            assert port.split(":")[-2] in header
    for secret in ("MINIO_ROOT_USER", "GRAFANA_ADMIN_PASSWORD", ".env", "minio-setup", "--scale", "run key", "keygen"):
        assert secret in header


# -- the Helm chart ---------------------------------------------------------------------------

VALUE_SETS = {
    "defaults": {},
    "gpu-pool": yaml.safe_load((CHART / "ci/gpu-pool-values.yaml").read_text()),
    "external-s3": yaml.safe_load((CHART / "ci/external-s3-values.yaml").read_text()),
    "in-chart-minio": yaml.safe_load((CHART / "ci/minio-values.yaml").read_text()),
    "in-chart-seaweedfs": yaml.safe_load((CHART / "ci/seaweedfs-values.yaml").read_text()),
    "job": yaml.safe_load((CHART / "ci/job-values.yaml").read_text()),
    "dedicated-syncer": yaml.safe_load((CHART / "ci/syncer-values.yaml").read_text()),
    "multi-gpu": yaml.safe_load((CHART / "ci/multi-gpu-values.yaml").read_text()),
    "learner-state": yaml.safe_load((CHART / "ci/state-values.yaml").read_text()),
}
CHART_MANAGED = {"mailbox", "learner_id", "metrics_port", "metrics_address", "script", "run_key", "run_key_file"}
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def _render(values: dict[str, Any]) -> dict[str, str]:
    with helm_python.Chart.load(CHART) as chart:
        return chart.render(values, name="gm", namespace="training", is_install=True)


def _documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    return [doc for name, text in rendered.items() if not name.endswith("NOTES.txt") for doc in yaml.safe_load_all(text) if doc]


def _learners(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """The learners' workload: the StatefulSet, or in job mode the Indexed Job."""
    (workload,) = [d for d in documents if d["kind"] in ("StatefulSet", "Job") and d["metadata"]["name"] == "gm-gradientmail"]
    return workload


def _learner_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    return _learners(documents)["spec"]["template"]["spec"]["containers"][0]


def _expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(NAME)`` expansion of a variable defined earlier in the container's env."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_helm_lint_passes(value_set):
    report = helm_python.lint(CHART, VALUE_SETS[value_set], strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report


def _supported_minors() -> tuple[str, str]:
    """The oldest Kubernetes the chart claims (``kubeVersion`` in Chart.yaml) and the newest the
    validator knows: every value set must validate strictly on both."""
    claimed = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    match = re.fullmatch(r">=(\d+\.\d+)\.0-0", claimed)
    assert match, f"kubeVersion {claimed!r}: expected >=MAJOR.MINOR.0-0"
    newest = subprocess.run([tool("kubernetes-validate"), "--help"], capture_output=True, text=True).stdout
    default = re.search(r"Defaults to (\d+\.\d+)\.\d+", " ".join(newest.split()))
    assert default, newest
    return f"{match[1]}.0", f"{default[1]}.0"


SUPPORTED_MINORS = _supported_minors()


@pytest.mark.parametrize("kubernetes", SUPPORTED_MINORS)
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_rendered_manifests_pass_kubernetes_validate_strict(value_set, kubernetes, tmp_path):
    """Every value set, strictly, on the oldest Kubernetes minor the chart claims and the newest."""
    rendered = _render(VALUE_SETS[value_set])
    files = []
    for name, text in rendered.items():
        if name.endswith("NOTES.txt") or not text.strip():
            continue
        path = tmp_path / name.replace("/", "_")
        path.write_text(text)
        files.append(str(path))
    result = subprocess.run([tool("kubernetes-validate"), "--strict", "-k", kubernetes, *files], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    documents = _documents(rendered)
    passed = 0
    for line in (result.stdout + result.stderr).splitlines():
        if line.startswith("INFO ") and " passed for resource " in line:
            passed += 1
        elif line.strip():  # the Prometheus Operator's kinds have no schema there: the only warnings
            assert "Couldn't find schema for kind" in line and any(kind in line for kind in CRD_KINDS), line
    assert passed == len([d for d in documents if d["kind"] not in CRD_KINDS])
    kinds = {doc["kind"] for doc in documents}
    assert {"Service", "ServiceAccount", "PodDisruptionBudget", "NetworkPolicy", "ConfigMap"} <= kinds
    assert _learners(documents)["kind"] == ("Job" if value_set == "job" else "StatefulSet")


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_rendered_learners_get_only_known_settings_and_no_plain_secrets(value_set):
    documents = _documents(_render(VALUE_SETS[value_set]))
    container = _learner_container(documents)
    literal = {}
    if value_set == "job":  # what the pod of completion index 3 gets from its annotation
        assert container["env"][1] == {
            "name": "JOB_COMPLETION_INDEX",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}},
        }
        literal["JOB_COMPLETION_INDEX"] = "3"
    else:
        assert container["env"][1] == {
            "name": "GRADIENTMAIL_LEARNER_ID",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        }
    for entry in container["env"]:
        name = entry["name"]
        if name.startswith("GRADIENTMAIL_") and name not in RUN_KEY_VARIABLES:
            assert name in SETTINGS_FIELDS_ENV, f"{name} is not a NodeSettings field"
        if name.startswith("AWS_") or name in RUN_KEY_VARIABLES:
            assert "value" not in entry and "secretKeyRef" in entry["valueFrom"], f"{name} must come from a Secret"
        if "value" in entry:
            literal[name] = _expand(entry["value"], literal)
    if value_set == "job":
        assert literal["GRADIENTMAIL_LEARNER_ID"] == "gm-gradientmail-3", "the id a StatefulSet's pod 3 has"
    literal.pop("JOB_COMPLETION_INDEX", None)
    settings = _settings_from(literal)
    settings.algorithm()
    settings.session_options()
    open_mailbox(settings.mailbox).close()
    values = VALUE_SETS[value_set]
    expected = set()
    if not values.get("runKey", {}).get("existingSecret"):
        expected.add("gm-gradientmail-run-key")
    if values.get("minio", {}).get("enabled"):
        expected |= {"gm-gradientmail-minio", "gm-gradientmail-minio-learner"}
    assert {d["metadata"]["name"] for d in documents if d["kind"] == "Secret"} == expected


def test_values_settings_are_exactly_the_node_settings_the_chart_does_not_manage():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["settings"]["properties"]) == SETTINGS_FIELDS - CHART_MANAGED


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_pod_is_locked_down(value_set):
    for document in _documents(_render(VALUE_SETS[value_set])):
        if document["kind"] not in ("StatefulSet", "Job"):
            continue
        pod = document["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, document["metadata"]["name"]
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]


def test_the_dedicated_syncer_is_a_cpu_deployment_the_policies_and_the_metrics_service_select():
    """syncer.enabled: one Deployment pod running `gradientmail node` with GRADIENTMAIL_ROLE=syncer
    on the CPU image, no GPU, the run's settings but the role, its own node id; the network
    policy, the MinIO policy's sources and the metrics Service select it with the learners."""
    documents = _documents(_render(VALUE_SETS["dedicated-syncer"]))
    (syncer,) = [d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "gm-gradientmail-syncer"]
    pod = syncer["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["image"] == f"ghcr.io/gradientmail/gradientmail-learner:{__version__}-cpu"
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["GRADIENTMAIL_ROLE"] == "syncer" and env["GRADIENTMAIL_SYNC_EVERY"] == "100"
    assert env["GRADIENTMAIL_LEARNER_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert [e["name"] for e in container["env"]].count("GRADIENTMAIL_ROLE") == 1
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
    labels = pod["metadata"]["labels"]
    (policy,) = [d for d in documents if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "gm-gradientmail"]
    (service,) = [d for d in documents if d["kind"] == "Service" and d["metadata"]["name"] == "gm-gradientmail"]
    learner_labels = _learners(documents)["spec"]["template"]["metadata"]["labels"]
    for selector in (policy["spec"]["podSelector"]["matchLabels"], service["spec"]["selector"]):
        assert selector.items() <= labels.items() and selector.items() <= learner_labels.items()
    assert _learner_container(documents)["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_a_pod_of_several_gpus_runs_torchrun_one_rank_per_gpu():
    container = _learner_container(_documents(_render(VALUE_SETS["multi-gpu"])))
    assert container["command"] == ["torchrun"]
    assert container["args"] == ["--standalone", "--nproc-per-node", "8", "--no-python", "gradientmail", "node"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"learners": {"torchrun": False}}, "gpu.count: 8 gives each learner 8 GPUs, but its job trains on one"),
        ({"gpu": {"count": 1}}, "it needs gpu.count of 2 or more"),
        ({"script": {"content": ""}}, "the default job trains on one device"),
    ],
    ids=["several-gpus-one-device-job", "torchrun-one-gpu", "torchrun-default-job"],
)
def test_a_multi_gpu_pod_with_a_single_device_job_is_refused(change, message):
    values = yaml.safe_load((CHART / "ci/multi-gpu-values.yaml").read_text())
    for section, fields in change.items():
        values[section] = {**values[section], **fields}
    with pytest.raises(helm_python.HelmError, match=message):
        _render(values)


def test_a_dedicated_syncer_beside_learner_only_nodes_is_refused():
    values = {**VALUE_SETS["dedicated-syncer"], "settings": {"role": "learner"}}
    with pytest.raises(helm_python.HelmError, match="no node to take the rounds over"):
        _render(values)


def test_the_learner_state_is_a_claim_per_pod_or_one_shared_claim_in_job_mode():
    """learners.state: GRADIENTMAIL_STATE_DIR names the mounted volume; a StatefulSet gets a claim
    per pod (volumeClaimTemplates), a Job one ReadWriteMany claim for every index, kept on
    uninstall; existingClaim mounts that claim instead; settings.state_dir wins over the mount."""
    documents = _documents(_render(VALUE_SETS["learner-state"]))
    workload = _learners(documents)
    (template,) = workload["spec"]["volumeClaimTemplates"]
    assert template["metadata"]["name"] == "state" and template["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert template["spec"]["storageClassName"] == "gp3" and template["spec"]["resources"]["requests"]["storage"] == "5Gi"
    container = _learner_container(documents)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GRADIENTMAIL_STATE_DIR"] == "/var/lib/gradientmail/state" and env["GRADIENTMAIL_SAVE_STATE_EVERY"] == "200"
    assert {"name": "state", "mountPath": "/var/lib/gradientmail/state"} in container["volumeMounts"]
    assert not any(d["kind"] == "PersistentVolumeClaim" for d in documents)

    job = _documents(_render(VALUE_SETS["job"]))
    (claim,) = [d for d in job if d["kind"] == "PersistentVolumeClaim"]
    assert (
        claim["spec"]["accessModes"] == ["ReadWriteMany"]
        and claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    )
    volumes = {v["name"]: v for v in _learners(job)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]

    existing = {**VALUE_SETS["learner-state"], "learners": {"state": {"enabled": True, "existingClaim": "nfs-state"}}}
    documents = _documents(_render(existing))
    assert "volumeClaimTemplates" not in _learners(documents)["spec"]
    volumes = {v["name"]: v for v in _learners(documents)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == "nfs-state"

    own = {**VALUE_SETS["learner-state"], "settings": {"state_dir": "/scratch/state"}}
    variables = _learner_container(_documents(_render(own)))["env"]
    assert [e["value"] for e in variables if e["name"] == "GRADIENTMAIL_STATE_DIR"] == ["/scratch/state"]  # the setting's, once


def test_every_monitoring_object_of_the_gpu_pool_carries_the_release_label_its_prometheus_selects():
    """kube-prometheus-stack's default selectors match its release label on ServiceMonitors and
    PrometheusRules alike: the worked GPU pool puts it on both (``metrics.labels``)."""
    documents = _documents(_render(VALUE_SETS["gpu-pool"]))
    monitoring = [d for d in documents if d["kind"] in CRD_KINDS]
    assert {d["kind"] for d in monitoring} == CRD_KINDS
    for document in monitoring:
        assert document["metadata"]["labels"]["release"] == "kube-prometheus-stack", document["kind"]
    (dashboards,) = [d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboards")]
    assert dashboards["metadata"]["namespace"] == "monitoring"  # where the sidecar looks by default


def test_the_gpu_pool_requests_gpus_and_places_learners():
    values = VALUE_SETS["gpu-pool"]
    documents = _documents(_render(values))
    container = _learner_container(documents)
    assert container["image"] == f"ghcr.io/gradientmail/gradientmail-learner:{__version__}-cuda"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1 and container["resources"]["requests"]["nvidia.com/gpu"] == 1
    (statefulset,) = [d for d in documents if d["kind"] == "StatefulSet"]
    pod = statefulset["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints"):
        assert pod[key] == values["learners"][key]
    assert statefulset["spec"]["replicas"] == 8 and statefulset["spec"]["podManagementPolicy"] == "Parallel"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GRADIENTMAIL_DEVICE"] == "cuda"
    assert {"ServiceMonitor", "PrometheusRule"} <= {d["kind"] for d in documents}


def test_the_gpu_pool_reaches_s3_with_the_pods_iam_role_and_needs_nothing_it_does_not_create():
    # EKS IRSA: the service account's role-arn annotation, no keys; an s3:// URL with its region
    documents = _documents(_render(VALUE_SETS["gpu-pool"]))
    container = _learner_container(documents)
    env = {e["name"]: e for e in container["env"]}
    assert not [name for name in env if name.startswith("AWS_")]
    mailbox = env["GRADIENTMAIL_MAILBOX"]["value"]
    assert mailbox == "s3://my-training-gradientmail/runs/gpt-a10g?region=us-east-1" and "endpoint=" not in mailbox
    (account,) = [d for d in documents if d["kind"] == "ServiceAccount"]
    pod = _learners(documents)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"] == "gm-gradientmail"
    annotations = account["metadata"]["annotations"]
    assert re.fullmatch(r"arn:aws:iam::\d{12}:role/[\w+=,.@-]+", annotations["eks.amazonaws.com/role-arn"])
    assert not [key for key in annotations if "gke.io" in key]
    # every ConfigMap and Secret the pod mounts or reads is one the release creates (or the run key's)
    created = {(d["kind"], d["metadata"]["name"]) for d in documents}
    for volume in pod["volumes"]:
        if "configMap" in volume:
            assert ("ConfigMap", volume["configMap"]["name"]) in created
    for entry in container["env"]:
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ("Secret", ref["name"]) in created


def test_the_default_learner_is_cpu_and_uses_the_pods_role():
    container = _learner_container(_documents(_render({})))
    assert container["image"] == f"ghcr.io/gradientmail/gradientmail-learner:{__version__}-cpu"
    assert not [e for e in container["env"] if e["name"].startswith("AWS_")]
    assert all(
        probe["httpGet"] == {"path": "/metrics", "port": "metrics"}
        for probe in (container["startupProbe"], container["readinessProbe"], container["livenessProbe"])
    )


def test_external_s3_credentials_come_from_the_existing_secret():
    container = _learner_container(_documents(_render(VALUE_SETS["external-s3"])))
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"].startswith("AWS_")}
    assert refs == {
        "AWS_ACCESS_KEY_ID": {"name": "r2-mailbox", "key": "access-key-id"},
        "AWS_SECRET_ACCESS_KEY": {"name": "r2-mailbox", "key": "secret-access-key"},
    }
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GRADIENTMAIL_MAILBOX"] == (
        "s3://gradientmail-runs/teams/lm/run-7?endpoint=https://0123456789abcdef.r2"
        ".cloudflarestorage.com&addressing=path&region=auto"
    )


def test_in_chart_minio_is_the_mailbox():
    documents = _documents(_render(VALUE_SETS["in-chart-minio"]))
    container = _learner_container(documents)
    env = {e["name"]: e for e in container["env"]}
    assert env["GRADIENTMAIL_MAILBOX"]["value"].startswith(
        "s3://gradientmail/runs/onprem?endpoint=http://gm-gradientmail-minio:9000"
    )
    # the learners hold the scoped user's keys, never MinIO's root keys
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "gm-gradientmail-minio-learner", "key": name}
    learner_pods = [
        d["spec"]["template"]["spec"]
        for d in documents
        if d["kind"] in ("StatefulSet", "Job") and d["metadata"]["name"] == "gm-gradientmail"
    ]
    assert learner_pods
    for pod in learner_pods:
        text = json.dumps(pod)
        assert "rootPassword" not in text and "rootUser" not in text and '"gm-gradientmail-minio"' not in text
    names = {(d["kind"], d["metadata"]["name"]) for d in documents}
    assert {
        ("StatefulSet", "gm-gradientmail-minio"),
        ("Service", "gm-gradientmail-minio"),
        ("Secret", "gm-gradientmail-minio"),
        ("Secret", "gm-gradientmail-minio-learner"),
        ("NetworkPolicy", "gm-gradientmail-minio"),
    } <= names
    (learner_secret,) = [
        d for d in documents if d["kind"] == "Secret" and d["metadata"]["name"] == "gm-gradientmail-minio-learner"
    ]
    assert learner_secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    keys = {k: base64.b64decode(v).decode() for k, v in learner_secret["data"].items()}
    assert keys["AWS_ACCESS_KEY_ID"] == "gradientmail-learner" and len(keys["AWS_SECRET_ACCESS_KEY"]) == 40
    assert (
        keys["storage.env"] == f"AWS_ACCESS_KEY_ID=gradientmail-learner\nAWS_SECRET_ACCESS_KEY={keys['AWS_SECRET_ACCESS_KEY']}\n"
    )
    # the setup Job: the learner image, `gradientmail minio-setup` with the root keys, giving the
    # user exactly the Secret's key (--keys)
    (job,) = [d for d in documents if d["kind"] == "Job"]
    assert job["metadata"]["name"].startswith("gm-gradientmail-minio-setup-")
    (setup,) = job["spec"]["template"]["spec"]["containers"]
    assert setup["image"] == container["image"] and setup["args"][0] == "minio-setup"
    assert "--user=gradientmail-learner" in setup["args"] and "--keys=/keys/storage.env" in setup["args"]
    setup_env = {e["name"]: e for e in setup["env"]}
    assert setup_env["GRADIENTMAIL_MAILBOX"] == env["GRADIENTMAIL_MAILBOX"]
    assert setup_env["MINIO_ROOT_USER"]["valueFrom"]["secretKeyRef"] == {"name": "gm-gradientmail-minio", "key": "rootUser"}
    assert setup_env["MINIO_ROOT_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "gm-gradientmail-minio",
        "key": "rootPassword",
    }
    (keys_volume,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "keys"]
    assert keys_volume["secret"]["secretName"] == "gm-gradientmail-minio-learner"
    # the MinIO NetworkPolicy lets the setup Job in
    (policy,) = [d for d in documents if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "gm-gradientmail-minio"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert any(
        set(peer.get("podSelector", {}).get("matchLabels", {}).items()) <= set(labels.items())
        for rule in policy["spec"]["ingress"]
        for peer in rule["from"]
    )


def test_in_chart_seaweedfs_serves_the_learners_scoped_user(tmp_path, monkeypatch):
    """minio.server=seaweedfs: the pod's own commands, run here as the kubelet would run them
    (the init container's `gradientmail seaweedfs-setup --identities`, then the server's weed
    command line with the pod's paths moved under tmp_path, then the Job's `--bucket`), give a
    SeaweedFS in which the learners' Secret keys work under the run's prefix and nowhere else;
    the learners' pods hold only those keys."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    from gradientmail import cli
    from tests.seaweedfs import SeaweedFS

    documents = _documents(_render(VALUE_SETS["in-chart-seaweedfs"]))
    learner_env = {e["name"]: e for e in _learner_container(documents)["env"]}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert learner_env[name]["valueFrom"]["secretKeyRef"] == {"name": "gm-gradientmail-minio-learner", "key": name}
    (server,) = [d for d in documents if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "gm-gradientmail-minio"]
    pod = server["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (weed,) = pod["containers"]
    assert weed["image"].startswith("chrislusf/seaweedfs:4.48@sha256:") and weed["command"] == ["weed"]
    (job,) = [d for d in documents if d["kind"] == "Job"]
    (setup,) = job["spec"]["template"]["spec"]["containers"]
    assert setup["args"] == ["seaweedfs-setup", "--bucket"]
    secrets = {
        d["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in d["data"].items()}
        for d in documents
        if d["kind"] == "Secret"
    }
    root = secrets["gm-gradientmail-minio"]
    monkeypatch.setenv("MINIO_ROOT_USER", root["rootUser"])
    monkeypatch.setenv("MINIO_ROOT_PASSWORD", root["rootPassword"])
    moved = {
        "/seaweedfs": tmp_path / "seaweedfs",
        "/tmp": tmp_path / "tmp",
        "/keys": tmp_path / "keys",
        "/data": tmp_path / "data",
    }

    def move(argument: str) -> str:
        for pod_path, here in moved.items():
            argument = argument.replace(f"={pod_path}/", f"={here}/").replace(f"={pod_path}", f"={here}")
        return argument

    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "storage.env").write_text(secrets["gm-gradientmail-minio-learner"]["storage.env"])
    init_env = {e["name"]: e.get("value") for e in init["env"]}
    assert cli.main([*map(move, init["args"]), "--mailbox", init_env["GRADIENTMAIL_MAILBOX"]]) == 0
    identities = Path(move(next(a for a in weed["args"] if a.startswith("-s3.config="))).split("=", 1)[1])
    started = SeaweedFS.start(tmp_path / "server", bucket="ready-probe", name="root", s3_config=identities)
    try:
        endpoint = started.server.endpoint_url
        url = re.sub(r"endpoint=[^&]+", f"endpoint={endpoint}", init_env["GRADIENTMAIL_MAILBOX"])
        assert cli.main([*setup["args"], "--mailbox", url]) == 0
        learner = secrets["gm-gradientmail-minio-learner"]
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=learner["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=learner["AWS_SECRET_ACCESS_KEY"],
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )
        client.put_object(Bucket="gradientmail", Key="runs/onprem/probe", Body=b"x")
        assert client.get_object(Bucket="gradientmail", Key="runs/onprem/probe")["Body"].read() == b"x"
        with pytest.raises(ClientError, match="AccessDenied"):
            client.put_object(Bucket="gradientmail", Key="runs/other/probe", Body=b"x")
    finally:
        started.stop()
    # the pod's flags are the ones the tests' own server runs with (tests/seaweedfs.py)
    ours = {argument.split("=", 1)[0] for argument in started.command_line[1:]}
    assert {argument.split("=", 1)[0] for argument in weed["args"]} - {"-logtostderr"} <= ours


def test_the_dashboards_and_rules_are_the_projects_files():
    documents = _documents(_render(VALUE_SETS["gpu-pool"]))
    (configmap,) = [d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboards")]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    expected = {path.name: path.read_text() for path in (ROOT / "dashboards/grafana").glob("*.json")}
    assert expected and configmap["data"] == expected
    (rule,) = [d for d in documents if d["kind"] == "PrometheusRule"]
    assert rule["spec"] == _project_rules(stalled_after="25m")  # sync_every 500 x 1 s x 3


def _project_rules(stalled_after: str = "15m", runbook: str | None = None) -> dict[str, Any]:
    """dashboards/prometheus/gradientmail.rules.yaml as the chart renders it: the stalled window
    put in, and with ``runbook`` each alert's runbook_url."""
    rules = yaml.safe_load((ROOT / "dashboards/prometheus/gradientmail.rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "GradientMailRoundsStalled":
                rule["expr"] = rule["expr"].replace("[15m]", f"[{stalled_after}]")
                rule["annotations"]["summary"] = rule["annotations"]["summary"].replace("15 minutes", stalled_after)
            if "alert" in rule and runbook is not None:
                anchor = re.search(r"docs/observability\.md#([a-z0-9-]+)", rule["annotations"]["description"])
                assert anchor, rule["alert"]
                rule["annotations"]["runbook_url"] = f"{runbook}#{anchor[1]}"
    return rules


def test_alert_thresholds_scale_with_the_run_and_carry_runbook_links():
    """GradientMailRoundsStalled waits 3 x sync_every x stepSeconds (at least 15 minutes) or the
    window given; runbookUrl gives every alert a runbook_url to its section, which exists."""

    def rule_of(values: dict[str, Any]) -> dict[str, Any]:
        (rule,) = [d for d in _documents(_render(values)) if d["kind"] == "PrometheusRule"]
        return rule["spec"]

    enabled = {"metrics": {"prometheusRule": {"enabled": True}}}
    assert rule_of(enabled) == _project_rules()  # sync_every 100 x 1 s x 3 = 5 min: the 15-minute floor
    slow = {**enabled, "settings": {"sync_every": 500}, "metrics": {"prometheusRule": {"enabled": True, "stepSeconds": 2.5}}}
    assert rule_of(slow) == _project_rules(stalled_after="63m")  # 3 x 500 x 2.5 s = 62.5 min, up
    runbook = "https://git.example.org/gm/-/blob/main/docs/observability.md"
    given = {"metrics": {"prometheusRule": {"enabled": True, "roundsStalledAfter": "2h", "runbookUrl": runbook + "/"}}}
    assert rule_of(given) == _project_rules(stalled_after="2h", runbook=runbook)
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", (ROOT / "docs/observability.md").read_text(), re.M)
    }
    for group in rule_of(given)["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["annotations"]["runbook_url"].rsplit("#", 1)[1] in headings, rule["alert"]
    with pytest.raises(helm_python.HelmError, match="roundsStalledAfter"):
        _render({"metrics": {"prometheusRule": {"enabled": True, "roundsStalledAfter": "15 minutes"}}})


def _run_key_secrets(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-run-key")]


def _run_key_env(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in _learner_container(documents)["env"] if e["name"] in RUN_KEY_VARIABLES]


def test_the_chart_generates_a_64_character_run_key_kept_by_uninstall():
    documents = _documents(_render({}))
    (secret,) = _run_key_secrets(documents)
    assert secret["metadata"]["name"] == "gm-gradientmail-run-key"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert secret["immutable"] is True and set(secret["data"]) == {"run-key"}
    key = base64.b64decode(secret["data"]["run-key"]).decode()
    assert len(key) == 64 and key.isascii() and key.isalnum()
    assert _run_key_env(documents) == [
        {"name": "GRADIENTMAIL_RUN_KEY", "valueFrom": {"secretKeyRef": {"name": "gm-gradientmail-run-key", "key": "run-key"}}}
    ]
    other = base64.b64decode(_run_key_secrets(_documents(_render({})))[0]["data"]["run-key"]).decode()
    assert other != key, "a fresh key for each install"


def test_an_upgrade_keeps_the_stored_run_key(tmp_path):
    # helm-python renders offline, where lookup finds nothing: stand in for the cluster by giving
    # the template the Secret a first install stored, exactly where lookup would return it
    chart = tmp_path / "gradientmail"
    shutil.copytree(CHART, chart, symlinks=False)
    template = chart / "templates/runkey-secret.yaml"
    lookup = 'lookup "v1" "Secret" .Release.Namespace $name'
    assert template.read_text().count(lookup) == 1
    stored = base64.b64encode(b"k" * 64).decode()
    template.write_text(template.read_text().replace(lookup, f'dict "data" (dict "run-key" "{stored}")'))
    with helm_python.Chart.load(chart) as loaded:
        rendered = loaded.render({}, name="gm", namespace="training", is_upgrade=True)
    (secret,) = _run_key_secrets(_documents(rendered))
    assert secret["data"] == {"run-key": stored}


def test_an_existing_run_key_secret_is_used_and_none_is_generated():
    documents = _documents(_render({"runKey": {"existingSecret": "team-run-key", "existingSecretKey": "key.txt"}}))
    assert not _run_key_secrets(documents) and not [d for d in documents if d["kind"] == "Secret"]
    assert _run_key_env(documents) == [
        {"name": "GRADIENTMAIL_RUN_KEY", "valueFrom": {"secretKeyRef": {"name": "team-run-key", "key": "key.txt"}}}
    ]
    # the multi-cluster set: the key is a Secret made in each cluster from one value
    run_key = VALUE_SETS["external-s3"]["runKey"]
    external = _documents(_render(VALUE_SETS["external-s3"]))
    assert not _run_key_secrets(external)
    ref = {"name": run_key["existingSecret"], "key": run_key["existingSecretKey"]}
    assert _run_key_env(external) == [{"name": "GRADIENTMAIL_RUN_KEY", "valueFrom": {"secretKeyRef": ref}}]


def test_without_a_run_key_there_is_no_secret_and_no_variable():
    rendered = _render({"runKey": {"enabled": False}})
    documents = _documents(rendered)
    assert not _run_key_secrets(documents) and not _run_key_env(documents)
    assert "the run's records are not signed" in rendered["gradientmail/templates/NOTES.txt"]


@pytest.mark.parametrize("variable", sorted(RUN_KEY_VARIABLES))
def test_the_run_key_in_extra_env_is_refused_with_the_values_to_use(variable):
    with pytest.raises(helm_python.HelmError, match=rf"{variable} is the run key.*runKey.existingSecret"):
        _render({"learners": {"extraEnv": [{"name": variable, "value": "x" * 40}]}})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mailbox": {"accessKeyId": "AKIAEXAMPLE"}}, "at '/mailbox': additional properties 'accessKeyId' not allowed"),
        ({"mailbox": {"prefix": "/runs//x"}}, "at '/mailbox/prefix'"),
        ({"mailbox": {"bucket": "My_Bucket"}}, "at '/mailbox/bucket'"),
        ({"mailbox": {"endpoint": "http://user:pw@s3.local:9000"}}, "at '/mailbox/endpoint'"),
        ({"minio": {"enabled": True}, "mailbox": {"existingSecret": "aws"}}, "at '/mailbox/existingSecret': value must be ''"),
        ({"settings": {"sync_evry": 10}}, "at '/settings': additional properties 'sync_evry' not allowed"),
        ({"settings": {"merge": "median"}}, "at '/settings/merge': value must be one of 'rda', 'weighted_mean'"),
        ({"settings": {"fragments": 0}}, "at '/settings/fragments': minimum: got 0, want 1"),
        ({"gpu": {"count": -1}}, "at '/gpu/count': minimum: got -1, want 0"),
        ({"learners": {"replicas": "three"}}, "at '/learners/replicas': got string, want integer"),
        ({"podSecurityContext": {"runAsNonRoot": False}}, "at '/podSecurityContext/runAsNonRoot'"),
        ({"securityContext": {"privileged": True}}, "at '/securityContext/privileged'"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy'"),
        ({"runKey": {"key": "not-a-value"}}, "at '/runKey': additional properties 'key' not allowed"),
        ({"runKey": {"enabled": "yes"}}, "at '/runKey/enabled': got string, want boolean"),
        ({"runKey": {"existingSecret": "Team_Key"}}, "at '/runKey/existingSecret'"),
        ({"runKey": {"existingSecretKey": "a/b"}}, "at '/runKey/existingSecretKey'"),
        # Kubernetes-shaped blocks take only Kubernetes' own field names
        ({"learners": {"resources": {"limit": {"cpu": "1"}}}}, "at '/learners/resources': additional properties 'limit'"),
        ({"securityContext": {"runAsNonroot": True}}, "at '/securityContext': additional properties 'runAsNonroot'"),
        ({"podSecurityContext": {"fsgroup": 10001}}, "at '/podSecurityContext': additional properties 'fsgroup'"),
        ({"learners": {"tolerations": [{"key": "x", "opertor": "Exists"}]}}, "additional properties 'opertor'"),
        ({"learners": {"affinity": {"nodeAfinity": {}}}}, "at '/learners/affinity': additional properties 'nodeAfinity'"),
        ({"learners": {"extraVolumeMounts": [{"name": "d", "mountpath": "/d"}]}}, "additional properties 'mountpath'"),
        ({"learners": {"extraVolumes": [{"name": "d", "emptydir": {}}]}}, "additional properties 'emptydir'"),
        ({"learners": {"extraEnv": [{"name": "HF_TOKEN", "valueForm": {}}]}}, "additional properties 'valueForm'"),
        (
            {
                "learners": {
                    "topologySpreadConstraints": [
                        {"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule", "labelselector": {}}
                    ]
                }
            },
            "additional properties 'labelselector'",
        ),
        ({"networkPolicy": {"mailboxTo": [{"ipblock": {"cidr": "10.0.0.0/8"}}]}}, "additional properties 'ipblock'"),
        ({"minio": {"resources": {"request": {"cpu": "1"}}}}, "at '/minio/resources': additional properties 'request'"),
        ({"learners": {"mode": "deployment"}}, "at '/learners/mode': value must be one of 'statefulset', 'job'"),
        ({"learners": {"job": {"backofflimit": 3}}}, "at '/learners/job': additional properties 'backofflimit'"),
        ({"learners": {"shm": {"size": "1Gi"}}}, "at '/learners/shm': additional properties 'size'"),
        ({"image": {"flavor": "rocm"}}, "at '/image/flavor'"),
        ({"image": {"digest": "latest"}}, "at '/image/digest'"),
    ],
)
def test_invalid_values_are_refused_by_the_schema_with_a_clear_message(values, message):
    with pytest.raises(helm_python.HelmValuesError) as refused:
        _render(values)
    assert message in str(refused.value)
    report = helm_python.lint(CHART, values)
    assert any(message in error for error in report["errors"]), report


def test_a_node_setting_in_extra_env_is_refused_with_the_setting_to_use():
    with pytest.raises(helm_python.HelmError, match=r"GRADIENTMAIL_SYNC_EVERY is a node setting; set it as settings.sync_every"):
        _render({"learners": {"extraEnv": [{"name": "GRADIENTMAIL_SYNC_EVERY", "value": "3"}]}})


def test_notes_tell_how_to_watch_the_run():
    notes = _render(VALUE_SETS["in-chart-minio"])["gradientmail/templates/NOTES.txt"]
    assert "kubectl -n training logs -f gm-gradientmail-0" in notes
    assert "gradientmail status" in notes and "s3://gradientmail/runs/onprem" in notes
    assert "kubectl -n training get secret gm-gradientmail-run-key -o jsonpath='{.data.run-key}' | base64 -d > run.key" in notes
    assert "(the in-chart MinIO gm-gradientmail-minio)" in notes
    seaweedfs = _render(VALUE_SETS["in-chart-seaweedfs"])["gradientmail/templates/NOTES.txt"]
    assert "(the in-chart SeaweedFS gm-gradientmail-minio)" in seaweedfs


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_notes_commands_work_when_pasted_one_per_line(value_set):
    notes = _render(VALUE_SETS[value_set])["gradientmail/templates/NOTES.txt"]
    commands = [line.strip() for line in notes.splitlines() if line.strip().startswith(("kubectl", "curl", "gradientmail", "("))]
    assert commands
    for command in commands:
        assert "&&" not in command and not command.endswith("&"), command
        if "port-forward" in command:  # it blocks: the curl is its own line, for another terminal
            assert command.split()[-1].count(":") == 1 and ";" not in command and "|" not in command, command
    assert any(c.startswith("curl -s localhost:9464/metrics") for c in commands)
    assert any(c.startswith("gradientmail export '") and c.endswith("' model.safetensors") for c in commands)


# -- versions and images ------------------------------------------------------------------------


def test_the_charts_versions_are_the_packages_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__ and isinstance(chart["appVersion"], str)
    assert chart["version"] == __version__, "the chart is released with the package, at its version"


def test_build_images_tags_both_flavours_with_the_version_and_pushes_on_request(tmp_path):
    log = tmp_path / "engine.log"
    engine = tmp_path / "engine"
    engine.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    engine.chmod(0o755)
    script = str(ROOT / "scripts/build-images")
    env = {"PATH": "/usr/bin:/bin", "ENGINE": str(engine)}
    version = subprocess.run([script, "--version"], capture_output=True, text=True, check=True, env=env).stdout.strip()
    assert version == __version__
    subprocess.run([script, "--", "--build-arg", "BASE_IMAGE=local/base"], check=True, env=env, capture_output=True)
    builds = log.read_text().splitlines()
    image = "ghcr.io/gradientmail/gradientmail-learner"
    for line, flavor in zip(builds, ("cpu", "cuda"), strict=True):
        args = line.split()
        assert args[:3] == ["build", "-f", f"docker/{flavor}.Dockerfile"] and args[-1] == "."
        assert f"{image}:{version}-{flavor}" in args and f"gradientmail-learner:{flavor}" in args
        assert "BASE_IMAGE=local/base" in args
    log.unlink()
    subprocess.run(
        [script, "--flavor", "cuda", "--push"], check=True, env={**env, "IMAGE": "reg.example/gm"}, capture_output=True
    )
    assert log.read_text().splitlines()[1] == f"push reg.example/gm:{version}-cuda"
    log.unlink()
    subprocess.run([script, "--flavor", "cpu", "--push", "ghcr.io/someone/"], check=True, env=env, capture_output=True)
    assert log.read_text().splitlines()[1] == f"push ghcr.io/someone/gradientmail-learner:{version}-cpu"
    refused = subprocess.run([script, "--flavor", "gpu"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "unknown flavor gpu" in refused.stderr
    # the chart's default image is the one the script builds
    assert _learner_container(_documents(_render({})))["image"] == f"{image}:{version}-cpu"


def test_the_images_install_the_locked_versions_of_pyproject_requirements():
    """docker/requirements.lock pins every package the images' extras ask for, at a version those
    requirements accept (scripts/lock-images --check), and both Dockerfiles install under it."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts/lock-images"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lock = (ROOT / "docker/requirements.lock").read_text()
    assert "torch==" + (ROOT / "constraints.txt").read_text().split("torch==")[1].split()[0] in lock.splitlines()
    assert not [line for line in lock.splitlines() if line.startswith(("nvidia-", "triton"))]
    for flavor in ("cpu", "cuda"):
        text = (ROOT / f"docker/{flavor}.Dockerfile").read_text()
        assert "COPY pyproject.toml README.md constraints.txt docker/requirements.lock ./" in text, flavor
        assert "-c constraints.txt -c requirements.lock" in text, flavor


def test_a_stale_lock_is_named(tmp_path):
    """--check names a requirement the lock misses or pins outside its range."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("lock_images", str(ROOT / "scripts/lock-images"))
    spec = importlib.util.spec_from_loader("lock_images", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    pins = module.read_lock()
    assert module.problems(pins) == []
    assert module.problems({**pins, "boto3": "1.0.0"}) == ["boto3==1.0.0 does not satisfy boto3>=1.35"]
    del pins["minio"]
    assert module.problems(pins) == ["minio is not in docker/requirements.lock"]


def test_the_images_workflow_is_a_valid_github_workflow_that_pushes_on_version_tags():
    workflow_path = ROOT / ".github/workflows/images.yml"
    result = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(workflow_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    workflow = yaml.safe_load(workflow_path.read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert triggers["push"]["tags"] == ["v*"]
    assert workflow["permissions"]["packages"] == "write"
    (job,) = workflow["jobs"].values()
    assert job["strategy"]["matrix"]["flavor"] == ["cpu", "cuda"]
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert 'scripts/build-images --flavor "${{ matrix.flavor }}" --push' in runs
    assert job["env"]["IMAGE"] == "ghcr.io/${{ github.repository_owner }}/gradientmail-learner"


# -- runs that finish: the Indexed Job ----------------------------------------------------------


def test_job_mode_runs_the_learners_as_an_indexed_job_that_ends():
    documents = _documents(_render(VALUE_SETS["job"]))
    assert not [d for d in documents if d["kind"] == "StatefulSet"]
    job = _learners(documents)
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4
    assert spec["backoffLimit"] == 8 and spec["podReplacementPolicy"] == "Failed"
    assert spec["ttlSecondsAfterFinished"] == 604800 and spec["activeDeadlineSeconds"] == 86400
    # exit 2 (bad settings) and 3 (run mismatch) fail the Job without a retry; evictions don't count
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onExitCodes": {"containerName": "learner", "operator": "In", "values": [2, 3]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never", "the only restartPolicy podFailurePolicy allows"
    assert "selector" not in spec, "the Job controller makes its own"
    labels = spec["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "learner"
    # the Service, PodDisruptionBudget and NetworkPolicy select the Job's pods as they do a StatefulSet's
    for document in documents:
        if document["kind"] in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
            selector = document["spec"].get("selector", document["spec"].get("podSelector"))
            selector = selector.get("matchLabels", selector)
            if selector.get("app.kubernetes.io/component") == "learner":
                assert selector.items() <= labels.items(), document["metadata"]["name"]


def test_job_mode_with_gpus_frees_them_and_the_default_mode_is_the_statefulset():
    values = {**VALUE_SETS["gpu-pool"], "learners": {**VALUE_SETS["gpu-pool"]["learners"], "mode": "job"}}
    documents = _documents(_render(values))
    job = _learners(documents)
    assert job["kind"] == "Job" and job["spec"]["completions"] == 8
    assert _learner_container(documents)["resources"]["limits"]["nvidia.com/gpu"] == 1
    notes = _render(values)["gradientmail/templates/NOTES.txt"]
    assert "wait --for=condition=complete" in notes and "scale statefulset" not in notes
    assert _learners(_documents(_render({})))["kind"] == "StatefulSet"


def test_job_completion_index_is_the_charts_in_extra_env():
    with pytest.raises(helm_python.HelmError, match="JOB_COMPLETION_INDEX is the learner's index"):
        _render({"learners": {"mode": "job", "extraEnv": [{"name": "JOB_COMPLETION_INDEX", "value": "0"}]}})


# -- the pod's volumes and script --------------------------------------------------------------


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_learners_get_a_memory_backed_dev_shm(value_set):
    documents = _documents(_render(VALUE_SETS[value_set]))
    pod = _learners(documents)["spec"]["template"]["spec"]
    (shm,) = [v for v in pod["volumes"] if v["name"] == "shm"]
    expected = VALUE_SETS[value_set].get("learners", {}).get("shm", {}).get("sizeLimit", "1Gi")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": expected}
    assert {"name": "shm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    off = _learners(_documents(_render({"learners": {"shm": {"enabled": False}}})))["spec"]["template"]["spec"]
    assert not [v for v in off["volumes"] if v["name"] == "shm"]


def test_a_script_given_as_a_value_becomes_the_charts_configmap():
    script = 'import gradientmail as gm\nprint("hello: \\"world\\"")\n'
    documents = _documents(_render({"script": {"content": script, "key": "train.py"}}))
    (configmap,) = [d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gm-gradientmail-script"]
    assert configmap["data"] == {"train.py": script}
    pod = _learners(documents)["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "script"]
    assert volume["configMap"]["name"] == "gm-gradientmail-script"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["GRADIENTMAIL_SCRIPT"] == "/opt/gradientmail-script/train.py"
    with pytest.raises(helm_python.HelmError, match="not both"):
        _render({"script": {"content": script, "configMap": "mine"}})


# -- a chart that stands alone -------------------------------------------------------------------


def test_the_chart_has_no_links_and_its_files_are_copies_of_the_sources():
    links = [path for path in CHART.rglob("*") if path.is_symlink()]
    assert not links, f"links in the chart: {links}; run scripts/sync-chart-files"
    sources = {p.name: p.read_bytes() for p in (ROOT / "dashboards/grafana").glob("*.json")}
    copies = {p.name: p.read_bytes() for p in (CHART / "files/dashboards").glob("*.json")}
    assert copies == sources, "the chart's dashboards differ from dashboards/grafana: run scripts/sync-chart-files"
    rules = (ROOT / "dashboards/prometheus/gradientmail.rules.yaml").read_bytes()
    assert (CHART / "files/gradientmail.rules.yaml").read_bytes() == rules, "run scripts/sync-chart-files"
    check = subprocess.run([str(ROOT / "scripts/sync-chart-files"), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_packaged_chart_renders_from_anywhere(tmp_path):
    # the chart copied away from the repository (links kept as links: one out of the chart would dangle)
    copy = tmp_path / "elsewhere" / "gradientmail"
    shutil.copytree(CHART, copy, symlinks=True)
    archive = helm_python.package(copy, destination=tmp_path)
    assert Path(archive).name == f"gradientmail-{__version__}.tgz"
    shutil.rmtree(tmp_path / "elsewhere")
    with helm_python.Chart.load(archive) as chart:
        rendered = chart.render(VALUE_SETS["gpu-pool"], name="gm", namespace="training", is_install=True)
    documents = _documents(rendered)
    (configmap,) = [d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboards")]
    assert configmap["data"] == {p.name: p.read_text() for p in (ROOT / "dashboards/grafana").glob("*.json")}
    (rule,) = [d for d in documents if d["kind"] == "PrometheusRule"]
    assert rule["spec"] == _project_rules(stalled_after="25m")
    assert _learner_container(documents)["image"].endswith(f":{__version__}-cuda")


def test_the_schemas_kubernetes_blocks_are_kubernetes_own_definitions():
    # values.schema.json's definitions: kubernetes-validate's strict schemas of the pinned
    # Kubernetes API (tests/deploy_tools.py; regenerate with `python -m tests.deploy_tools`)
    schema = json.loads((CHART / "values.schema.json").read_text())
    kubernetes = {name: d for name, d in schema["definitions"].items() if name.startswith("io.k8s.")}
    assert kubernetes == kubernetes_definitions()
    for name, definition in kubernetes.items():
        if "properties" in definition:
            assert definition.get("additionalProperties") is False, name
