# Prometheus from Debian's `prometheus` package, standing in for prom/prometheus in
# scripts/podman-compose-check, where that image cannot be pulled. Laid out as the upstream
# image is, so compose.yaml's prometheus service runs it unchanged: the binary is the entry
# point, the configuration is read from /etc/prometheus/prometheus.yml (compose mounts
# docker/prometheus.yml there, and the rules under /etc/prometheus/rules/), the TSDB lives in
# the volume /prometheus, the user is nobody, the port 9090. Debian bookworm packages
# Prometheus 2.42, not the v3 compose names: for the check only, not for production.
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE}
# bookworm's version, matched by prefix so a point release's rebuild still installs
ARG PROMETHEUS_VERSION=2.42.0+ds-5*
# policy-rc.d keeps the package's scripts from starting a daemon during the build
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d \
    && chmod 0755 /usr/sbin/policy-rc.d \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "prometheus=${PROMETHEUS_VERSION}" \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \
    && mkdir -p /prometheus \
    && chown -R nobody:nogroup /etc/prometheus /prometheus \
    && chmod g+w /prometheus \
    && /usr/bin/prometheus --version
WORKDIR /prometheus
USER 65534:65534
EXPOSE 9090
VOLUME ["/prometheus"]
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
