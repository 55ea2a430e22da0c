"""Total CPU per transaction, A/B between git refs and against the offered load (issue 47).

    # interleaved A/B: main against a branch, medians of 3 pairs, ratio B/A per metric
    python benchmarks/runtime/cpu_ab.py --ref A=main --ref B=my-branch --rates 200,1000 \\
        --dist uniform,zipf --pairs 3 --seconds 20 --out /tmp/ab.jsonl
    # the CPU-vs-load curve, 100 TPS to saturation, per ref ("worktree": this checkout as it is)
    python benchmarks/runtime/cpu_ab.py --curve --ref main=main --ref new=worktree --plot /tmp/curve.png
    # the tables (and the plot) again from a run's JSON lines
    python benchmarks/runtime/cpu_ab.py --report /tmp/ab.jsonl

Each ref is checked out in a ``git worktree`` (in a temporary directory, removed at the
end) and each point runs in a subprocess started there (``cwd`` and ``PYTHONPATH`` the
worktree): the cluster it starts (``launcher.cluster.up`` spawns ``sys.executable -m
sfaas`` from its ``cwd``), the client and the load generator all run that ref's code; a
point checks this and fails otherwise. The measuring code (this file, ``bench.py`` and
``broker_requests.py``) is this checkout's, copied into every worktree, so both sides are
measured alike.

A point (``bench.one_point``: a fresh cluster, 2 s of warm-up, ``--seconds`` of open-loop
YCSB-T ``transfer``s) reports committed TPS, p50/p99 ms over every reply, and **total
CPU**: user + system seconds (psutil) of the coordinator, the workers and their children,
the supervisor, the Kafka broker and the client process (this point's process: the
``sfaas.Client`` and the load generator), as cores busy and µs per committed transaction.
MinIO's is reported apart. Then, on the same cluster, **broker requests per transaction**:
the broker's request logger at DEBUG (``broker_requests.py``), the requests it completed
in a window of the run counted from its log, only those on the connections the cluster's
processes and the client hold (their ports, from psutil), divided by the transactions
that completed in that window. With each point: the load average before it, the CPU
of the machine's other processes and the time the host stole during it.

Defaults are issue 47's table: memonly, 10K keys, 2 workers, rounds every 5 s. Kafka and
MinIO must be running (``./run sfaas services up``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.runtime import bench  # noqa: E402
from benchmarks.runtime.cpu_ab_tables import (  # noqa: E402
    SATURATION_COMMITTED,
    SATURATION_P99_MS,
    ab_schedule,
    medians,
    plot,
    point_metrics,
    progress,
    ratios,
    report,
    saturation,
)

#: what measures, copied from this checkout into every ref's worktree
HARNESS = ("benchmarks/__init__.py", "benchmarks/runtime/bench.py", "benchmarks/runtime/broker_requests.py",
           "benchmarks/runtime/cpu_ab.py", "benchmarks/runtime/cpu_ab_tables.py",
           "benchmarks/runtime/cpu_meter.py")
AB_RATES = "200,1000"
CURVE_RATES = "100,200,500,1000,2000,3000,4000,6000,8000,10000,12000,14000,16000,20000"
#: transactions a request-log window may hold (the broker keeps 80 MB of log, ~4 KB per
#: transaction at DEBUG): at high rates the window shrinks
REQUEST_LOG_TXNS = 12_000
#: seconds of the logged run left out before and after its counted window
REQUEST_HEAD, REQUEST_TAIL = 1.0, 0.5


class BadInput(ValueError):
    """An argument that cannot be run; the message names it and what was expected."""


# ---------------------------------------------------------------- arguments (pure)


def parse_refs(items: Sequence[str]) -> list[tuple[str, str]]:
    """``["A=main", "B=worktree"]`` → ``[("A", "main"), ("B", "worktree")]``."""
    out: list[tuple[str, str]] = []
    for item in items:
        name, eq, ref = item.partition("=")
        if not eq or not ref or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise BadInput(f"--ref wants NAME=REF (NAME: letters, digits, '_.-'; REF: a git ref or "
                           f"'worktree'), got {item!r}")
        if name in {n for n, _ in out}:
            raise BadInput(f"--ref: the name {name!r} is given twice")
        out.append((name, ref))
    return out


def parse_rates(text: str) -> list[float]:
    """``"200,1000"`` → ``[200.0, 1000.0]``; every rate a number > 0."""
    rates = []
    for part in text.split(","):
        try:
            rate = float(part)
        except ValueError:
            raise BadInput(f"--rates wants offered TPS separated by commas, got {part!r} in {text!r}") from None
        if not rate > 0:
            raise BadInput(f"--rates: every rate must be > 0 TPS, got {part!r}")
        rates.append(rate)
    return rates


def parse_dists(text: str) -> list[str]:
    known = ["uniform", *bench.THETAS]
    dists = [d for d in text.split(",") if d]
    bad = [d for d in dists if d not in known]
    if bad or not dists:
        raise BadInput(f"--dist wants some of {', '.join(known)} separated by commas, got {text!r}")
    return dists


def parse_env(items: Sequence[str], names: Sequence[str]) -> dict[str, dict[str, str]]:
    """``["B:SFAAS_EPOCH_GATHER=0.004"]`` → ``{"B": {"SFAAS_EPOCH_GATHER": "0.004"}}``."""
    out: dict[str, dict[str, str]] = {n: {} for n in names}
    for item in items:
        name, colon, rest = item.partition(":")
        key, eq, value = rest.partition("=")
        if not colon or not eq or not key:
            raise BadInput(f"--env wants NAME:KEY=VALUE, got {item!r}")
        if name not in out:
            raise BadInput(f"--env {item!r}: no --ref is named {name!r} (the refs: {', '.join(names)})")
        out[name][key] = value
    return out


def check_args(args: argparse.Namespace) -> None:
    """The arguments' ranges and combinations; :class:`BadInput` naming the first wrong one."""
    refs = parse_refs(args.ref)
    if args.report:
        return
    if len(refs) < (1 if args.curve else 2):
        raise BadInput("an A/B run wants two --ref NAME=REF (or more: ratios against the first)"
                       if not args.curve else "--curve wants at least one --ref NAME=REF")
    for name, value, low in (("--seconds", args.seconds, 1.0), ("--pairs", args.pairs, 1), ("--keys", args.keys, 2),
                             ("--workers", args.workers, 1), ("--requests-seconds", args.requests_seconds, 0.0)):
        if value is not None and value < low:
            raise BadInput(f"{name} must be ≥ {low}, got {value}")
    if args.plot and not args.curve:
        raise BadInput("--plot draws the curve: use it with --curve (or --report FILE of a curve run)")
    parse_rates(args.rates or (CURVE_RATES if args.curve else AB_RATES))
    parse_dists(args.dist)
    parse_env(args.env, [n for n, _ in refs])


