"""Bounded memory under overload: YCSB-T offered at 3× saturation for 60 s (issue 11).

A fresh local cluster the way ``bench.py`` starts one (``examples.ycsbt``, 2 workers, 8
partitions, 10K keys preloaded, snapshot rounds every 1 s with the epoch log on) is offered
``--factor`` × ``--saturation`` requests/s of uniform ``transfer`` transactions for
``--seconds``. The cluster can commit about ``--saturation`` of them; the rest waits in the
ingress topic, and the runtime must take it at its own pace instead of buffering it in
memory. Every second the RSS of the coordinator and of each worker is sampled (Kafka's and
the load generator's too, for information) with the replies received. After the load, the
replies are awaited until every request has one (or ``--drain-timeout``); each request id
must be answered exactly once.

Verdict per runtime process: its RSS from ``--warmup`` seconds into the load to the load's
end, against its RSS at ``--warmup`` seconds, must stay within ``--tolerance`` % (±10).

The requests are not sent through :class:`sfaas.Client` (one Kafka send per request is too
slow for ~28,000 requests/s in Python on 2 shared cores): a generator *process* encodes
the same :class:`sfaas.runtime.wire.Request` records and produces them in one Kafka batch per
ingress partition every 100 ms tick; the replies, spread over all egress partitions, are
read here. Raw samples go to ``{--out}/overload.jsonl``; the report into
benchmarks/README.md (unless ``--no-readme``). Kafka and MinIO must run (``sfaas services up``).

    python -m benchmarks.runtime.overload                   # 60 s at 3 × 9,500 TPS, memonly
    python -m benchmarks.runtime.overload --store lsm --saturation 11000
    python -m benchmarks.runtime.overload --quick           # 15 s, results in /tmp, no README
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil

from benchmarks.readme import publish
from benchmarks.runtime import bench
from benchmarks.runtime.overload_report import INFO, RUNTIME, mb, report

ROOT = Path(__file__).resolve().parents[2]
NAME = "overload"
TITLE = "Overload: 60 s at 3× saturation, memory bounded"
#: The processes whose RSS must stay flat; the others are sampled for information.
#: Gauges of the processes' /metrics kept with each sample (where the memory could be).
GAUGES = ("sfaas_queue_depth", "sfaas_worker_in_flight_requests", "sfaas_ingress_lag_records",
          "sfaas_channel_buffered_bytes")
TICK = 0.1


# -- the verdicts (no cluster needed) ---------------------------------------------------------------------


class Ledger:
    """Which requests got a reply, and how many: request ``seq`` has id ``prefix + str(seq)``.

    A byte per request (a 60 s run at 28,500 requests/s sends 1.7M), not a set of ids."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._counts = bytearray()
        #: replies read; replies to a request already answered; replies to no request of ours
        self.replies = self.duplicates = self.foreign = 0
        #: requests answered at least once
        self.answered = 0

    def answer(self, rid: str) -> bool:
        """Count a reply to ``rid``; True if it is that request's first."""
        self.replies += 1
        tail = rid[len(self.prefix):] if rid.startswith(self.prefix) else ""
        if not (tail.isascii() and tail.isdigit()):
            self.foreign += 1
            return False
        seq = int(tail)
        if seq >= len(self._counts):
            self._counts.extend(bytes(max(seq + 1 - len(self._counts), 1 << 16)))
        count = self._counts[seq]
        self._counts[seq] = min(255, count + 1)
        if count:
            self.duplicates += 1
            return False
        self.answered += 1
        return True

    def missing(self, sent: int) -> int:
        """Requests ``0 … sent-1`` without a reply."""
        return self._counts[:sent].count(0) + max(0, sent - len(self._counts))

    def unsent_answered(self, sent: int) -> int:
        """Ids at or above ``sent`` that got a reply (requests never sent: a bug if not 0)."""
        tail = self._counts[sent:]
        return len(tail) - tail.count(0)

    def first_missing(self, sent: int, n: int = 5) -> list[int]:
        """Up to ``n`` of the missing requests' sequence numbers (to look for in the logs)."""
        out: list[int] = []
        i = self._counts.find(0, 0, sent)
        while 0 <= i and len(out) < n:
            out.append(i)
            i = self._counts.find(0, i + 1, sent)
        out += range(len(self._counts), sent)[: n - len(out)]  # never even grown to
        return out


