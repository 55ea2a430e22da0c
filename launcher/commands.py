"""The ``sfaas`` command: services, processes, a local cluster, calls and the demo.

Every flag has an ``SFAAS_*`` environment variable (see :mod:`sfaas.runtime.settings`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from launcher import alive, ready, replay
from launcher.stalls import StallWatch
from sfaas.errors import (
    EXIT_RECOVERY_STOPPED,
    EXIT_RETIRED,
    EXIT_START_AGAIN,
    RecoveryStopped,
    SfaasError,
    StartAgain,
    TransactionAborted,
)
from sfaas.runtime import tracing
from sfaas.runtime.settings import Settings

__all__ = ["main"]

log = logging.getLogger("launcher")



class SubParsers(Protocol):
    """What the commands' builders use of ``ArgumentParser.add_subparsers()``'s result
    (argparse names its type only privately)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kafka", help="Kafka bootstrap servers (SFAAS_KAFKA)")
    p.add_argument("--namespace", help="topic/cluster namespace (SFAAS_NAMESPACE)")
    p.add_argument("--log-level", dest="log_level", help="logging level (SFAAS_LOG_LEVEL)")


def _metrics_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", dest="metrics_port", type=int,
                   help="serve /metrics (and, on the coordinator, the status page) on this port, "
                        "0 = off (SFAAS_METRICS_PORT)")


def _rounds_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--snapshot-interval", dest="snapshot_interval", type=float,
                   help="seconds between snapshot rounds, 0 = off (SFAAS_SNAPSHOT_INTERVAL)")
    p.add_argument("--snapshot-retain", dest="snapshot_retain", type=int,
                   help="complete rounds kept in MinIO (SFAAS_SNAPSHOT_RETAIN)")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sfaas", description="Transactional stateful functions.")
    sub = ap.add_subparsers(dest="command", required=True)
    _process_commands(sub)  # (in this order: it is the order of `sfaas --help`)
    _cluster_commands(sub)
    _client_commands(sub)
    return ap


def _process_commands(sub: SubParsers) -> None:
    """``services``, ``coordinator``, ``worker``, ``up``: what starts processes."""
    sv = sub.add_parser("services", help="local Kafka and MinIO (and Jaeger) as background "
                                         "processes")
    sv.add_argument("action", choices=["up", "down", "status"])
    sv.add_argument("--no-kafka", action="store_true", help="leave Kafka alone")
    sv.add_argument("--no-minio", action="store_true", help="leave MinIO alone")
    sv.add_argument("--tracing", action="store_true",
                    help="up: Jaeger too (OTLP on 127.0.0.1:4317/4318, its UI on :16686)")

    c = sub.add_parser("coordinator", help="run a coordinator in the foreground")
    _common(c)
    c.add_argument("--app", help="MODULE:APP (SFAAS_APP)")
    c.add_argument("--listen", dest="coordinator",
                   help="host:port to listen on (SFAAS_COORDINATOR)")
    c.add_argument("--workers", type=int, help="workers to wait for (SFAAS_WORKERS)")
    c.add_argument("--partitions", type=int, help="topic partitions (SFAAS_PARTITIONS)")
    _rounds_flags(c)
    _metrics_flag(c)

    w = sub.add_parser("worker", help="run a worker in the foreground")
    _common(w)
    w.add_argument("--app", help="MODULE:APP (SFAAS_APP)")
    w.add_argument("--coordinator", help="coordinator host:port (SFAAS_COORDINATOR)")
    w.add_argument("--host", help="host to listen on for peers (SFAAS_HOST)")
    w.add_argument("--port", type=int, help="peer port, 0 = any (SFAAS_PORT)")
    w.add_argument("--store", help="override every operator's store engine (SFAAS_STORE)")
    w.add_argument("--max-batch", dest="max_batch", type=int,
                   help="requests per epoch (SFAAS_MAX_BATCH)")
    w.add_argument("--name", help="worker name in logs")
    w.add_argument("--standby-of", dest="standby_of", type=int,
                   help="be a standby of this worker index (SFAAS_STANDBY_OF)")
    _metrics_flag(w)

    u = sub.add_parser("up", help="start a local cluster in the background")
    _common(u)
    u.add_argument("app", help="MODULE:APP, e.g. examples.bank:app")
    u.add_argument("--workers", type=int, default=2)
    u.add_argument("--standbys", type=int, default=0,
                   help="standby workers per worker: each follows its primary's stores and "
                        "takes over without a download")
    u.add_argument("--partitions", type=int)
    u.add_argument("--store", help="override every operator's store engine")
    _rounds_flags(u)
    u.add_argument("--metrics-port", dest="metrics_port", type=int,
                   help="the coordinator's /metrics and status page on this port, the workers' "
                        "on the next ones; 0 = off (default: free ports, see 'sfaas ps'; "
                        "SFAAS_METRICS_PORT)")


