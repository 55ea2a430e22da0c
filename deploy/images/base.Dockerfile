# The local base of every sfaas image on a machine without an image registry:
# Debian bookworm (made by `debootstrap` and `docker import` as local/debian:bookworm, see
# launcher/containers.py) + Python 3.11 in a venv at /opt/py. ca/ holds the build machine's
# extra CA certificates (an HTTPS-intercepting proxy in front of PyPI); it may be empty.
ARG DEBIAN=local/debian:bookworm
FROM ${DEBIAN}
COPY ca/ /usr/local/share/ca-certificates/
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      python3 python3-venv ca-certificates \
 && update-ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/py \
 && PIP_CERT=/etc/ssl/certs/ca-certificates.crt /opt/py/bin/pip install -q --upgrade pip
ENV PATH=/opt/py/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
