"""``sfaas alive``: the liveness probe, on the standard library alone.

A container healthcheck or a Kubernetes ``livenessProbe`` runs it every few seconds in every
coordinator and worker container. Through the whole ``sfaas`` command it cost 0.7 s of CPU
per run (importing the runtime, aiokafka, msgpack): with seven containers probed every 5 s
that was half of a 2-core machine, taken from the processes it watches. Here it is one
``stat``: ``launcher`` runs this module before importing anything else.

The file is the one :mod:`sfaas.runtime.liveness` touches: ``$SFAAS_ALIVE_FILE``, else
``$SFAAS_HOME/alive`` (``SFAAS_HOME`` defaulting as ``Settings.home`` does).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

__all__ = ["main", "probe", "default_path"]

#: :data:`sfaas.runtime.liveness.ENV` (this module may not import the runtime)
ENV = "SFAAS_ALIVE_FILE"


def default_path() -> str:
    """The liveness file of this host's process (``sfaas.runtime.liveness.alive_path`` of
    the default settings' home)."""
    home = os.environ.get("SFAAS_HOME") or os.path.expanduser("~/.local/state/sfaas")
    return os.environ.get(ENV) or os.path.join(home, "alive")


def probe(path: str | None, limit: float) -> int:
    """0 if the liveness file is at most ``limit`` seconds old, 1 if older or missing, 2
    for a limit that is not a positive number."""
    if not limit > 0:
        print(f"error: --max-age must be a positive number of seconds, got {limit}",
              file=sys.stderr)
        return 2
    path = path or default_path()
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        print(f"not alive: no liveness file {path}", file=sys.stderr)
        return 1
    if age > limit:
        print(f"not alive: {path} was last touched {age:.1f} s ago (more than {limit:g} s)",
              file=sys.stderr)
        return 1
    print(f"alive: {path} touched {age:.1f} s ago")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's options (also on the full ``sfaas`` parser, for its help)."""
    p.add_argument("--max-age", dest="max_age", type=float, required=True,
                   help="seconds the liveness file may be old, e.g. 2 x heartbeat timeout + 1")
    p.add_argument("--file", dest="alive_file",
                   help="the liveness file (default: $SFAAS_ALIVE_FILE, else $SFAAS_HOME/alive)")


def main(argv: Sequence[str]) -> int:
    """``sfaas alive ARGS``."""
    p = argparse.ArgumentParser(prog="sfaas alive", description=HELP)
    add_arguments(p)
    ns = p.parse_args(list(argv))
    return probe(ns.alive_file, ns.max_age)


HELP = ("is this host's sfaas process alive? exit 0 if its liveness file is fresh, 1 if not "
        "(a liveness probe)")
