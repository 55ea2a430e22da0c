"""How a store's costs grow with its state: keys 10K → 50M, values 100 B → 100 KB.

    python -m benchmarks.scale.state                              # lsm, 10K … 50M keys
    python -m benchmarks.scale.state --keys 10K,100K,1M --engines lsm,appendlog
    python -m benchmarks.scale.state --values 100,1K,10K,100K     # the value-size curve

One store per point, on disk (``--dir``, default ``~/.cache/sfaas/scale``), with a
directory remote standing in for MinIO (the bytes a round uploads are the same; the
seconds are a local disk's). Per point:

- **preload**: the keys written straight into the store in batches of 10,000 (not through
  transactions), then flushed; keys/s;
- **first round**: the snapshot that uploads everything (bytes, seconds);
- **a round after 1% changed**: 1% of the keys rewritten (random keys, new values of the
  same size), then a snapshot: the bytes it uploads against the bytes changed (issue 34's
  target: ≤ 2×), the freeze and the upload's seconds;
- **lookups**: p50 / p99 of 20,000 random point reads (µs);
- **restore**: a fresh directory restoring the newest round (a replacement without local
  state: what a recovery without a standby downloads), and a reopen of the existing
  directory (a restart on the same machine);
- **RSS** of this process and the store's background processes, and the bytes on disk.

Each point prints one line as it finishes and appends it as JSON to ``--out``; a 50M-key
lsm point takes ~25 minutes here and ~19 GB of disk (the store, the directory
remote and the restored copy).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import remotes  # noqa: E402
import statestores  # noqa: E402

ENGINES = ("lsm", "appendlog", "hybridlog", "memonly")
DEFAULT_KEYS = "10K,100K,1M,10M,50M"
BATCH = 10_000
LOOKUPS = 20_000


def parse_count(text: str, what: str) -> int:
    """``"10K"`` → 10000, ``"50M"`` → 50000000; bad input names itself."""
    t = text.strip().upper()
    mult = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000}.get(t[-1:], 1)
    try:
        n = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise SystemExit(f"{what}: {text!r} is not a count (expected e.g. 100, 10K, 50M)") from None
    if n <= 0:
        raise SystemExit(f"{what}: {text!r} must be positive")
    return n


def _key(i: int) -> bytes:
    return b"user%010d" % i


def _rss(me: psutil.Process) -> int:
    total: int = me.memory_info().rss
    for c in me.children(recursive=True):  # the store's background processes
        try:
            total += c.memory_info().rss
        except psutil.Error:
            continue
    return total


def _disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def _progress(what: str, done: int, total: int, t0: float) -> None:
    if sys.stderr.isatty() or done == total:
        print(f"\r  {what}: {done:,}/{total:,} ({time.monotonic() - t0:.0f} s)", end="",
              file=sys.stderr, flush=True)
        if done == total:
            print(file=sys.stderr)


def point(engine: str, keys: int, value_size: int, base: Path, seed: int = 1) -> dict[str, object]:
    """One store of ``keys`` keys of ``value_size``-byte values (see the module docstring)."""
    where = base / f"{engine}-{keys}-{value_size}"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    remote = remotes.PathRemote(str(where / "remote"))
    rnd = random.Random(seed)
    value = bytes(rnd.getrandbits(8) for _ in range(value_size))
    me = psutil.Process()
    out: dict[str, object] = {"engine": engine, "keys": keys, "value_bytes": value_size}
    s = statestores.open(engine, where / "db", remote=remote)
    try:
        t0 = time.monotonic()
        for i in range(0, keys, BATCH):
            s.write_batch([(_key(j), value) for j in range(i, min(keys, i + BATCH))])
            if i % (BATCH * 100) == 0:
                _progress(f"{engine} {keys:,} keys preload", i, keys, t0)
        s.flush()
        s.settle()
        _progress(f"{engine} {keys:,} keys preload", keys, keys, t0)
        out["preload_s"] = round(time.monotonic() - t0, 1)
        out["preload_keys_per_s"] = round(keys / max(1e-9, time.monotonic() - t0))

        first = s.snapshot(1)
        s.settle()
        out["first_round_mb"] = round(first.bytes_uploaded / 1e6, 1)
        out["first_round_s"] = round(first.freeze_seconds + first.upload_seconds, 2)

        changed = max(1, keys // 100)
        new = bytes(b ^ 0x5A for b in value)
        t0 = time.monotonic()
        picked = rnd.sample(range(keys), changed) if changed < keys else list(range(keys))
        for i in range(0, changed, BATCH):
            s.write_batch([(_key(j), new) for j in picked[i:i + BATCH]])
        out["change_1pct_s"] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        second = s.snapshot(2)
        out["round_s"] = round(time.monotonic() - t0, 2)
        s.settle()
        changed_bytes = changed * (len(_key(0)) + value_size)
        out["changed_mb"] = round(changed_bytes / 1e6, 2)
        out["round_mb"] = round(second.bytes_uploaded / 1e6, 2)
        out["round_over_changed"] = round(second.bytes_uploaded / changed_bytes, 2)
        out["round_files"] = second.files_uploaded
        out["freeze_ms"] = round(1000 * second.freeze_seconds, 2)

        lat = []
        for _ in range(LOOKUPS):
            k = _key(rnd.randrange(keys))
            t = time.perf_counter()
            v = s.get(k)
            lat.append(time.perf_counter() - t)
            if v is None:
                raise AssertionError(f"{engine}: key {k!r} lost (keys {keys})")
        out["get_p50_us"] = round(1e6 * _pct(lat, 0.5), 1)
        out["get_p99_us"] = round(1e6 * _pct(lat, 0.99), 1)
        out["rss_mb"] = round(_rss(me) / 1e6)
        out["disk_mb"] = round(_disk(where / "db") / 1e6)
    finally:
        s.close()

    t0 = time.monotonic()  # a restart on the same machine: reopen the directory
    s = statestores.open(engine, where / "db", remote=remote)
    out["reopen_s"] = round(time.monotonic() - t0, 2)
    s.close()
    t0 = time.monotonic()  # a replacement with nothing local: opening restores the newest round
    s = statestores.open(engine, where / "fresh", remote=remote)
    try:
        out["restore_s"] = round(time.monotonic() - t0, 2)
        out["restore_mb"] = round(_disk(where / "fresh") / 1e6, 1)
        probe = _key(rnd.randrange(keys))
        if s.get(probe) not in (value, new):
            raise AssertionError(f"{engine}: restored store lost {probe!r}")
    finally:
        s.close()
    shutil.rmtree(where, ignore_errors=True)
    return out


def line(p: dict[str, object]) -> str:
    return (f"{p['engine']:>9} {p['keys']:>11,} keys × {p['value_bytes']:>6} B: "
            f"preload {p['preload_s']} s, first round {p['first_round_mb']} MB in "
            f"{p['first_round_s']} s; 1% changed ({p['changed_mb']} MB) → round "
            f"{p['round_mb']} MB ({p['round_over_changed']}×) in {p['round_s']} s, freeze "
            f"{p['freeze_ms']} ms; get p50/p99 {p['get_p50_us']}/{p['get_p99_us']} µs; "
            f"reopen {p['reopen_s']} s, restore {p['restore_mb']} MB in {p['restore_s']} s; "
            f"RSS {p['rss_mb']} MB, disk {p['disk_mb']} MB")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default="lsm", help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--keys", default=None, help=f"key counts (default {DEFAULT_KEYS})")
    ap.add_argument("--values", default=None,
                    help="value sizes in bytes, e.g. 100,1K,10K,100K: the value-size curve "
                         "(keys then default to 2 GB of values or 100K, whichever is fewer)")
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "sfaas" / "scale")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scale-state.jsonl")
    a = ap.parse_args(argv)
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINES:
            raise SystemExit(f"--engines: unknown engine {e!r}: expected one of {', '.join(ENGINES)}")
    values = [parse_count(v, "--values") for v in (a.values or "100").split(",")]
    points: list[tuple[int, int]] = []
    for v in values:
        if a.keys is not None:
            counts = [parse_count(k, "--keys") for k in a.keys.split(",")]
        elif a.values is not None:
            counts = [min(100_000, (2 << 30) // v)]
        else:
            counts = [parse_count(k, "--keys") for k in DEFAULT_KEYS.split(",")]
        points += [(k, v) for k in counts]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    for engine in engines:
        for keys, v in points:
            p = point(engine, keys, v, a.dir)
            p["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            print(line(p), flush=True)
            with a.out.open("a") as f:
                f.write(json.dumps(p) + "\n")
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
