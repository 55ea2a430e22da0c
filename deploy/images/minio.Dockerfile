# MinIO from the binary the project builds with `go install` (launcher/minio_server.py,
# ensure_minio_binary): minio beside this file in the build context.
ARG DEBIAN=local/debian:bookworm
FROM ${DEBIAN}
COPY minio /usr/local/bin/minio
VOLUME /data
ENTRYPOINT ["minio"]
