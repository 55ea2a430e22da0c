"""A warm spare's own side (``launcher.spares`` is the supervisor's): ``python -m sfaas spare
ROLE`` imports what ROLE runs, waits for the supervisor's one line on its stdin, and becomes
the process it names — its output in the child's log, the environment the line adds, the
command run as ``python -m sfaas`` would have run it. Nothing but the supervisor writes to
that pipe, and the line is JSON, never pickle."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Sequence

from launcher.spares import IMPORTS

__all__ = ["serve"]


def serve(args: Sequence[str]) -> int:
    """``python -m sfaas spare ROLE``: import ROLE's code, wait for the supervisor's line,
    then run it (see the module docstring)."""
    if len(args) != 1 or args[0] not in IMPORTS:
        print(f"usage: sfaas spare {{{','.join(IMPORTS)}}} (started by the supervisor), "
              f"got {list(args)}", file=sys.stderr)
        return 2
    for module in IMPORTS[args[0]]:
        importlib.import_module(module)
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the supervisor went away, or stops its spares
    order = json.loads(line)
    argv, logfile, env = list(order["args"]), str(order["log"]), dict(order["env"])
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.update(env)
    sys.argv = [sys.argv[0], *argv]
    from launcher.commands import main

    return main(argv)
