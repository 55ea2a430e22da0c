"""A local cluster as background processes: ``sfaas up`` / ``ps`` / ``down``.

State lives in ``$SFAAS_HOME/cluster/<namespace>/``: ``cluster.json`` (app, roles, pids,
addresses, log files) and ``secret`` (the generated shared secret, mode 0600, never
printed or logged). Each process runs in its own session and logs to its own file.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .app import load_app
from .errors import ClusterError
from .settings import Settings

log = logging.getLogger("sfaas.cluster")

__all__ = ["ProcessInfo", "up", "ps", "down", "state_dir", "cluster_settings"]


@dataclass
class ProcessInfo:
    """One process of the local cluster."""

    role: str
    pid: int
    address: str
    log: str
    alive: bool = True


def state_dir(settings: Settings) -> Path:
    """Where the local cluster of ``settings.namespace`` keeps its state."""
    return Path(settings.home) / "cluster" / settings.namespace


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _repo_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def _spawn(args: list[str], env: dict[str, str], logfile: Path) -> int:
    out = open(logfile, "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sfaas", *args],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=os.getcwd(),
        )
    finally:
        out.close()
    return proc.pid


def cluster_settings(settings: Settings) -> tuple[dict[str, Any], Settings]:
    """The running cluster's description and settings (with its secret) for ``namespace``."""
    sd = state_dir(settings)
    try:
        info = json.loads((sd / "cluster.json").read_text())
    except FileNotFoundError:
        raise ClusterError(f"no local cluster in {sd} (start one with 'sfaas up MODULE:APP')") from None
    secret = (sd / "secret").read_text().strip() if (sd / "secret").exists() else settings.secret
    s = Settings.load({"kafka": info["kafka"], "namespace": info["namespace"], "secret": secret,
                       "coordinator": info["coordinator"], "home": settings.home})
    return info, s


def up(settings: Settings, app_spec: str, workers: int, timeout: float = 60.0) -> list[ProcessInfo]:
    """Start a coordinator and ``workers`` workers for ``app_spec``; wait until epochs run."""
    app = load_app(app_spec)
    sd = state_dir(settings)
    sd.mkdir(parents=True, exist_ok=True)
    current = ps(settings)
    if any(p.alive for p in current):
        raise ClusterError(f"a cluster is already running in {sd}; run 'sfaas down' first")
    secret = settings.secret or secrets.token_hex(24)
    secret_file = sd / "secret"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    port = _free_port(settings.host)
    coord = f"{settings.host}:{port}"
    ready = sd / "ready"
    ready.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update({k: v for k, v in settings.as_env().items() if k not in ("SFAAS_SECRET",)})
    env.update({
        "SFAAS_SECRET": secret, "SFAAS_COORDINATOR": coord, "SFAAS_WORKERS": str(workers),
        "SFAAS_APP": app_spec, "SFAAS_READY_FILE": str(ready), "SFAAS_PORT": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), _repo_root(), env.get("PYTHONPATH", "")])),
    })
    procs = [ProcessInfo("coordinator", _spawn(["coordinator"], env, sd / "coordinator.log"), coord,
                         str(sd / "coordinator.log"))]
    for i in range(workers):
        logf = sd / f"worker-{i}.log"
        procs.append(ProcessInfo("worker", _spawn(["worker", "--name", f"worker-{i}"], env, logf), "", str(logf)))
    info = {"app": app.name, "app_spec": app_spec, "namespace": settings.namespace,
            "kafka": settings.kafka, "coordinator": coord, "processes": [asdict(p) for p in procs]}
    (sd / "cluster.json").write_text(json.dumps(info, indent=2))
    deadline = time.monotonic() + timeout
    while not ready.exists():
        dead = [p for p in procs if not _alive(p.pid)]
        if dead or time.monotonic() > deadline:
            down(settings)
            tail = Path(dead[0].log).read_text()[-2000:] if dead else ""
            raise ClusterError(
                f"cluster did not become ready ({'a ' + dead[0].role + ' exited' if dead else 'timeout'}); "
                f"logs in {sd}\n{tail}"
            )
        time.sleep(0.1)
    return ps(settings)


def ps(settings: Settings) -> list[ProcessInfo]:
    """The local cluster's processes and whether each is alive."""
    sd = state_dir(settings)
    try:
        info = json.loads((sd / "cluster.json").read_text())
    except FileNotFoundError:
        return []
    addresses: dict[int, str] = {}
    try:
        members = json.loads((sd / "ready").read_text())
        addresses = {w["pid"]: w["address"] for w in members.get("workers", [])}
    except (FileNotFoundError, ValueError):
        pass
    out = []
    for p in info.get("processes", []):
        proc = ProcessInfo(**{k: p[k] for k in ("role", "pid", "address", "log")})
        proc.address = proc.address or addresses.get(proc.pid, "")
        proc.alive = _alive(proc.pid)
        out.append(proc)
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(procs: list[ProcessInfo], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        while _alive(p.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
            try:
                os.waitpid(p.pid, os.WNOHANG)
            except ChildProcessError:
                pass


def down(settings: Settings, timeout: float = 15.0) -> list[ProcessInfo]:
    """Stop the local cluster's processes (TERM, then KILL after ``timeout``).

    The coordinator goes first: it tells the workers to stop, so they close Kafka clients
    and stores cleanly; workers still running after a few seconds get their own TERM.
    """
    procs = ps(settings)
    coords = [p for p in procs if p.role == "coordinator" and p.alive]
    for p in coords:
        _signal(p.pid, signal.SIGTERM)
    _wait_gone(procs, 5.0 if coords else 0.0)
    for p in procs:
        if _alive(p.pid):
            _signal(p.pid, signal.SIGTERM)
    _wait_gone(procs, timeout)
    for p in procs:
        if _alive(p.pid):
            log.warning("%s pid %d ignored SIGTERM; killing", p.role, p.pid)
            _signal(p.pid, signal.SIGKILL)
    sd = state_dir(settings)
    (sd / "cluster.json").unlink(missing_ok=True)
    (sd / "ready").unlink(missing_ok=True)
    return procs
