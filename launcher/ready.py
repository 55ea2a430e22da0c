"""``sfaas ready``: whether a client's call would succeed now — a readiness probe.

The check ``sfaas up`` waits on (``launcher.cluster.ReadProbe``): a key of the app's first
operator is read from every partition's owner, the way a client reads (the placement from
the coordinator, the read over the owner's authenticated channel). A direct read writes
nothing to Kafka and touches no state, so the probe may run every few seconds. The Helm
chart's coordinator runs it as its readiness probe: the cluster's Service is ready only
once a call would succeed — not merely once every worker joined (its ready file), when
the workers may not serve yet.

Exit status: 0 when every partition's owner answered (one line on stdout); 1 when one did
not, or the coordinator has no placement yet (what lacked, on stderr); 2 on bad input (no
app, an app that does not import).
"""

from __future__ import annotations

import argparse
import sys

from sfaas.app import load_app
from sfaas.errors import ConfigError
from sfaas.runtime.settings import Settings

__all__ = ["HELP", "add_arguments", "run"]

HELP = ("exit 0 once a client's call would succeed: every partition's owner answers a read "
        "(a readiness probe)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``sfaas ready``."""
    p.add_argument("--app", help="MODULE:APP (SFAAS_APP): its first operator is read")
    p.add_argument("--coordinator", help="host:port of the coordinator (SFAAS_COORDINATOR)")
    p.add_argument("--namespace", help="topic/cluster namespace (SFAAS_NAMESPACE)")
    p.add_argument("--timeout", type=float, default=2.0,
                   help="seconds the whole check may take (default 2)")


def run(ns: argparse.Namespace) -> int:
    """One check (see the module docstring); the exit status."""
    from launcher.cluster import ReadProbe

    if ns.timeout <= 0:
        raise ConfigError(f"--timeout must be > 0 seconds, got {ns.timeout}")
    s = Settings.load({"app": ns.app, "coordinator": ns.coordinator,
                       "namespace": ns.namespace})
    if not s.app:
        raise ConfigError("sfaas ready needs the app: --app MODULE:APP or SFAAS_APP")
    app = load_app(s.app)
    operator = next(iter(app.operators), None)
    probe = ReadProbe(s, app.name, operator)
    if not probe.serving(ns.timeout):
        print(f"not ready: {probe.lacking}", file=sys.stderr)
        return 1
    if operator is None:
        print(f"ready: app {app.name!r} has no operator to read")
    else:
        print(f"ready: the owners of all {probe.partitions} partitions answered a read of "
              f"{operator!r} (coordinator {s.coordinator})")
    return 0
