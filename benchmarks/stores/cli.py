"""``python -m benchmarks.stores``: run every store benchmark, print and publish the results.

Every measurement runs in its own child process (``child.py``), one after another, with a
progress bar. An engine that fails or hangs is reported in the tables and the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from . import report
from .adapters import DEFAULT_ENGINES, ENGINES, OURS

__all__ = ["main", "Sizes", "SIZES", "build_tasks", "run_child"]

log = logging.getLogger("benchmarks.stores")

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARTS = ("kv", "reopen", "snapshots", "profile")
#: The durability mode each log engine's snapshot task also runs in (its default is the other).
OTHER_SYNC = {"lsm": "none", "appendlog": "none", "hybridlog": "os"}


@dataclass(frozen=True)
class Sizes:
    """Workload sizes of one run mode."""

    n_keys: int
    n_ops: int
    lat_ops: int
    reopen_keys: int
    grow_iters: int
    grow_keys: int
    big_keys: int
    upd_frac: float
    upd_iters: int
    profile_keys: int
    profile_ops: int
    repeat: int
    timeout_s: float


SIZES = {
    "full": Sizes(100_000, 1_000_000, 200_000, 1_000_000, 20, 50_000, 1_000_000, 0.01, 10, 100_000, 200_000, 1, 1800.0),
    "quick": Sizes(10_000, 100_000, 50_000, 100_000, 20, 5_000, 100_000, 0.01, 10, 10_000, 50_000, 3, 600.0),
}


def build_tasks(engines: Sequence[str], sizes: Sizes, parts: Sequence[str], workdir: str, remote: dict[str, Any]) -> list[dict[str, Any]]:
    """The ordered list of child tasks of one run (repetitions interleave the engines)."""
    tasks: list[dict[str, Any]] = []
    if "kv" in parts:
        for _rep in range(sizes.repeat):
            for dist in ("uniform", "zipf"):
                for e in engines:
                    tasks.append(
                        {
                            "kind": "kv",
                            "engine": e,
                            "dist": dist,
                            "n_keys": sizes.n_keys,
                            "n_ops": sizes.n_ops,
                            "lat_ops": sizes.lat_ops,
                            "workdir": workdir,
                        }
                    )
    if "reopen" in parts:
        for e in engines:
            path = os.path.join(workdir, f"reopen-{e}")
            tasks.append({"kind": "build", "engine": e, "n_keys": sizes.reopen_keys, "path": path})
            for _rep in range(3):
                tasks.append({"kind": "reopen", "engine": e, "n_keys": sizes.reopen_keys, "path": path})
    if "snapshots" in parts:
        for e in engines:
            if e in OURS:
                # each log engine also in its other durability mode (hybridlog: with a WAL)
                for sync in (None, *([OTHER_SYNC[e]] if e in OTHER_SYNC else [])):
                    task = {
                        "kind": "snapshots",
                        "engine": e,
                        "grow_iters": sizes.grow_iters,
                        "grow_keys": sizes.grow_keys,
                        "big_keys": sizes.big_keys,
                        "upd_frac": sizes.upd_frac,
                        "upd_iters": sizes.upd_iters,
                        "workdir": workdir,
                        "remote_spec": remote,
                    }
                    if sync is not None:
                        task["sync"] = sync
                    tasks.append(task)
    if "profile" in parts:
        for e in engines:
            if e in OURS:
                tasks.append(
                    {"kind": "profile", "engine": e, "n_keys": sizes.profile_keys, "n_ops": sizes.profile_ops, "workdir": workdir}
                )
    return tasks


def _label(task: dict[str, Any]) -> str:
    return " ".join(str(task[k]) for k in ("kind", "engine", "dist", "sync") if k in task)


def run_child(task: dict[str, Any], timeout_s: float, on_phase: Any = None) -> dict[str, Any]:
    """Run ``task`` in a fresh interpreter; its result, or ``{"error": ...}``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = _REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.stores.child", json.dumps(task)],
        cwd=_REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        proc.kill()

    t0 = time.perf_counter()
    timer = threading.Timer(timeout_s, kill)
    timer.start()
    stderr_lines: list[str] = []
    reader = threading.Thread(target=lambda: stderr_lines.extend(proc.stderr or []), daemon=True)
    reader.start()
    result: dict[str, Any] | None = None
    try:
        for line in proc.stdout or []:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue  # a stray print from a library
            if "phase" in msg and on_phase is not None:
                on_phase(msg["phase"])
            elif "result" in msg:
                result = msg["result"]
        proc.wait()
    finally:
        timer.cancel()
        reader.join(timeout=5)
    seconds = time.perf_counter() - t0
    if timed_out.is_set():
        return {"error": f"timed out after {timeout_s:.0f} s", "task_seconds": seconds}
    if proc.returncode != 0 or result is None:
        tail = [ln.rstrip() for ln in stderr_lines if ln.strip()]
        last = tail[-1] if tail else f"exit code {proc.returncode}"
        return {"error": last[:300], "stderr_tail": "\n".join(tail[-25:]), "task_seconds": seconds}
    return {**result, "task_seconds": seconds}


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.stores",
        description="Benchmark the statestores engines against RocksDB, LevelDB and LMDB in one run.",
    )
    p.add_argument("--quick", action="store_true", help="10x smaller workloads, 3 repetitions (medians)")
    p.add_argument("--engines", nargs="+", default=list(DEFAULT_ENGINES), choices=list(ENGINES), metavar="ENGINE",
                   help=f"engines to run (default: all of {', '.join(DEFAULT_ENGINES)})")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS), help="which measurements to run")
    p.add_argument("--repeat", type=int, default=None, help="repetitions of the put/get runs (default: 3 quick, 1 full)")
    p.add_argument("--out", default=os.path.join(_REPO, "benchmarks", "results"), help="directory for JSON, plots, profiles")
    p.add_argument("--readme", default=os.path.join(_REPO, "benchmarks", "REPORTS.md"),
                   help="the page whose results section is rewritten")
    p.add_argument("--no-readme", action="store_true", help="do not touch the README")
    p.add_argument("--minio", action="store_true", help="snapshot to the MinIO of launcher.services instead of a directory")
    p.add_argument("--workdir", default=None, help="where stores are created (default: a fresh temp dir, removed afterwards)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before one child task is killed")
    p.add_argument("--from-json", default=None, metavar="PATH",
                   help="do not measure: re-render tables, plots and README from a results(.partial).json")
    a = p.parse_args(argv)
    if a.repeat is not None and a.repeat < 1:
        p.error(f"--repeat must be >= 1, got {a.repeat}")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; exit status 0 even when engines fail (the tables say so)."""
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        _publish(args, saved["meta"], saved["raw"])
        return 0
    mode = "quick" if args.quick else "full"
    sizes = SIZES[mode]
    if args.repeat is not None:
        sizes = Sizes(**{**sizes.__dict__, "repeat": args.repeat})
    if args.timeout is not None:
        sizes = Sizes(**{**sizes.__dict__, "timeout_s": args.timeout})
    workdir = args.workdir or tempfile.mkdtemp(prefix="sfaas-bench-")
    os.makedirs(workdir, exist_ok=True)
    if args.minio:
        remote: dict[str, Any] = {"kind": "minio", "bucket": "sfaas-bench"}
    else:
        remote = {"kind": "path", "root": os.path.join(workdir, "remote")}
    tasks = build_tasks(args.engines, sizes, args.parts, workdir, remote)
    given = list(sys.argv[1:] if argv is None else argv)
    command = " ".join(["python -m benchmarks.stores", *(shlex.quote(a) for a in given)])
    meta = {
        "command": command,
        "mode": mode,
        "sizes": sizes.__dict__,
        "engines": list(args.engines),
        "remote": remote["kind"],
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "loadavg_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "durability": {e: ENGINES[e].durability for e in args.engines},
    }
    raw: list[dict[str, Any]] = []
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    partial = os.path.join(out, "results.partial.json")
    t_start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        if args.minio:
            from launcher import services

            # A lease: MinIO is started if needed, and stopped afterwards only if we started it.
            stack.enter_context(services.using(minio=True, progress=lambda msg: log.info("%s", msg)))
        with tqdm(total=len(tasks), unit="task", dynamic_ncols=True) as bar:
            for task in tasks:
                label = _label(task)
                bar.set_description(label)

                def on_phase(phase: str, label: str = label) -> None:
                    bar.set_postfix_str(phase)

                if task["kind"] == "reopen" and _build_failed(raw, task["engine"]):
                    res: dict[str, Any] = {"error": "build failed"}
                else:
                    res = run_child(task, sizes.timeout_s, on_phase)
                if "error" in res:
                    tqdm.write(f"{label}: ERROR {res['error']}")
                raw.append({"task": {k: v for k, v in task.items() if k not in ("workdir", "path", "remote_spec")}, **res})
                # so an interrupted run still leaves its numbers behind
                report.write_json(partial, {"meta": meta, "raw": raw})
                bar.update(1)
    meta["seconds"] = time.perf_counter() - t_start
    meta["loadavg_end"] = list(os.getloadavg())
    os.makedirs(out, exist_ok=True)
    _publish(args, meta, raw)
    os.remove(partial)
    return 0


def _publish(args: argparse.Namespace, meta: dict[str, Any], raw: list[dict[str, Any]]) -> None:
    """Summaries, plots, JSON, profiles, the printed tables and the README section."""
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    summary = report.summarize(raw, meta)
    plots = report.plot_all(summary, out)
    report.write_json(os.path.join(out, "results.json"), {"meta": meta, "summary": summary, "raw": raw})
    report.write_profiles(os.path.join(out, "profiles.txt"), raw)
    md = report.markdown(summary, meta, plots, os.path.dirname(os.path.abspath(args.readme)))
    print(md)
    if not args.no_readme:
        report.rewrite_readme(args.readme, md)
        log.info("results written to %s and %s", out, args.readme)


def _build_failed(raw: list[dict[str, Any]], engine: str) -> bool:
    for r in reversed(raw):
        if r["task"]["kind"] == "build" and r["task"]["engine"] == engine:
            return "error" in r
    return False
