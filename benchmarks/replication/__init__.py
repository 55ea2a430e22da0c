"""Replication benchmarks: standby cost, failover, rescaling (``python -m benchmarks.replication.<name>``)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def cluster_args(name: str, doc: str | None, seconds: float) -> argparse.ArgumentParser:
    """The options every cluster-level replication benchmark takes."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--store", default="lsm")
    ap.add_argument("--seconds", type=float, default=seconds)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / time.strftime(f"%Y-%m-%d-{name}"))
    ap.add_argument("--no-readme", action="store_true")
    return ap


def run_points(a: argparse.Namespace, name: str, variants: Iterable[tuple[str, list[str]]]) -> list[dict[str, Any]]:
    """``a.repeats`` × each ``(description, extra bench.py args)`` at 1,000 TPS on
    ``a.keys`` preloaded keys; the points, also appended to ``{a.out}/{name}.jsonl``."""
    from benchmarks.runtime import bench

    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    variants = list(variants)
    for rep in range(1, a.repeats + 1):
        for what, extra in variants:
            print(f"[{time.monotonic() - t0:.0f} s] repeat {rep}: {what}, {a.keys:,} keys", file=sys.stderr, flush=True)
            rows += bench.run(bench.parser().parse_args([
                "--store", a.store, "--keys", str(a.keys), "--preload", "--rates", "1000", "--seconds", str(a.seconds),
                *extra, "--label", f"r{rep}", "--out", str(a.out / f"{name}.jsonl"),
            ]))
    return rows


def finish(a: argparse.Namespace, name: str, title: str, report: Callable[[list[dict[str, Any]]], str],
           rows: list[dict[str, Any]]) -> None:
    """Print the report; write it into benchmarks/REPORTS.md (or ``REPORT.md`` with ``--no-readme``)."""
    from benchmarks.readme import publish

    text = report(rows)
    print(text)
    if a.no_readme:
        (a.out / "REPORT.md").write_text(text + "\n")
    else:
        publish(name, title, text, a.out, f"python -m benchmarks.replication.{name}", f"{name}.jsonl")
