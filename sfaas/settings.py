"""One typed settings object per process: defaults < ``SFAAS_*`` environment < flags.

Every field ``name`` is read from ``SFAAS_<NAME>`` (e.g. ``SFAAS_KAFKA``,
``SFAAS_SECRET``, ``SFAAS_PARTITIONS``); command-line flags override the environment.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

log = logging.getLogger("sfaas.settings")

__all__ = ["Settings", "DEV_SECRET"]

#: Used when ``SFAAS_SECRET`` is unset, with a warning: fine on a laptop, never in production.
DEV_SECRET = "sfaas-dev-secret-change-me"


def _default_home() -> str:
    return os.environ.get("SFAAS_HOME", os.path.expanduser("~/.local/state/sfaas"))


@dataclass
class Settings:
    """Configuration of a coordinator, worker, client or local cluster."""

    #: The app as ``package.module:attr`` (workers, ``sfaas up``).
    app: str = ""
    #: Kafka bootstrap servers.
    kafka: str = "127.0.0.1:9092"
    #: Prefix of topic and consumer-group names (separates clusters sharing one Kafka).
    namespace: str = "sfaas"
    #: Shared secret of the coordinator/worker channels.
    secret: str = field(default="", repr=False)
    #: Where the coordinator listens / workers find it.
    coordinator: str = "127.0.0.1:7700"
    #: Host workers listen on for peer channels (port 0: any free port).
    host: str = "127.0.0.1"
    port: int = 0
    #: Workers the coordinator waits for before running epochs.
    workers: int = 2
    #: Standby workers per worker (``sfaas up --standbys``): each follows its primary's
    #: stores from shipped files and takes over, without a download, when the primary dies.
    standbys: int = 0
    #: A worker process: ask to be a standby of this worker index (-1: whatever the
    #: coordinator needs — a free slot first, then a standby where one is missing).
    standby_of: int = -1
    #: Ingress/egress topic partitions (also the key partitions; ≥ workers).
    partitions: int = 8
    #: Most transactions (re-runs first) one worker runs in one epoch. Conflicts grow with
    #: the square of the epoch size, so a bound keeps contention from snowballing.
    max_batch: int = 1000
    #: Override every operator's store engine (benchmarks); empty: the app's choice.
    store: str = ""
    #: Cluster state (pid files, logs) and store data live under here.
    home: str = field(default_factory=_default_home)
    #: Kafka consumer fetch wait (ms) when no data is there; the broker answers at once when
    #: records arrive, so this only bounds idle polling (a small value burns CPU).
    fetch_wait_ms: int = 50
    #: Kafka producer linger (ms).
    linger_ms: int = 0
    #: Logging level of the process.
    log_level: str = "INFO"
    #: The coordinator creates this file once all workers are ready (used by ``sfaas up``).
    ready_file: str = ""
    #: Seconds between snapshot rounds; 0 turns rounds off (benchmarks). A round costs what
    #: changed since the last one (stores upload only new files), so frequent rounds are
    #: cheap, and the interval bounds how much a recovery replays: 5 s of epochs at the
    #: runtime's ~10,000 TPS saturation replay in well under a second.
    snapshot_interval: float = 5.0
    #: Complete snapshot rounds kept in MinIO (≥ 1); files only older rounds need are deleted.
    snapshot_retain: int = 3
    #: MinIO (S3) endpoint ``host:port`` (``https://`` for TLS) holding the snapshots.
    minio: str = "127.0.0.1:9000"
    #: MinIO credentials (the local services' defaults; never logged).
    minio_access_key: str = field(default="sfaas", repr=False)
    minio_secret_key: str = field(default="sfaas-local-secret", repr=False)
    #: Bucket of the snapshots; objects live under ``{namespace}/{app}/``.
    bucket: str = "sfaas"
    #: Seconds of silence after which the coordinator declares a worker lost and recovers
    #: (workers send a heartbeat every ``heartbeat_timeout / 4``; a closed channel is
    #: detected at once).
    heartbeat_timeout: float = 2.0
    #: Port of this process's ``/metrics`` (Prometheus) on its listening host — the
    #: coordinator also serves its status page there (``/``, ``/status.json``); 0: off.
    #: ``sfaas up`` gives each of its processes a port of its own (``--metrics-port``).
    metrics_port: int = 0

    @classmethod
    def load(
        cls, overrides: dict[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> Settings:
        """Defaults, then ``SFAAS_*`` variables from ``env`` (default ``os.environ``), then ``overrides``."""
        if env is None:
            env = os.environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(f"SFAAS_{f.name.upper()}")
            if raw is not None and raw != "":
                values[f.name] = _convert(f, raw, f"SFAAS_{f.name.upper()}")
        for name, value in (overrides or {}).items():
            if value is None:
                continue
            if name not in {f.name for f in dataclasses.fields(cls)}:
                raise ConfigError(f"unknown setting {name!r}")
            values[name] = value
        s = cls(**values)
        s.validate()
        return s

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid value."""
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.partitions < self.workers:
            raise ConfigError(f"partitions ({self.partitions}) must be >= workers ({self.workers})")
        if self.standbys < 0:
            raise ConfigError(f"standbys must be >= 0 (standby workers per worker), got {self.standbys}")
        if self.standbys and not self.snapshot_interval:
            raise ConfigError("standbys need snapshot rounds (snapshot_interval > 0): a standby takes over at a round")
        if self.standby_of < -1:
            raise ConfigError(f"standby_of must be a worker index >= 0, or -1 for none, got {self.standby_of}")
        if self.max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {self.max_batch}")
        if not self.snapshot_interval >= 0 or self.snapshot_interval == float("inf"):
            raise ConfigError(f"snapshot_interval must be a number of seconds >= 0 (0: off), got {self.snapshot_interval}")
        if not 0.2 <= self.heartbeat_timeout <= 3600:
            raise ConfigError(f"heartbeat_timeout must be between 0.2 and 3600 seconds, got {self.heartbeat_timeout}")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port (SFAAS_METRICS_PORT) must be a TCP port 1..65535, or 0 for no metrics, "
                              f"got {self.metrics_port}")
        if self.snapshot_retain < 1:
            raise ConfigError(f"snapshot_retain must be >= 1, got {self.snapshot_retain}")
        if self.snapshot_interval:
            from minio.helpers import check_bucket_name

            try:
                check_bucket_name(self.bucket, strict=True)
            except ValueError as exc:
                raise ConfigError(f"bucket {self.bucket!r} is not a valid S3 bucket name: {exc}") from None
        if self.store:
            import statestores

            if self.store not in statestores.ENGINES:
                raise ConfigError(f"store must be one of {statestores.ENGINES}, got {self.store!r}")
        self.coordinator_address()

    def coordinator_address(self) -> tuple[str, int]:
        """``(host, port)`` of the coordinator."""
        host, sep, port = self.coordinator.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"coordinator must be host:port, got {self.coordinator!r}")
        return host, int(port)

    def shared_secret(self) -> str:
        """The channel secret (the development default, with a warning, when unset)."""
        if not self.secret:
            log.warning("SFAAS_SECRET is not set; using the insecure development default")
            return DEV_SECRET
        return self.secret

    def topics(self, app: str) -> tuple[str, str]:
        """``(ingress, egress)`` topic names of ``app``."""
        return f"{self.namespace}.{app}.in", f"{self.namespace}.{app}.out"

    def epoch_log_topic(self, app: str) -> str:
        """The single-partition topic of ``app``'s epoch log (see :mod:`sfaas.epochlog`)."""
        return f"{self.namespace}.{app}.epochs"

    def as_env(self) -> dict[str, str]:
        """These settings as ``SFAAS_*`` variables (to pass to child processes)."""
        return {f"SFAAS_{f.name.upper()}": str(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _convert(f: dataclasses.Field[Any], raw: str, name: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "str")
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    return raw
