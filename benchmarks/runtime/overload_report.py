"""The overload benchmark's report (``overload.py``): its table, verdicts and one honest
sentence, as markdown, from a run's summary."""

from __future__ import annotations

from typing import Any

#: The runtime processes whose RSS gets a verdict, and those shown for information.
RUNTIME = ("coordinator", "worker-0", "worker-1")
INFO = ("kafka", "generator", "bench")


def _pct(v: dict[str, Any] | None) -> str:
    return "–" if v is None else f"{v['deviation_pct']:+.1f}%"


def mb(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e6:,.1f}"


def report(r: dict[str, Any]) -> str:
    """The run's table and verdicts as markdown."""
    w = r["warmup"]
    tol = r["tolerance_pct"]
    lines = [
        f"{r['store']}, YCSB-T uniform on {r['keys']:,} preloaded keys, 2 workers, {r['partitions']} partitions, "
        f"snapshot rounds every {r['snapshot_interval']:g} s with the epoch log; at {r['commit']}, "
        f"{r['started']}–{r['ended']} UTC; load average (1 min) {r['loadavg_before']:.1f} before, "
        f"≤ {r['loadavg_load_max']:.1f} during the load, ≤ {r['loadavg_drain_max']:.1f} while draining "
        f"(2 cores, shared).",
        "",
        f"| process | RSS MB before the load | at {w:g} s | min ({w:g} s – end of load) | max | end of load "
        f"| end of drain | deviation from {w:g} s | verdict (±{tol:g}%) | deviation from {r['seconds'] / 2:g} s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in (*RUNTIME, *INFO):
        v = r["rss"].get(name)
        if v is None:
            continue
        label = {"kafka": "Kafka broker (info)", "generator": "load generator (info)",
                 "bench": "reply reader (info)"}.get(name, name.replace("-", " "))
        verdict = ("flat" if v["flat"] else "**not flat**") if name in RUNTIME else "–"
        lines.append(f"| {label} | {mb(r['rss_before'].get(name))} | {mb(v['base'])} | {mb(v['min'])} "
                     f"| {mb(v['max'])} | {mb(r['rss_end_of_load'].get(name))} | {mb(r['rss_end_of_drain'].get(name))} "
                     f"| {v['deviation_pct']:+.1f}% | {verdict} | {_pct(r['rss_second_half'].get(name))} |")
    g = r["generator"]
    short = r["offered_rate"] < 0.98 * r["target_rate"]
    offered = (f"Offered: **{r['offered_rate']:,.0f} requests/s** for {r['seconds']:g} s ({r['sent']:,} requests; "
               f"target {r['factor']:g} × {r['saturation']:,.0f} = {r['target_rate']:,.0f}/s")
    offered += (f" — **short of the target by {100 * (1 - r['offered_rate'] / r['target_rate']):.0f}%**, "
                f"{g['late_ticks']} late 100 ms ticks)." if short else ").")
    if r["drained"]:
        drain = f"all answered {r['drain_s']:.0f} s after the load stopped"
    else:
        drain = f"**{r['missing']:,} still unanswered** when the drain timeout ran out"
    cpu = ", ".join(f"{k} {v:.0f}%" for k, v in r["cpu_percent_load"].items())
    lines += [
        "",
        offered,
        f"Committed during the overload: median **{r['committed_tps_median']:,.0f} TPS** per second "
        f"({r['committed_tps_after_warmup']:,.0f} from {w:g} s on); the rest waited in the ingress topic; "
        f"{drain}.",
        f"Requests sent {r['sent']:,}, answered {r['answered']:,}, **lost {r['missing']:,}**, "
        f"**duplicates {r['duplicates']:,}**, replies to no request {r['foreign']:,}; "
        f"aborted {sum(r['aborts'].values()):,}.",
        f"CPU during the load (% of one core): {cpu}; the machine's {r['cores']} cores were "
        f"{r['machine_cpu_load']:.0f}% busy (median of the seconds), "
        f"{sum(r['cpu_percent_load'].values()) / r['cores']:.0f}% by these processes.",
    ]
    if r.get("backlog_end_of_load") is not None:
        peaks = "; ".join(f"{name} " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(g.items()))
                          for name, g in sorted(r["gauges_max"].items()) if g)
        lines.append(f"Unanswered at the end of the load: {r['backlog_end_of_load']:,}. Largest values the "
                     f"processes' /metrics showed (sampled each second): {peaks or 'none'}."
                     + (f" Scraping failed: {'; '.join(r['scrape_errors'])}." if r.get("scrape_errors") else ""))
    if r["restarts"]:
        lines.append(f"**Restarted during the run:** {r['restarts']} (new pids): the RSS of those is not comparable.")
    lines += ["", prose(r)]
    return "\n".join(lines)


def prose(r: dict[str, Any]) -> str:
    """One honest sentence on the outcome."""
    bad = [n for n in RUNTIME if r["rss"].get(n) and not r["rss"][n]["flat"]]
    missing = [n for n in RUNTIME if not r["rss"].get(n)]
    worst = max((r["rss"][n] for n in RUNTIME if r["rss"].get(n)), key=lambda v: abs(v["deviation_pct"]), default=None)
    if missing:
        memory = f"No RSS samples for {', '.join(missing)} (it died?): no verdict."
    elif bad:
        memory = ("RSS is **not flat** under this overload: "
                  + ", ".join(f"{n} {r['rss'][n]['deviation_pct']:+.1f}%" for n in bad)
                  + f" against its RSS at {r['warmup']:g} s (target ±{r['tolerance_pct']:g}%; the last column "
                  "tells a late plateau from a process still growing).")
    else:
        assert worst is not None
        memory = (f"Every runtime process' RSS stayed within ±{r['tolerance_pct']:g}% of its value at "
                  f"{r['warmup']:g} s (worst {worst['deviation_pct']:+.1f}%): flat.")
    if not r["drained"] or r["missing"] or r["duplicates"] or r["foreign"]:
        fate = (f" Not every request was answered exactly once ({r['missing']:,} missing, {r['duplicates']:,} "
                f"duplicated, {r['foreign']:,} unknown replies).")
    else:
        fate = " Nothing was lost or duplicated."
    if r["offered_rate"] < 0.98 * r["target_rate"]:
        fate += (f" The generator reached only {r['offered_rate'] / r['saturation']:.1f}× the saturation rate, "
                 f"not {r['factor']:g}×.")
    return memory + fate
