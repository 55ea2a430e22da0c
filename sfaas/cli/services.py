"""Real local services for development, demos and tests: MinIO and a single-node Kafka.

Both run as plain background processes (no Docker): each is started in its own session
(process group), its pid is kept in a pid file under the state directory, and :func:`down`
stops exactly the processes :func:`up` started. The binaries are built/downloaded once
into a cache directory:

* MinIO: ``go install github.com/minio/minio@<pinned>`` into ``$SFAAS_CACHE/bin/minio``;
* Kafka: ``mvn dependency:copy-dependencies`` of ``org.apache.kafka:kafka_2.13`` into
  ``$SFAAS_CACHE/kafka-<version>/libs``.

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
========================== =========================== ==================================
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import json
import logging
import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Endpoints",
    "ServiceSettings",
    "ServiceError",
    "MINIO_MODULE",
    "MINIO_VERSION",
    "KAFKA_VERSION",
    "ensure_minio_binary",
    "ensure_kafka_libs",
    "up",
    "down",
    "status",
    "endpoints",
    "using",
    "log_tail",
]

log = logging.getLogger(__name__)

MINIO_MODULE = "github.com/minio/minio"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
KAFKA_VERSION = "4.3.1"
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

    @classmethod
    def from_env(cls) -> ServiceSettings:
        """Settings from ``SFAAS_*`` environment variables, defaults for the rest."""
        cache = Path(os.environ.get("SFAAS_CACHE") or Path.home() / ".cache" / "sfaas").expanduser()
        state = Path(os.environ.get("SFAAS_HOME") or Path.home() / ".local" / "state" / "sfaas").expanduser()
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
        )

    @property
    def minio_binary(self) -> Path:
        return self.cache_dir / "bin" / "minio"

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


def endpoints() -> Endpoints:
    """The endpoints the services use (or will use) with the current settings."""
    s = ServiceSettings.from_env()
    return Endpoints(
        kafka_bootstrap=f"127.0.0.1:{s.kafka_port}",
        minio_endpoint=f"127.0.0.1:{s.minio_port}",
        minio_access_key=s.minio_access_key,
        minio_secret_key=s.minio_secret_key,
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


def ensure_minio_binary(progress: Progress = True) -> Path:
    """Path of the pinned MinIO server binary, building it with ``go install`` if missing.

    Cold builds take ~3.5 minutes and need Go >= 1.24 (``/usr/local/go`` from go.dev/dl,
    or Debian's ``golang-1.24``/newer from backports).
    """
    s = ServiceSettings.from_env()
    say = _reporter(progress)
    binary = s.minio_binary
    if os.access(binary, os.X_OK):
        return binary
    with _file_lock(s.cache_dir / ".minio-build.lock"):
        if os.access(binary, os.X_OK):  # built by another process while we waited
            return binary
        go = _which("go", ("/usr/local/go/bin/go", "/usr/lib/go/bin/go"))
        if go is None:
            raise ServiceError(
                "building MinIO needs Go, and `go` is not on PATH: `apt-get install golang-go` "
                "(any version: an older Go fetches Go >= 1.24 from the module proxy), or install "
                "Go from https://go.dev/dl, or put a minio binary at " + str(binary)
            )
        if _go_version(go) < (1, 21):
            go = _fetch_go_toolchain(go, s, say)
        binary.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=binary.parent, prefix=".gobin-") as gobin:
            env = dict(os.environ, GOBIN=gobin, GOFLAGS="-mod=mod")
            # Debian's Go pins GOTOOLCHAIN=local; "auto" lets Go 1.21+ fetch the toolchain
            # MinIO's go.mod asks for from the module proxy.
            env.setdefault("GOTOOLCHAIN", "auto")
            say(f"building MinIO {MINIO_VERSION} with {go} (first time only, ~3-4 min)")
            t0 = time.monotonic()
            res = subprocess.run(
                [go, "install", f"{MINIO_MODULE}@{MINIO_VERSION}"],
                env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            )
            if res.returncode != 0:
                raise ServiceError(
                    f"`go install {MINIO_MODULE}@{MINIO_VERSION}` failed (exit {res.returncode}):\n"
                    + "\n".join((res.stderr or res.stdout).splitlines()[-30:])
                )
            os.replace(Path(gobin) / "minio", binary)
            say(f"built {binary} in {time.monotonic() - t0:.0f}s")
    return binary


def _fetch_go_toolchain(go: str, s: ServiceSettings, say: Callable[[str], None]) -> str:
    """A Go >= 1.24 for building MinIO, fetched with an older ``go`` (e.g. Debian's 1.19).

    Go publishes its toolchains as the module ``golang.org/toolchain`` on the module proxy
    (this is what ``GOTOOLCHAIN=auto`` uses from Go 1.21 on); older Go can download that
    module like any other. Module zips drop file modes, so the binaries are made
    executable again after the copy into the cache.
    """
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
    if arch is None:
        raise ServiceError(f"no Go toolchain known for machine {platform.machine()!r}; install Go >= 1.24")
    dest = s.cache_dir / "go" / GO_TOOLCHAIN
    gobin = dest / "bin" / "go"
    if os.access(gobin, os.X_OK):
        return str(gobin)
    module = f"golang.org/toolchain@v0.0.1-{GO_TOOLCHAIN}.linux-{arch}"
    say(f"{go} is older than Go 1.21; fetching {module} from the Go module proxy")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as work:
        env = dict(os.environ, GOMODCACHE=str(Path(work) / "modcache"), GO111MODULE="on")
        try:
            res = subprocess.run(
                [go, "mod", "download", "-json", module],
                cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            )
            info = json.loads(res.stdout) if res.stdout.strip() else {}
            if res.returncode != 0 or not info.get("Dir"):
                raise ServiceError(
                    f"`go mod download {module}` failed (exit {res.returncode}): "
                    f"{info.get('Error') or res.stderr.strip()[-2000:]}"
                )
            staged = Path(work) / "go"
            shutil.copytree(info["Dir"], staged)
            for sub in ("bin", f"pkg/tool/linux_{arch}"):
                for f in (staged / sub).glob("*"):
                    if f.is_file():
                        f.chmod(0o755)
            os.replace(staged, dest)
        finally:
            # the module cache is read-only by design; let go remove it
            subprocess.run([go, "clean", "-modcache"], env=env, cwd=work, capture_output=True,
                           stdin=subprocess.DEVNULL)
    say(f"Go toolchain {GO_TOOLCHAIN} in {dest}")
    return str(gobin)


def _go_version(go: str) -> tuple[int, ...]:
    """``(major, minor)`` of the Go toolchain at ``go`` ((0,) if it cannot be told)."""
    res = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    raw = res.stdout.strip().removeprefix("go")
    try:
        return tuple(int(p) for p in raw.split(".")[:2])
    except ValueError:
        return (0,)


def _minio_live(s: ServiceSettings) -> bool:
    url = f"http://127.0.0.1:{s.minio_port}/minio/health/live"
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _minio_usable(s: ServiceSettings) -> bool:
    """Live and accepts our credentials (an unrelated S3 server on the port does not count)."""
    if not _minio_live(s):
        return False
    import urllib3
    from minio import Minio

    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=1.0, read=3.0), retries=False)
    try:
        Minio(
            f"127.0.0.1:{s.minio_port}", access_key=s.minio_access_key,
            secret_key=s.minio_secret_key, secure=False, region="us-east-1", http_client=http,
        ).list_buckets()
        return True
    except Exception as e:  # any failure means "not usable by us"; say why at debug level
        log.debug("MinIO on port %d rejected us: %s", s.minio_port, type(e).__name__)
        return False
    finally:
        http.clear()


def _up_minio(s: ServiceSettings, say: Callable[[str], None], *, auto: bool, timeout: float = 90.0) -> None:
    svc = _MINIO
    with _file_lock(svc.lock_file(s)):
        pid = svc.read_pid(s)
        if pid is not None:
            _wait_ready(svc, s, pid, lambda: _minio_usable(s), timeout)
            say(f"MinIO already running (pid {pid}) at http://127.0.0.1:{s.minio_port}")
            return
        if _port_open(s.minio_port):
            if _minio_usable(s):
                say(f"MinIO already running (not started by sfaas) at http://127.0.0.1:{s.minio_port}")
                return
            raise ServiceError(
                f"port {s.minio_port} is in use by something that is not a MinIO accepting the "
                f"sfaas credentials; stop it or set SFAAS_MINIO_PORT to a free port"
            )
        binary = ensure_minio_binary(say)
        data = svc.pid_file(s).parent / "data"
        data.mkdir(parents=True, exist_ok=True)
        env = dict(
            os.environ,
            MINIO_ROOT_USER=s.minio_access_key,
            MINIO_ROOT_PASSWORD=s.minio_secret_key,
            MINIO_UPDATE="off",
        )
        argv = [
            str(binary), "server", str(data),
            "--address", f"127.0.0.1:{s.minio_port}",
            "--console-address", f"127.0.0.1:{s.minio_console_port}",
            "--quiet",
        ]
        t0 = time.monotonic()
        pid = _spawn(svc, s, argv, env)
        _mark_auto(svc, s, auto)
        say(f"starting MinIO (pid {pid}), data in {data}, log {svc.log_file(s)}")
        try:
            _wait_ready(svc, s, pid, lambda: _minio_usable(s), timeout)
        except ServiceError:
            with contextlib.suppress(ServiceError):
                _stop(svc, s)
            raise
        say(f"MinIO ready at http://127.0.0.1:{s.minio_port} in {time.monotonic() - t0:.1f}s")


# ----------------------------------------------------------------------------- Kafka

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.sfaas</groupId>
  <artifactId>kafka-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def _kafka_libs_complete(libs: Path) -> bool:
    return (libs / f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}.jar").is_file() and any(
        libs.glob("log4j-slf4j-impl-*.jar")
    )


def ensure_kafka_libs(progress: Progress = True) -> Path:
    """Directory of the Kafka broker jars, downloading them with Maven if missing (~45 MB)."""
    s = ServiceSettings.from_env()
    say = _reporter(progress)
    libs = s.kafka_libs
    if _kafka_libs_complete(libs):
        return libs
    with _file_lock(s.cache_dir / ".kafka-libs.lock"):
        if _kafka_libs_complete(libs):
            return libs
        mvn = _which("mvn")
        if mvn is None:
            raise ServiceError(
                "downloading Kafka needs Maven and a JDK: `apt-get install maven openjdk-17-jre-headless`"
            )
        libs.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=libs.parent, prefix=".mvn-") as work:
            Path(work, "pom.xml").write_text(
                _POM.format(scala=SCALA_VERSION, kafka=KAFKA_VERSION, log4j=LOG4J_VERSION)
            )
            out = Path(work) / "libs"
            say(f"downloading Kafka {KAFKA_VERSION} jars with Maven (first time only)")
            res = subprocess.run(
                [mvn, "-q", "-B", "dependency:copy-dependencies", "-DincludeScope=runtime",
                 f"-DoutputDirectory={out}"],
                cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            )
            if res.returncode != 0 or not _kafka_libs_complete(out):
                raise ServiceError(
                    f"`mvn dependency:copy-dependencies` for Kafka {KAFKA_VERSION} failed "
                    f"(exit {res.returncode}):\n" + "\n".join((res.stdout + res.stderr).splitlines()[-30:])
                )
            if libs.exists():
                shutil.rmtree(libs)
            os.replace(out, libs)
        say(f"Kafka jars in {libs}")
    return libs


def _java() -> str:
    java = _which("java")
    if java is None:
        raise ServiceError("running Kafka needs Java >= 17: `apt-get install openjdk-17-jre-headless`")
    return java


def _kafka_properties(s: ServiceSettings, data: Path) -> str:
    return "\n".join(
        [
            "# written by sfaas.services; single-node KRaft broker+controller",
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers=127.0.0.1:{s.kafka_controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{s.kafka_port},CONTROLLER://127.0.0.1:{s.kafka_controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{s.kafka_port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={data}",
            "num.partitions=4",
            "default.replication.factor=1",
            "min.insync.replicas=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=4",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "delete.topic.enable=true",
            "num.network.threads=2",
            "num.io.threads=4",
            "log.retention.hours=24",
            "log.segment.bytes=67108864",
            "",
        ]
    )


_LOG4J2 = """Configuration:
  name: sfaas-kafka
  Appenders:
    RollingFile:
      name: file
      fileName: "{dir}/server.log"
      filePattern: "{dir}/server.log.%i"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
      Policies:
        SizeBasedTriggeringPolicy:
          size: 20MB
      DefaultRolloverStrategy:
        max: 3
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: file
    Logger:
      - name: kafka
        level: INFO
      - name: org.apache.kafka
        level: INFO
      - name: state.change.logger
        level: WARN
      - name: kafka.request.logger
        level: WARN
"""


def _kafka_usable(s: ServiceSettings) -> bool:
    """The broker answers a metadata request listing at least one broker."""
    if not _port_open(s.kafka_port):
        return False
    result: list[bool] = [False]

    async def probe() -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(
            bootstrap_servers=f"127.0.0.1:{s.kafka_port}", request_timeout_ms=3000
        )
        try:
            await asyncio.wait_for(admin.start(), 5)
            cluster = await asyncio.wait_for(admin.describe_cluster(), 5)
            result[0] = bool(cluster.get("brokers"))
        finally:
            await admin.close()

    def run() -> None:
        # A private loop in a thread: works even when the caller already runs an event loop.
        try:
            asyncio.run(probe())
        except Exception as e:  # not ready yet; the caller polls again
            log.debug("Kafka probe failed: %s: %s", type(e).__name__, e)

    t = threading.Thread(target=run, name="sfaas-kafka-probe", daemon=True)
    t.start()
    t.join(15)
    return result[0]


def _up_kafka(s: ServiceSettings, say: Callable[[str], None], *, auto: bool, timeout: float = 180.0) -> None:
    svc = _KAFKA
    with _file_lock(svc.lock_file(s)):
        pid = svc.read_pid(s)
        if pid is not None:
            _wait_ready(svc, s, pid, lambda: _kafka_usable(s), timeout)
            say(f"Kafka already running (pid {pid}) at 127.0.0.1:{s.kafka_port}")
            return
        if _port_open(s.kafka_port):
            if _kafka_usable(s):
                say(f"Kafka already running (not started by sfaas) at 127.0.0.1:{s.kafka_port}")
                return
            raise ServiceError(
                f"port {s.kafka_port} is in use by something that is not a Kafka broker; "
                f"stop it or set SFAAS_KAFKA_PORT to a free port"
            )
        if _port_open(s.kafka_controller_port):
            raise ServiceError(
                f"Kafka controller port {s.kafka_controller_port} is in use; stop what uses it "
                f"or set SFAAS_KAFKA_CONTROLLER_PORT to a free port"
            )
        libs = ensure_kafka_libs(say)
        java = _java()
        home = svc.pid_file(s).parent
        data = home / "data"
        logs = home / "logs"
        data.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        props = home / "server.properties"
        props.write_text(_kafka_properties(s, data))
        log4j = home / "log4j2.yaml"
        log4j.write_text(_LOG4J2.format(dir=logs))
        classpath = f"{libs}/*"
        jvm_log = [f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.dir={logs}"]
        if not (data / "meta.properties").exists():
            # Kafka's cluster id: 16 random bytes, url-safe base64 without padding.
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            say(f"formatting Kafka storage in {data} (cluster id {cluster_id})")
            res = subprocess.run(
                [java, *jvm_log, "-cp", classpath, "kafka.tools.StorageTool", "format",
                 "-t", cluster_id, "-c", str(props), "--standalone"],
                stdin=subprocess.DEVNULL, capture_output=True, text=True,
            )
            if res.returncode != 0:
                raise ServiceError(
                    f"formatting Kafka storage in {data} failed (exit {res.returncode}):\n"
                    + "\n".join((res.stdout + res.stderr).splitlines()[-30:])
                )
        argv = [
            java, f"-Xmx{s.kafka_heap}", f"-Xms{s.kafka_heap}", "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true", *jvm_log,
            "-cp", classpath, "kafka.Kafka", str(props),
        ]
        t0 = time.monotonic()
        pid = _spawn(svc, s, argv, dict(os.environ))
        _mark_auto(svc, s, auto)
        say(f"starting Kafka {KAFKA_VERSION} (pid {pid}), data in {data}, logs in {logs}")
        try:
            _wait_ready(svc, s, pid, lambda: _kafka_usable(s), timeout)
        except ServiceError as e:
            with contextlib.suppress(ServiceError):
                _stop(svc, s)
            raise ServiceError(f"{e}\nbroker log {logs / 'server.log'} ends with:\n{log_tail(logs / 'server.log')}") from None
        say(f"Kafka ready at 127.0.0.1:{s.kafka_port} in {time.monotonic() - t0:.1f}s")


# ----------------------------------------------------------------------------- public API


def up(*, kafka: bool = True, minio: bool = True, progress: Progress = True) -> Endpoints:
    """Start the services that are not running yet and wait until they serve requests.

    Idempotent: a service that already runs (started by sfaas, or by someone else on the
    same port with the same credentials) is reused. Raises :class:`ServiceError` with the
    log tail when a service cannot start.
    """
    return _up(kafka=kafka, minio=minio, progress=progress, auto=False)


def _up(*, kafka: bool, minio: bool, progress: Progress, auto: bool) -> Endpoints:
    s = ServiceSettings.from_env()
    say = _reporter(progress)
    if minio:
        _up_minio(s, say, auto=auto)
    if kafka:
        _up_kafka(s, say, auto=auto)
    return endpoints()


def down(*, kafka: bool = True, minio: bool = True, progress: Progress = True) -> None:
    """Stop the services that :func:`up` started (by pid file); others are left alone."""
    s = ServiceSettings.from_env()
    say = _reporter(progress)
    for wanted, svc in ((kafka, _KAFKA), (minio, _MINIO)):
        if not wanted:
            continue
        with _file_lock(svc.lock_file(s)):
            if _stop(svc, s):
                say(f"stopped {svc.name}")
            else:
                say(f"{svc.name} was not running (started by sfaas)")


def status() -> dict[str, dict[str, object]]:
    """Per service: ``running`` (started by sfaas, process alive), ``pid``, ``endpoint``,
    ``reachable`` (the port accepts connections, whoever listens) and ``log``."""
    s = ServiceSettings.from_env()
    ep = endpoints()
    out: dict[str, dict[str, object]] = {}
    for svc, endpoint in ((_MINIO, ep.minio_endpoint), (_KAFKA, ep.kafka_bootstrap)):
        pid = svc.read_pid(s)
        out[svc.name] = {
            "running": pid is not None,
            "pid": pid,
            "endpoint": endpoint,
            "reachable": _port_open(svc.port(s)),
            "log": str(svc.log_file(s)),
        }
    return out


# ----------------------------------------------------------------------------- shared use


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


@contextlib.contextmanager
def using(*, kafka: bool = False, minio: bool = False, progress: Progress = True) -> Iterator[Endpoints]:
    """Make the services run while the block runs, shared safely between processes.

    Each user (e.g. a pytest session) takes a lease; a service this mechanism started is
    stopped when the last lease holder leaves. A service started by ``sfaas services up``
    (or by anyone else) is never stopped here.
    """
    s = ServiceSettings.from_env()
    say = _reporter(progress)
    chosen = [svc for wanted, svc in ((minio, _MINIO), (kafka, _KAFKA)) if wanted]
    for svc in chosen:
        with _file_lock(svc.lock_file(s)):
            _lease_dir(s, svc).mkdir(parents=True, exist_ok=True)
            (_lease_dir(s, svc) / str(os.getpid())).touch()
    try:
        yield _up(minio=minio, kafka=kafka, progress=say, auto=True)
    finally:
        for svc in chosen:
            with _file_lock(svc.lock_file(s)):
                (_lease_dir(s, svc) / str(os.getpid())).unlink(missing_ok=True)
                if _auto_file(svc, s).exists() and not _live_leases(s, svc):
                    with contextlib.suppress(ServiceError):
                        if _stop(svc, s):
                            say(f"stopped {svc.name} (last user left)")


def main(argv: list[str] | None = None) -> int:
    """``python -m sfaas.cli.services {up,down,status} [--kafka-only|--minio-only]`` (for scripts)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m sfaas.cli.services", description=main.__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--kafka-only", action="store_true", help="only Kafka")
    only.add_argument("--minio-only", action="store_true", help="only MinIO")
    args = parser.parse_args(argv)
    which = {"kafka": not args.minio_only, "minio": not args.kafka_only}

    def say(msg: str) -> None:
        print(msg, file=sys.stderr)

    try:
        if args.command == "up":
            ep = up(progress=say, **which)
            print(f"kafka: {ep.kafka_bootstrap}\nminio: http://{ep.minio_endpoint} (access key {ep.minio_access_key})")
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
