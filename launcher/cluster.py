"""A local cluster as background processes: ``sfaas up`` / ``ps`` / ``down``.

``up`` starts one supervisor process (``launcher.supervisor``), which starts the coordinator
and the workers and restarts any that die. State lives in
``$SFAAS_HOME/cluster/<namespace>/``: ``cluster.json`` (app, the supervisor, roles, pids,
restarts, addresses, log files; rewritten by the supervisor) and ``secret`` (the generated
shared secret, mode 0600, never printed or logged). Each process runs in its own session
and logs to its own file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from sfaas.app import load_app
from sfaas.errors import ClusterError, ConfigError, SfaasError, TransactionAborted
from sfaas.runtime.settings import Settings

if TYPE_CHECKING:
    from sfaas.reads import DirectReads

log = logging.getLogger("sfaas.cluster")

__all__ = ["ProcessInfo", "up", "ps", "down", "scale", "state_dir", "cluster_settings",
           "supervisor_pid", "status_url"]


@dataclass
class ProcessInfo:
    """One process of the local cluster."""

    role: str
    pid: int
    address: str
    log: str
    alive: bool = True
    #: the role's index (workers: 0..n-1) and how often the supervisor restarted it
    index: int = 0
    restarts: int = 0
    #: why the supervisor stopped restarting it (empty: it did not)
    gave_up: str = ""
    #: its Prometheus endpoint (empty: metrics off); the coordinator's status page is at ``/``
    metrics: str = ""


def state_dir(settings: Settings) -> Path:
    """Where the local cluster of ``settings.namespace`` keeps its state."""
    return Path(settings.home) / "cluster" / settings.namespace


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux; else its default)."""
    try:
        ports = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        lo, hi = (int(x) for x in ports)
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str, avoid: Collection[int] = ()) -> int:
    """A TCP port nobody listens on at ``host`` right now, chosen outside the ephemeral
    range: a port from that range can be taken by any outgoing connection (a Kafka
    client's) between this check and the bind of the process it is meant for.

    ``avoid``: ports already handed to processes that may not have bound them yet (a
    cluster's ports are all chosen before its processes start; a CI run failed when a
    worker's metrics port came out equal to the coordinator's)."""
    lo, hi = ephemeral_ports()
    ranges = [(a, b) for a, b in ((10000, lo - 1), (hi + 1, 65535)) if b - a >= 1000]
    total = sum(b - a + 1 for a, b in ranges)
    pick = random.SystemRandom()
    for _ in range(200 if ranges else 0):
        port = pick.randrange(total)  # uniform over both ranges, so picks collide least
        for a, b in ranges:
            if port <= b - a:
                port += a
                break
            port -= b - a + 1
        if port in avoid:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue  # in use: another
            return port
    for _ in range(100):  # nothing free outside the range: the kernel's choice
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port
    raise ClusterError(f"no free TCP port on {host}")


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
    return str(Path(__file__).resolve().parents[2])


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
        raise ClusterError(
            f"no local cluster in {sd} (start one with 'sfaas up MODULE:APP')") from None
    secret = (sd / "secret").read_text().strip() if (sd / "secret").exists() else settings.secret
    s = Settings.load({"kafka": info["kafka"], "namespace": info["namespace"], "secret": secret,
                       "coordinator": info["coordinator"], "home": settings.home})
    return info, s


def _metrics_mode(base: int | None, n: int) -> str | int:
    """How the supervisor gives ``n`` processes their metrics ports (``Supervisor.metrics``):
    ``"free"`` ports when ``base`` is None, ``"off"`` when 0, else ``base``, ``base + 1``, …"""
    if base is None:
        return "free"
    if base == 0:
        return "off"
    if not 0 < base <= 65536 - n:
        raise ClusterError(f"--metrics-port (SFAAS_METRICS_PORT) must leave room for {n} ports "
                           f"below 65536, got {base}")
    return base