def _sources(settings: Any, root: Path) -> dict[str, Any]:
    """Where this process's and the cluster's code comes from; RuntimeError if not ``root``."""
    import psutil

    from launcher import cluster

    mods = {m: str(Path(sys.modules[m].__file__ or "").resolve()) for m in
            ("sfaas", "launcher.cluster", "launcher.loadgen", "examples.ycsbt") if m in sys.modules}
    procs = {}
    for p in cluster.ps(settings):
        proc = psutil.Process(p.pid)
        path = proc.environ().get("PYTHONPATH", "").split(os.pathsep)[0]
        procs[f"{p.role}-{p.index}"] = {"cwd": proc.cwd(), "pythonpath": path}
    wrong = [f"{m} from {f}" for m, f in mods.items() if not Path(f).is_relative_to(root)]
    wrong += [f"{n} runs in {d['cwd']} (PYTHONPATH {d['pythonpath']})" for n, d in procs.items()
              if not (Path(d["cwd"]).resolve().is_relative_to(root) and Path(d["pythonpath"]).resolve() == root)]
    if wrong:
        raise RuntimeError(f"this point must run the code of {root}, but: " + "; ".join(wrong))
    return {"root": str(root), "modules": mods, "processes": procs}


def broker_requests(settings: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Requests per committed transaction the broker completed for this cluster and client
    in a window of a second run on the same cluster (its request logger at DEBUG)."""
    from benchmarks.runtime import broker_requests as br
    from launcher import cluster

    rate = spec["rate"]
    window = min(spec["requests_seconds"], max(1.0, REQUEST_LOG_TXNS / rate))
    pids = [p.pid for p in cluster.ps(settings) if p.alive] + [os.getpid()]
    watcher = br.PortWatcher(pids, int(settings.kafka.rsplit(":", 1)[1]))
    br.set_request_log("DEBUG")
    try:
        watcher.start()
        p = asyncio.run(bench.one_point(settings, rate, REQUEST_HEAD + window + REQUEST_TAIL,
                                        spec["keys"], spec["dist"]))
    finally:
        ports = watcher.stop()
        br.set_request_log("INFO")
    start = p["window"]["start"] + REQUEST_HEAD
    counted = br.count_requests(start, start + window, f"{settings.namespace}.", ports)
    replies = sum(start <= a <= start + window for a in p["_timeline"]["arrivals"])
    txns = replies * p["committed"] / max(1, p["committed"] + p["aborted"])
    # past saturation the replies in the window are not the requests' transactions: no count
    overloaded = saturation({"rate": rate, "p99_ms": p["p99_ms"], "committed_tps": p["committed_tps"]})
    ok = txns > 0 and not counted.truncated and not overloaded
    return {"per_txn": round(counted.total / txns, 3) if ok else None, "window_s": round(window, 2),
            "requests": counted.total, "txns": round(txns), "ports": len(ports), "truncated": counted.truncated,
            "overloaded": overloaded,
            "foreign_per_s": round(counted.foreign / window, 1),
            "by_kind": {k: round(v / txns, 3) for k, v in counted.counts.most_common()} if txns else {}}


def _first_round(settings: Any, interval: float) -> dict[str, Any] | None:
    """Wait for the cluster's first snapshot round (its stores' background processes start
    their uploads then: a one-time cost kept out of the measured window); None when rounds
    are off or it did not say so within 30 s (a ref whose coordinator logs it otherwise)."""
    try:
        return bench._first_round(settings, interval, patience=max(30.0, 3 * interval))
    except RuntimeError:
        return None


def run_point(spec: dict[str, Any]) -> dict[str, Any]:
    """One point, in this process (started in the ref's worktree by :class:`Runner`)."""
    from launcher import cluster
    from sfaas.runtime.settings import Settings

    s = Settings.load({"namespace": spec["namespace"], "partitions": spec["partitions"], "store": spec["store"],
                       "max_batch": spec["max_batch"], "snapshot_interval": spec["snapshot_interval"],
                       "workers": spec["workers"]})
    os.environ["SFAAS_STORE"] = spec["store"]
    before = {"loadavg_before": round(os.getloadavg()[0], 2), **bench.machine_probe()}
    cluster.up(s, "examples.ycsbt:app", spec["workers"], timeout=120)
    try:
        sources = _sources(s, ROOT)
        first_round = _first_round(s, spec["snapshot_interval"])
        p = asyncio.run(bench.one_point(s, spec["rate"], spec["seconds"], spec["keys"], spec["dist"]))
        p.pop("_timeline")
        requests = broker_requests(s, spec) if spec["requests_seconds"] > 0 else None
    finally:
        cluster.down(s)
        bench.cleanup(s)
    return {**point_metrics(p), "broker_requests_per_txn": requests["per_txn"] if requests else None,
            **before, "first_round": first_round, "requests": requests, "sources": sources,
            "raw": {k: p[k] for k in ("sent", "committed", "aborted", "lost", "abort_rate", "quantiles_ms",
                                      "cpu_s", "window")}}


# ---------------------------------------------------------------- the runs (in this checkout)


@dataclass
class Side:
    """One ref under test and the worktree its code runs from."""

    name: str
    ref: str
    sha: str
    root: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.ref}{'' if self.ref == 'worktree' else ' ' + self.sha[:8]})"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def resolve(ref: str) -> str:
    """The commit ``ref`` names (``worktree``: HEAD, the checkout's files as they are)."""
    res = _git("rev-parse", "--verify", "--quiet", f"{'HEAD' if ref == 'worktree' else ref}^{{commit}}")
    if res.returncode != 0:
        raise BadInput(f"--ref: {ref!r} names no commit in {ROOT} (git rev-parse); give a branch, tag, "
                       "commit or 'worktree'")
    return res.stdout.strip()