def _cluster_commands(sub: SubParsers) -> None:
    """``status``, ``snapshots``, ``alive``, ``ready``, ``replay``, ``supervise``, ``ps``,
    ``scale``, ``down``: what looks at or changes a cluster."""
    st = sub.add_parser("status",
                        help="print (and open) the URL of the running cluster's status page")
    st.add_argument("--namespace")
    st.add_argument("--no-browser", dest="browser", action="store_false", help="only print the URL")

    sn = sub.add_parser("snapshots", help="list the complete snapshot rounds in MinIO")
    _common(sn)
    sn.add_argument("--app", dest="app_name",
                    help="app name (default: the running local cluster's)")
    sn.add_argument("--json", action="store_true", help="machine-readable output")

    alive.add_arguments(sub.add_parser("alive", help=alive.HELP))
    ready.add_arguments(sub.add_parser("ready", help=ready.HELP))

    rp = sub.add_parser("replay", help=replay.HELP)
    _common(rp)
    replay.add_arguments(rp)

    sp = sub.add_parser("supervise", help=argparse.SUPPRESS)  # started by `sfaas up`
    sp.add_argument("--state-dir", dest="state_dir", required=True)
    sp.add_argument("--workers", type=int, required=True)

    p = sub.add_parser("ps", help="list the local cluster's processes")
    p.add_argument("--namespace")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    sc = sub.add_parser("scale",
                        help="rescale the local cluster: move partitions to M workers under load")
    sc.add_argument("--workers", type=int, required=True, help="workers to run")
    sc.add_argument("--namespace")

    d = sub.add_parser("down", help="stop the local cluster")
    d.add_argument("--namespace")


def _client_commands(sub: SubParsers) -> None:
    """``call``, ``gateway``, ``state``, ``demo``: what talks to an app."""
    cl = sub.add_parser("call", help="call a function through Kafka and print the result as JSON")
    _common(cl)
    cl.add_argument("--app", dest="app_name",
                    help="app name (default: the running local cluster's)")
    cl.add_argument("--timeout", type=float, default=30.0)
    cl.add_argument("--idempotency-key", dest="idempotency_key",
                    help="a retry with the same key gets the first outcome without running again")
    cl.add_argument("operator")
    cl.add_argument("key")
    cl.add_argument("function")
    cl.add_argument("args", nargs="*", help="arguments, each as JSON (bare words are strings)")

    gw = sub.add_parser("gateway", help="serve the app over HTTP/JSON (calls, state reads, "
                                         "/openapi.json) through one Kafka client")
    _common(gw)
    gw.add_argument("--app", help="MODULE:APP (SFAAS_APP)")
    gw.add_argument("--listen", help="host:port to serve HTTP on; beyond loopback it needs "
                                     "SFAAS_GATEWAY_TOKEN (SFAAS_GATEWAY_LISTEN)")
    gw.add_argument("--bootstrap", dest="kafka",
                    help="Kafka bootstrap servers, like --kafka (SFAAS_KAFKA)")
    gw.add_argument("--max-in-flight", dest="max_in_flight", type=int,
                    help="requests at once; one more gets 429 (SFAAS_GATEWAY_MAX_IN_FLIGHT)")
    gw.add_argument("--timeout", type=float,
                    help="seconds to wait for a reply before 504 (SFAAS_GATEWAY_TIMEOUT)")
    gw.add_argument("--metrics-port", dest="metrics_port", type=int,
                    help="also serve /metrics on this port (it is always on the HTTP port; "
                         "0 or the HTTP port: nothing more) (SFAAS_METRICS_PORT)")

    sr = sub.add_parser("state", help="read committed state without a transaction, as JSON")
    _common(sr)
    sr.add_argument("--app", dest="app_name",
                    help="app name (default: the running local cluster's)")
    sr.add_argument("--timeout", type=float, default=30.0)
    srs = sr.add_subparsers(dest="read", required=True)
    g = srs.add_parser("get", help="one key's value (null: none)")
    g.add_argument("operator")
    g.add_argument("key")
    sc = srs.add_parser("scan", help="[key, value] pairs in key order")
    sc.add_argument("operator")
    sc.add_argument("--prefix", default="")
    sc.add_argument("--limit", type=int, default=100)

    dm = sub.add_parser(
        "demo", help="services up, a 2-worker bank cluster under load, a summary, all stopped")
    dm.add_argument("--seconds", type=float, default=10.0)
    dm.add_argument("--rate", type=float, default=1000.0, help="offered transactions per second")
    dm.add_argument("--accounts", type=int, default=1000)
    dm.add_argument("--store", default="hybridlog")
    dm.add_argument("--keep", action="store_true", help="leave services running afterwards")
    dm.add_argument("--no-chaos", dest="chaos", action="store_false",
                    help="do not kill a worker midway "
                         "(by default one is SIGKILLed and the cluster recovers)")


