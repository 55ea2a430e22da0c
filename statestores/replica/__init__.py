"""Replication: read-only replicas of a store, kept from its shipped edits.

The primary's :class:`Shipper` ships every version edit with the files the primary built
(runs with their footers, log files with their hints) and every completed snapshot's file
list; a :class:`Follower` installs them in order and never flushes, merges or indexes.
``follower.promote()`` turns the replica into a normal store without copying a file.

>>> import statestores
>>> from statestores.replica import Shipper, LocalSource
>>> db = statestores.open("lsm", "/tmp/primary")
>>> shipper = Shipper(db)
>>> replica = statestores.follow("lsm", "/tmp/replica", LocalSource(shipper))
"""

from __future__ import annotations

from .directory import discard
from .follower import Follower
from .path import PathSink, PathSource
from .rdma import RdmaServer, RdmaSource, check_device
from .shipper import SHIPPED_KINDS, Delivery, Shipper
from .source import LocalSource, Received, Source
from .tcp import TcpServer, TcpSource
from .wire import ProtocolError, ReplicationError

__all__ = [
    "Follower",
    "discard",
    "Shipper",
    "Delivery",
    "Source",
    "Received",
    "LocalSource",
    "TcpServer",
    "TcpSource",
    "PathSink",
    "PathSource",
    "RdmaServer",
    "RdmaSource",
    "check_device",
    "ReplicationError",
    "ProtocolError",
    "SHIPPED_KINDS",
]