@contextlib.contextmanager
def worktrees(sides: list[Side]) -> Iterator[list[Side]]:
    """Each side but ``worktree`` checked out (``git worktree add --detach``) in a temporary
    directory with this checkout's harness copied in; all removed at the end."""
    base = Path(tempfile.mkdtemp(prefix="sfaas-cpu-ab-"))
    made = []
    try:
        for side in sides:
            if side.ref == "worktree":
                continue
            path = base / f"{side.name}-{side.sha[:10]}"
            res = _git("worktree", "add", "--detach", "--quiet", str(path), side.sha)
            if res.returncode != 0:
                raise RuntimeError(f"git worktree add {path} {side.sha} failed: {res.stderr.strip()}")
            made.append(path)
            for rel in HARNESS:
                (path / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, path / rel)
            side.root = path.resolve()
        yield sides
    finally:
        for path in made:
            res = _git("worktree", "remove", "--force", str(path))
            if res.returncode != 0:
                print(f"warning: git worktree remove {path}: {res.stderr.strip()}", file=sys.stderr)
        shutil.rmtree(base, ignore_errors=True)
        _git("worktree", "prune")


def check_services(need_minio: bool) -> None:
    """Kafka (started by sfaas: its CPU is counted) and, for snapshot rounds, MinIO."""
    from launcher import services

    st = services.status()
    kafka, minio = st["kafka"], st["minio"]
    if not kafka["reachable"]:
        raise BadInput(f"Kafka is not running at {kafka['endpoint']}: start it with `./run sfaas services up`")
    if not kafka["pid"]:
        raise BadInput(f"the Kafka at {kafka['endpoint']} was not started by sfaas, so its CPU cannot be "
                       "counted: stop it and run `./run sfaas services up`")
    if need_minio and not minio["reachable"]:
        raise BadInput(f"MinIO is not running at {minio['endpoint']} (snapshot rounds need it): start it with "
                       "`./run sfaas services up`, or measure with --snapshot-interval 0")


