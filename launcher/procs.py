"""What the local services share: their settings and endpoints, and starting, stopping and
waiting for a service process (its pid file, its own session, leases of
:func:`~launcher.services.using`).

The services themselves: :mod:`launcher.minio_server`, :mod:`launcher.kafka_broker`,
:mod:`launcher.jaeger_server`;
the public API (``up``, ``down``, ``status``, ``using``): :mod:`launcher.services`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("launcher.services")

MINIO_MODULE = "github.com/minio/minio"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
KAFKA_VERSION = "4.3.1"
#: Jaeger (``sfaas services up --tracing``): the v2 binary ``cmd/jaeger`` of the module's
#: release v1.76.0 (Jaeger tags each v2 release with a v1 module version too).
JAEGER_MODULE = "github.com/jaegertracing/jaeger"
JAEGER_VERSION = "v1.76.0"
# Go that MinIO's go.mod asks for (`toolchain` line); fetched when the local Go is < 1.21.
GO_TOOLCHAIN = "go1.24.8"
SCALA_VERSION = "2.13"
LOG4J_VERSION = "2.24.3"

Progress = bool | Callable[[str], None]


class ServiceError(RuntimeError):
    """A service could not be built, started or stopped; the message says why and what to do."""


# ----------------------------------------------------------------------------- settings


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"${name} must be an integer port, got {raw!r}") from None
    if not 0 < value < 65536:
        raise ValueError(f"${name} must be a port in 1..65535, got {value}")
    return value


@dataclass(frozen=True)
class ServiceSettings:
    """Where the services live and which ports/credentials they use (see module docstring)."""

    cache_dir: Path
    state_dir: Path
    minio_port: int = 9000
    minio_console_port: int = 9001
    minio_access_key: str = "sfaas"
    minio_secret_key: str = field(default="sfaas-local-secret", repr=False)
    kafka_port: int = 9092
    kafka_controller_port: int = 9093
    kafka_heap: str = "512m"
    jaeger_port: int = 16686  # its query API and UI
    jaeger_grpc_port: int = 16685  # its query API over gRPC
    otlp_grpc_port: int = 4317  # OTLP receivers: where the processes export their spans
    otlp_http_port: int = 4318

    @classmethod
    def from_env(cls) -> ServiceSettings:
        """Settings from ``SFAAS_*`` environment variables, defaults for the rest."""
        cache = Path(os.environ.get("SFAAS_CACHE")
                     or Path.home() / ".cache" / "sfaas").expanduser()
        state = Path(os.environ.get("SFAAS_HOME")
                     or Path.home() / ".local" / "state" / "sfaas").expanduser()
        return cls(
            cache_dir=cache,
            state_dir=state,
            minio_port=_env_int("SFAAS_MINIO_PORT", 9000),
            minio_console_port=_env_int("SFAAS_MINIO_CONSOLE_PORT", 9001),
            minio_access_key=os.environ.get("SFAAS_MINIO_ACCESS_KEY") or "sfaas",
            minio_secret_key=os.environ.get("SFAAS_MINIO_SECRET_KEY") or "sfaas-local-secret",
            kafka_port=_env_int("SFAAS_KAFKA_PORT", 9092),
            kafka_controller_port=_env_int("SFAAS_KAFKA_CONTROLLER_PORT", 9093),
            kafka_heap=os.environ.get("SFAAS_KAFKA_HEAP") or "512m",
            jaeger_port=_env_int("SFAAS_JAEGER_PORT", 16686),
            jaeger_grpc_port=_env_int("SFAAS_JAEGER_GRPC_PORT", 16685),
            otlp_grpc_port=_env_int("SFAAS_OTLP_GRPC_PORT", 4317),
            otlp_http_port=_env_int("SFAAS_OTLP_HTTP_PORT", 4318),
        )

    @property
    def minio_binary(self) -> Path:
        return self.cache_dir / "bin" / "minio"

    @property
    def jaeger_binary(self) -> Path:
        return self.cache_dir / "bin" / f"jaeger-{JAEGER_VERSION}"

    @property
    def kafka_libs(self) -> Path:
        return self.cache_dir / f"kafka-{KAFKA_VERSION}" / "libs"

    def service_dir(self, service: str) -> Path:
        return self.state_dir / service


@dataclass(frozen=True)
class Endpoints:
    """How to reach the running services."""

    kafka_bootstrap: str
    minio_endpoint: str
    minio_access_key: str
    minio_secret_key: str = field(repr=False)
    #: Jaeger's query API and UI (``http://host:port``), and where its OTLP/HTTP receiver
    #: takes spans (``OTEL_EXPORTER_OTLP_ENDPOINT``): ``sfaas services up --tracing``
    jaeger_url: str = ""
    otlp_endpoint: str = ""


def endpoints() -> Endpoints:
    """The endpoints the services use (or will use) with the current settings."""
    s = ServiceSettings.from_env()
    return Endpoints(
        kafka_bootstrap=f"127.0.0.1:{s.kafka_port}",
        minio_endpoint=f"127.0.0.1:{s.minio_port}",
        minio_access_key=s.minio_access_key,
        minio_secret_key=s.minio_secret_key,
        jaeger_url=f"http://127.0.0.1:{s.jaeger_port}",
        otlp_endpoint=f"http://127.0.0.1:{s.otlp_http_port}",
    )


# ----------------------------------------------------------------------------- helpers


def _reporter(progress: Progress) -> Callable[[str], None]:
    if callable(progress):
        return progress
    if progress:
        return lambda msg: log.info("%s", msg)
    return lambda msg: log.debug("%s", msg)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock (so two test sessions don't start MinIO twice)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _which(tool: str, extra: tuple[str, ...] = ()) -> str | None:
    found = shutil.which(tool)
    if found:
        return found
    for candidate in extra:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ("" if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# Popen objects of the services this process started, so exits are reaped (no zombies
# that would look alive to kill(pid, 0)).
_children: dict[int, subprocess.Popen[bytes]] = {}
_children_lock = threading.Lock()


def _pid_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs and its command line contains ``marker`` (guards pid reuse)."""
    with _children_lock:
        child = _children.get(pid)
    if child is not None:
        # Our own child: trust Popen (its cmdline is still Python's until exec).
        return child.poll() is None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # state is the field after the parenthesized command name
        if stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"Z":
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return False
    return marker in cmdline