def up(settings: Settings, app_spec: str, workers: int, timeout: float = 60.0, standbys: int = 0,
       metrics_port: int | None = None,
       progress: Callable[[str], None] | None = None) -> list[ProcessInfo]:
    """Start a coordinator and ``workers`` workers for ``app_spec``, plus ``standbys``
    standby workers per worker; return once a client's call would succeed: every worker
    joined, and the owner of every partition answered a direct read (:class:`ReadProbe`).

    ``metrics_port``: the coordinator serves ``/metrics`` and the status page there, each
    worker process on the next port (in supervisor order); None: on free ports; 0: off.
    ``ps`` reports each process's URL. Refused before anything starts in a namespace whose
    data directory here holds another app's stores, or this app's written with another
    engine or partition count (``sfaas.runtime.state``). ``progress`` hears what ``up``
    waits for (``sfaas up`` prints it on stderr).
    """
    if standbys < 0:
        raise ClusterError(f"standbys must be >= 0 (standby workers per worker), got {standbys}")
    if standbys and not settings.snapshot_interval:
        raise ClusterError("standbys need snapshot rounds: set snapshot_interval > 0")
    metrics = _metrics_mode(metrics_port, 1 + workers * (1 + standbys))
    app = load_app(app_spec)
    # a namespace holding another app's stores, or stores written with another engine or
    # partition count: say so now, start nothing
    from sfaas.runtime.state import check_layout, check_namespace, stores_root

    try:
        check_namespace(settings, app.name)
        check_layout(app, stores_root(settings, app.name), settings.partitions,
                     settings.store or None, write=False)
    except ConfigError as exc:
        raise ClusterError(str(exc)) from None
    sd = state_dir(settings)
    sd.mkdir(parents=True, exist_ok=True)
    current = ps(settings)
    if any(p.alive for p in current) or supervisor_pid(settings) is not None:
        raise ClusterError(f"a cluster is already running in {sd}; run 'sfaas down' first")
    secret = settings.secret or secrets.token_hex(24)
    secret_file = sd / "secret"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    port = free_port(settings.host)
    coord = f"{settings.host}:{port}"
    ready = sd / "ready"
    ready.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update({k: v for k, v in settings.as_env().items() if k not in ("SFAAS_SECRET",)})
    env.update({
        "SFAAS_SECRET": secret, "SFAAS_COORDINATOR": coord, "SFAAS_WORKERS": str(workers),
        "SFAAS_STANDBYS": str(standbys),
        "SFAAS_APP": app_spec, "SFAAS_READY_FILE": str(ready), "SFAAS_PORT": "0",
        "SFAAS_METRICS_PORT": "0",  # each child gets its own port as a flag (see supervisor)
        "PYTHONPATH": os.pathsep.join(
            filter(None, [os.getcwd(), _repo_root(), env.get("PYTHONPATH", "")])),
    })
    info: dict[str, Any] = {"app": app.name, "app_spec": app_spec, "namespace": settings.namespace,
            "kafka": settings.kafka, "coordinator": coord, "worker_host": settings.host,
            "processes": [], "metrics": metrics, "standbys": standbys}
    (sd / "cluster.json").write_text(json.dumps(info, indent=2))
    sup = _spawn(["supervise", "--state-dir", str(sd), "--workers", str(workers * (1 + standbys))],
                 env, sd / "supervisor.log")
    if progress is not None:
        progress(f"started a coordinator and {workers * (1 + standbys)} worker process(es) "
                 f"of {app_spec}; waiting until they serve (logs in {sd})")
    # (the app's first operator; an app without one has nothing to read: it waits for the
    # ready file only, as ``up`` did before it probed)
    probe = ReadProbe(dataclasses.replace(settings, secret=secret, coordinator=coord),
                      app.name, next(iter(app.operators), None))
    _await_ready(settings, sup, timeout, probe, progress)
    return ps(settings)