class Runner:
    """Runs points in subprocesses of their side's worktree; appends each to ``out``."""

    def __init__(self, args: argparse.Namespace, sides: list[Side], mode: str) -> None:
        self.args, self.sides, self.mode = args, {s.name: s for s in sides}, mode
        self.out = Path(args.out)
        self.logs = self.out.with_suffix(".logs")
        self.logs.mkdir(parents=True, exist_ok=True)
        self.points: list[dict[str, Any]] = []
        self.done = 0
        self.failed_in_a_row: dict[str, int] = {}

    def spec(self, rate: float, dist: str) -> dict[str, Any]:
        a = self.args
        return {"namespace": f"benchab{uuid.uuid4().hex[:8]}", "rate": rate, "dist": dist, "seconds": a.seconds,
                "keys": a.keys, "store": a.store, "workers": a.workers, "partitions": a.partitions,
                "snapshot_interval": a.snapshot_interval, "max_batch": a.max_batch,
                "requests_seconds": a.requests_seconds}

    def run(self, pair: int, name: str, rate: float, dist: str, of: str) -> dict[str, Any] | None:
        side, spec = self.sides[name], self.spec(rate, dist)
        self.done += 1
        log = self.logs / f"{self.done:03d}-{name}-{int(rate)}-{dist}.log"
        t0 = time.monotonic()
        try:
            result = self._subprocess(side, spec, log)
        except (RuntimeError, ValueError) as exc:
            self.failed_in_a_row[name] = self.failed_in_a_row.get(name, 0) + 1
            print(f"[{self.done}/{of}] {side.label} {rate:,.0f} TPS {dist} pair {pair + 1}: FAILED ({exc}); "
                  f"log {log}", file=sys.stderr, flush=True)
            self._write({"kind": "error", "side": name, "rate": rate, "dist": dist, "pair": pair, "error": str(exc)})
            if self.failed_in_a_row[name] >= 2:
                raise SystemExit(f"{side.label}: two points in a row failed; see {log}") from None
            return None
        self.failed_in_a_row[name] = 0
        point = {"kind": "point", "mode": self.mode, "side": name, "ref": side.ref, "sha": side.sha, "env": side.env,
                 "pair": pair, "rate": rate, "dist": dist, "seconds": spec["seconds"], "keys": spec["keys"],
                 "store": spec["store"], "workers": spec["workers"], "snapshot_interval": spec["snapshot_interval"],
                 "took_s": round(time.monotonic() - t0, 1), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 **result}
        self.points.append(point)
        self._write(point)
        print(f"[{self.done}/{of}] {progress(point, side.label)}", file=sys.stderr, flush=True)
        return point

    def _subprocess(self, side: Side, spec: dict[str, Any], log: Path) -> dict[str, Any]:
        env = {**os.environ, **side.env, "PYTHONPATH": str(side.root)}
        cmd = [sys.executable, str(side.root / "benchmarks/runtime/cpu_ab.py"), "--point", json.dumps(spec)]
        limit = spec["seconds"] + spec["requests_seconds"] + 600
        with open(log, "w") as err:
            proc = subprocess.Popen(cmd, cwd=side.root, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
            try:
                stdout, _ = proc.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)  # (its cluster goes down in its ``finally``)
                self._reap(proc, spec)
                raise RuntimeError(f"no result after {limit:.0f} s") from None
            except KeyboardInterrupt:  # (the point got the terminal's SIGINT too: let it clean up)
                self._reap(proc, spec)
                raise
        if proc.returncode != 0 or not stdout.strip():
            _leftovers(spec)
            tail = log.read_text()[-600:].strip().splitlines()
            raise RuntimeError(f"exit {proc.returncode}: {tail[-1] if tail else 'no output'}")
        result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
        return result

    @staticmethod
    def _reap(proc: subprocess.Popen[str], spec: dict[str, Any]) -> None:
        try:
            proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        _leftovers(spec)

    def _write(self, row: dict[str, Any]) -> None:
        with open(self.out, "a") as f:
            f.write(json.dumps(row) + "\n")