@dataclass(frozen=True)
class _Service:
    name: str
    marker: str  # substring of the command line, to recognize our process
    port: Callable[[ServiceSettings], int]

    def pid_file(self, s: ServiceSettings) -> Path:
        return s.service_dir(self.name) / f"{self.name}.pid"

    def log_file(self, s: ServiceSettings) -> Path:
        return s.service_dir(self.name) / f"{self.name}.log"

    def lock_file(self, s: ServiceSettings) -> Path:
        return s.service_dir(self.name) / ".lock"

    def read_pid(self, s: ServiceSettings) -> int | None:
        try:
            pid = int(self.pid_file(s).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _pid_alive(pid, self.marker) else None


_MINIO = _Service("minio", "minio server", lambda s: s.minio_port)
_KAFKA = _Service("kafka", "kafka.Kafka", lambda s: s.kafka_port)
_JAEGER = _Service("jaeger", "jaeger.yaml", lambda s: s.jaeger_port)


def _default_priority() -> None:
    """(In the child, before exec.) A shared service runs at the default priority whoever
    started it: ``./run test`` nices its CPU-bound lane, and a broker that lane happened to
    start would serve every other lane's clusters niced. Only allowed to root; else kept."""
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)


def _spawn(svc: _Service, s: ServiceSettings, argv: list[str], env: dict[str, str]) -> int:
    """Start ``argv`` detached (own session), output to the service log; write the pid file."""
    logf = svc.log_file(s)
    logf.parent.mkdir(parents=True, exist_ok=True)
    with open(logf, "ab") as out:
        out.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {svc.name}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_default_priority,
        )
    with _children_lock:
        _children[proc.pid] = proc
    tmp = svc.pid_file(s).with_suffix(".pid.tmp")
    tmp.write_text(f"{proc.pid}\n")
    os.replace(tmp, svc.pid_file(s))
    return proc.pid


