"""Running the gateway: one :class:`~sfaas.client.Client`, then uvicorn serving
:class:`~gateway.app.Gateway` until SIGINT/SIGTERM. ``/metrics`` is on the HTTP port, and
also on ``SFAAS_METRICS_PORT`` when that is set to another port (like every sfaas process).

The client connects before the port opens, so a gateway that answers has a cluster
connection; one whose Kafka cannot be reached exits with :class:`ClusterError` instead of
answering 503 to everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Iterator
from typing import Any

from gateway.app import Gateway
from gateway.settings import GatewaySettings
from gateway.values import dumps
from sfaas.app import App
from sfaas.client import Client
from sfaas.errors import ClusterError
from sfaas.runtime.metrics import HttpServer
from sfaas.runtime.settings import Settings

log = logging.getLogger("gateway")

__all__ = ["run_gateway", "serve"]

#: Seconds an idle keep-alive connection stays open.
KEEP_ALIVE_S = 5
#: Open connections (and requests) beyond ``max_in_flight`` that uvicorn accepts; above
#: ``max_in_flight + CONNECTION_ROOM`` it answers 503 itself. The room keeps idle keep-alive
#: connections, /healthz and /metrics from being turned away while /v1 is at its limit.
CONNECTION_ROOM = 1024


async def serve(app: App, settings: Settings, gw: GatewaySettings) -> None:
    """Serve ``app``'s gateway until the process is told to stop."""
    import uvicorn

    host, port = gw.address()
    # (the client gets the app's name, not the app: the gateway validates each request
    # against the app itself, once, before the client sees it)
    client = Client(app.name, settings=settings, timeout=gw.timeout,
                    max_in_flight=gw.max_in_flight)
    await client.start()
    try:
        gateway = Gateway(app, client, gw)
        try:
            sock = socket.create_server((host, port), family=_family(host), reuse_port=False)
        except OSError as exc:
            raise ClusterError(f"cannot listen on {gw.listen} (SFAAS_GATEWAY_LISTEN): "
                               f"{exc.strerror or exc}") from None
        config = uvicorn.Config(
            gateway.asgi, interface="asgi3", loop="none", http=_json_400_protocol(),
            lifespan="off", access_log=False, proxy_headers=False, log_config=None,
            server_header=False, date_header=False, timeout_keep_alive=KEEP_ALIVE_S,
            limit_concurrency=gw.max_in_flight + CONNECTION_ROOM)
        server = _server(config)
        extra = None
        if settings.metrics_port and settings.metrics_port != sock.getsockname()[1]:
            # like every sfaas process, /metrics on SFAAS_METRICS_PORT too
            extra = HttpServer(gateway.metrics.registry)
            await extra.start(host, settings.metrics_port)
        log.info("gateway of app %r on http://%s:%d (auth %s, max_in_flight %d, timeout %s s)",
                 app.name, host, sock.getsockname()[1], "on" if gw.token else "off",
                 gw.max_in_flight, gw.timeout)
        # what is alive now (modules, the app, the clients) lives as long as the process:
        # out of the collector's way, a full collection stays short (the p99's friend)
        gc.collect()
        gc.freeze()
        try:
            await server.serve(sockets=[sock])
        finally:
            if extra is not None:
                await extra.close()
        log.info("stopped")
    finally:
        await client.close()


def _server(config: Any) -> Any:
    """A uvicorn server that stops on SIGINT/SIGTERM and then returns (uvicorn's own raises
    the signal again once stopped, which would end the process before the client closes)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {sig: signal.signal(sig, self.handle_exit)
                        for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server(config)


def _json_400_protocol() -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, answering a request HTTP cannot parse (a garbage
    request line, an unknown method, raw control bytes in the target or a header) with a
    JSON 400 like every other refusal instead of its plain-text one."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    body = dumps({"error": "not a valid HTTP/1.1 request: its request line (method, target, "
                           "version) or a header could not be parsed", "type": "BadHttp"})

    class Protocol(HttpToolsProtocol):
        def send_400_response(self, msg: str) -> None:
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json"
                                 b"\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                                 % (len(body), body))
            self.transport.close()

    return Protocol


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def run_gateway(app: App, settings: Settings, gw: GatewaySettings) -> int:
    """The ``sfaas gateway`` command: serve until SIGINT/SIGTERM; the exit code."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        asyncio.run(serve(app, settings, gw))
    else:
        uvloop.run(serve(app, settings, gw))
    return 0
