"""Real local services for development, demos and tests: MinIO, a single-node Kafka and,
for tracing, Jaeger.

Both run as plain background processes (no Docker): each is started in its own session
(process group), its pid is kept in a pid file under the state directory, and :func:`down`
stops exactly the processes :func:`up` started. The binaries are built/downloaded once
into a cache directory:

* MinIO: ``go install github.com/minio/minio@<pinned>`` into ``$SFAAS_CACHE/bin/minio``;
* Kafka: ``mvn dependency:copy-dependencies`` of ``org.apache.kafka:kafka_2.13`` into
  ``$SFAAS_CACHE/kafka-<version>/libs``;
* Jaeger (only with ``tracing``): ``go build`` of ``github.com/jaegertracing/jaeger/cmd/jaeger``
  at the pinned version into ``$SFAAS_CACHE/bin/jaeger-<version>``.

This module is the public API (``up``, ``down``, ``status``, ``using``, the ``sfaas
services`` command); each service lives in its own module (:mod:`.minio_server`,
:mod:`.kafka_broker`, :mod:`.jaeger_server`) over what they share (:mod:`.procs`:
settings, pid files, starting, stopping and waiting for a process, leases).

Settings (environment variables, with laptop defaults):

========================== =========================== ==================================
variable                   default                     meaning
========================== =========================== ==================================
``SFAAS_CACHE``            ``~/.cache/sfaas``          binaries and jars
``SFAAS_HOME``             ``~/.local/state/sfaas``    data dirs, pid files, logs
``SFAAS_MINIO_PORT``       ``9000``                    S3 API port (127.0.0.1)
``SFAAS_MINIO_CONSOLE_PORT`` ``9001``                  MinIO console port
``SFAAS_MINIO_ACCESS_KEY`` ``sfaas``                   MinIO root user
``SFAAS_MINIO_SECRET_KEY`` ``sfaas-local-secret``      MinIO root password (never logged)
``SFAAS_KAFKA_PORT``       ``9092``                    broker listener (127.0.0.1)
``SFAAS_KAFKA_CONTROLLER_PORT`` ``9093``               KRaft controller listener
``SFAAS_KAFKA_HEAP``       ``512m``                    broker JVM heap (-Xmx)
``SFAAS_JAEGER_PORT``      ``16686``                   Jaeger's query API and UI
``SFAAS_JAEGER_GRPC_PORT`` ``16685``                   Jaeger's query API over gRPC
``SFAAS_OTLP_GRPC_PORT``   ``4317``                    Jaeger's OTLP/gRPC receiver
``SFAAS_OTLP_HTTP_PORT``   ``4318``                    Jaeger's OTLP/HTTP receiver
========================== =========================== ==================================
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator

from launcher.jaeger_server import _up_jaeger, ensure_jaeger_binary
from launcher.kafka_broker import _up_kafka, ensure_kafka_libs
from launcher.minio_server import _up_minio, ensure_minio_binary
from launcher.procs import (
    _JAEGER,
    _KAFKA,
    _MINIO,
    JAEGER_VERSION,
    KAFKA_VERSION,
    MINIO_MODULE,
    MINIO_VERSION,
    Endpoints,
    Progress,
    ServiceError,
    ServiceSettings,
    _auto_file,
    _file_lock,
    _lease_dir,
    _live_leases,
    _port_open,
    _reporter,
    _stop,
    endpoints,
    log_tail,
)

__all__ = [
    "Endpoints",
    "ServiceSettings",
    "ServiceError",
    "MINIO_MODULE",
    "MINIO_VERSION",
    "KAFKA_VERSION",
    "JAEGER_VERSION",
    "ensure_minio_binary",
    "ensure_jaeger_binary",
    "ensure_kafka_libs",
    "up",
    "down",
    "status",
    "endpoints",
    "using",
    "log_tail",
]

log = logging.getLogger(__name__)


def up(*, kafka: bool = True, minio: bool = True, tracing: bool = False,
       progress: Progress = True) -> Endpoints:
    """Start the services that are not running yet and wait until they serve requests
    (Jaeger only with ``tracing``).

    Idempotent: a service that already runs (started by sfaas, or by someone else on the
    same port with the same credentials) is reused. Raises :class:`ServiceError` with the
    log tail when a service cannot start.
    """
    return _up(kafka=kafka, minio=minio, tracing=tracing, progress=progress, auto=False)


def _up(*, kafka: bool, minio: bool, progress: Progress, auto: bool,
        tracing: bool = False) -> Endpoints:
    s = ServiceSettings.from_env()
    say = _reporter(progress)
    if minio:
        _up_minio(s, say, auto=auto)
    if kafka:
        _up_kafka(s, say, auto=auto)
    if tracing:
        _up_jaeger(s, say, auto=auto)
    return endpoints()


def down(*, kafka: bool = True, minio: bool = True, tracing: bool = True,
         progress: Progress = True) -> None:
    """Stop the services that :func:`up` started (by pid file); others are left alone.
    Jaeger (``tracing``) is stopped if it runs, and said nothing of otherwise."""
    s = ServiceSettings.from_env()
    say = _reporter(progress)
    for wanted, svc in ((kafka, _KAFKA), (minio, _MINIO), (tracing, _JAEGER)):
        if not wanted:
            continue
        with _file_lock(svc.lock_file(s)):
            if _stop(svc, s):
                say(f"stopped {svc.name}")
            elif svc is not _JAEGER:
                say(f"{svc.name} was not running (started by sfaas)")


def status() -> dict[str, dict[str, object]]:
    """Per service: ``running`` (started by sfaas, process alive), ``pid``, ``endpoint``,
    ``reachable`` (the port accepts connections, whoever listens) and ``log``."""
    s = ServiceSettings.from_env()
    ep = endpoints()
    out: dict[str, dict[str, object]] = {}
    for svc, endpoint in ((_MINIO, ep.minio_endpoint), (_KAFKA, ep.kafka_bootstrap),
                          (_JAEGER, ep.jaeger_url)):
        pid = svc.read_pid(s)
        out[svc.name] = {
            "running": pid is not None,
            "pid": pid,
            "endpoint": endpoint,
            "reachable": _port_open(svc.port(s)),
            "log": str(svc.log_file(s)),
        }
    return out


@contextlib.contextmanager
def using(*, kafka: bool = False, minio: bool = False, tracing: bool = False,
          progress: Progress = True) -> Iterator[Endpoints]:
    """Make the services run while the block runs, shared safely between processes.

    Each user (e.g. a pytest session) takes a lease; a service this mechanism started is
    stopped when the last lease holder leaves. A service started by ``sfaas services up``
    (or by anyone else) is never stopped here.
    """
    s = ServiceSettings.from_env()
    say = _reporter(progress)
    chosen = [svc for wanted, svc in ((minio, _MINIO), (kafka, _KAFKA), (tracing, _JAEGER))
              if wanted]
    for svc in chosen:
        with _file_lock(svc.lock_file(s)):
            _lease_dir(s, svc).mkdir(parents=True, exist_ok=True)
            (_lease_dir(s, svc) / str(os.getpid())).touch()
    try:
        yield _up(minio=minio, kafka=kafka, tracing=tracing, progress=say, auto=True)
    finally:
        for svc in chosen:
            with _file_lock(svc.lock_file(s)):
                (_lease_dir(s, svc) / str(os.getpid())).unlink(missing_ok=True)
                if _auto_file(svc, s).exists() and not _live_leases(s, svc):
                    with contextlib.suppress(ServiceError):
                        if _stop(svc, s):
                            say(f"stopped {svc.name} (last user left)")


def main(argv: list[str] | None = None) -> int:
    """``python -m launcher.services {up,down,status} [--kafka-only|--minio-only|
    --jaeger-only] [--tracing]`` (for scripts)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m launcher.services", description=main.__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--tracing", action="store_true", help="up: Jaeger too")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--kafka-only", action="store_true", help="only Kafka")
    only.add_argument("--minio-only", action="store_true", help="only MinIO")
    only.add_argument("--jaeger-only", action="store_true", help="only Jaeger")
    args = parser.parse_args(argv)
    which = {"kafka": args.kafka_only or not (args.minio_only or args.jaeger_only),
             "minio": args.minio_only or not (args.kafka_only or args.jaeger_only),
             "tracing": args.jaeger_only or (not (args.kafka_only or args.minio_only)
                                             and (args.tracing or args.command == "down"))}

    def say(msg: str) -> None:
        print(msg, file=sys.stderr)

    try:
        if args.command == "up":
            ep = up(progress=say, **which)
            print(f"kafka: {ep.kafka_bootstrap}\n"
                  f"minio: http://{ep.minio_endpoint} (access key {ep.minio_access_key})")
            if which["tracing"]:
                print(f"jaeger: {ep.jaeger_url} (OTLP: {ep.otlp_endpoint})")

        elif args.command == "down":
            down(progress=say, **which)
        else:
            print(json.dumps(status(), indent=2))
    except ServiceError as e:
        say(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
