"""The ``sfaas`` command and the local-cluster tooling behind it.

Nothing here is part of what apps import: ``import sfaas`` never loads this package, and
this package imports the ``worker`` and ``coordinator`` services only inside the commands
that run them. Its rooms:

* :mod:`launcher.commands`   the argument parser and the command dispatch (``main``);
* :mod:`launcher.alive`      ``sfaas alive``, the liveness probe (the standard library only);
* :mod:`launcher.services`   Kafka and MinIO as local background processes;
* :mod:`launcher.cluster`    ``sfaas up`` / ``ps`` / ``down``: a local cluster;
* :mod:`launcher.replay`     ``sfaas replay``: a round's epochs re-run in this process;
* :mod:`launcher.supervisor` the process that starts and restarts the cluster's roles;
* :mod:`launcher.demo`       ``sfaas demo``; :mod:`launcher.loadgen` its open-loop load.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sfaas`` console script. ``sfaas alive`` runs before anything
    else is imported: a probe runs it every few seconds in every container."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["alive"]:
        from launcher.alive import main as alive

        return alive(args[1:])
    if args[:1] == ["spare"]:  # the supervisor's warm spare (``launcher.spare``)
        from launcher.spare import serve

        return serve(args[1:])
    from launcher.commands import main as run

    return run(argv)
