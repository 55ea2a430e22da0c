# Prometheus from Debian's package (no image registry needed).
ARG DEBIAN=local/debian:bookworm
FROM ${DEBIAN}
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["prometheus", "--storage.tsdb.path=/tmp/prometheus"]
