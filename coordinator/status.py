"""The coordinator's status page: ``/`` (HTML) and ``/status.json`` (what the page shows).

:func:`data` gathers what the coordinator knows (its snapshot, ``coordinator.snapshot``) —
the workers with their partitions, roles and health, the standbys, throughput and p50/p99
over the last minutes (from the workers' heartbeats, ``coordinator.metrics``), the snapshot
rounds and their failures, the recoveries, a rescale under way or the last one, and each
operator's state in the newest round — as a summary, tables of pre-formatted cells and
time series. :func:`page` renders the same data as plain HTML; a small inline script then
polls ``/status.json`` every two seconds and refills the tables and the chart, so the page
needs no build step and works without the script, too.

No credential is shown: the page shows no setting that holds one, and text that comes from
elsewhere (a failed round's error) has the configured secrets blanked out. Text from the
network (worker names) is escaped in the HTML and set as text by the script.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Callable
from typing import Any

from coordinator.metrics import WINDOW_SECONDS, CoordinatorMetrics, Sample, operator_bytes
from coordinator.slowview import COLUMNS
from coordinator.snapshot import ClusterSnapshot, MemberView
from sfaas.runtime.lifecycle import Service
from sfaas.runtime.metrics import LATENCY_BOUNDS, quantile
from sfaas.runtime.partitioning import owned
from sfaas.runtime.protocols.rounds import RoundManifest

__all__ = ["StatusServer", "data", "as_json", "page", "POLL_SECONDS"]

#: How often the page asks for fresh data.
POLL_SECONDS = 2.0
#: The summary's throughput and quantiles cover this many seconds.
RECENT_SECONDS = 60.0
#: Each point of the latency series covers this many seconds.
SMOOTH_SECONDS = 10.0


def _num(n: float) -> str:
    return f"{n:,.0f}"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def _ago(t: float, now: float) -> str:
    s = max(0.0, now - t)
    return f"{s:.1f} s ago" if s < 60 else f"{s / 60:.0f} min ago"


def _window(samples: list[Sample], now: Sample,
            seconds: float) -> tuple[float | None, list[int]]:
    """Requests per second and latency counts between ``now`` and the sample ``seconds``
    before."""
    older = [s for s in samples if s.t <= now.t - 1.0]
    if not older:
        return None, [0] * len(now.latency)
    base = next((s for s in older if s.t >= now.t - seconds), older[-1])
    counts = [max(0, a - b) for a, b in zip(now.latency, base.latency, strict=True)]
    answered = sum(now.answered.values()) - sum(base.answered.get(k, 0) for k in now.answered)
    return max(0, answered) / (now.t - base.t), counts


def _health(mb: MemberView, age: float, timeout: float) -> str:
    """What the workers table says of member ``mb``, heard from ``age`` seconds ago."""
    if not mb.alive:
        return f"lost (promoting {mb.promoting})" if mb.promoting else "lost"
    if not mb.ready:
        return "starting"
    return "silent" if age > timeout else "healthy"


def _workers(c: ClusterSnapshot, samples: list[Sample], cur: Sample,
             mono: float) -> tuple[list[list[str]], list[dict[str, Any]], int]:
    """The workers table's rows (primaries, each followed by its standbys, then the
    joiners), their raw form for the JSON, and how many primaries are healthy."""
    owners = list(c.owners)  # the partition map in force
    workers: list[list[str]] = []
    raw_workers: list[dict[str, Any]] = []
    healthy = 0
    for mb in sorted(c.members, key=lambda x: x.index):
        age = mono - mb.last_seen
        health = _health(mb, age, c.heartbeat_timeout)
        healthy += health == "healthy"
        parts = owned(owners, mb.index)
        done = cur.answered.get(mb.index, 0)
        w_rate = None
        base = next((x for x in samples if cur.t - RECENT_SECONDS <= x.t <= cur.t - 1.0), None)
        if base is not None:
            w_rate = max(0, done - base.answered.get(mb.index, 0)) / (cur.t - base.t)
        workers.append([str(mb.index), "primary", mb.name, str(mb.pid), mb.address,
                        ", ".join(map(str, parts)), health, f"{age:.1f} s ago", _num(done),
                        "–" if w_rate is None else f"{w_rate:,.1f}"])
        raw_workers.append({"index": mb.index, "role": "primary", "name": mb.name, "pid": mb.pid,
                            "partitions": parts, "health": health, "answered": done})
        for sb in c.standbys_of(mb.index):
            following = "following" if sb.following else "waiting"
            workers.append([str(sb.of), "standby", sb.name, str(sb.pid), sb.host,
                            f"follows {', '.join(map(str, parts))}", following, "", "", ""])
            raw_workers.append({"index": sb.of, "role": "standby", "name": sb.name, "pid": sb.pid,
                                "partitions": parts, "health": following})
    for j in c.joiners:
        workers.append(["", "joining", j.name, str(j.pid), f"{j.host}:{j.port}", "",
                        "joining a rescale", f"{mono - j.last_seen:.1f} s ago", "", ""])
        raw_workers.append({"index": j.index, "role": "joining", "name": j.name, "pid": j.pid,
                            "partitions": [], "health": "joining"})
    return workers, raw_workers, healthy


def _rescaling(c: ClusterSnapshot) -> str:
    rescaling = f"to {c.rescale_target} workers" if c.rescale_target is not None else "no"
    if c.last_rescale:
        scaled = c.last_rescale
        rescaling += (f"; last: {scaled['workers']} workers, {len(scaled['moved'])} partitions "
                      f"moved, paused {_ms(scaled['pause_seconds'])}")
    return rescaling


def _store_rows(last: RoundManifest | None) -> list[list[str]]:
    """The state per operator of round ``last`` (none before the first complete round)."""
    store_rows: list[list[str]] = []
    if last is not None:
        per_op = operator_bytes(last)
        for op in sorted(per_op):
            cuts = [st for st in last.stores if st.operator == op]
            store_rows.append([op, str(len(cuts)), _bytes(per_op[op]),
                               _num(sum(st.files for st in cuts)),
                               _bytes(sum(st.bytes_uploaded for st in cuts))])
    return store_rows


def _series(samples: list[Sample], cur: Sample, now: float) -> dict[str, list[Any]]:
    """The plots: throughput and smoothed latency quantiles between consecutive samples."""
    series: dict[str, list[Any]] = {"t": [], "throughput": [], "p50_ms": [], "p99_ms": []}
    points = [*samples, cur]
    k = max(1, round(SMOOTH_SECONDS / 2.0))
    for i in range(1, len(points)):
        a, b = points[i - 1], points[i]
        if b.t - a.t < 0.5:
            continue
        done_b = sum(b.answered.values())
        done_a = sum(a.answered.get(x, 0) for x in b.answered)
        lat = [max(0, x - y) for x, y in zip(b.latency, points[max(0, i - k)].latency, strict=True)]
        series["t"].append(round(b.t - now, 1))
        series["throughput"].append(round(max(0, done_b - done_a) / (b.t - a.t), 1))
        q50, q99 = quantile(LATENCY_BOUNDS, lat, 0.5), quantile(LATENCY_BOUNDS, lat, 0.99)
        series["p50_ms"].append(None if q50 is None else round(q50 * 1000, 2))
        series["p99_ms"].append(None if q99 is None else round(q99 * 1000, 2))
    return series


def _tables(c: ClusterSnapshot, m: CoordinatorMetrics, workers: list[list[str]],
            now: float) -> list[dict[str, Any]]:
    """Every table of the page but the summary."""
    rounds = c.rounds
    history = list(rounds.history)
    round_rows = [[str(r.round), _ago(r.created, now), str(r.epoch),
                   _ms(max(0.0, r.created - r.started)), _bytes(r.bytes_uploaded),
                   _bytes(r.total_bytes), _num(r.files)] for r in reversed(history[-5:])]
    failure_rows = [[_ago(t, now), str(rnd), why[:300]]
                    for t, rnd, why in reversed(rounds.failures[-5:])]
    recovery_rows = [[_ago(r["finished"], now), str(r.get("attempt", "")), str(r.get("round", "")),
                      str(r.get("epochs_replayed", "")), _ms(r.get("detect+restart")),
                      _ms(r.get("restore")), _ms(r.get("replay")), _ms(r.get("seconds"))]
                     for r in reversed(m.recoveries)]
    diverged_rows = [[_ago(d["time"], now), str(d["worker"]), d["function"], repr(d["key"]),
                      d["rid"], d["before"], d["after"]] for d in reversed(m.divergences)]
    return [
        {"id": "workers", "title": "Workers", "empty": "no worker registered yet",
         "columns": ["slot", "role", "name", "pid", "address", "partitions", "health",
                     "heard from", "answered", "req/s (1 min)"], "rows": workers},
        {"id": "rounds", "title": "Snapshot rounds", "empty": "no complete round yet",
         "columns": ["round", "published", "epoch", "marker → published", "uploaded", "state",
                     "files"],
         "rows": round_rows},
        {"id": "round-failures", "title": "Failed rounds", "empty": "none",
         "columns": ["when", "round", "why"], "rows": failure_rows},
        {"id": "recoveries", "title": "Recoveries", "empty": "none",
         "columns": ["finished", "attempt", "round", "epochs replayed", "detect + restart",
                     "restore", "replay", "total"], "rows": recovery_rows},
        {"id": "divergences", "title": "Replays that diverged (functions not deterministic)",
         "empty": "none",
         "columns": ["when", "worker", "function", "key", "request", "reply before the crash",
                     "reply in the replay"], "rows": diverged_rows},
        {"id": "slow", "title": "Slowest and aborted requests (last minute)",
         "empty": "none in the last minute", "columns": COLUMNS,
         "rows": m.slow.rows(now, c.jaeger_ui)},
        {"id": "stores", "title": "State per operator (newest round)",
         "empty": "no complete round yet",
         "columns": ["operator", "partitions", "state", "files", "uploaded in the round"],
         "rows": _store_rows(rounds.last_complete)},
    ]


def data(c: ClusterSnapshot, m: CoordinatorMetrics) -> dict[str, Any]:
    """What the status page shows (see module docstring): snapshot ``c`` and the history
    ``m`` keeps."""
    now, mono = m.clock.time(), m.clock.monotonic()  # (the coordinator's clock port)
    samples = list(m.samples)
    cur = m.current()
    rate, recent = _window(samples, cur, RECENT_SECONDS)
    p50, p99 = quantile(LATENCY_BOUNDS, recent, 0.5), quantile(LATENCY_BOUNDS, recent, 0.99)
    workers, raw_workers, healthy = _workers(c, samples, cur, mono)
    rounds = c.rounds
    last = rounds.last_complete
    answered = sum(cur.answered.values())
    summary = [
        ["throughput", "requests/s (1 min)", "–" if rate is None else f"{rate:,.1f}"],
        ["p50", "p50 latency (1 min)", _ms(p50)],
        ["p99", "p99 latency (1 min)", _ms(p99)],
        ["answered", "requests answered", _num(answered)],
        ["epochs", "epochs", _num(c.stats.epochs)],
        ["workers", "workers healthy", f"{healthy} of {c.slots}"],
        ["standbys", "standbys", str(len(c.standbys))],
        ["round", "newest snapshot round",
         "none yet" if last is None else f"#{last.round}, {_ago(last.created, now)}"],
        ["recoveries", "recoveries", str(m.recovered_total)],
        ["diverged", "replies a replay changed (not deterministic)", str(m.diverged_total)],
        ["rescale", "rescaling", _rescaling(c)],
    ]
    if c.recovery_stopped:
        summary.insert(0, ["stopped", "RECOVERY STOPPED", c.recovery_stopped])
    return {
        "app": c.app, "namespace": c.namespace, "time": now, "poll_seconds": POLL_SECONDS,
        "recovery_stopped": c.recovery_stopped,
        "summary": summary,
        "tables": _tables(c, m, workers, now),
        "series": _series(samples, cur, now),
        "raw": {"answered": answered, "epochs": c.stats.epochs, "workers": raw_workers,
                "rate": rate, "p50_seconds": p50, "p99_seconds": p99,
                "rounds_completed": rounds.completed, "recoveries": m.recovered_total,
                "replay_divergences": m.diverged_total},
    }


class StatusServer(Service):
    """Serves ``/metrics``, this page (``/``) and its data (``/status.json``) on
    ``host:port`` (0: nothing is served), from ``metrics`` and what ``snapshot`` says the
    coordinator looks like now."""

    part = "metrics"

    def __init__(self, metrics: CoordinatorMetrics, snapshot: Callable[[], ClusterSnapshot],
                 host: str, port: int) -> None:
        self._metrics = metrics
        self._snapshot = snapshot
        self._where = (host, port)

    def html_page(self) -> tuple[str, bytes]:
        return "text/html; charset=utf-8", page(self._snapshot(), self._metrics).encode()

    def json_data(self) -> tuple[str, bytes]:
        return "application/json", as_json(self._snapshot(), self._metrics).encode()

    async def on_start(self) -> None:
        await self._metrics.start(*self._where, {"/": self.html_page,
                                                      "/status.json": self.json_data})

    async def on_stop(self) -> None:
        await self._metrics.close()


def as_json(c: ClusterSnapshot, m: CoordinatorMetrics) -> str:
    return json.dumps(data(c, m))


def _cell(cell: str | list[str]) -> str:
    """A cell's HTML: its text, or ``[text, URL]`` a link (a request's trace)."""
    e = html.escape
    if isinstance(cell, list):
        return f'<td><a href="{e(cell[1])}" target="_blank" rel="noopener">{e(cell[0])}</a></td>'
    return f"<td>{e(cell)}</td>"


def _table(t: dict[str, Any]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(col)}</th>" for col in t["columns"])
    if t["rows"]:
        body = "".join("<tr>" + "".join(_cell(cell) for cell in row) + "</tr>"
                       for row in t["rows"])
    else:
        body = f'<tr class="empty"><td colspan="{len(t["columns"])}">{e(t["empty"])}</td></tr>'
    return (f'<section><h2>{e(t["title"])}</h2>'
            f'<table id="{e(t["id"])}" data-empty="{e(t["empty"])}">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></section>")


def page(c: ClusterSnapshot, m: CoordinatorMetrics) -> str:
    """The status page, rendered with the current data."""
    d = data(c, m)
    e = html.escape
    cards = "".join(f'<div class="card" data-key="{e(k)}"><div class="label">{e(label)}</div>'
                    f'<div class="value">{e(value)}</div></div>'
                    for k, label, value in d["summary"])
    tables = "".join(_table(t) for t in d["tables"])
    updated = time.strftime("%H:%M:%S", time.localtime(d["time"]))
    fields = {"title": e(f"sfaas · {d['app']}"), "app": e(d["app"]),
              "namespace": e(d["namespace"]), "updated": updated, "cards": cards,
              "tables": tables, "poll_ms": str(int(d["poll_seconds"] * 1000)),
              "window_s": str(int(WINDOW_SECONDS)), "window_min": str(int(WINDOW_SECONDS // 60))}
    # one pass: text from the data is never looked at for placeholders again
    return re.sub(r"\{(" + "|".join(fields) + r")\}", lambda mt: fields[mt.group(1)], _PAGE)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em 2em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.05em;margin:1.2em 0 .4em}
.sub{color:#666;margin-bottom:1em}.stale{color:#b00}
.cards{display:flex;flex-wrap:wrap;gap:.6em}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.5em .8em;min-width:9em}
.card .label{color:#666;font-size:.85em}
.card .value{font-size:1.3em;font-variant-numeric:tabular-nums}
table{border-collapse:collapse;background:#fff}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left}
th{background:#f0f0f0;font-weight:600}td{font-variant-numeric:tabular-nums}tr.empty td{color:#888}
#chart{background:#fff;border:1px solid #ddd;border-radius:6px;margin-top:.8em}
.legend{font-size:.85em;color:#666}
</style></head><body>
<h1>sfaas · app <span id="app">{app}</span></h1>
<div class="sub">namespace {namespace} · updated <span id="updated">{updated}</span>
<span id="stale" class="stale"></span> · <a href="/status.json">status.json</a>
· <a href="/metrics">metrics</a></div>
<div class="cards" id="summary">{cards}</div>
<svg id="chart" width="720" height="160" viewBox="0 0 720 160" role="img"
 aria-label="throughput and p99 latency over the last minutes"></svg>
<div class="legend"><span style="color:#2a6fdb">━ requests/s</span> ·
<span style="color:#d9822b">━ p99 latency (ms)</span> · the last {window_min} minutes</div>
{tables}
<script>
"use strict";
function fill(tbody, rows, ncols, empty) {
  tbody.replaceChildren();
  if (!rows.length) {
    const tr = tbody.insertRow(); tr.className = "empty";
    const td = tr.insertCell(); td.colSpan = ncols; td.textContent = empty; return;
  }
  for (const row of rows) {
    const tr = tbody.insertRow();
    for (const cell of row) tr.insertCell().textContent = cell;
  }
}
function line(ts, values, max, color) {
  const pts = [];
  values.forEach((v, i) => {
    if (v === null) return;
    const x = 40 + 670 * (1 + ts[i] / {window_s});
    pts.push(x.toFixed(1) + "," + (150 - 135 * v / (max || 1)).toFixed(1));
  });
  const el = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  el.setAttribute("points", pts.join(" ")); el.setAttribute("fill", "none");
  el.setAttribute("stroke", color); el.setAttribute("stroke-width", "2");
  return el;
}
function label(text, x, y, color) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", "text");
  el.setAttribute("x", x); el.setAttribute("y", y); el.setAttribute("font-size", "11");
  el.setAttribute("fill", color); el.textContent = text; return el;
}
function chart(s) {
  const svg = document.getElementById("chart");
  svg.replaceChildren();
  const tmax = Math.max(1, ...s.throughput);
  const pmax = Math.max(1, ...s.p99_ms.filter(v => v !== null));
  svg.append(line(s.t, s.throughput, tmax, "#2a6fdb"), line(s.t, s.p99_ms, pmax, "#d9822b"),
             label(tmax.toFixed(0) + "/s", 2, 14, "#2a6fdb"),
             label(pmax.toFixed(1) + " ms", 2, 28, "#d9822b"));
}
function render(d) {
  for (const [key, , value] of d.summary) {
    const card = document.querySelector('.card[data-key="' + key + '"] .value');
    if (!card) { location.reload(); return; }  // a new card (recovery stopped): render anew
    card.textContent = value;
  }
  for (const t of d.tables) {
    const table = document.getElementById(t.id);
    if (table) fill(table.tBodies[0], t.rows, t.columns.length, t.empty);
  }
  chart(d.series);
  document.getElementById("updated").textContent = new Date(d.time * 1000).toLocaleTimeString();
  document.getElementById("stale").textContent = "";
}
async function poll() {
  try {
    const r = await fetch("/status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
  } catch (err) {
    document.getElementById("stale").textContent =
      "(cannot reach the coordinator: " + err.message + ")";
  }
  setTimeout(poll, {poll_ms});
}
poll();
</script>
</body></html>
"""