def _leftovers(spec: dict[str, Any]) -> None:
    """Stop a failed point's cluster and delete what it left, if its process could not."""
    from launcher import cluster
    from sfaas.runtime.settings import Settings

    s = Settings.load({"namespace": spec["namespace"], "snapshot_interval": spec["snapshot_interval"]})
    with contextlib.suppress(Exception):
        cluster.down(s)
    bench.cleanup(s)


def run_ab(args: argparse.Namespace, runner: Runner, names: list[str]) -> None:
    points = [(rate, dist) for dist in parse_dists(args.dist) for rate in parse_rates(args.rates or AB_RATES)]
    plan = ab_schedule(names, points, args.pairs or 3)
    for pair, name, rate, dist in plan:
        runner.run(pair, name, rate, dist, str(len(plan)))


def run_curve(args: argparse.Namespace, runner: Runner, names: list[str]) -> None:
    """Per dist, the rates in order; a side stops after its first rate past saturation
    (judged on the median of the rate's repeats)."""
    rates, pairs = parse_rates(args.rates or CURVE_RATES), args.pairs or 1
    for dist in parse_dists(args.dist):
        active = list(names)
        most = len(rates) * pairs * len(names)
        for j, rate in enumerate(rates):
            for i in range(pairs):
                k = (i + j) % len(active)
                for name in [*active[k:], *active[:k]]:
                    runner.run(i, name, rate, dist, f"≤{most}")
            rows = medians([p for p in runner.points if p["dist"] == dist and p["rate"] == rate])
            for row in rows:
                if (why := saturation(row)) and row["side"] in active:
                    print(f"  {runner.sides[row['side']].label} {dist}: saturated at {rate:,.0f} TPS ({why})",
                          file=sys.stderr, flush=True)
                    active.remove(row["side"])
            if not active:
                break