def _settings(ns: argparse.Namespace, *names: str) -> Settings:
    return Settings.load({n: getattr(ns, n, None) for n in names})


def _setup_logging(level: str, log_format: str = "text") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if log_format == "json":
        from sfaas.runtime.jsonlog import JsonLines

        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonLines())


def _observe(s: Settings, process: str) -> None:
    """The process's logging and tracing (``sfaas.runtime.tracing``), as its settings say."""
    _setup_logging(s.log_level, s.log_format)
    tracing.setup(s, process)


#: Threads of libuv's pool, which runs every name lookup of a uvloop process
#: (``UV_THREADPOOL_SIZE``, unless the environment sets it). libuv's default is 4: a
#: stopped broker's name lookup hangs for the resolver's timeout (5 s in the nemesis), and
#: every Kafka client reconnecting to it holds a thread — four such lookups queued every
#: other lookup behind them, the probes of the live brokers too
#: (``sfaas.runtime.kafka.Reachability``), and the coordinator replaced healthy workers as
#: "cut from Kafka for 5.3 s" (nemesis seed 3). A thread waiting on a lookup costs no CPU.
RESOLVER_THREADS = 64


def size_resolver_pool() -> None:
    """Give libuv's thread pool :data:`RESOLVER_THREADS` threads (before the loop's first
    use of it: the pool is sized once, at its first task)."""
    os.environ.setdefault("UV_THREADPOOL_SIZE", str(RESOLVER_THREADS))


def _run_service(coro_factory: Any, settings: Settings | None = None) -> int:
    """Run a service's coroutine until it ends or a signal stops it; with ``settings``,
    touch the process's liveness file from its loop meanwhile (``sfaas.runtime.liveness``)."""
    size_resolver_pool()
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency
        runner = asyncio.run

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        beat = None
        watch = StallWatch(loop, max(0.5, settings.heartbeat_timeout / 2 if settings else 0))
        watch.start()
        if settings is not None:
            from sfaas.runtime import liveness

            path, every = (liveness.alive_path(settings.home, settings.alive_file),
                           settings.heartbeat_timeout / 4)
            beat = loop.create_task(liveness.touch_forever(path, every), name="liveness")
        try:
            await coro_factory()
        except asyncio.CancelledError:
            log.info("stopped by signal")
        except SystemExit as exc:
            if beat is not None and exc.code == EXIT_RETIRED:  # (the rest of its exit is no stall)
                liveness.touch_while_exiting(path, every)
            raise
        finally:
            watch.stop()
            if beat is not None:
                beat.cancel()

    runner(main())
    return 0