def flatness(samples: Iterable[tuple[float, int]], since: float, tolerance_pct: float) -> dict[str, Any] | None:
    """RSS ``(seconds into the load, bytes)`` samples from ``since`` on, against the first of
    them: the largest deviation in % (signed), and whether it stays within ±``tolerance_pct``.
    None without a sample from ``since`` on."""
    window = sorted((t, rss) for t, rss in samples if t >= since)
    if not window:
        return None
    base = window[0][1]
    values = [rss for _, rss in window]
    worst = max((v - base for v in values), key=abs)
    deviation = 100.0 * worst / base if base else float("inf")
    return {"at": window[0][0], "base": base, "min": min(values), "max": max(values), "end": values[-1],
            "deviation_pct": round(deviation, 1), "flat": abs(deviation) <= tolerance_pct}


# -- the load generator (its own process) -----------------------------------------------------------------


@dataclass
class Plan:
    """What the generator sends (pickled to its process)."""

    kafka: str
    ingress: str
    reply_partitions: int
    keys: int
    rate: float
    seconds: float
    prefix: str
    seed: int = 2


def generate(plan: Plan, sent: Any, start: Any, go: Any, ready: Any, out: Connection) -> None:
    """The generator process: requests at ``plan.rate`` from ``start.value`` (monotonic) on,
    once ``go`` is set; ``sent`` counts those the broker acknowledged; the summary goes to ``out``."""
    try:
        out.send(asyncio.run(_generate(plan, sent, start, go, ready)))
    except BaseException as exc:
        out.send({"error": f"{type(exc).__name__}: {exc}"})
        raise


async def _generate(plan: Plan, sent: Any, start: Any, go: Any, ready: Any) -> dict[str, Any]:
    from sfaas.runtime.kafka import make_producer, partition_count
    from sfaas.runtime.partitioning import partition_of
    from sfaas.runtime.wire import Request

    make = bench.make_generator(plan.keys, "uniform", plan.seed)
    producer = make_producer(plan.kafka)  # acks=1, batches up to 1 MB
    await producer.start()
    try:
        parts = await partition_count(producer, plan.ingress)
        ready.set()
        while not go.is_set():
            await asyncio.sleep(0.01)
        t0 = start.value
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        total = int(plan.rate * plan.seconds)
        n = late_ticks = 0
        busy = 0.0
        while n < total:
            now = time.monotonic()
            k = int((now - t0) / TICK)  # the tick we are in: send what is due by its end
            if k * TICK >= plan.seconds:
                break
            due = min(total, int(plan.rate * (k + 1) * TICK))
            wall = time.time()
            batches: dict[int, Any] = {}
            futures = []
            for i in range(n, due):
                op, key, fn, args = make(i)
                p = partition_of(op, key, parts)
                value = Request(f"{plan.prefix}{i}", op, key, fn, args, i % plan.reply_partitions, wall).encode()
                batch = batches.get(p)
                if batch is None or batch.append(timestamp=None, key=None, value=value) is None:
                    if batch is not None:  # full: off it goes, a new one takes the record
                        futures.append(await producer.send_batch(batch, plan.ingress, partition=p))
                    batch = batches[p] = producer.create_batch()
                    batch.append(timestamp=None, key=None, value=value)
            for p, batch in batches.items():
                futures.append(await producer.send_batch(batch, plan.ingress, partition=p))
            await asyncio.gather(*futures)  # a failed send fails the run: its requests were never offered
            n = due
            sent.value = n
            busy += time.monotonic() - now
            pause = t0 + (k + 1) * TICK - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            else:
                late_ticks += 1
        return {"sent": n, "elapsed_s": round(time.monotonic() - t0, 3), "late_ticks": late_ticks,
                "busy_s": round(busy, 2), "total_planned": total}
    finally:
        await producer.stop()


