"""The ready file: the membership and the standbys, for ``sfaas ps`` and ``sfaas up``.

It is written once every worker is ready (its appearing tells ``sfaas up`` the cluster
runs), and again at every change of the membership or the standbys after that, and when
a recovery begins, ends or stops retrying (``recovering``, ``recovery_stopped``: ``sfaas
up`` waits for a restarted cluster's recovery, ``sfaas ps`` shows why one stopped).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from coordinator.snapshot import ClusterSnapshot

__all__ = ["ReadyFile"]


class ReadyFile:
    """Writes ``path`` ("" : nothing) from ``snapshot`` once :meth:`open` gave it the
    coordinator's address."""

    def __init__(self, path: str, snapshot: Callable[[], ClusterSnapshot]) -> None:
        self._path = path
        self._snapshot = snapshot
        self._address = ""

    def open(self, host: str, port: int) -> None:
        """Every worker is ready: write the file now and at every change from now on."""
        self._address = f"{host}:{port}"
        self.write()

    def write(self) -> None:
        """(Re)write the file, if it is open."""
        if not self._path or not self._address:
            return
        c = self._snapshot()
        members = [{"index": m.index, "name": m.name, "pid": m.pid, "address": m.address,
                    "alive": m.alive} for m in c.members]
        standbys = [{"of": sb.of, "name": sb.name, "pid": sb.pid, "following": sb.following}
                    for sb in c.standbys]
        doc = {"coordinator": self._address, "workers": members, "standbys": standbys,
               "promotions": c.promotions, "recovering": c.recovering,
               "recovery_stopped": c.recovery_stopped}
        tmp = self._path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self._path)
