"""What one snapshot round costs a store, engine by engine, without Kafka or a cluster.

One store of 10,000 keys (100-byte values) on tmpfs with a directory remote takes a
first snapshot, then 40 rounds of what a runtime store sees at 1,000 TPS between two
rounds (125 write batches of 4 random keys), each followed by a snapshot and a settle.
Prints, per engine: files and KiB uploaded per round, the CPU of this process and its
background processes per round, the freeze's median and maximum, and the merges done.

    python benchmarks/runtime/round_cost.py lsm appendlog hybridlog memonly

The counts are deterministic (a seeded key sequence); the CPU is the machine's.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from any clone

import remotes  # noqa: E402
import statestores  # noqa: E402

ROUNDS = 40
ENGINES = ("lsm", "appendlog", "hybridlog", "memonly")


def _cpu(me: psutil.Process) -> float:
    t = me.cpu_times()
    total = t.user + t.system
    for c in me.children(recursive=True):  # the store's background processes
        try:
            ct = c.cpu_times()
        except psutil.Error:
            continue
        total += ct.user + ct.system
    return total


def measure(engine: str) -> str:
    root = tempfile.mkdtemp(prefix="sfaas-rounds-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        remote = remotes.PathRemote(os.path.join(root, "remote"))
        s = statestores.open(engine, os.path.join(root, "db"), remote=remote)
        rng = random.Random(1)
        for i in range(0, 10000, 500):
            s.write_batch([(b"k%05d" % j, b"v" * 100) for j in range(i, i + 500)])
        s.snapshot(1)
        s.settle()
        me = psutil.Process()
        files = size = 0
        freeze = []
        c0 = _cpu(me)
        for r in range(2, ROUNDS + 2):
            for _ in range(125):
                s.write_batch([(b"k%05d" % rng.randrange(10000), b"w%d" % r * 20) for _ in range(4)])
            info = s.snapshot(r)
            files += info.files_uploaded
            size += info.bytes_uploaded
            freeze.append(info.freeze_seconds)
            s.settle()
        cpu = _cpu(me) - c0
        merges = s.stats().get("merges_done", 0)
        s.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    freeze.sort()
    return (f"{engine:>9}: {files / ROUNDS:.2f} files/round, {size / ROUNDS / 1024:.1f} KiB/round, "
            f"CPU {1000 * cpu / ROUNDS:.1f} ms/round (all processes), freeze p50 {1000 * freeze[len(freeze) // 2]:.2f} ms "
            f"max {1000 * freeze[-1]:.2f} ms, {merges} merges")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engines", nargs="*", default=list(ENGINES), help=f"any of {', '.join(ENGINES)} (default: all)")
    args = ap.parse_args()
    bad = [e for e in args.engines if e not in ENGINES]
    if bad:
        ap.error(f"unknown engine {bad[0]!r}: expected one of {', '.join(ENGINES)}")
    t0 = time.monotonic()
    for e in args.engines:
        print(measure(e), flush=True)
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