# -- measuring ---------------------------------------------------------------------------------------------


@dataclass
class Watched:
    """The processes sampled, by name (``coordinator``, ``worker-0``, …, ``kafka``, ``generator``, ``bench``)."""

    settings: Any
    extra: dict[str, int]
    procs: dict[str, psutil.Process] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)
    restarts: dict[str, list[int]] = field(default_factory=dict)
    scrape_errors: dict[tuple[str, type], str] = field(default_factory=dict)

    def refresh(self) -> None:
        """Follow the cluster's current pids (a restarted worker is noted in ``restarts``)."""
        from launcher import cluster

        pids = dict(self.extra)
        for p in cluster.ps(self.settings):
            if p.alive and p.role in ("coordinator", "worker"):
                name = p.role if p.role == "coordinator" else f"worker-{p.index}"
                pids[name] = p.pid
                if p.metrics:
                    self.metrics[name] = p.metrics
        for name, pid in pids.items():
            old = self.procs.get(name)
            if old is None or old.pid != pid:
                if old is not None:
                    self.restarts.setdefault(name, []).append(pid)
                try:
                    self.procs[name] = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    self.procs.pop(name, None)

    def rss(self) -> dict[str, int]:
        out = {}
        for name, proc in self.procs.items():
            try:
                out[name] = proc.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return out

    def cpu(self) -> dict[str, float]:
        out = {}
        for name, proc in self.procs.items():
            try:
                c = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            out[name] = c.user + c.system
        return out

    def gauges(self) -> dict[str, dict[str, float]]:
        """The :data:`GAUGES` of each runtime process (summed over their labels' values)."""
        out: dict[str, dict[str, float]] = {}
        for name, url in self.metrics.items():
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    text = r.read().decode()
            except OSError as exc:  # said once per process and kind (a sample without them is still a sample)
                why = f"{type(exc).__name__}: {exc}"
                if (name, type(exc)) not in self.scrape_errors:
                    self.scrape_errors[(name, type(exc))] = why
                    print(f"scraping {name}'s {url} failed: {why}", file=sys.stderr, flush=True)
                continue
            got: dict[str, float] = {}
            for m in re.finditer(r"^(sfaas_\w+)(?:\{(?:\w+=\"([^\"]*)\")?[^}]*\})? (\S+)$", text, re.M):
                metric, label, value = m.groups()
                if metric in GAUGES:
                    k = metric.removeprefix("sfaas_") + (f".{label}" if metric == "sfaas_queue_depth" else "")
                    got[k] = got.get(k, 0.0) + float(value)
            out[name] = got
        return out


