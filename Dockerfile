# The sfaas runtime image: coordinator and workers (`sfaas coordinator`, `sfaas worker`).
# Your app's code is copied in (or mounted) and named with SFAAS_APP=package.module:app.
# BASE: any image with Python >= 3.11 and pip on PATH — the public one by default; a machine
# without a registry builds its own (`debootstrap --variant=minbase bookworm DIR`, `tar -C
# DIR -c . | docker import - local/debian:bookworm`, then python3 + venv on top, with the
# host's extra CA certificates if PyPI is reached through an HTTPS proxy).
ARG BASE=python:3.11-slim
FROM ${BASE}
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sfaas ./sfaas
COPY statestores ./statestores
COPY remotes ./remotes
COPY coordinator ./coordinator
COPY worker ./worker
COPY launcher ./launcher
COPY gateway ./gateway
COPY examples ./examples
RUN pip install --no-cache-dir .
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["sfaas"]