def _parse_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sfaas`` console script."""
    ns = _parser().parse_args(argv)
    try:
        return _dispatch(ns)
    except TransactionAborted as exc:
        print(f"aborted ({exc.error_type}): {exc.reason}", file=sys.stderr)
        return 1
    except RecoveryStopped as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_RECOVERY_STOPPED
    except StartAgain as exc:  # (the supervisor restarts it without counting a crash)
        print(f"error: {exc}; starting again", file=sys.stderr)
        return EXIT_START_AGAIN
    except SfaasError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _say(message: str) -> None:
    """Progress of long set-up steps (first-run builds take minutes), on stderr."""
    print(message, file=sys.stderr, flush=True)


def _dispatch(ns: argparse.Namespace) -> int:
    if ns.command == "alive":  # (launcher.main runs it before importing this module)
        return alive.probe(ns.alive_file, ns.max_age)
    return _COMMANDS[ns.command](ns)


def _services(ns: argparse.Namespace) -> int:
    from launcher import services

    kw = {"kafka": not ns.no_kafka, "minio": not ns.no_minio}
    if ns.action == "up":
        ep = services.up(**kw, tracing=ns.tracing, progress=_say)
        print(f"kafka  {ep.kafka_bootstrap}\n"
              f"minio  {ep.minio_endpoint} (access key {ep.minio_access_key})")
        if ns.tracing:
            print(f"jaeger {ep.jaeger_url} (OTLP {ep.otlp_endpoint}: "
                  f"SFAAS_TRACING=1 OTEL_EXPORTER_OTLP_ENDPOINT={ep.otlp_endpoint})")
    elif ns.action == "down":
        services.down(**kw, progress=_say)
    else:
        for name, st in services.status().items():
            if st.get("running"):
                state = "running"
            else:
                state = "reachable" if st.get("reachable") else "stopped"
            print(f"{name:6} {state:9} {st.get('endpoint')} pid={st.get('pid')}")
    return 0


def _coordinator(ns: argparse.Namespace) -> int:
    s = _settings(ns, "kafka", "namespace", "log_level", "app", "coordinator", "workers",
                  "partitions", "snapshot_interval", "snapshot_retain", "metrics_port")
    _observe(s, "coordinator")
    from coordinator.service import run_coordinator
    from sfaas.app import load_app

    app = load_app(s.app)
    return _run_service(lambda: run_coordinator(s, app.name), s)


def _worker(ns: argparse.Namespace) -> int:
    s = _settings(ns, "kafka", "namespace", "log_level", "app", "coordinator", "host", "port",
                  "store", "max_batch", "standby_of", "metrics_port")
    _observe(s, ns.name or "worker")
    from sfaas.app import load_app
    from worker.service import run_worker

    app = load_app(s.app)
    return _run_service(lambda: run_worker(s, app, ns.name), s)


def _up(ns: argparse.Namespace) -> int:
    from launcher import cluster

    s = _settings(ns, "kafka", "namespace", "log_level", "partitions", "store",
                  "snapshot_interval", "snapshot_retain", "metrics_port")
    chosen = ns.metrics_port is not None or bool(os.environ.get("SFAAS_METRICS_PORT"))
    procs = cluster.up(s, ns.app, ns.workers, standbys=ns.standbys,
                       metrics_port=s.metrics_port if chosen else None, progress=_say)
    for p in procs:
        print(f"{p.role:12} pid={p.pid:<8} {p.address}")
    page = cluster.status_url(s)
    if page:
        print(f"status page  {page}  (sfaas status)")
    return 0


def _status(ns: argparse.Namespace) -> int:
    from launcher import cluster

    url = cluster.status_url(_settings(ns, "namespace"), required=True)
    print(url)
    if ns.browser:
        import webbrowser

        webbrowser.open(url)
    return 0


def _supervise(ns: argparse.Namespace) -> int:
    from launcher.supervisor import supervise

    _setup_logging("INFO")
    return supervise(ns.state_dir, ns.workers)


def _ps(ns: argparse.Namespace) -> int:
    from launcher import cluster

    procs = cluster.ps(_settings(ns, "namespace"))
    if ns.json:
        from dataclasses import asdict

        print(json.dumps([asdict(p) for p in procs], indent=2))
    elif not procs:
        print("no local cluster")
    else:
        print(f"{'ROLE':12} {'INDEX':5} {'PID':8} {'ALIVE':6} {'RESTARTS':8} {'ADDRESS':22} "
              "METRICS")
        for p in procs:
            gave_up = f"  GAVE UP: {p.gave_up}" if p.gave_up else ""
            print(f"{p.role:12} {p.index:<5} {p.pid:<8} {'yes' if p.alive else 'no':6} "
                  f"{p.restarts:<8} {p.address or '-':22} {p.metrics or '-'}" + gave_up)
    return 0


def _down(ns: argparse.Namespace) -> int:
    from launcher import cluster

    procs = cluster.down(_settings(ns, "namespace"))
    print(f"stopped {len(procs)} process(es)" if procs else "no local cluster")
    return 0


def _scale(ns: argparse.Namespace) -> int:
    from launcher import cluster

    _say(f"rescaling to {ns.workers} workers "
         "(partitions move by shipping their stores; epochs go on)")
    print(cluster.scale(_settings(ns, "namespace"), ns.workers))
    return 0


def _gateway(ns: argparse.Namespace) -> int:
    from gateway.service import run_gateway
    from gateway.settings import GatewaySettings
    from sfaas.app import load_app

    s = _settings(ns, "kafka", "namespace", "log_level", "app", "metrics_port")
    gws = GatewaySettings.load({"listen": ns.listen, "max_in_flight": ns.max_in_flight,
                                "timeout": ns.timeout})
    _observe(s, "gateway")
    return run_gateway(load_app(s.app), s, gws)


def _demo(ns: argparse.Namespace) -> int:
    from launcher.demo import run_demo

    return run_demo(seconds=ns.seconds, rate=ns.rate, accounts=ns.accounts, store=ns.store,
                    keep=ns.keep, chaos=ns.chaos)


def _client_target(ns: argparse.Namespace) -> tuple[str, Settings]:
    """The app name and settings a ``call``/``state`` command talks to."""
    from launcher import cluster

    s = _settings(ns, "kafka", "namespace", "log_level")
    app_name = ns.app_name
    if app_name is None:
        info, _ = cluster.cluster_settings(s)
        app_name = info["app"]
        s = Settings.load({"kafka": ns.kafka or info["kafka"], "namespace": info["namespace"]})
    return app_name, s


def _state(ns: argparse.Namespace) -> int:
    from sfaas.client import Client

    app_name, s = _client_target(ns)

    async def go() -> Any:
        async with Client(app_name, settings=s, timeout=ns.timeout) as client:
            if ns.read == "get":
                return await client.get(ns.operator, ns.key)
            return [list(kv) for kv in await client.scan(ns.operator, ns.prefix, ns.limit)]

    print(json.dumps(asyncio.run(go())))
    return 0


def _call(ns: argparse.Namespace) -> int:
    from sfaas.client import Client

    app_name, s = _client_target(ns)

    async def go() -> Any:
        async with Client(app_name, settings=s, timeout=ns.timeout) as client:
            return await client.call(ns.operator, ns.key, ns.function, *map(_parse_arg, ns.args),
                                     idempotency_key=ns.idempotency_key)

    print(json.dumps(asyncio.run(go())))
    return 0


def _snapshots(ns: argparse.Namespace) -> int:
    import time

    from launcher import cluster
    from sfaas.runtime.protocols.rounds import Rounds
    from sfaas.runtime.state import rounds_remote

    s = _settings(ns, "kafka", "namespace", "log_level")
    app_name = ns.app_name
    if app_name is None:
        app_name = cluster.cluster_settings(s)[0]["app"]
    rounds = Rounds(rounds_remote(s, app_name))
    try:
        manifests = [rounds.read(r) for r in rounds.ids()]
    except Exception as exc:  # RemoteError, RoundError: both name the remote
        raise SfaasError(f"cannot list the snapshot rounds of app {app_name!r}: {exc}") from None
    if ns.json:
        print(json.dumps([{
            "round": m.round, "epoch": m.epoch, "created": m.created,
            "publish_seconds": m.created - m.started,
            "bytes_uploaded": m.bytes_uploaded, "bytes_total": m.total_bytes, "files": m.files,
            "partitions": sorted({st.partition for st in m.stores}), "stores": len(m.stores),
            "ingress": m.ingress,
        } for m in manifests], indent=2))
    elif not manifests:
        print(f"no complete snapshot round of app {app_name!r} in namespace {s.namespace!r}")
    else:
        print(f"{'ROUND':>6} {'TIME (UTC)':20} {'EPOCH':>8} {'UPLOADED':>10} {'TOTAL':>10} "
              f"{'FILES':>6} PARTITIONS")

        for m in manifests:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m.created))
            parts = sorted({st.partition for st in m.stores})
            print(f"{m.round:>6} {when:20} {m.epoch:>8} {m.bytes_uploaded / 1e6:>8.2f}MB "
                  f"{m.total_bytes / 1e6:>8.2f}MB {m.files:>6} {','.join(map(str, parts))}")
    return 0


#: What each command runs (``alive`` aside: see ``_dispatch``).
_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "services": _services, "coordinator": _coordinator, "worker": _worker, "up": _up,
    "status": _status, "supervise": _supervise, "ps": _ps, "down": _down, "scale": _scale,
    "gateway": _gateway, "state": _state, "call": _call, "snapshots": _snapshots, "demo": _demo,
    "replay": replay.run, "ready": ready.run,
}


if __name__ == "__main__":
    raise SystemExit(main())
