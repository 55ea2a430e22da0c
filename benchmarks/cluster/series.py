"""Fault series (issue 48): a fault every few seconds for a minute on a local cluster, and
the longest gap between replies against its target.

    python -m benchmarks.cluster.series [--series faults,pauses] [--seconds 60] [--seed N]
                                        [--out FILE.json] [--logs DIR] [--workers 2] [--standbys N]

Each series starts its own local 2-worker cluster (``sfaas up``'s supervisor, lsm stores,
a snapshot round every second) over the local Kafka and MinIO (``sfaas services up``; they
are started when they do not answer, and MinIO must be one sfaas started: it is stopped
and started again). The load and its invariants are the chaos test's
(``tests.runtime.test_recovery._scenario``: transfers with overdraft aborts, counter bumps
and crossing clocks, half of them on one hot key), under a seeded schedule:

- ``faults`` (no standbys, like the chaos test): a fault every 5 s — worker SIGKILLs, one
  coordinator SIGKILL, and a 10 s MinIO outage (the slot inside it stays empty) followed by
  two worker SIGKILLs 2 s apart as MinIO comes back. Target: longest reply gap ≤ 3 s.
- ``pauses`` (one standby per worker, like tests/runtime/test_fencing_cluster.py): every
  7 s a worker or the coordinator is SIGSTOPped for 6 s (3× the heartbeat timeout: it is
  declared lost, fenced and replaced; the supervisor's watchdog may SIGKILL it first),
  then SIGCONTed. Target: longest reply gap ≤ 5 s.
- ``cuts`` (no standbys; not run by default: it needs root, ``iptables`` and cgroup v2):
  every 8 s a worker is cut from Kafka and MinIO for 5 s — every packet between it and
  their ports dropped, its channels to the coordinator and its peers untouched
  (``benchmarks.cluster.cut``). Target: longest reply gap ≤ 2 s (issue 48's one fault).

For each series it prints, and writes to ``--out`` as JSON: the seed and the schedule
(``--seed N`` with the same ``--seconds`` replays it); each fault, when it fired and whether
it was seen to take effect (``tests.cluster.faults``); the longest reply gap overall and
after each fault (a gap counts for the last fault fired before it began, or up to
``LEAD`` = 0.5 s after its last reply); the target and
whether it was met; the invariants checked; every recovery's phases (the coordinator's
"recovery N done in X s: ... (detect+restart a s, restore b s, replay c s)" lines); and
the worst gap's timeline — the coordinator's, workers' and supervisor's log lines from
1 s before it to 1 s after, relative to its start, and the longest stretch between two of
them (which step took the time: detection, restart, promotion, fencing, restore, replay).

A kill or a pause hits the live process of its role whose supervisor child (log file) was
hit least so far (ties: the seed's choice). The supervisor restarts a process killed from
outside at once and does not count it toward giving up (``launcher.supervisor``:
``MAX_CRASHES`` crashes within 60 s), so the faults series runs on 2 workers.

A fault that did not take effect or a broken invariant (a request unanswered or answered
twice, money not conserved, the epoch log's replay disagreeing with a reply) fails the
run: exit status 1, with the logs' tails, what was measured until then and any slot the
supervisor gave up on (the logs are kept, ``--logs`` or $TMPDIR/series-logs). A missed
target is a result: printed as MISSED, exit status 0. The cluster runs without the test suite's
determinism check (``--check-determinism`` turns it on), as a deployment would.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.cluster.cut import Cut  # noqa: E402
from launcher import cluster, services  # noqa: E402
from tests.cluster.faults import FaultLog, process_halted, process_stopped  # noqa: E402
from tests.namespaces import drop_objects, drop_topics  # noqa: E402
from tests.runtime import test_recovery  # noqa: E402
from tests.runtime.test_fencing_cluster import APP, PAUSE  # noqa: E402
from tests.runtime.test_standby import _wait_roles  # noqa: E402

OUTAGE = 10.0  # seconds MinIO is down in the faults series
CUT = 5.0  # seconds a worker is cut from Kafka and MinIO in the cuts series
#: a gap's timeline: log lines from this long before it began to this long after it ended
MARGIN = 1.0
#: a gap may begin this long before the fault that caused it (the fault hit right after a reply)
LEAD = 0.5
#: log lines worth a timeline: any warning or error, and these milestones
MILESTONES = re.compile(r"started |registered as|all \d+ workers ready|rejoined|stands by|"
                        r"recovery \d+|promot|fenc|lost ")
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (\w+) (\S+): (.*)$")
_RECOVERY = re.compile(r"recovery (\d+) done in ([\d.]+) s: rolled back to round (\d+), "
                       r"replayed (\d+) epochs \(([^)]*)\)")
INVARIANTS = [
    "every fault took effect (its process gone or stopped, MinIO's port closed, a cut's "
    "rules in place)",
    "every request answered, none still waiting 180 s after the load",
    "no request id answered twice in the egress topic",
    "money conserved and never negative (the balances sum to what was deposited)",
    "each counter's replies are exactly 0..n-1 and its final value n (every bump once)",
    "the epoch log replayed serially from empty gives every reply the clients got, and the "
    "final balances, counters and clocks",
]

Fault = test_recovery.Fault


def faults_schedule(rnd: random.Random, seconds: float, every: float = 5.0) -> list[Fault]:
    """A fault every ``every`` s: worker kills, one coordinator kill, and a MinIO outage
    whose slots stay empty until two worker kills 2 s apart as it ends."""
    slots = [every * i for i in range(1, int((seconds - 1e-9) // every) + 1)]
    after = int(OUTAGE // every)  # the slot the outage ends at
    room = [i for i, t in enumerate(slots) if i + after < len(slots) and t + OUTAGE + 2 < seconds]
    if not room:
        raise ValueError(f"--seconds must leave room for the {OUTAGE:g} s MinIO outage and "
                         f"its two kills (more than {every + OUTAGE + 2:g} s), got {seconds:g}")
    k = rnd.choice(room)
    kills = [i for i in range(len(slots)) if not k <= i <= k + after]
    coordinator = rnd.choice(kills)
    out: list[Fault] = []
    for i, t in enumerate(slots):
        if i == k:
            out.append((t, "minio"))
        elif i == k + after:
            out += [(t, "worker"), (t + 2.0, "worker")]
        elif k < i < k + after:
            continue  # MinIO is still down: that is this slot's fault
        else:
            out.append((t, "coordinator" if i == coordinator else "worker"))
    return out


def pauses_schedule(rnd: random.Random, seconds: float, every: float = 7.0) -> list[Fault]:
    """Every ``every`` s a pause of a worker (2 in 3) or of the coordinator; both at least once."""
    slots = [every * i for i in range(1, int((seconds - 1e-9) // every) + 1)]
    if len(slots) < 2:
        raise ValueError(f"--seconds must hold at least two pauses ({2 * every + 1:g} s), got {seconds:g}")
    roles = ["coordinator" if rnd.random() < 1 / 3 else "worker" for _ in slots]
    for missing in {"worker", "coordinator"} - set(roles):
        roles[rnd.randrange(len(roles))] = missing
    if len(set(roles)) < 2:  # (the one flip above may have undone the other)
        roles[0], roles[-1] = "worker", "coordinator"
    return [(t, f"pause {role}") for t, role in zip(slots, roles, strict=True)]


def cuts_schedule(rnd: random.Random, seconds: float, every: float = 8.0) -> list[Fault]:
    """Every ``every`` s a worker cut from Kafka and MinIO for :data:`CUT` s (``rnd`` is
    the victims' tie-break, as for the other series)."""
    slots = [every * i for i in range(1, int((seconds - 1e-9) // every) + 1)]
    if not slots:
        raise ValueError(f"--seconds must hold at least one cut (more than {every:g} s), "
                         f"got {seconds:g}")
    return [(t, "cut worker") for t in slots]


@dataclass(frozen=True)
class Series:
    """A fault series: its schedule, its target and the cluster it runs on."""

    schedule: Callable[[random.Random, float], list[Fault]]
    target_s: float
    standbys: int
    what: str


SERIES = {
    "faults": Series(faults_schedule, 3.0, 0, "a fault every 5 s: worker and coordinator "
                     "SIGKILLs, a 10 s MinIO outage then two worker kills 2 s apart"),
    "pauses": Series(pauses_schedule, 5.0, 1, f"a worker or the coordinator SIGSTOPped for "
                     f"{PAUSE:g} s every 7 s, one standby per worker"),
    "cuts": Series(cuts_schedule, 2.0, 0, f"a worker cut from Kafka and MinIO (its packets "
                   f"to and from their ports dropped) for {CUT:g} s every 8 s, no standby"),
}


@dataclass
class Shot:
    """One fault as fired: when (wall clock), its kind (the FaultLog's), what it hit."""

    at: float
    kind: str
    what: str
    effect: str = ""
    took_effect: bool = False


@dataclass
class Injector:
    """Fires a series' faults into the local cluster of ``s`` (the scenario's ``fire``)."""

    s: Any
    rnd: random.Random
    shots: list[Shot] = field(default_factory=list)
    log: FaultLog | None = None
    stopped: set[int] = field(default_factory=set)
    #: faults per supervisor child (its log file) so far
    hits: Counter[str] = field(default_factory=Counter)
    #: the ports a cut drops (Kafka's and MinIO's)
    cut_ports: tuple[int, ...] = ()

    async def fire(self, fault: str, lasting: list[asyncio.Task[str]], log: FaultLog) -> object:
        self.log = log
        kind, _, role = fault.partition(" ")
        if kind == "minio":
            self.shots.append(Shot(time.time(), "minio", "minio stopped"))
            lasting.append(asyncio.create_task(test_recovery._outage("minio", OUTAGE, log)))
            return 0
        if kind == "pause":
            return await self._pause(role, lasting, log)
        if kind == "cut":
            return await self._cut(role, lasting, log)
        pid = self._victim(kind)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            self.shots.append(Shot(time.time(), kind, f"{kind} pid {pid} halted"))
            await log.confirm(kind, self.shots[-1].what, process_halted(pid), timeout=5.0)
        return pid

    def _victim(self, role: str) -> int | None:
        """A live, running ``role`` process, of the slots hit least so far (ties: the seed's
        choice): the supervisor gives up on a slot that exits ``MAX_CRASHES`` times within a
        minute, so a random victim would end the series early more often than it must.
        None when there is none (e.g. the coordinator is restarting: the scenario asks again)."""
        procs = [p for p in cluster.ps(self.s)
                 if p.role == role and p.alive and p.pid not in self.stopped]
        if not procs:
            return None
        # (the supervisor counts exits per child, i.e. per log file: the slot a process
        # serves, ``p.index``, moves when a restarted worker takes another's slot)
        victim = min(procs, key=lambda p: (self.hits[p.log], self.rnd.random()))
        self.hits[victim.log] += 1
        return victim.pid

    async def _pause(self, role: str, lasting: list[asyncio.Task[str]], log: FaultLog) -> int | None:
        pid = self._victim(role)
        if pid is None:
            return None
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        self.stopped.add(pid)
        self.shots.append(Shot(time.time(), "pause", f"pause {role} pid {pid} stopped"))
        await log.confirm("pause", self.shots[-1].what, process_stopped(pid), timeout=2.0)
        lasting.append(asyncio.create_task(self._resume(pid, role, stopped)))
        return pid

    async def _cut(self, role: str, lasting: list[asyncio.Task[str]], log: FaultLog) -> int | None:
        pid = self._victim(role)
        if pid is None:
            return None
        cut = Cut(pid, self.cut_ports)
        try:
            n = cut.apply()
        except BaseException:
            cut.heal()
            raise
        self.shots.append(Shot(time.time(), "cut", f"cut {role} pid {pid} ({n} connections)"))
        await log.confirm("cut", self.shots[-1].what, cut.in_effect, timeout=2.0)

        async def heal() -> str:
            await asyncio.sleep(CUT)
            cut.heal()
            gone = process_halted(pid)() is not None
            return f"{role} pid {pid} healed after {CUT:g} s ({'gone by then' if gone else 'still up'})"
        lasting.append(asyncio.create_task(heal()))
        return pid

    async def _resume(self, pid: int, role: str, stopped: float) -> str:
        await asyncio.sleep(max(0.0, PAUSE - (time.monotonic() - stopped)))
        self.stopped.discard(pid)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return f"{role} pid {pid} gone before its SIGCONT (the watchdog killed it)"
        return f"{role} pid {pid} resumed after {time.monotonic() - stopped:.1f} s"

    def settle(self) -> list[Shot]:
        """Each shot with what the FaultLog saw of it (or why it did not take effect)."""
        log = self.log or FaultLog()  # (no log: nothing fired)
        for shot in self.shots:
            seen = [x for x in log.seen if x.startswith(shot.what + ":")]
            failed = [x for x in log.failed if x.startswith(shot.what + ":")]
            shot.took_effect = bool(seen) and not failed
            shot.effect = (seen or failed or ["never confirmed"])[0].split(": ", 1)[-1]
        return self.shots


def longest_gaps(replies: list[float], n: int = 3) -> list[tuple[float, float]]:
    """The ``n`` longest gaps between consecutive replies: (length, start), longest first."""
    at = sorted(replies)
    return sorted(((b - a, a) for a, b in zip(at, at[1:], strict=False)), reverse=True)[:n]


def gaps_per_fault(replies: list[float], faults: list[float],
                   lead: float = LEAD) -> list[tuple[float, float] | None]:
    """For each fault time (ascending), the longest gap (length, start) that began after it
    (or at most ``lead`` s before it) and before the next fault; None when none did."""
    assert faults == sorted(faults), faults
    at = sorted(replies)
    best: list[tuple[float, float] | None] = [None] * len(faults)
    for a, b in zip(at, at[1:], strict=False):
        # the last fault fired before the gap began, or just after its last reply: not one
        # fired while the gap went on (the schedule does not wait for a recovery)
        i = bisect.bisect_left(faults, a + lead) - 1
        if i >= 0 and (best[i] is None or b - a > best[i][0]):  # type: ignore[index]
            best[i] = (b - a, a)
    return best


def gap_around(replies: list[float], t: float) -> tuple[float, float] | None:
    """The gap between replies (length, start) going on at time ``t``; None outside them."""
    at = sorted(replies)
    i = bisect.bisect_right(at, t)
    return (at[i] - at[i - 1], at[i - 1]) if 0 < i < len(at) else None


def parse_line(line: str) -> tuple[float, str, str, str] | None:
    """A log line's (wall clock, level, logger, message); None for a continuation line."""
    m = _LINE.match(line)
    if m is None:
        return None
    when = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
    return when, m.group(3), m.group(4), m.group(5)


def timeline(logs: dict[str, str], start: float, end: float, margin: float = MARGIN,
             limit: int = 80) -> list[dict[str, Any]]:
    """The warnings, errors and milestones of ``logs`` (source → text) from ``margin`` s
    before ``start`` to ``margin`` s after ``end`` (wall clock), in time order, each at
    its offset from ``start``."""
    out = []
    for source, text in logs.items():
        for line in text.splitlines():
            parsed = parse_line(line)
            if parsed is None or parsed[2].startswith(("aiokafka", "kafka")):
                continue
            when, level, logger, msg = parsed
            if start - margin <= when <= end + margin and \
                    (level in ("WARNING", "ERROR", "CRITICAL") or MILESTONES.search(msg)):
                out.append({"t": round(when - start, 3), "source": source, "level": level,
                            "logger": logger, "message": msg[:220]})
    return sorted(out, key=lambda e: e["t"])[:limit]


def slowest_step(events: list[dict[str, Any]], length: float) -> dict[str, Any]:
    """The longest stretch of a gap (``length`` s, ``events`` at offsets from its start)
    between two consecutive things that happened: its last reply, each event inside the
    gap, its first reply after."""
    marks = [(0.0, "the last reply before the gap")]
    marks += [(e["t"], f"{e['source']}: {e['message'][:100]}") for e in events if 0 <= e["t"] <= length]
    marks.append((length, "the first reply after the gap"))
    span, (t0, a), (_, b) = max((y[0] - x[0], x, y) for x, y in zip(marks, marks[1:], strict=False))
    return {"seconds": round(span, 3), "from_s": round(t0, 3), "after": a, "until": b}


def recoveries(coordinator_log: str) -> list[dict[str, Any]]:
    """Every finished recovery of the coordinator's log: when (wall clock), its attempt
    number, seconds, the round rolled back to, epochs replayed and its phases."""
    out = []
    for line in coordinator_log.splitlines():
        parsed = parse_line(line)
        m = _RECOVERY.search(line)
        if parsed is None or m is None:
            continue
        phases = {k: float(v) for k, v in re.findall(r"([\w+]+) ([\d.]+) s", m.group(5))}
        out.append({"at": parsed[0], "attempt": int(m.group(1)), "seconds": float(m.group(2)),
                    "round": int(m.group(3)), "epochs": int(m.group(4)), "phases": phases})
    return out


def _logs(s: Any) -> dict[str, str]:
    return {f.stem: f.read_text(errors="replace") for f in sorted(cluster.state_dir(s).glob("*.log"))}


def _gap(gap: tuple[float, float] | None, target: float, logs: dict[str, str],
         began: float) -> dict[str, Any] | None:
    """A fault's longest gap; over the target, with its timeline and slowest step."""
    if gap is None:
        return None
    out: dict[str, Any] = {"s": round(gap[0], 2), "from": round(gap[1], 2)}
    if gap[0] > target:
        out["timeline"] = timeline(logs, began + gap[1], began + gap[1] + gap[0])
        out["slowest_step"] = slowest_step(out["timeline"], gap[0])
    return out


def _inside(replies: list[float], t: float) -> dict[str, float] | None:
    """The gap a fault fired into when an earlier fault's gap was still going on."""
    g = gap_around(replies, t)
    return None if g is None or g[1] > t - LEAD else {"s": round(g[0], 2), "from": round(g[1], 2)}


def analyse(name: str, seed: int, schedule: list[Fault], report: dict[str, Any],
            shots: list[Shot], replies: list[float], logs: dict[str, str]) -> dict[str, Any]:
    """A finished series' result: faults, gaps overall and per fault, the target, the
    recoveries and the worst gap's timeline (times in seconds into the load)."""
    began = report["began"]
    series = SERIES[name]
    gaps = longest_gaps(replies)
    worst = gaps[0] if gaps else (0.0, 0.0)
    per = gaps_per_fault(replies, [x.at - began for x in shots])
    events = timeline(logs, began + worst[1], began + worst[1] + worst[0])
    return {
        "series": name, "seed": seed, "what": series.what, "when": time.strftime("%Y-%m-%d %H:%M"),
        "schedule": [(round(t, 2), f) for t, f in schedule],
        "faults": [{**asdict(x), "at": round(x.at - began, 2),
                    "longest_gap_after": _gap(g, series.target_s, logs, began),
                    "fired_inside": _inside(replies, x.at - began)}
                   for x, g in zip(shots, per, strict=True)],
        "lasting": report.get("outages", []), "unfired": report.get("unfired", []),
        "fault_kinds": report.get("faults", {}), "replies": len(replies),
        "longest_gap_s": round(worst[0], 2), "longest_gaps": [(round(g, 2), round(a, 2)) for g, a in gaps],
        "target_s": series.target_s, "met": worst[0] <= series.target_s,
        "invariants": INVARIANTS,
        "recoveries": [{**r, "at": round(r["at"] - began, 2)} for r in recoveries(logs.get("coordinator", ""))],
        "worst_gap": {"s": round(worst[0], 2), "from": round(worst[1], 2), "timeline": events,
                      "slowest_step": slowest_step(events, worst[0])},
    }


def show(r: dict[str, Any]) -> None:
    """Print one series' result for a reader."""
    p = print
    p(f"\n== {r['series']}: {r['what']}\n   seed {r['seed']} (replay: --series {r['series']} "
      f"--seed {r['seed']}); {r['when']}, load average {r['load_average'][0]:.1f} before, "
      f"{r['load_average'][1]:.1f} after\n   schedule: " + ", ".join(f"{t:g} {f}" for t, f in r["schedule"]))
    p("   faults (s into the load; the longest reply gap that began with it, s at s):")
    for x in r["faults"]:
        g = x["longest_gap_after"]
        gap = "-" if g is None else f"{g['s']:.2f} s at {g['from']:.2f}"
        p(f"   {x['at']:6.2f}  {x['what']:34} {'took effect' if x['took_effect'] else 'NO EFFECT'}"
          f" ({x['effect']}); gap {gap}")
        if x["fired_inside"]:
            p(f"           fired inside the {x['fired_inside']['s']:.2f} s gap from "
              f"{x['fired_inside']['from']:.2f} s (an earlier fault's, still going on)")
        if g is not None and "slowest_step" in g:
            st = g["slowest_step"]
            p(f"           over the target; slowest step {st['seconds']:.2f} s from "
              f"{st['from_s']:+.3f}: after [{st['after'][:90]}] until [{st['until'][:90]}]")
    for what in r["lasting"] + [f"never fired: {u}" for u in r["unfired"]]:
        p(f"           {what}")
    verdict = "met" if r["met"] else "MISSED"
    p(f"   longest reply gap {r['longest_gap_s']:.2f} s (target ≤ {r['target_s']:g} s: {verdict}); "
      f"the three longest (s, at): {r['longest_gaps']}; {r['replies']} replies")
    held = f"FAILED: {r['failed']}" if r["failed"] else "all held"
    p(f"   invariants checked, {held}:\n" + "\n".join(f"     - {i}" for i in r["invariants"]))
    for why in r["gave_up"]:
        p(f"   the supervisor gave up restarting {why}")
    p("   recoveries:")
    for x in r["recoveries"]:
        p(f"     #{x['attempt']} done at {x['at']:.2f} s in {x['seconds']:.2f} s (round {x['round']}, "
          f"{x['epochs']} epochs): " + ", ".join(f"{k} {v:.2f} s" for k, v in x["phases"].items()))
    w = r["worst_gap"]
    p(f"   worst gap {w['s']:.2f} s from {w['from']:.2f} s; its timeline (s from its start):")
    for e in w["timeline"]:
        p(f"     {e['t']:+7.3f} {e['source']:12} {e['level'][:4]} {e['message'][:150]}")
    st = w["slowest_step"]
    p(f"   slowest step: {st['seconds']:.2f} s from {st['from_s']:+.3f}, after [{st['after']}] "
      f"until [{st['until']}]")


def run_series(name: str, a: argparse.Namespace, seed: int, ep: services.Endpoints,
               results: list[dict[str, Any]]) -> None:
    """Start a cluster, run series ``name`` on it, stop it; its result goes to ``results``.
    Raises when a fault did not take effect or an invariant broke, after adding (and
    printing) what the run measured until then, marked ``failed``. The processes' logs are
    copied to ``a.logs``/NAME-SEED when given, and after a failure always (default:
    $TMPDIR/series-logs)."""
    series = SERIES[name]
    rnd = random.Random(seed)
    schedule = series.schedule(rnd, a.seconds)
    standbys = series.standbys if a.standbys is None else a.standbys
    logs: Path | None = a.logs
    with tempfile.TemporaryDirectory(prefix=f"series-{name}-") as tmp:
        s = test_recovery.chaos_settings(ep, ep, Path(tmp), check_determinism=a.check_determinism)
        print(f"{name}: seed {seed}, starting {a.workers} workers ({standbys} standby per worker) "
              f"in namespace {s.namespace}", flush=True)
        load = os.getloadavg()[0]  # (the machine is shared: a gap may be a wait for a core)
        cluster.up(s, APP, a.workers, timeout=90, standbys=standbys)
        injector = Injector(s, rnd, cut_ports=(_port(ep.kafka_bootstrap), _port(ep.minio_endpoint)))
        replies: list[float] = []
        report: dict[str, Any] = {"seed": seed}

        def result(failed: str = "") -> dict[str, Any]:
            r = analyse(name, seed, schedule, report, injector.settle(), replies, _logs(s))
            return {**r, "workers": a.workers, "standbys": standbys, "failed": failed,
                    "load_average": [load, os.getloadavg()[0]],
                    "gave_up": [f"{Path(p.log).stem}: {p.gave_up}" for p in cluster.ps(s) if p.gave_up]}
        try:
            if standbys:  # (the standbys stand by only once they hold their worker's state)
                _wait_roles(s, sorted([("coordinator", 0)] + [("worker", i) for i in range(a.workers)]
                                      + [("standby", i) for i in range(a.workers)] * standbys), 60)
            cs = cluster.cluster_settings(s)[1]
            asyncio.run(test_recovery._scenario(
                s, cs, random.Random(seed), report, Path(tmp) / "replay", faults=list(schedule),
                fire=injector.fire, seconds=a.seconds, workers=a.workers, replies_at=replies))
            results.append(result())
        except BaseException as exc:
            print(f"{name} (seed {seed}) FAILED; report {report}\n"
                  f"{test_recovery.log_tails(s, 15000, 4000)}", flush=True)
            if replies:  # what it measured until it failed
                results.append(result(f"{type(exc).__name__}: {str(exc)[:400]}"))
                show(results[-1])
            logs = logs or Path(tempfile.gettempdir()) / "series-logs"
            raise
        finally:
            cluster.down(s)
            drop_topics(ep.kafka_bootstrap, [s.namespace])
            drop_objects(ep, [s.namespace])
            if logs is not None:
                shutil.copytree(cluster.state_dir(s), logs / f"{name}-{seed}", dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("secret"))
                print(f"{name}: the cluster's logs are in {logs / f'{name}-{seed}'}")


def _port(endpoint: str) -> int:
    """The port of ``host:port`` (a scheme or several endpoints: the first one's)."""
    return int(endpoint.split(",")[0].rstrip("/").rsplit(":", 1)[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--series", default="faults,pauses",
                   help=f"comma-separated, of {', '.join(SERIES)} (default: faults,pauses; "
                   "cuts needs root, iptables and cgroup v2)")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of load per series")
    p.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: random)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--workers", type=int, default=2, help="workers of the cluster (default 2)")
    p.add_argument("--standbys", type=int, default=None,
                   help="standbys per worker (default: faults 0, pauses 1, cuts 0)")
    p.add_argument("--logs", type=Path, default=None,
                   help="copy each cluster's logs to DIR/SERIES-SEED (a failed run's always are)")
    p.add_argument("--check-determinism", action="store_true",
                   help="run the cluster with the test suite's determinism check")
    a = p.parse_args(argv)
    names = [n.strip() for n in a.series.split(",") if n.strip()]
    if not names or set(names) - set(SERIES):
        p.error(f"--series takes a comma-separated list of {', '.join(SERIES)}, got {a.series!r}")
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 32)
    for name in names:  # (a schedule that does not fit: said now, before any cluster starts)
        try:
            SERIES[name].schedule(random.Random(seed), a.seconds)
        except ValueError as exc:
            p.error(f"{name}: {exc}")
    results: list[dict[str, Any]] = []
    try:
        with services.using(kafka=True, minio=True, progress=False) as ep:
            for name in names:
                run_series(name, a, seed, ep, results)
                show(results[-1])
    finally:  # (a failed series' partial result too)
        if a.out is not None and results:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps({"seconds": a.seconds, "series": results}, indent=1))
            print(f"written to {a.out}")
    print("\n" + "; ".join(f"{r['series']}: longest gap {r['longest_gap_s']:.2f} s "
                           f"(target ≤ {r['target_s']:g} s: {'met' if r['met'] else 'MISSED'})"
                           for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
