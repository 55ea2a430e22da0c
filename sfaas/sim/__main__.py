"""``python -m sfaas.sim --app M:APP --seed N [--seconds S]``: one simulated cluster of the
app (``sfaas.sim.cluster``), its seed, outcome and trace digest (``--trace``: every line);
exit 1 when an invariant failed."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import logging
import sys
import time

from coordinator.service import Coordinator
from sfaas.app import App
from sfaas.sim import timed_faults
from sfaas.sim.cluster import Bank, Roles, simulate
from sfaas.sim.faults import DISK_KINDS, Disk, Jump, Schedule, Slow, Stale
from worker.service import Worker

#: the real processes (``python -m`` is the command: it may load the services)
ROLES = Roles(coordinator=Coordinator, worker=Worker)


def _load(ref: str) -> App:
    module, sep, name = ref.partition(":")
    if not sep or not module or not name:
        raise SystemExit(f"--app must be module:attribute (e.g. examples.bank:app), got {ref!r}")
    app = getattr(importlib.import_module(module), name)
    if not isinstance(app, App):
        raise SystemExit(f"{ref} is a {type(app).__name__}, not an sfaas.App")
    need = {"deposit", "transfer", "balance"}
    op = app.operators.get("accounts")
    if op is None or need - set(op.functions):
        raise SystemExit(f"{ref}: the bank workload needs an operator 'accounts' with the "
                         f"functions {sorted(need)} (as examples.bank:app)")
    return app


def _pair(text: str) -> tuple[float, float] | None:
    """``"AT,SECONDS"`` (SECONDS 1 when left out); None for ``""``."""
    if not text:
        return None
    at, _, seconds = text.partition(",")
    return float(at), float(seconds or 1.0)


def parser() -> argparse.ArgumentParser:
    """The command's flags."""
    p = argparse.ArgumentParser(prog="python -m sfaas.sim", description=__doc__)
    p.add_argument("--app", required=True, help="module:attribute of the App")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--seconds", type=float, default=60.0,
                   help="simulated seconds each phase may wait for its replies")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--transfers", type=int, default=200)
    p.add_argument("--accounts", type=int, default=Bank.accounts)
    p.add_argument("--rate", type=float, default=Bank.rate,
                   help="transfers sent per simulated second")
    p.add_argument("--idle", type=float, default=0.0,
                   help="simulated seconds the cluster idles before the balances")
    p.add_argument("--crash", metavar="AT,DOWN", default="",
                   help="worker 1 crashes AT simulated seconds in; a fresh one replaces it "
                        "DOWN seconds later (e.g. 2,1)")
    p.add_argument("--crash-coordinator", metavar="AT,DOWN", default="",
                   help="the coordinator crashes AT simulated seconds in; a fresh one starts "
                        "DOWN seconds later")
    p.add_argument("--cut", metavar="AT,FOR", default="",
                   help="worker 1 and the coordinator cut apart AT simulated seconds in, "
                        "healed FOR seconds later (e.g. 1,1)")
    p.add_argument("--cut-kafka", metavar="AT,FOR", default="",
                   help="worker 1 cut from every broker AT simulated seconds in, healed FOR "
                        "seconds later (e.g. 1,2)")
    p.add_argument("--outage", metavar="AT,FOR", default="",
                   help="Kafka unreachable AT simulated seconds in, for FOR seconds")
    p.add_argument("--stale", metavar="AT,FOR,TOPIC,PART,BEHIND", default="",
                   help="a stale leader answers TOPIC (epochs, in, out) partition PART, "
                        "BEHIND records short, AT seconds in for FOR seconds")
    p.add_argument("--slow", metavar="AT,FOR,A,B,EXTRA", default="",
                   help="the link between processes A and B (coordinator, worker-N) takes "
                        "EXTRA seconds more, in order, AT simulated seconds in for FOR "
                        "seconds (e.g. 0.5,1,worker-1,coordinator,0.8)")
    p.add_argument("--clock", metavar="AT,PROCESS,SECONDS", default="",
                   help="PROCESS's wall clock (time(), not monotonic()) jumps by SECONDS "
                        "(back when negative) AT simulated seconds in, and stays so "
                        "(e.g. 0.4,coordinator,-12.5)")
    p.add_argument("--disk", metavar="AT,WORKER,KIND", default="",
                   help="WORKER's disk (worker-N: its stores' file system) fails its first "
                        f"write at or after AT simulated seconds, KIND one of {DISK_KINDS} "
                        "(torn: a prefix written), and every call after it; the worker is "
                        "restarted over the same directory (e.g. 0.4,worker-1,torn)")
    p.add_argument("--kafka-errors", type=float, default=0.0, metavar="P",
                   help="each produce request times out with probability P")
    p.add_argument("--object-errors", type=float, default=0.0, metavar="P",
                   help="each object-store request fails with probability P; a call "
                        "retries it as MinioRemote does (6 tries, backoff)")
    p.add_argument("--rounds", type=float, default=None, metavar="S",
                   help="the snapshot interval in simulated seconds (default: 2.5 with "
                        "faults, none without; 0: none)")
    p.add_argument("--store", default="memonly",
                   help="the workers' store engine (memonly; hybridlog, appendlog, lsm: files "
                        "on a temp dir per process, background work on the loop)")
    p.add_argument("--standbys", type=int, default=0, metavar="N",
                   help="standby workers per worker (processes standby-N, following every "
                        "store of their primary; promoted when it dies); rounds on")
    p.add_argument("--trace", action="store_true", help="print every line of the trace")
    return p


def schedule(ns: argparse.Namespace) -> Schedule:
    """The fault schedule the flags ``ns`` give (``Schedule.args`` gives the flags back)."""
    return Schedule(crash=_pair(ns.crash), cut=_pair(ns.cut), outage=_pair(ns.outage),
                    stale=Stale.parse(ns.stale) if ns.stale else None,
                    kafka_errors=ns.kafka_errors, object_errors=ns.object_errors,
                    coordinator=_pair(ns.crash_coordinator), rounds=ns.rounds,
                    store=ns.store, slow=Slow.parse(ns.slow) if ns.slow else None,
                    clock=Jump.parse(ns.clock) if ns.clock else None,
                    disk=Disk.parse(ns.disk) if ns.disk else None, standbys=ns.standbys,
                    kafka_cut=_pair(ns.cut_kafka))


def main(argv: list[str] | None = None) -> int:
    p = parser()
    ns = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    app = _load(ns.app)
    try:
        sched = schedule(ns)
        timed_faults.check(sched, ns.workers)
    except ValueError as exc:
        p.error(str(exc))
    print(f"seed {ns.seed}" + (f" faults {sched}" if sched.faults() else ""))
    t0 = time.perf_counter()
    o = simulate(app, ROLES, ns.seed, seconds=ns.seconds, workers=ns.workers,
                 bank=Bank(accounts=ns.accounts, transfers=ns.transfers, rate=ns.rate,
                           idle=ns.idle),
                 schedule=sched, store=ns.store)
    wall = time.perf_counter() - t0
    if ns.trace:
        print("\n".join(o.trace))
    digest = hashlib.sha256("\n".join(o.trace).encode()).hexdigest()[:16]
    print(f"sent {o.sent}, answered {len(o.replies)} ({o.committed} committed, {o.aborted} "
          f"aborted), balances sum {sum(o.balances.values())}; {len(o.trace)} trace lines, "
          f"digest {digest}")
    print(f"{o.simulated_seconds:.2f} simulated s in {wall:.2f} wall s", file=sys.stderr)
    for v in o.violations:
        print(f"VIOLATION: {v}")
    return 1 if o.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
