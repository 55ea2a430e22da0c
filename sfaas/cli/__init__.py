"""The ``sfaas`` command and the local-cluster tooling behind it.

Nothing here is part of what apps import: ``import sfaas`` never loads this package, and
this package imports the ``worker`` and ``coordinator`` services only inside the commands
that run them. Its rooms:

* :mod:`sfaas.cli.commands`   the argument parser and the command dispatch (``main``);
* :mod:`sfaas.cli.services`   Kafka and MinIO as local background processes;
* :mod:`sfaas.cli.cluster`    ``sfaas up`` / ``ps`` / ``down``: a local cluster;
* :mod:`sfaas.cli.supervisor` the process that starts and restarts the cluster's roles;
* :mod:`sfaas.cli.demo`       ``sfaas demo``; :mod:`sfaas.cli.loadgen` its open-loop load.
"""

from __future__ import annotations

from .commands import main

__all__ = ["main"]