def _cpu_percent(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    return {k: round(100 * (after[k] - before[k]) / seconds, 1) for k in after if k in before and seconds > 0}


async def measure(a: argparse.Namespace, settings: Any, write: Any) -> dict[str, Any]:
    """Offer the load, sample every second, drain; the run's summary (samples go to ``write``)."""
    from aiokafka import TopicPartition

    from launcher import services
    from sfaas.runtime.kafka import make_consumer, make_producer, partition_count
    from sfaas.runtime.wire import ProtocolError, Reply

    ingress, egress = settings.topics("ycsbt")
    consumer = make_consumer(settings.kafka, None, settings.fetch_wait_ms)
    await consumer.start()
    ctx = mp.get_context("spawn")
    gen: Any = None
    try:
        probe = make_producer(settings.kafka)  # (what a Client asks its producer)
        await probe.start()
        try:
            tps = [TopicPartition(egress, p) for p in range(await partition_count(probe, egress))]
        finally:
            await probe.stop()
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)  # pinned before the first request goes out
        prefix = f"{uuid.uuid4().hex}-"
        rate = a.factor * a.saturation
        plan = Plan(settings.kafka, ingress, len(tps), a.keys, rate, a.seconds, prefix)
        sent, start = ctx.Value("q", 0, lock=False), ctx.Value("d", 0.0, lock=False)
        go, ready = ctx.Event(), ctx.Event()
        result_in, result_out = ctx.Pipe(duplex=False)
        gen = ctx.Process(target=generate, args=(plan, sent, start, go, ready, result_out), name="overload-generator")
        gen.start()
        deadline = time.monotonic() + 60
        while not ready.is_set():
            if not gen.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the load generator did not start: {result_in.recv() if result_in.poll() else gen.exitcode}")
            await asyncio.sleep(0.05)

        extra = {"generator": gen.pid, "bench": os.getpid()}
        kafka_pid = services.status().get("kafka", {}).get("pid")
        if isinstance(kafka_pid, int):  # the broker shares the cores and its memory is worth seeing
            extra["kafka"] = kafka_pid
        watched = Watched(settings, extra)
        watched.refresh()
        before = {"t": 0, "phase": "before", "rss": watched.rss(), "loadavg": os.getloadavg()[0]}
        write(before)

        ledger = Ledger(prefix)
        window = {"committed": 0, "aborted": 0}
        reasons: dict[str, int] = {}

        async def read_replies() -> None:
            while True:
                for records in (await consumer.getmany(timeout_ms=200, max_records=20_000)).values():
                    for rec in records:
                        try:
                            reply = Reply.decode(rec.value)
                        except ProtocolError:
                            ledger.foreign += 1
                            continue
                        if ledger.answer(reply.rid):
                            if reply.ok:
                                window["committed"] += 1
                            else:
                                window["aborted"] += 1
                                why = f"{reply.error_type}: {reply.reason or ''}"[:80]
                                reasons[why] = reasons.get(why, 0) + 1

        gauges: dict[str, dict[str, float]] = {}

        async def scrape() -> None:  # apart from the samples: a busy process may answer late
            while True:
                gauges.update(await asyncio.to_thread(watched.gauges))
                await asyncio.sleep(1.0)

        reader = asyncio.create_task(read_replies())
        scraper = asyncio.create_task(scrape())
        psutil.cpu_percent()  # the machine's CPU from here on: is someone else using the cores?
        t0 = start.value = time.monotonic() + 0.3
        go.set()
        cpu0 = watched.cpu()
        samples: list[dict[str, Any]] = []
        gen_result: dict[str, Any] | None = None
        cpu_load: dict[str, float] = {}
        load_end: dict[str, Any] = {}
        drained_at: float | None = None
        k = 0
        try:
            while True:
                k += 1
                await asyncio.sleep(max(0.0, t0 + k - time.monotonic()))
                if reader.done():
                    reader.result()  # raises what stopped it
                phase = "load" if k <= a.seconds else "drain"
                watched.refresh()
                n_sent = gen_result["sent"] if gen_result else sent.value
                sample = {"t": k, "phase": phase, "loadavg": os.getloadavg()[0], "machine_cpu": psutil.cpu_percent(),
                          "rss": watched.rss(),
                          "sent": n_sent, "answered": ledger.answered, "outstanding": n_sent - ledger.answered,
                          **window, "gauges": dict(gauges)}
                window.update(committed=0, aborted=0)
                samples.append(sample)
                write(sample)
                if k == int(a.seconds):
                    cpu_load = _cpu_percent(cpu0, watched.cpu(), a.seconds)
                    load_end = sample
                if k % 10 == 0:
                    _progress(sample, samples)
                if gen_result is None and not gen.is_alive():
                    gen_result = result_in.recv() if result_in.poll() else {"error": f"exit code {gen.exitcode}"}
                    if "error" in gen_result:
                        raise RuntimeError(f"the load generator failed: {gen_result['error']}")
                if gen_result is None or k < a.seconds:
                    continue
                if ledger.answered >= gen_result["sent"]:
                    if drained_at is None:
                        drained_at = time.monotonic() - t0
                    if time.monotonic() - t0 >= drained_at + a.linger:  # late duplicates would show by now
                        break
                elif time.monotonic() - t0 > a.seconds + a.drain_timeout:
                    print(f"drain timeout: {gen_result['sent'] - ledger.answered:,} requests unanswered "
                          f"{a.drain_timeout:.0f} s after the load", file=sys.stderr, flush=True)
                    break
        finally:
            reader.cancel()
            scraper.cancel()
            await asyncio.gather(reader, scraper, return_exceptions=True)
        assert gen_result is not None
        n_sent = gen_result["sent"]
        load = [s for s in samples if s["phase"] == "load"]
        def judge(name: str, since: float) -> dict[str, Any] | None:
            return flatness(((s["t"], s["rss"][name]) for s in load if name in s["rss"]), since, a.tolerance)

        verdicts = {name: judge(name, a.warmup) for name in (*RUNTIME, *INFO)}
        # still growing at the end, or a plateau reached late? the second half alone tells
        late = {name: judge(name, a.seconds / 2) for name in (*RUNTIME, *INFO)}
        committed = [s["committed"] for s in load]
        return {
            "kind": "summary", "store": a.store, "keys": a.keys, "partitions": a.partitions, "workers": 2,
            "snapshot_interval": a.snapshot_interval, "factor": a.factor, "saturation": a.saturation,
            "target_rate": rate, "seconds": a.seconds, "warmup": a.warmup, "tolerance_pct": a.tolerance,
            "generator": gen_result, "offered_rate": round(n_sent / a.seconds, 1),
            "sent": n_sent, "answered": ledger.answered, "replies": ledger.replies,
            "missing": ledger.missing(n_sent), "duplicates": ledger.duplicates,
            "foreign": ledger.foreign + ledger.unsent_answered(n_sent), "first_missing": ledger.first_missing(n_sent),
            "drained": drained_at is not None,
            "drain_s": round(drained_at - a.seconds, 1) if drained_at is not None else None,
            "committed_tps_median": statistics.median(committed) if committed else 0,
            "committed_tps_after_warmup": _median([s["committed"] for s in load if s["t"] > a.warmup]),
            "committed_during_load": sum(committed), "aborts": reasons,
            "rss_before": before["rss"], "rss_end_of_load": load_end.get("rss", {}),
            "rss_end_of_drain": samples[-1]["rss"] if samples else {}, "rss": verdicts, "rss_second_half": late,
            "cpu_percent_load": cpu_load, "restarts": watched.restarts,
            "backlog_end_of_load": load_end.get("outstanding"), "gauges_max": _gauges_max(samples),
            "scrape_errors": sorted({f"{name}: {why}" for (name, _), why in watched.scrape_errors.items()}),
            "cores": psutil.cpu_count(), "machine_cpu_load": round(_median([s["machine_cpu"] for s in load]), 1),
            "loadavg_before": before["loadavg"], "loadavg_load_max": max((s["loadavg"] for s in load), default=0.0),
            "loadavg_drain_max": max((s["loadavg"] for s in samples if s["phase"] == "drain"), default=0.0),
        }
    finally:
        await consumer.stop()
        if gen is not None and gen.is_alive():
            gen.terminate()
        if gen is not None:
            gen.join(10)