# ---------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", action="append", default=[], metavar="NAME=REF",
                    help="a side: a git ref (branch, tag, commit) or 'worktree' (this checkout as it is); "
                         "repeat it; ratios are against the first")
    ap.add_argument("--curve", action="store_true", help="the CPU-vs-load curve, rates in order until saturation "
                    f"(p99 > {SATURATION_P99_MS:.0f} ms or < {SATURATION_COMMITTED * 100:.0f}%% committed)")
    ap.add_argument("--rates", default="", help=f"offered TPS (A/B default {AB_RATES}; curve default {CURVE_RATES})")
    ap.add_argument("--dist", default="uniform,zipf", help="key distributions: uniform, zipf (0.99), zipf0.999")
    ap.add_argument("--pairs", type=int, default=None, help="repeats of every point per side (A/B 3, curve 1)")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per point")
    ap.add_argument("--requests-seconds", dest="requests_seconds", type=float, default=8.0,
                    help="seconds of a second run, request log on, counting broker requests (0: not counted)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME:KEY=VALUE",
                    help="an environment variable for one side's processes (e.g. B:SFAAS_EPOCH_GATHER=0.004)")
    ap.add_argument("--store", default="memonly")
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--max-batch", dest="max_batch", type=int, default=1000)
    ap.add_argument("--snapshot-interval", dest="snapshot_interval", type=float, default=5.0,
                    help="seconds between snapshot rounds (MinIO); 0: rounds and epoch log off")
    ap.add_argument("--out", default="", help="JSON lines, appended (default ~/.cache/sfaas/cpu_ab/<UTC time>.jsonl); "
                    "each point's log beside it in OUT.logs/")
    ap.add_argument("--plot", default="", help="with --curve: draw the curve into this PNG")
    ap.add_argument("--report", default="", help="print the tables of an earlier run's --out file (no run)")
    ap.add_argument("--point", default="", help=argparse.SUPPRESS)  # (one point, in a ref's worktree)
    return ap


def _report_only(args: argparse.Namespace) -> None:
    rows = [json.loads(x) for x in Path(args.report).read_text().splitlines() if x.strip()]
    points = [r for r in rows if r.get("kind") == "point"]
    if not points:
        raise BadInput(f"--report {args.report}: no points in it")
    sides = list(dict.fromkeys(p["side"] for p in points))
    curve = points[0].get("mode") == "curve"
    print(report(points, sides, curve))
    if args.plot:
        plot(medians(points), args.plot, Path(args.report).name)


def _run(args: argparse.Namespace) -> None:
    refs = parse_refs(args.ref)
    env = parse_env(args.env, [n for n, _ in refs])
    sides = [Side(name, ref, resolve(ref), env=env[name]) for name, ref in refs]
    check_services(args.snapshot_interval > 0)
    if not args.out:
        args.out = str(Path.home() / ".cache/sfaas/cpu_ab" / time.strftime("%Y%m%dT%H%M%SZ.jsonl", time.gmtime()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    mode = "curve" if args.curve else "ab"
    print(f"{mode}: {', '.join(s.label for s in sides)}; {args.store}, {args.keys:,} keys, {args.workers} workers, "
          f"rounds every {args.snapshot_interval:g} s, {args.seconds:g} s a point; points → {args.out}",
          file=sys.stderr, flush=True)
    with worktrees(sides):
        runner = Runner(args, sides, mode)
        try:
            (run_curve if args.curve else run_ab)(args, runner, [s.name for s in sides])
        finally:
            if runner.points:
                text = report(runner.points, [s.name for s in sides], args.curve)
                print(text)
                rows = medians(runner.points)
                with open(args.out, "a") as f:
                    f.writelines(json.dumps({"kind": "median", **r}) + "\n" for r in rows)
                    f.writelines(json.dumps({"kind": "ratio", **r}) + "\n" for r in ratios(rows, sides[0].name))
                if args.plot:
                    plot(rows, args.plot, f"{args.store}, {args.keys:,} keys, {args.workers} workers, "
                         f"rounds every {args.snapshot_interval:g} s")


def main(argv: Sequence[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    if args.point:
        logging.basicConfig(level=logging.WARNING)
        print(json.dumps(run_point(json.loads(args.point))), flush=True)
        return
    try:
        check_args(args)
        _report_only(args) if args.report else _run(args)
    except BadInput as exc:
        ap.error(str(exc))


if __name__ == "__main__":
    main()
