"""The ports a process gets its outside world from (issue 51): Kafka, the object store,
the network, the clock, the disk its stores write to, the transport that ships its stores
to standbys and the process's own end.

A process is built with one :class:`Ports` value. :data:`REAL` fills every port with the
real implementation — aiokafka, MinIO, asyncio's TCP streams, the system clocks, the
stores' real ``statestores.FileSystem``, the ``tcp`` replica transport, ``os._exit`` — and is
what every process gets unless told otherwise; the simulator (``sfaas.sim``) fills them
with its simulated log, object store, in-memory network and virtual clock. The product
code reads its world through these and never asks which it got (no ``if simulated:``).

The network port gives byte streams only: :mod:`sfaas.runtime.channels` runs the shared
secret's handshake on top of whatever stream the port opened, on every path.

Parts receive the one port they use (``worker.clients.KafkaClients`` the Kafka port, the
coordinator's remotes the object port, ...), passed down from the ``Worker`` or
``Coordinator`` that was given the whole value. Code not handed a port yet (it lives in
rooms being changed meanwhile: ``worker/links.py``, ``worker/heartbeat.py``,
``coordinator/listener.py``, ``worker/protocols/*``) reaches the ports of its process
through :func:`current` — :data:`REAL` unless the process's tasks run in a
:func:`context` of other ports (the simulator runs each simulated process in one).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from remotes import Remote
    from sfaas.runtime.settings import Settings
    from statestores import FileSystem
    from statestores.replica import Follower, Shipper

__all__ = ["KafkaPort", "ObjectsPort", "NetworkPort", "ClockPort", "DiskPort", "ReplicaPort",
           "ReplicaServer", "Ports", "REAL", "AioKafka", "MinioObjects", "TcpNetwork",
           "SystemClock", "LocalDisk", "TcpReplicas", "current", "context", "Connected"]

#: A connection handler: what a server runs for each stream pair it accepts.
Connected = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class KafkaPort(Protocol):
    """aiokafka's three client classes, made with its keyword arguments, and a probe of a
    broker's address (``sfaas.runtime.kafka.Reachability``)."""

    def producer(self, **kwargs: Any) -> Any: ...

    def consumer(self, **kwargs: Any) -> Any: ...

    def admin(self, **kwargs: Any) -> Any: ...

    async def probe(self, host: str, port: int) -> None:
        """Return when ``host:port`` accepted a connection; raise ``OSError`` otherwise."""


class ObjectsPort(Protocol):
    """The object store: a :class:`remotes.Remote` on ``prefix`` of the settings' bucket."""

    def remote(self, settings: Settings, prefix: str) -> Remote: ...