def _gauges_max(samples: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per process, each gauge's largest value over the run."""
    out: dict[str, dict[str, float]] = {}
    for s in samples:
        for name, gauges in s["gauges"].items():
            mine = out.setdefault(name, {})
            for k, v in gauges.items():
                mine[k] = max(v, mine.get(k, v))
    return out


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _progress(sample: dict[str, Any], samples: list[dict[str, Any]]) -> None:
    prev = samples[-11] if len(samples) > 10 else {"sent": 0, "t": 0}
    offered = (sample["sent"] - prev["sent"]) / (sample["t"] - prev["t"])
    committed = sum(s["committed"] for s in samples[-10:]) / min(10, len(samples))
    rss = " ".join(f"{n} {mb(sample['rss'].get(n))}" for n in RUNTIME)
    what = (f"offered {offered:,.0f}/s" if sample["phase"] == "load" else "draining")
    print(f"[{sample['phase']} {sample['t']} s] {what}, committed {committed:,.0f}/s, "
          f"{sample['outstanding']:,} unanswered; RSS MB {rss}; load {sample['loadavg']:.1f}",
          file=sys.stderr, flush=True)


# -- the run ---------------------------------------------------------------------------------------------


def run(a: argparse.Namespace) -> dict[str, Any]:
    """One fresh cluster under the overload; the summary (also the last line of the JSONL)."""
    from launcher import cluster
    from sfaas.runtime.settings import Settings

    os.environ.update({"SFAAS_STORE": a.store, "SFAAS_FALLBACK": "1"})  # the workers inherit it (bench.py's way)
    s = Settings.load({"namespace": f"overload{uuid.uuid4().hex[:8]}", "partitions": a.partitions,
                       "store": a.store, "kafka": a.kafka, "snapshot_interval": a.snapshot_interval})
    a.out.mkdir(parents=True, exist_ok=True)
    raw = a.out / f"{NAME}.jsonl"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    commit = _commit()  # before the run writes its own results (tracked files)
    print(f"preloading {a.keys:,} keys, starting a {a.store} cluster ({s.namespace})", file=sys.stderr, flush=True)
    bench.preload(s, a.keys)
    cluster.up(s, "examples.ycsbt:app", 2, timeout=120)
    with raw.open("a") as f:
        def write(row: dict[str, Any]) -> None:
            f.write(json.dumps({"run": s.namespace, **row}) + "\n")
            f.flush()

        try:
            out = asyncio.run(measure(a, s, write))
        finally:
            cluster.down(s)
            if not a.keep:
                bench.cleanup(s)
        out.update(started=started, ended=time.strftime("%H:%M:%S", time.gmtime()), commit=commit,
                   command=a.command)
        write(out)
    return out


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + ("+changes" if dirty else "")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="memonly")
    ap.add_argument("--factor", type=float, default=3.0, help="offered rate = factor × saturation")
    ap.add_argument("--saturation", type=float, default=9500.0,
                    help="committed TPS at saturation (benchmarks/README.md: memonly 9,500, lsm 11,000)")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the load")
    ap.add_argument("--warmup", type=float, default=10.0, help="RSS is compared from this many seconds in on")
    ap.add_argument("--tolerance", type=float, default=10.0, help="allowed RSS deviation, %%")
    ap.add_argument("--drain-timeout", dest="drain_timeout", type=float, default=600.0,
                    help="seconds to wait for the last replies after the load")
    ap.add_argument("--linger", type=float, default=3.0,
                    help="seconds to keep reading once every request is answered (late duplicates)")
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--snapshot-interval", dest="snapshot_interval", type=float, default=1.0)
    ap.add_argument("--kafka", default=os.environ.get("SFAAS_KAFKA", "127.0.0.1:9092"))
    ap.add_argument("--quick", action="store_true",
                    help="a try: 15 s (warm-up 5 s), results in the temp folder, no README")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder of the raw samples (default benchmarks/results/<date>-overload)")
    ap.add_argument("--keep", action="store_true", help="keep the run's topics, MinIO objects and stores")
    ap.add_argument("--no-readme", dest="no_readme", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    a = parser().parse_args(argv)
    a.command = shlex.join(["python", "-m", "benchmarks.runtime.overload", *argv])
    if a.quick:
        given = {x.split("=")[0] for x in argv}
        # (the default rate: below ~15,000/s a cluster on a quiet machine keeps up, no backlog)
        for opt, value in (("--seconds", 15.0), ("--warmup", 5.0), ("--drain-timeout", 180.0)):
            if opt not in given:
                setattr(a, opt[2:].replace("-", "_"), value)
        a.no_readme = True
        if a.out is None:
            a.out = Path(tempfile.gettempdir()) / "sfaas-overload-quick"
    if a.out is None:
        a.out = ROOT / "benchmarks" / "results" / time.strftime(f"%Y-%m-%d-{NAME}")
    if a.seconds <= a.warmup:
        raise SystemExit(f"--seconds ({a.seconds:g}) must be longer than --warmup ({a.warmup:g})")
    r = run(a)
    text = report(r)
    print(text)
    if a.no_readme:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "REPORT.md").write_text(text + "\n")
        print(f"(report in {a.out / 'REPORT.md'}; README not touched)", file=sys.stderr)
    else:
        publish(NAME, TITLE, text, a.out, a.command, f"{NAME}.jsonl")


if __name__ == "__main__":
    main()
