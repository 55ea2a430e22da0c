"""The ``sfaas`` command and the local-cluster tooling behind it.

Nothing here is part of what apps import: ``import sfaas`` never loads this package, and
this package imports the ``worker`` and ``coordinator`` services only inside the commands
that run them. Its rooms:

* :mod:`launcher.commands`   the argument parser and the command dispatch (``main``);
* :mod:`launcher.services`   Kafka and MinIO as local background processes;
* :mod:`launcher.cluster`    ``sfaas up`` / ``ps`` / ``down``: a local cluster;
* :mod:`launcher.supervisor` the process that starts and restarts the cluster's roles;
* :mod:`launcher.demo`       ``sfaas demo``; :mod:`launcher.loadgen` its open-loop load.
"""

from __future__ import annotations

from launcher.commands import main

__all__ = ["main"]