def _stop(svc: _Service, s: ServiceSettings, timeout: float = 20.0) -> bool:
    """Stop the process group in ``svc``'s pid file; True if something was stopped."""
    pid = svc.read_pid(s)
    if pid is None:
        svc.pid_file(s).unlink(missing_ok=True)
        return False
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)  # start_new_session made pid the group id
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _pid_alive(pid, svc.marker):
            time.sleep(0.1)
        if not _pid_alive(pid, svc.marker):
            break
        log.warning("%s (pid %d) ignored SIGTERM for %.0fs; killing it", svc.name, pid, wait)
    with _children_lock:
        child = _children.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=1)
    if _pid_alive(pid, svc.marker):
        raise ServiceError(f"could not stop {svc.name} (pid {pid})")
    svc.pid_file(s).unlink(missing_ok=True)
    _auto_file(svc, s).unlink(missing_ok=True)
    return True


def _wait_ready(
    svc: _Service, s: ServiceSettings, pid: int | None, check: Callable[[], bool], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if pid is not None and not _pid_alive(pid, svc.marker):
            raise ServiceError(
                f"{svc.name} exited during startup; log {svc.log_file(s)} ends with:\n"
                f"{log_tail(svc.log_file(s))}"
            )
        time.sleep(0.2)
    raise ServiceError(
        f"{svc.name} not ready after {timeout:.0f}s on 127.0.0.1:{svc.port(s)}; "
        f"log {svc.log_file(s)} ends with:\n{log_tail(svc.log_file(s))}"
    )


# ----------------------------------------------------------------------------- MinIO



# ----------------------------------------------------------------------------- leases and ownership


def _lease_dir(s: ServiceSettings, svc: _Service) -> Path:
    return s.service_dir(svc.name) / "leases"


def _auto_file(svc: _Service, s: ServiceSettings) -> Path:
    return s.service_dir(svc.name) / "auto-started"


def _mark_auto(svc: _Service, s: ServiceSettings, auto: bool) -> None:
    """Record whether the process just started belongs to :func:`using` (stopped when its
    last user leaves) or to an explicit :func:`up` (runs until :func:`down`)."""
    if auto:
        _auto_file(svc, s).write_text(f"{os.getpid()}\n")
    else:
        _auto_file(svc, s).unlink(missing_ok=True)


def _live_leases(s: ServiceSettings, svc: _Service) -> list[int]:
    live = []
    d = _lease_dir(s, svc)
    for p in d.glob("*") if d.is_dir() else []:
        try:
            pid = int(p.name)
        except ValueError:
            continue
        try:
            os.kill(pid, 0)
            live.append(pid)
        except ProcessLookupError:
            p.unlink(missing_ok=True)
        except PermissionError:
            live.append(pid)
    return live


def adopt_running(svc: _Service, s: ServiceSettings, port: int, usable: Callable[[], bool],
                  timeout: float, say: Callable[[str], None], what: str, where: str,
                  not_usable: str, port_env: str) -> bool:

    """(lock held) True if ``svc`` already serves: started by us (waited until ready) or by
    someone else on its port (and ``usable``); raises when the port is taken by anything
    else, naming ``port_env``; False: the caller starts it."""
    pid = svc.read_pid(s)
    if pid is not None:
        _wait_ready(svc, s, pid, usable, timeout)
        say(f"{what} already running (pid {pid}) at {where}")
        return True
    if _port_open(port):
        if usable():
            say(f"{what} already running (not started by sfaas) at {where}")
            return True
        raise ServiceError(f"port {port} is in use by something that is not {not_usable}; "
                           f"stop it or set {port_env} to a free port")
    return False
