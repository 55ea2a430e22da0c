"""One typed settings object per process: defaults < ``SFAAS_*`` environment < flags.

Every field ``name`` is read from ``SFAAS_<NAME>`` (e.g. ``SFAAS_KAFKA``,
``SFAAS_SECRET``, ``SFAAS_PARTITIONS``); command-line flags override the environment.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sfaas.errors import ConfigError

log = logging.getLogger("sfaas.runtime.settings")

__all__ = ["Settings", "DEV_SECRET"]

#: Used when ``SFAAS_SECRET`` is unset, with a warning — and only while every address the
#: process listens on is a loopback one (:meth:`Settings.shared_secret`).
DEV_SECRET = "sfaas-dev-secret-change-me"
#: Names that become parts of Kafka topics and consumer groups.
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
#: Fields that hold credentials: never in a repr, an error message or a pickle.
SECRET_FIELDS = ("secret", "minio_access_key", "minio_secret_key")
#: The values of ``fallback`` and the phase each names.
FALLBACK_PHASES = {"cross": "cross", "1": "cross", "local": "local", "off": "off", "0": "off"}


def _default_home() -> str:
    return os.environ.get("SFAAS_HOME", os.path.expanduser("~/.local/state/sfaas"))


@dataclass
class Settings:
    """Configuration of a coordinator, worker, client or local cluster."""

    #: The app as ``package.module:attr`` (workers, ``sfaas up``).
    app: str = ""
    #: Kafka bootstrap servers: ``host:port``, or several separated by commas (no blanks),
    #: e.g. ``k1:9092,k2:9092,k3:9092`` — clients reach the cluster through any that answers.
    kafka: str = "127.0.0.1:9092"
    #: Prefix of topic and consumer-group names (separates clusters sharing one Kafka).
    namespace: str = "sfaas"
    #: Replication factor of the topics the coordinator creates (3 on a 3-broker cluster,
    #: with the brokers' ``min.insync.replicas`` 2: every write survives a lost broker).
    replication: int = 1
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
    #: Epochs the workers may run ahead on their own (``wire.EpochLease``): they exchange their
    #: reports and commit and begin epochs without a round trip through the coordinator,
    #: which extends the lease as it follows them. 0 (the default): the coordinator begins
    #: and commits every epoch itself. Leases measured lower p99 under load (5,000 and
    #: 11,000 TPS) but not lower latency at 1,000 TPS (benchmarks/README.md).
    epoch_lease: int = 0
    #: The most seconds from one epoch's Begin before the coordinator begins the next (0: at
    #: once). An epoch costs about the same messages, syscalls and epoch-log records
    #: whatever it carries, so epochs begun at once carry one or two transactions and the
    #: CPU goes to the epochs; waiting makes them carry more. The coordinator waits this
    #: long when loaded and less at light load (``epoch_gather_adaptive``,
    #: ``coordinator/gathering.py``); loaded epochs that take longer are not delayed
    #: (issue 47, benchmarks/README.md).
    epoch_gather: float = 0.005
    #: Scale the gathering window with the measured load (False: always ``epoch_gather``).
    epoch_gather_adaptive: bool = True
    #: Override every operator's store engine (benchmarks); empty: the app's choice.
    store: str = ""
    #: Cluster state (pid files, logs) and store data live under here.
    home: str = field(default_factory=_default_home)
    #: Kafka consumer fetch wait (ms) when no data is there; the broker answers at once when
    #: records arrive, so this only bounds idle polling (a small value burns CPU: 50 ms
    #: cost 0.79x the cluster's CPU per transaction at 200 TPS with direct calls, when the
    #: workers' ingress consumers are mostly idle — issue 47).
    fetch_wait_ms: int = 250
    #: Kafka producer linger (ms).
    linger_ms: int = 0
    #: How long (ms) a worker's reply transaction stays open for more replies before it
    #: commits (``worker.egress``). Replies are produced as they come — ``sfaas.Client``
    #: sees them at once — and each transaction costs the broker a few requests and a
    #: marker per partition, so a longer window means fewer transactions; ``read_committed``
    #: readers of the egress topic see a reply up to this much later. 0: each batch of
    #: replies commits at once. A snapshot round and a recovery commit at once, whatever it is.
    reply_commit_ms: int = 50
    #: Logging level of the process.
    log_level: str = "INFO"
    #: Log lines as ``text`` or ``json`` (JSON lines: a line's structured fields, and the
    #: ``trace_id`` and ``span_id`` of the span current when it was logged, if any).
    log_format: str = "text"
    #: Export OpenTelemetry traces (``sfaas.runtime.tracing``), configured by the standard
    #: ``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_TRACES_SAMPLER``, …).
    #: Off, nothing of OpenTelemetry is imported and no span is made.
    tracing: bool = False
    #: With tracing on, a request slower than this many seconds (from its client's send to
    #: its reply) or aborted has its span kept even when the head sampler
    #: (``OTEL_TRACES_SAMPLER``) dropped its trace — tail sampling, at most
    #: ``TAIL_PER_SECOND`` spans a second per process; so is an epoch that took longer.
    trace_slow: float = 0.1
    #: The Jaeger UI the status page links a request's trace to (empty: no links), e.g.
    #: ``http://127.0.0.1:16686``.
    jaeger_ui: str = ""
    #: The coordinator creates this file once all workers are ready (used by ``sfaas up``).
    ready_file: str = ""
    #: Seconds between snapshot rounds; 0 turns rounds off (benchmarks). A round costs what
    #: changed since the last one (stores upload only new files), so frequent rounds are
    #: cheap, and the interval bounds how much a recovery replays: 5 s of epochs at the
    #: runtime's ~10,000 TPS saturation replay in well under a second.
    snapshot_interval: float = 5.0
    #: Complete snapshot rounds kept in MinIO (≥ 1); files only older rounds need are deleted.
    snapshot_retain: int = 3
    #: MinIO (S3) endpoint ``host:port`` (``https://`` for TLS) holding the snapshots, or the
    #: nodes of one distributed MinIO separated by commas (no blanks), e.g.
    #: ``m1:9000,m2:9000,m3:9000,m4:9000``: one is used at a time, the next when it fails.
    minio: str = "127.0.0.1:9000"
    #: MinIO credentials (the local services' defaults; never logged).
    minio_access_key: str = field(default="sfaas", repr=False)
    minio_secret_key: str = field(default="sfaas-local-secret", repr=False)
    #: Bucket of the snapshots; objects live under ``{namespace}/{app}/``.
    bucket: str = "sfaas"
    #: Seconds of silence after which the coordinator declares a worker lost and recovers
    #: (workers send a heartbeat every ``heartbeat_timeout / 4``; a closed channel is
    #: detected at once). 0.75 s calls a paused or cut worker lost within 1 s (the
    #: watchdog looks every quarter); no false loss on a saturated 2-core host
    #: (benchmarks/README.md, issue 48). Was 2.0 s.
    heartbeat_timeout: float = 0.75
    #: Run each transaction whose calls stayed on its worker a second time against the same
    #: state before it commits, and abort it with ``NondeterminismError`` when the runs
    #: differ (``sfaas.runtime.txn.determinism``). Costs CPU; on in the test suite.
    check_determinism: bool = False
    #: Put the traceback of an exception a function raised into the client's reply (it shows
    #: the app's code to whoever calls it: for development). The worker always logs it.
    reply_tracebacks: bool = False
    #: Seconds a request's outcome is kept for its idempotency key (``Client.call(...,
    #: idempotency_key=…)``): a retry within it gets the first outcome without running.
    idempotency_retention: float = 86400.0
    #: Clients send transactions straight to the worker owning their key, over the
    #: cluster's authenticated channels (``sfaas.direct``), and get the replies there;
    #: False: through Kafka (the ingress and egress topics) only.
    direct_calls: bool = True
    #: Seconds a worker keeps a direct call's reply its client has not acknowledged (a
    #: client resending the call within it gets that reply): longer than a client's
    #: timeout (``worker.direct``).
    direct_retention: float = 300.0
    #: Seconds a ``ctx.run`` effect may take; one that takes longer is journaled as a
    #: ``TimeoutError`` (raised in the function).
    effect_timeout: float = 30.0
    #: ``ctx.run`` effects running at once per worker; more wait their turn (their
    #: transactions stay parked, holding nothing).
    max_effects: int = 1000
    #: Port of this process's ``/metrics`` (Prometheus) on its listening host — the
    #: coordinator also serves its status page there (``/``, ``/status.json``); 0: off.
    #: ``sfaas up`` gives each of its processes a port of its own (``--metrics-port``).
    metrics_port: int = 0
    #: A worker's fallback phase: ``cross`` (also ``1``) re-runs every conflicting root in its
    #: epoch under locks ordered across workers (``worker.protocols.fallback``); ``local``
    #: only roots whose first run stayed on their worker; ``0`` (also ``off``) none, the
    #: conflicting roots re-run in the next epoch (benchmarks).
    fallback: str = "cross"
    #: Where the stores' merges, flushes and uploads run: ``process``, in background
    #: processes (``statestores.background``), ``thread``, on a thread of this process
    #: (under a profiler, on one core), or ``loop``, later on the worker's event loop (no
    #: thread: the simulator's, ``sfaas.sim``).
    background: str = "process"
    #: The liveness file this process touches (``sfaas.runtime.liveness``); empty:
    #: ``{home}/alive``. ``sfaas up``'s supervisor gives each child its own.
    alive_file: str = ""
    #: Seconds of a silent liveness file after which ``sfaas up``'s supervisor replaces the
    #: process; 0 turns its watchdog off; -1: ``heartbeat_timeout + 1``.
    supervisor_max_age: float = -1.0
    #: ``sfaas up``'s supervisor keeps a warm spare process per role (imported, waiting), so
    #: a restarted worker or coordinator skips Python's start (``launcher.spares``).
    supervisor_spares: bool = True

    @classmethod
    def load(
        cls, overrides: dict[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> Settings:
        """Defaults, then ``SFAAS_*`` variables from ``env`` (default ``os.environ``), then
        ``overrides``."""
        if env is None:
            env = os.environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(f"SFAAS_{f.name.upper()}")
            if raw is not None and raw != "":
                values[f.name] = _convert(f, raw, f"SFAAS_{f.name.upper()}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in (overrides or {}).items():
            if value is None:
                continue
            if name not in fields:
                raise ConfigError(f"unknown setting {name!r}")
            values[name] = _typed(fields[name], value, name)
        s = cls(**values)
        s.validate()
        return s

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid value."""
        for f in dataclasses.fields(self):  # a value set in code must have its field's type
            _typed(f, getattr(self, f.name), f.name)
        self._validate_names()
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0-65535 (0: any free port), got {self.port}")
        for name in ("fetch_wait_ms", "linger_ms", "reply_commit_ms"):
            if not 0 <= getattr(self, name) <= 60_000:
                raise ConfigError(
                    f"{name} must be 0-60000 milliseconds, got {getattr(self, name)}")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError("log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, "
                              f"got {self.log_level!r:.40}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.partitions < self.workers:
            raise ConfigError(
                f"partitions ({self.partitions}) must be >= workers ({self.workers})")
        if self.standbys < 0:
            raise ConfigError(
                f"standbys must be >= 0 (standby workers per worker), got {self.standbys}")
        if self.standbys and not self.snapshot_interval:
            raise ConfigError("standbys need snapshot rounds (snapshot_interval > 0): a standby "
                              "takes over at a round")
        if self.standby_of < -1:
            raise ConfigError("standby_of must be a worker index >= 0, or -1 for none, "
                              f"got {self.standby_of}")
        self._validate_limits()
        self._validate_modes()
        if self.snapshot_interval:
            from minio.helpers import check_bucket_name

            try:
                check_bucket_name(self.bucket, strict=True)
            except ValueError as exc:
                raise ConfigError(
                    f"bucket {self.bucket!r} is not a valid S3 bucket name: {exc}") from None
        if self.store:
            import statestores

            if self.store not in statestores.ENGINES:
                raise ConfigError(
                    f"store must be one of {statestores.ENGINES}, got {self.store!r}")
        self.coordinator_address()

    def _validate_names(self) -> None:
        """The names, addresses, paths and credentials (part of :meth:`validate`)."""
        for name in ("namespace",):
            if not _NAME_RE.match(getattr(self, name)):
                raise ConfigError(f"{name} must be 1-100 letters, digits, '.', '_' or '-' "
                                  f"(it names Kafka topics), got {getattr(self, name)!r:.60}")
        for name in ("home", "coordinator", "host"):
            value = getattr(self, name)
            if not value or "\0" in value or value != value.strip():
                raise ConfigError(f"{name} must be a non-empty value without NUL or surrounding "
                                  f"blanks, got {value!r:.60}")
        for name in ("minio_access_key", "minio_secret_key"):  # (never echoed: credentials)
            if not getattr(self, name):
                raise ConfigError(f"{name} must not be empty (SFAAS_{name.upper()} unset gives the "
                                  "local default)")
        self.kafka_servers()
        self.minio_endpoints()
        if "\0" in self.ready_file or "\0" in self.app:
            raise ConfigError("app and ready_file must not contain NUL")

    def _validate_limits(self) -> None:
        """The ports, timeouts, retentions and bounds (part of :meth:`validate`)."""
        if self.max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {self.max_batch}")
        if not 1 <= self.replication <= 16:
            raise ConfigError("replication (SFAAS_REPLICATION) must be a topic replication "
                              f"factor between 1 and 16, got {self.replication}")
        if not 0 <= self.epoch_lease <= 10_000:
            raise ConfigError(
                f"epoch_lease must be between 0 and 10000 epochs, got {self.epoch_lease}")
        if self.jaeger_ui and not re.fullmatch(r"https?://[^\s\"'<>]+", self.jaeger_ui):
            raise ConfigError("jaeger_ui (SFAAS_JAEGER_UI) must be an http:// or https:// URL "
                              "(the Jaeger UI, e.g. http://127.0.0.1:16686), "
                              f"got {self.jaeger_ui!r:.80}")
        if not 0 <= self.trace_slow <= 3600:
            raise ConfigError("trace_slow (SFAAS_TRACE_SLOW) must be seconds between 0 and 3600, "
                              f"got {self.trace_slow}")
        if not 0 <= self.epoch_gather <= 1:
            raise ConfigError("epoch_gather (SFAAS_EPOCH_GATHER) must be between 0 and 1 second, "
                              f"got {self.epoch_gather}")
        if not self.snapshot_interval >= 0 or self.snapshot_interval == float("inf"):
            raise ConfigError("snapshot_interval must be a number of seconds >= 0 (0: off), "
                              f"got {self.snapshot_interval}")
        if not 0.2 <= self.heartbeat_timeout <= 3600:
            raise ConfigError("heartbeat_timeout must be between 0.2 and 3600 seconds, "
                              f"got {self.heartbeat_timeout}")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError("metrics_port (SFAAS_METRICS_PORT) must be a TCP port 1..65535, "
                              f"or 0 for no metrics, got {self.metrics_port}")
        if not 0 < self.effect_timeout <= 86400:
            raise ConfigError("effect_timeout must be between 0 and 86400 seconds, "
                              f"got {self.effect_timeout}")
        if not 1 <= self.idempotency_retention <= 366 * 86400:
            raise ConfigError("idempotency_retention must be between 1 s and 366 days, "
                              f"got {self.idempotency_retention}")
        if not 1 <= self.direct_retention <= 86400:
            raise ConfigError("direct_retention must be between 1 s and 1 day, "
                              f"got {self.direct_retention}")
        if self.max_effects < 1:
            raise ConfigError(f"max_effects must be >= 1, got {self.max_effects}")
        if self.snapshot_retain < 1:
            raise ConfigError(f"snapshot_retain must be >= 1, got {self.snapshot_retain}")

    def _validate_modes(self) -> None:
        """The settings that choose how a part works (part of :meth:`validate`)."""
        if self.fallback not in FALLBACK_PHASES:
            raise ConfigError("fallback (SFAAS_FALLBACK) must be cross (or 1), local or 0 (or "
                              f"off), got {self.fallback!r:.40}")
        if self.log_format not in ("text", "json"):
            raise ConfigError("log_format (SFAAS_LOG_FORMAT) must be 'text' or 'json', "
                              f"got {self.log_format!r:.40}")
        if self.background not in ("process", "thread", "loop"):
            raise ConfigError("background (SFAAS_BACKGROUND) must be 'process', 'thread' or "
                              f"'loop', got {self.background!r:.40}")
        if "\0" in self.alive_file:
            raise ConfigError("alive_file (SFAAS_ALIVE_FILE) must not contain NUL")
        if not (self.supervisor_max_age == -1 or self.supervisor_max_age >= 0):
            raise ConfigError("supervisor_max_age (SFAAS_SUPERVISOR_MAX_AGE) must be seconds >= 0 "
                              "(0: no watchdog), or -1 for heartbeat_timeout + 1, "
                              f"got {self.supervisor_max_age}")

    def fallback_phase(self) -> str:
        """``fallback`` by its name: ``"cross"``, ``"local"`` or ``"off"``."""
        return FALLBACK_PHASES[self.fallback]

    def coordinator_address(self) -> tuple[str, int]:
        """``(host, port)`` of the coordinator."""
        host, sep, port = self.coordinator.rpartition(":")
        if not sep or not host or not port.isascii() or not port.isdigit() or len(port) > 5 \
                or int(port) > 65535:
            raise ConfigError(
                f"coordinator must be host:port (port 0-65535), got {self.coordinator!r:.80}")
        return host, int(port)

    def kafka_servers(self) -> list[str]:
        """The ``host:port`` entries of ``kafka`` (see :func:`split_endpoints`); aiokafka
        takes the comma-separated ``kafka`` as it is."""
        return split_endpoints("kafka", self.kafka)

    def minio_endpoints(self) -> list[str]:
        """The entries of ``minio`` (``host:port`` — or a host alone: port 80/443 —, each
        with the same optional ``http://`` or ``https://``; see :func:`split_endpoints`);
        ``remotes.minio.MinioRemote`` takes the comma-separated ``minio`` as it is."""
        entries = split_endpoints("minio", self.minio, schemes=("http://", "https://"),
                                  port_optional=True)
        used = {e.partition("://")[0] if "://" in e else "" for e in entries}
        if len(used) > 1:
            raise ConfigError(f"minio entries must all use the same scheme (all http://, all "
                              f"https:// or none), got {self.minio!r:.200}")
        return entries

    def shared_secret(self) -> str:
        """The channel secret. Unset, the development default is used — with a warning, and
        only when every address this process listens on (``coordinator``'s host, ``host``)
        is a loopback one; otherwise :class:`ConfigError` says to set ``SFAAS_SECRET``."""
        if self.secret and self.secret != DEV_SECRET:
            return self.secret
        exposed = [h for h in (self.coordinator_address()[0], self.host) if not is_loopback(h)]
        if exposed:
            raise ConfigError(
                f"refusing to listen on {', '.join(sorted(set(exposed)))} with the insecure "
                "default secret: set SFAAS_SECRET to a long random value (the same for the "
                "coordinator and every worker; `sfaas up` generates one), or listen on a loopback "
                "address only"
            )
        log.warning(
            "SFAAS_SECRET is not set; using the insecure development default (loopback only)")
        return DEV_SECRET

    def __getstate__(self) -> dict[str, Any]:
        """A pickle carries no credential: the receiving process completes them from its own
        ``SFAAS_*`` environment (:meth:`__setstate__`)."""
        return {k: v for k, v in self.__dict__.items() if k not in SECRET_FIELDS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        for k in SECRET_FIELDS:
            self.__dict__[k] = os.environ.get(f"SFAAS_{k.upper()}") or _field_default(k)

    def topics(self, app: str) -> tuple[str, str]:
        """``(ingress, egress)`` topic names of ``app``."""
        return f"{self.namespace}.{app}.in", f"{self.namespace}.{app}.out"

    def epoch_log_topic(self, app: str) -> str:
        """The single-partition topic of ``app``'s epoch log (see
        :mod:`sfaas.runtime.epochlog`)."""
        return f"{self.namespace}.{app}.epochs"

    def as_env(self) -> dict[str, str]:
        """These settings as ``SFAAS_*`` variables (to pass to child processes); unset
        ones (empty, None) are left out, so an app reading ``os.environ.get("SFAAS_STORE",
        default)`` gets its default, not an empty string."""
        return {f"SFAAS_{f.name.upper()}": str(value) for f in dataclasses.fields(self)
                if (value := getattr(self, f.name)) not in ("", None)}


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface only (``localhost``,
    ``127.0.0.0/8``, ``::1``); wildcard and other addresses are not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_endpoints(name: str, value: str, schemes: tuple[str, ...] = (), *,
                    port_optional: bool = False) -> list[str]:
    """The entries of the comma-separated ``host:port`` list ``value`` of setting ``name``;
    :class:`ConfigError` names the first bad entry (empty, blanks, no port unless
    ``port_optional``, a port outside 1-65535, a path, listed twice). An entry may start
    with one of ``schemes``."""
    entries = value.split(",")
    seen: set[str] = set()
    for i, entry in enumerate(entries, 1):
        where = (f"{name} entry {i} of {len(entries)} ({entry!r:.80})" if len(entries) > 1
                 else f"{name} ({entry!r:.80})")
        hint = f"{name} must be host:port, or several separated by commas without blanks " \
               f"(h1:1234,h2:1234), got {value!r:.200}"
        if not entry:
            raise ConfigError(f"{where} is empty: {hint}")
        if entry != entry.strip() or any(c.isspace() or c == "\0" for c in entry):
            raise ConfigError(f"{where} has blanks or NUL: {hint}")
        address = entry
        for scheme in schemes:
            if address.startswith(scheme):
                address = address[len(scheme):]
                break
        host, sep, port = address.rpartition(":")
        if port_optional and ":" not in address.rpartition("]")[2]:
            host, sep, port = address, ":", "1"  # a host alone: the scheme's port
        if not sep or not host or "/" in address or not port.isascii() or not port.isdigit() \
                or len(port) > 5 or not 1 <= int(port) <= 65535:
            raise ConfigError(f"{where} is not host:port with a port 1-65535: {hint}")
        if entry in seen:
            raise ConfigError(f"{where} is listed twice: {hint}")
        seen.add(entry)
    return entries


def _field_default(name: str) -> Any:
    f = next(f for f in dataclasses.fields(Settings) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[operator]


def _typed(f: dataclasses.Field[Any], value: Any, name: str) -> Any:
    """``value`` for field ``f``: a str is converted like an environment variable; any
    other value must have the field's type (an int is fine for a float)."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "str")
    if isinstance(value, str) and kind != "str":
        return _convert(f, value, name)
    ok = {"int": type(value) is int, "float": type(value) in (int, float),
          "str": type(value) is str, "bool": type(value) is bool}.get(kind, True)
    if not ok:
        wanted = {"float": "a number", "int": "an int", "bool": "a bool"}.get(kind, "a str")
        raise ConfigError(f"setting {name} must be {wanted}, got {type(value).__name__}")
    if kind == "float" and not math.isfinite(value) and name != "snapshot_interval":
        raise ConfigError(f"setting {name} must be a finite number, got {value}")
    return float(value) if kind == "float" else value


def _convert(f: dataclasses.Field[Any], raw: str, name: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "str")
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r:.60}") from None
    if kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{name} must be a number, got {raw!r:.60}") from None
    if kind == "bool":
        value = {"1": True, "true": True, "yes": True, "on": True,
                 "0": False, "false": False, "no": False, "off": False, "": False}.get(raw.lower())
        if value is None:
            raise ConfigError(f"{name} must be 1/true/yes/on or 0/false/no/off, got {raw!r:.60}")
        return value
    return raw
