"""The local MinIO server: its pinned binary (built with ``go install``) and starting it;
and a distributed MinIO of local nodes for failover tests (:func:`start_distributed`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher.procs import (
    _MINIO,
    GO_TOOLCHAIN,
    MINIO_MODULE,
    MINIO_VERSION,
    Progress,
    ServiceError,
    ServiceSettings,
    _file_lock,
    _mark_auto,
    _reporter,
    _spawn,
    _stop,
    _wait_ready,
    _which,
    adopt_running,
    log_tail,
)

log = logging.getLogger("launcher.services")

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
        go = go_to_build("MinIO", binary, s, say)
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


def go_to_build(what: str, binary: Path, s: ServiceSettings, say: Callable[[str], None]) -> str:
    """The ``go`` to build ``what`` (whose binary belongs at ``binary``) with: the one on
    PATH, or a Go >= 1.24 it fetches when it is older than 1.21; a clear error without one."""
    go = _which("go", ("/usr/local/go/bin/go", "/usr/lib/go/bin/go"))
    if go is None:
        raise ServiceError(
            f"building {what} needs Go, and `go` is not on PATH: `apt-get install golang-go` "
            "(any version: an older Go fetches Go >= 1.24 from the module proxy), or install "
            f"Go from https://go.dev/dl, or put a {what.lower()} binary at {binary}")
    if _go_version(go) < (1, 21):
        go = _fetch_go_toolchain(go, s, say)
    return go


def _fetch_go_toolchain(go: str, s: ServiceSettings, say: Callable[[str], None]) -> str:
    """A Go >= 1.24 for building MinIO, fetched with an older ``go`` (e.g. Debian's 1.19).

    Go publishes its toolchains as the module ``golang.org/toolchain`` on the module proxy
    (this is what ``GOTOOLCHAIN=auto`` uses from Go 1.21 on); older Go can download that
    module like any other. Module zips drop file modes, so the binaries are made
    executable again after the copy into the cache.
    """
    arches = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
    arch = arches.get(platform.machine())
    if arch is None:
        raise ServiceError(f"no Go toolchain known for machine {platform.machine()!r}; "
                           "install Go >= 1.24")
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
    res = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL)
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


def _up_minio(s: ServiceSettings, say: Callable[[str], None], *, auto: bool,
              timeout: float = 90.0) -> None:
    svc = _MINIO
    with _file_lock(svc.lock_file(s)):
        if adopt_running(svc, s, s.minio_port, lambda: _minio_usable(s), timeout, say, "MinIO",
                         f"http://127.0.0.1:{s.minio_port}",
                         "a MinIO accepting the sfaas credentials", "SFAAS_MINIO_PORT"):

            return
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


# ----------------------------------------------------------------------------- distributed


@dataclass
class DistributedMinio:
    """A distributed MinIO of ``len(endpoints)`` local nodes (see :func:`start_distributed`).

    ``endpoints[i]`` is node *i*'s ``127.0.0.1:port``; ``",".join(endpoints)`` is what
    ``SFAAS_MINIO``/``MinioRemote`` take. :meth:`kill` and :meth:`start` take single nodes
    down and up (failover tests); :meth:`stop` ends them all (the drives stay).
    """

    endpoints: list[str]
    access_key: str
    secret_key: str = field(repr=False)
    base_dir: Path
    _argv: list[list[str]] = field(repr=False)
    _env: list[dict[str, str]] = field(repr=False)
    _procs: list[subprocess.Popen[bytes] | None] = field(repr=False)

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (no shutdown: like a lost machine) and reap it."""
        proc = self._procs[i]
        if proc is not None:
            proc.kill()
            proc.wait()
            self._procs[i] = None

    def start(self, i: int) -> None:
        """Start node ``i`` again (after :meth:`kill`) on its port and drive."""
        if self._procs[i] is None:
            with open(self.base_dir / f"node{i}.log", "ab") as out:
                self._procs[i] = subprocess.Popen(
                    self._argv[i], env=self._env[i], stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def alive(self, i: int) -> bool:
        """Whether node ``i``'s process runs."""
        proc = self._procs[i]
        return proc is not None and proc.poll() is None

    def healthy(self, i: int) -> bool:
        """Whether node ``i`` says the cluster has write quorum (``/minio/health/cluster``)."""
        try:
            url = f"http://{self.endpoints[i]}/minio/health/cluster"
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Wait until every running node reports a healthy cluster; ``ServiceError`` (with
        the logs' tails) after ``timeout`` seconds or when a node exits."""
        deadline = time.monotonic() + timeout
        while True:
            running = [i for i, p in enumerate(self._procs) if p is not None]
            for i in running:
                if not self.alive(i):
                    raise ServiceError(f"MinIO node {i} ({self.endpoints[i]}) exited:\n"
                                       + log_tail(self.base_dir / f"node{i}.log"))
            if all(self.healthy(i) for i in running):
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"node {i}:\n{log_tail(self.base_dir / f'node{i}.log', 10)}"
                                  for i in running)
                raise ServiceError(f"distributed MinIO {self.endpoints} not healthy after "
                                   f"{timeout:.0f}s:\n{tails}")
            time.sleep(0.2)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every node (SIGTERM, then SIGKILL after ``timeout`` seconds)."""
        for proc in self._procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for i, proc in enumerate(self._procs):
            if proc is not None:
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                self._procs[i] = None

    def __enter__(self) -> DistributedMinio:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    # A test run that is killed must not leave its nodes running (Linux: PR_SET_PDEATHSIG,
    # SIGKILL when the thread that started the node ends — start nodes from a thread that
    # outlives them, like the main one).
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def start_distributed(n: int, base_dir: str | os.PathLike[str], *, timeout: float = 60.0,
                      access_key: str | None = None, secret_key: str | None = None) \
        -> DistributedMinio:
    """Start a distributed (erasure-coded) MinIO of ``n`` (2-16) ``minio server`` processes
    on 127.0.0.1, each on a free port with one drive ``base_dir/node<i>/drive``, and wait
    until every node reports the cluster healthy. With 4 nodes MinIO picks EC:2 parity:
    reads survive 2 lost nodes, writes 1. Credentials: the local services' (``SFAAS_MINIO_*``
    or their defaults) unless given. Call :meth:`DistributedMinio.stop` (or use ``with``).

    Every node gets the same explicit list of ``http://127.0.0.1:<port>/<drive>`` URLs:
    MinIO's ``{a...b}`` expansion makes the cross product of ports and paths, so on one
    host it cannot give each node a drive of its own.
    """
    if not 2 <= n <= 16:
        raise ValueError(f"n must be 2-16 nodes (one erasure set), got {n}")
    from launcher.cluster import free_port

    s = ServiceSettings.from_env()
    binary = ensure_minio_binary(False)
    base = Path(base_dir).resolve()
    ports: list[int] = []
    for _ in range(2 * n):  # S3 and console port of each node
        ports.append(free_port("127.0.0.1", avoid=ports))
    endpoints = [f"127.0.0.1:{p}" for p in ports[:n]]
    drives = [base / f"node{i}" / "drive" for i in range(n)]
    for d in drives:
        d.mkdir(parents=True, exist_ok=True)
    urls = [f"http://{ep}{d}" for ep, d in zip(endpoints, drives, strict=True)]
    common = dict(
        os.environ,
        MINIO_ROOT_USER=access_key or s.minio_access_key,
        MINIO_ROOT_PASSWORD=secret_key or s.minio_secret_key,
        MINIO_UPDATE="off",
        # The drives are directories on the root file system, which distributed MinIO
        # refuses ("drive is part of root drive") unless told this is a test setup.
        MINIO_CI_CD="1",
    )
    envs = [
        # In a container (/.dockerenv) MinIO waits for 127.0.0.1 to resolve to a non-loopback
        # address before it believes an endpoint is its own; this names the node's own one.
        dict(common, _MINIO_SERVER_LOCAL=endpoints[i]) for i in range(n)
    ]
    argv = [[str(binary), "server", "--quiet", "--address", endpoints[i],
             "--console-address", f"127.0.0.1:{ports[n + i]}", *urls] for i in range(n)]
    cluster = DistributedMinio(endpoints, common["MINIO_ROOT_USER"], common["MINIO_ROOT_PASSWORD"],
                               base, argv, envs, [None] * n)
    try:
        for i in range(n):
            cluster.start(i)
        t0 = time.monotonic()
        cluster.wait_healthy(timeout)
        log.info("distributed MinIO of %d nodes healthy in %.1fs: %s", n,
                 time.monotonic() - t0, ",".join(endpoints))
    except BaseException:
        cluster.stop()
        raise
    return cluster


# ----------------------------------------------------------------------------- Kafka