class NetworkPort(Protocol):
    """Byte streams between processes (asyncio's ``open_connection``/``start_server``)."""

    async def open_connection(self, host: str,
                              port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...

    async def start_server(self, on_connect: Connected, host: str, port: int) -> Any:
        """A server (``close()``, ``sockets[0].getsockname()``) running ``on_connect``."""


class ClockPort(Protocol):
    """The clocks protocol decisions read: ``monotonic()`` for spans and deadlines,
    ``time()`` for wall time."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class DiskPort(Protocol):
    """The disk a process's stores write to: the file system they are opened with
    (``sfaas.runtime.state.open_stores``; the stores' seam, ``statestores.fs``)."""

    def file_system(self) -> FileSystem: ...


class ProcessPort(Protocol):
    """The process's end: a worker fenced or with a failed ingest leaves at once."""

    def exit(self, code: int) -> None:
        """End the process now with ``code``: nothing of it acts after this returns (the
        real one never returns)."""


class ReplicaServer(Protocol):
    """A primary's replication server: where its standbys reach it, and its end."""

    @property
    def address(self) -> tuple[str, int]: ...

    def close(self) -> None: ...


class ReplicaPort(Protocol):
    """Shipping a worker's stores to its standbys (``worker.replication``,
    ``worker.protocols.standby``): the primary's server of its ``Shipper`` s, and a
    standby's ``Follower`` of one store at such a server."""

    def serve(self, shippers: Callable[[str], Shipper | None], secret: str,
              host: str) -> ReplicaServer:
        """Serve the shippers ``shippers`` names on a free port of ``host``."""

    def follow(self, engine: str, directory: str, address: tuple[str, int], store: str,
               secret: str, **options: Any) -> Follower:
        """A replica in ``directory`` of the store ``store`` the server at ``address``
        ships (``options``: ``statestores.follow``'s)."""


@dataclass(frozen=True)
class Ports:
    """Where a process gets its outside world from (see the module docstring)."""

    kafka: KafkaPort
    objects: ObjectsPort
    network: NetworkPort
    clock: ClockPort
    process: ProcessPort
    #: (last, with a default: the ports made before it had a disk give the real one)
    disk: DiskPort = field(default_factory=lambda: LocalDisk())
    replica: ReplicaPort = field(default_factory=lambda: TcpReplicas())


class AioKafka:
    """The real Kafka port: aiokafka's classes."""

    def producer(self, **kwargs: Any) -> Any:
        from aiokafka import AIOKafkaProducer

        return AIOKafkaProducer(**kwargs)

    def consumer(self, **kwargs: Any) -> Any:
        from aiokafka import AIOKafkaConsumer

        return AIOKafkaConsumer(**kwargs)

    def admin(self, **kwargs: Any) -> Any:
        from aiokafka.admin import AIOKafkaAdminClient

        return AIOKafkaAdminClient(**kwargs)

    async def probe(self, host: str, port: int) -> None:
        _, writer = await asyncio.open_connection(host, port)
        writer.close()


class MinioObjects:
    """The real object port: a :class:`remotes.minio.MinioRemote` of the settings' MinIO."""

    def remote(self, settings: Settings, prefix: str) -> Remote:
        from remotes.minio import MinioRemote, RetryPolicy

        # a short retry budget: a round against a MinIO that is down fails within seconds
        # and is retried at the next interval, instead of stalling the uploader for minutes
        return MinioRemote(settings.minio, settings.minio_access_key, settings.minio_secret_key,
                           settings.bucket, prefix=prefix, retry=RetryPolicy(deadline=5.0))


class TcpNetwork:
    """The real network port: asyncio's TCP streams."""

    async def open_connection(self, host: str,
                              port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(host, port)

    async def start_server(self, on_connect: Connected, host: str, port: int) -> Any:
        return await asyncio.start_server(on_connect, host, port)


class SystemClock:
    """The real clock port: ``time.monotonic`` and ``time.time`` themselves (no call of
    ours in between: the lease reads the clock on every action, ``worker.fence``)."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)


class LocalDisk:
    """The real disk port: the operating system's files."""

    def file_system(self) -> FileSystem:
        from statestores import FileSystem

        return FileSystem()


class TcpReplicas:
    """The real replica port: the ``tcp`` transport (``statestores.replica.tcp``), a
    follower on a thread of its own."""

    def serve(self, shippers: Callable[[str], Shipper | None], secret: str,
              host: str) -> ReplicaServer:
        from statestores.replica import TcpServer

        return TcpServer(shippers, secret, host=host, port=0)

    def follow(self, engine: str, directory: str, address: tuple[str, int], store: str,
               secret: str, **options: Any) -> Follower:
        import statestores
        from statestores.replica import TcpSource

        source = TcpSource(address[0], address[1], store, secret)
        fol: Follower = statestores.follow(engine, directory, source, **options)
        return fol


class OsProcess:
    """The real process port: ``os._exit`` after flushing the logs (no clean stop: it
    would flush replies and commit offsets)."""

    def exit(self, code: int) -> None:
        for h in logging.getLogger().handlers + logging.getLogger("sfaas").handlers:
            try:
                h.flush()
            except Exception:  # noqa: S110 - leaving anyway
                pass
        sys.stderr.flush()
        os._exit(code)


#: The real world: what every process gets unless it is built with other ports.
REAL = Ports(kafka=AioKafka(), objects=MinioObjects(), network=TcpNetwork(),
             clock=SystemClock(), process=OsProcess(), disk=LocalDisk(), replica=TcpReplicas())

_CURRENT: contextvars.ContextVar[Ports] = contextvars.ContextVar("sfaas_ports", default=REAL)


def current() -> Ports:
    """The ports of the process the calling task belongs to (:data:`REAL` unless it runs
    in a :func:`context` of others)."""
    return _CURRENT.get()


def context(ports: Ports) -> contextvars.Context:
    """A copy of the current context in which :func:`current` is ``ports``: a process's
    root task created in it (``asyncio.create_task(coro, context=...)``), and every task
    that one creates, get ``ports``."""
    ctx = contextvars.copy_context()
    ctx.run(_CURRENT.set, ports)
    return ctx
