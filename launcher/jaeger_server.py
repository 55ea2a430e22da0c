"""The local Jaeger (``sfaas services up --tracing``): its pinned binary, built from its Go
module like MinIO's, and starting it with a configuration of our own.

Jaeger v2 is an OpenTelemetry collector: the configuration written here keeps the traces
in memory (the newest 100,000), takes spans over OTLP (gRPC and HTTP) and serves its query
API and UI, every port on 127.0.0.1 (``SFAAS_OTLP_GRPC_PORT``, ``SFAAS_OTLP_HTTP_PORT``,
``SFAAS_JAEGER_PORT``, ``SFAAS_JAEGER_GRPC_PORT``) and nothing else — the stock all-in-one
configuration opens a dozen more ports.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from launcher.minio_server import go_to_build
from launcher.procs import (
    _JAEGER,
    JAEGER_MODULE,
    JAEGER_VERSION,
    Progress,
    ServiceError,
    ServiceSettings,
    _file_lock,
    _mark_auto,
    _port_open,
    _reporter,
    _spawn,
    _stop,
    _wait_ready,
    adopt_running,
)

__all__ = ["ensure_jaeger_binary", "jaeger_config"]

#: The configuration ``jaeger --config`` gets (``{…}`` filled from the settings).
_CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_grpc}
      http:
        endpoint: 127.0.0.1:{otlp_http}
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


def jaeger_config(s: ServiceSettings) -> str:
    """The YAML configuration of the local Jaeger for settings ``s``."""
    return _CONFIG.format(query=s.jaeger_port, query_grpc=s.jaeger_grpc_port,
                          otlp_grpc=s.otlp_grpc_port, otlp_http=s.otlp_http_port)


def ensure_jaeger_binary(progress: Progress = True) -> Path:
    """Path of the pinned Jaeger binary, building it from its Go module if missing.

    ``go install module@version`` refuses Jaeger's module (its ``go.mod`` has a
    ``replace``), so the module's source is downloaded from the module proxy and built in
    a copy of it, with its own ``go.mod``, ``go.sum`` and ``replace`` as released. A cold
    build takes several minutes (hundreds of modules) and needs Go >= 1.24.
    """
    s = ServiceSettings.from_env()
    say = _reporter(progress)
    binary = s.jaeger_binary
    if os.access(binary, os.X_OK):
        return binary
    with _file_lock(s.cache_dir / ".jaeger-build.lock"):
        if os.access(binary, os.X_OK):  # built by another process while we waited
            return binary
        go = go_to_build("Jaeger", binary, s, say)
        binary.parent.mkdir(parents=True, exist_ok=True)
        # (GOTOOLCHAIN auto: Debian's Go pins "local"; Jaeger's go.mod may ask for a newer one)
        env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="auto")
        say(f"building Jaeger {JAEGER_VERSION} with {go} (first time only, several minutes)")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(dir=binary.parent, prefix=".jaeger-") as work:
            src = _module_source(go, env, Path(work))
            _run(go, ["build", "-trimpath", "-o", str(Path(work) / "jaeger"), "./cmd/jaeger"],
                 env, src, "build ./cmd/jaeger")
            os.replace(Path(work) / "jaeger", binary)
        say(f"built {binary} in {time.monotonic() - t0:.0f}s")
    return binary


def _module_source(go: str, env: dict[str, str], work: Path) -> Path:
    """A writable copy of Jaeger's module source (downloaded to the module cache)."""
    out = _run(go, ["mod", "download", "-json", f"{JAEGER_MODULE}@{JAEGER_VERSION}"], env, work,
               "mod download")
    info = json.loads(out) if out.strip() else {}
    if not info.get("Dir"):
        raise ServiceError(f"`go mod download {JAEGER_MODULE}@{JAEGER_VERSION}` gave no source "
                           f"directory: {info.get('Error') or out[-2000:]}")
    src = work / "src"
    # (the module cache is read-only: the copy is made writable for the build's files)
    shutil.copytree(info["Dir"], src, copy_function=shutil.copy)
    for d, _, files in os.walk(src):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    return src


def _run(go: str, args: list[str], env: dict[str, str], cwd: Path, what: str) -> str:
    res = subprocess.run([go, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise ServiceError(f"`go {what}` of {JAEGER_MODULE}@{JAEGER_VERSION} failed (exit "
                           f"{res.returncode}):\n"
                           + "\n".join((res.stderr or res.stdout).splitlines()[-30:]))
    return res.stdout


def jaeger_usable(s: ServiceSettings) -> bool:
    """Whether a Jaeger query API answers on its port (``GET /api/services``)."""
    url = f"http://127.0.0.1:{s.jaeger_port}/api/services"
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return resp.status == 200 and "data" in json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _up_jaeger(s: ServiceSettings, say: Callable[[str], None], *, auto: bool,
               timeout: float = 60.0) -> None:
    svc = _JAEGER
    with _file_lock(svc.lock_file(s)):
        where = f"http://127.0.0.1:{s.jaeger_port}"
        if adopt_running(svc, s, s.jaeger_port, lambda: jaeger_usable(s), timeout, say, "Jaeger",
                         where, "a Jaeger query API", "SFAAS_JAEGER_PORT"):
            return
        for port, var in ((s.otlp_grpc_port, "SFAAS_OTLP_GRPC_PORT"),
                          (s.otlp_http_port, "SFAAS_OTLP_HTTP_PORT"),
                          (s.jaeger_grpc_port, "SFAAS_JAEGER_GRPC_PORT")):
            if _port_open(port):
                raise ServiceError(f"port {port}, which Jaeger needs, is in use; stop what uses "
                                   f"it or set {var} to a free port")
        binary = ensure_jaeger_binary(say)
        config = svc.pid_file(s).parent / "jaeger.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(jaeger_config(s))
        t0 = time.monotonic()
        pid = _spawn(svc, s, [str(binary), "--config", str(config)], dict(os.environ))
        _mark_auto(svc, s, auto)
        say(f"starting Jaeger (pid {pid}), log {svc.log_file(s)}")
        try:
            _wait_ready(svc, s, pid, lambda: jaeger_usable(s), timeout)
        except ServiceError:
            with contextlib.suppress(ServiceError):
                _stop(svc, s)
            raise
        say(f"Jaeger ready at {where} (OTLP on 127.0.0.1:{s.otlp_grpc_port} gRPC, "
            f"http://127.0.0.1:{s.otlp_http_port} HTTP) in {time.monotonic() - t0:.1f}s")