def _await_ready(settings: Settings, sup: int, timeout: float, probe: ReadProbe | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
    """Wait until the cluster started by supervisor ``sup`` is ready — its coordinator's
    ready file says every worker joined, then ``probe`` (if any) got an answer from every
    partition's owner; if a process exits, the supervisor does or ``timeout`` passes, stop
    it and raise :class:`ClusterError` with what did not answer and the log's tail. A
    recovery that stopped retrying raises its own reason (``_ready``)."""
    ready = state_dir(settings) / "ready"
    t0 = time.monotonic()
    deadline, said = t0 + timeout, t0
    while True:
        if _ready(ready):
            if probe is None or probe.serving(max(0.1, min(PROBE_ATTEMPT,
                                                            deadline - time.monotonic()))):
                break
            if progress is not None and time.monotonic() - said >= PROBE_SAY_EVERY:
                said = time.monotonic()
                progress(f"not serving yet: {probe.lacking}")
        crashed = [p for p in ps(settings) if p.restarts or p.gave_up]
        if crashed:
            # ``ps`` names a coordinator whose recovery stopped retrying "gave up" too, and
            # it may have written so since ``_ready`` read the file: that is no crash
            _ready(ready)
        if crashed or not _alive(sup) or time.monotonic() > deadline:
            if crashed:
                why = f"the {crashed[0].role} exited"
            elif not _alive(sup):
                why = "the supervisor exited"
            else:
                why = f"not ready after {timeout:.0f} s"
                if probe is not None and probe.tried:
                    why += f": {probe.lacking}"
            _stop_unready(settings, sup, why, crashed[0].log if crashed else "")
        time.sleep(0.05)
    if progress is not None and probe is not None and probe.partitions:
        progress(f"serving: the owner of each of {probe.partitions} partitions answered a "
                 f"read ({time.monotonic() - t0:.1f} s)")


def _stop_unready(settings: Settings, sup: int, why: str, logfile: str) -> NoReturn:
    """Stop the cluster of supervisor ``sup`` that did not become ready, and raise
    :class:`ClusterError` saying ``why`` with the tail of ``logfile`` (default: the
    supervisor's)."""
    sd = state_dir(settings)
    _signal(sup, signal.SIGTERM)
    _wait_gone([ProcessInfo("supervisor", sup, "", "")], 25.0)
    down(settings)
    logf = Path(logfile) if logfile else sd / "supervisor.log"
    tail = logf.read_text()[-2000:] if logf.exists() else ""
    raise ClusterError(f"cluster did not become ready ({why}); logs in {sd}\n{tail}")


#: Seconds one probe of every partition may take before ``up`` tries again, and between
#: two "not serving yet" progress lines.
PROBE_ATTEMPT = 5.0
PROBE_SAY_EVERY = 5.0
#: The keys the probe reads (``PROBE_KEY`` + a number): whether an app has them or not, the
#: answer (None for a missing key) proves the worker serves.
PROBE_KEY = "sfaas-up-probe-"


class ReadProbe:
    """Up means up: whether a client's call would succeed now.

    The coordinator writes its ready file once every worker joined, but a worker serves
    reads and calls only from its first epoch on (``WorkerState.reads_open``), and a client
    finds it through the coordinator's placement, empty until every member is alive. So
    ``up`` then reads a key (:data:`PROBE_KEY`) of ``operator`` from every partition's owner,
    the way a client does (``sfaas.reads``: the placement from the coordinator, the read
    over the owner's authenticated channel). A direct read writes no Kafka record — a test
    reading the ingress topic back sees no probe. No setting turns the workers' reads off
    (``direct_calls`` is a client's choice of path for its calls), so the probe runs for
    every app with an operator; ``operator`` None: it passes at once.

    ``reads``: makes the client side of one attempt (the seam tests fake).
    """

    def __init__(self, settings: Settings, app: str, operator: str | None,
                 reads: Callable[[Settings, str], DirectReads] | None = None) -> None:
        self._settings = settings
        self._app = app
        self._operator = operator
        self._reads = reads
        #: what did not answer the last attempt ("" once every partition's owner answered)
        self.lacking = "nothing tried yet"
        #: whether an attempt ran (``operator`` None: never)
        self.tried = False
        #: partitions whose owners answered (0 until an attempt succeeded)
        self.partitions = 0

    def serving(self, timeout: float) -> bool:
        """One attempt, bounded by ``timeout`` seconds: whether every partition's owner
        answered (else :attr:`lacking` says what did not)."""
        if self._operator is None:
            return True
        self.tried = True
        self.lacking = asyncio.run(self._attempt(self._operator, timeout))
        return not self.lacking

    async def _attempt(self, operator: str, timeout: float) -> str:
        from sfaas.reads import DirectReads, Unavailable

        reads = (self._reads or DirectReads)(self._settings, self._app)
        asking = f"the coordinator at {self._settings.coordinator}"
        try:
            async with asyncio.timeout(timeout):
                placement = await reads.where(fresh=True)
                if not placement.owners:
                    return f"{asking} has no placement yet (a worker not alive, or a recovery)"
                for p, key in enumerate(_probe_keys(operator, len(placement.owners))):
                    peer = placement.peers[placement.owners[p]]
                    asking = (f"worker {placement.owners[p]} at {peer.host}:{peer.port} "
                              f"(partition {p})")
                    try:
                        answered, _ = await reads.read(operator, p, key)
                    except TransactionAborted:
                        answered = True  # an error the worker named: it serves
                    if not answered:
                        return f"{asking} did not answer a read: {reads.why_not}"
                self.partitions = len(placement.owners)
                return ""
        except TimeoutError:
            return f"{asking} did not answer within {timeout:.1f} s"
        except (Unavailable, SfaasError, OSError) as exc:  # e.g. no coordinator to ask
            return f"{asking}: {type(exc).__name__}: {exc}"
        finally:
            await reads.close()


def _probe_keys(operator: str, partitions: int) -> list[str]:
    """One :data:`PROBE_KEY` key of ``operator`` in each of ``partitions`` partitions
    (the n-th in partition n)."""
    from sfaas.runtime.partitioning import partition_of

    keys: dict[int, str] = {}
    i = 0
    while len(keys) < partitions:
        keys.setdefault(partition_of(operator, f"{PROBE_KEY}{i}", partitions), f"{PROBE_KEY}{i}")
        i += 1
    return [keys[p] for p in range(partitions)]


def _ready(path: Path) -> bool:
    """Whether the coordinator's ready file says every worker is ready and no recovery is
    under way (a restarted cluster first recovers); :class:`ClusterError` if its recovery
    stopped retrying (the cluster stays up for its status page; 'sfaas down' stops it)."""
    try:
        doc = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return False
    if doc.get("recovery_stopped"):
        raise ClusterError(f"{doc['recovery_stopped']}. The cluster is still running so its "
                           f"status page and logs ({path.parent}) show it; stop it with "
                           "'sfaas down'")
    return not doc.get("recovering")


def ps(settings: Settings) -> list[ProcessInfo]:
    """The local cluster's processes and whether each is alive."""
    sd = state_dir(settings)
    try:
        info = json.loads((sd / "cluster.json").read_text())
    except FileNotFoundError:
        return []
    addresses: dict[int, str] = {}
    slots: dict[int, tuple[str, int]] = {}  # pid → (role, index) as the coordinator sees it now
    stopped = ""
    try:
        members = json.loads((sd / "ready").read_text())
        stopped = str(members.get("recovery_stopped") or "")
        addresses = {w["pid"]: w["address"] for w in members.get("workers", [])}
        slots = {w["pid"]: ("worker", w["index"]) for w in members.get("workers", [])}
        slots.update({sb["pid"]: ("standby", sb["of"]) for sb in members.get("standbys", [])})
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        pass
    out = []
    for p in info.get("processes", []):
        address = info.get("coordinator", "") if p["role"] == "coordinator" else ""
        proc = ProcessInfo(p["role"], p["pid"], address,
                           p["log"], index=p.get("index", 0), restarts=p.get("restarts", 0),
                           gave_up=p.get("gave_up", ""), metrics=p.get("metrics", ""))
        if proc.role == "coordinator" and stopped and not proc.gave_up:
            proc.gave_up = stopped
        proc.address = proc.address or addresses.get(proc.pid, "")
        if proc.role == "worker" and proc.pid in slots:
            proc.role, proc.index = slots[proc.pid]
        proc.alive = bool(proc.pid) and _alive(proc.pid)
        out.append(proc)
    order = {"coordinator": 0, "worker": 1, "standby": 2}
    return sorted(out, key=lambda p: (order.get(p.role, 3), p.index))


def status_url(settings: Settings, required: bool = False) -> str:
    """The URL of the running cluster's status page (served by its coordinator); empty
    (or, if ``required``, :class:`ClusterError`) when there is none."""
    coords = [p for p in ps(settings) if p.role == "coordinator"]
    if not coords:
        if required:
            raise ClusterError(f"no local cluster in {state_dir(settings)} "
                               "(start one with 'sfaas up MODULE:APP')")
        return ""
    if not coords[0].metrics:
        if required:
            raise ClusterError("the local cluster runs without metrics "
                               "('sfaas up --metrics-port 0'): "
                               "the status page is served on the coordinator's metrics port")
        return ""
    return coords[0].metrics.removesuffix("metrics")


def scale(settings: Settings, workers: int, timeout: float = 600.0) -> str:
    """Rescale the local cluster to ``workers`` workers; returns the coordinator's summary.

    The supervisor starts the missing worker processes (a scale-up); the coordinator moves
    partitions by shipping their stores and switches at an epoch boundary
    (``coordinator.protocols.rescale``), retiring surplus workers (a scale-down). Epochs go on
    meanwhile; they pause only for the switch. A cluster started with ``standbys`` R runs
    ``workers × (1 + R)`` worker processes: a new worker comes with R standbys, and a
    retired one's standbys retire with it.
    """
    import asyncio

    from sfaas.runtime import channels, wire

    if workers < 1:
        raise ClusterError(f"workers must be >= 1, got {workers}")
    info, s = cluster_settings(settings)
    sup = supervisor_pid(settings)
    if sup is None:
        raise ClusterError("the local cluster's supervisor is not running "
                           f"(state in {state_dir(settings)})")

    standbys = int(info.get("standbys", 0))
    sd = state_dir(settings)

    def tell_supervisor() -> None:
        # (the supervisor counts processes: each worker's standbys are worker processes too)
        (sd / "workers.tmp").write_text(str(workers * (1 + standbys)))
        os.replace(sd / "workers.tmp", sd / "workers")
        _signal(sup, signal.SIGHUP)

    async def ask() -> wire.Scaled:
        host, port = s.coordinator_address()
        chan = await channels.connect(host, port, s.shared_secret())
        try:
            chan.send(wire.Scale(workers))
            msgs = await asyncio.wait_for(chan.recv(), timeout)
        finally:
            chan.close()
        if not msgs or not isinstance(msgs[0], wire.Scaled):
            raise ClusterError(f"unexpected answer from the coordinator: {msgs!r:.200}")
        return msgs[0]

    # refused at once (bad input) before any process starts: ask first, start after
    answer: dict[str, wire.Scaled] = {}

    async def run() -> None:
        task = asyncio.create_task(ask())
        await asyncio.sleep(0.2)
        if not task.done():
            tell_supervisor()  # it starts the joining processes
        answer["a"] = await task

    try:
        asyncio.run(run())
    except (OSError, TimeoutError) as exc:
        raise ClusterError(f"rescaling to {workers} workers: {type(exc).__name__}: {exc}") from None
    a = answer["a"]
    if not a.ok:
        raise ClusterError(f"rescale to {workers} workers refused: {a.detail}")
    tell_supervisor()  # (after a scale-down: the count it keeps)
    return a.detail


def supervisor_pid(settings: Settings) -> int | None:
    """The pid of the local cluster's supervisor, if it runs."""
    try:
        pid = json.loads((state_dir(settings) / "cluster.json").read_text()).get("supervisor")
    except (FileNotFoundError, ValueError):
        return None
    return pid if isinstance(pid, int) and _alive(pid) else None


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
    sup = supervisor_pid(settings)
    if sup is not None:  # it stops its children (coordinator first) and exits
        _signal(sup, signal.SIGTERM)
        _wait_gone([ProcessInfo("supervisor", sup, "", "")], timeout + 10.0)
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
