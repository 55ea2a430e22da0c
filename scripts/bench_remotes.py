"""Throughput/latency of PathRemote vs MinioRemote (needs MinIO:
`python -m launcher.services up --minio-only`).

    python -m scripts.bench_remotes [--mib 64] [--files 64]   (from the repo root)

Prints one table row per operation: seconds, MiB/s or ops/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from launcher import services
from remotes import FileInfo, Manifest, Remote
from remotes.minio import MinioRemote
from remotes.path import PathRemote


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(remote: Remote, work: Path, mib: int, nfiles: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    big = work / "big"
    big.write_bytes(os.urandom(mib << 20))
    small = []
    for i in range(nfiles):
        p = work / f"small-{i}"
        p.write_bytes(os.urandom(1 << 20))
        small.append(p)

    t = timed(lambda: remote.put_file("big", big))
    rows.append((f"put 1 x {mib} MiB", f"{t:.3f} s  {mib / t:.0f} MiB/s"))
    t = timed(lambda: remote.get_file("big", work / "big.out"))
    rows.append((f"get 1 x {mib} MiB", f"{t:.3f} s  {mib / t:.0f} MiB/s"))

    t = timed(lambda: [remote.put_file(p.name, p) for p in small])
    rows.append((f"put {nfiles} x 1 MiB, 1 thread", f"{t:.3f} s  {nfiles / t:.0f} MiB/s"))
    with ThreadPoolExecutor(8) as pool:
        t = timed(lambda: list(pool.map(lambda p: remote.put_file(p.name + "-p", p), small)))
    rows.append((f"put {nfiles} x 1 MiB, 8 threads", f"{t:.3f} s  {nfiles / t:.0f} MiB/s"))
    with ThreadPoolExecutor(8) as pool:
        def fetch(p: Path) -> None:
            remote.get_file(p.name, work / (p.name + ".out"))

        t = timed(lambda: list(pool.map(fetch, small)))
    rows.append((f"get {nfiles} x 1 MiB, 8 threads", f"{t:.3f} s  {nfiles / t:.0f} MiB/s"))

    lat = []
    for i in range(50):
        m = Manifest(i, "bench", {p.name: FileInfo(1 << 20, 0) for p in small})
        lat.append(timed(lambda m=m: remote.write_manifest(m)))  # type: ignore[misc]
    rows.append((f"write_manifest ({nfiles} files), p50", f"{statistics.median(lat) * 1e3:.2f} ms"))
    lat = [timed(lambda i=i: remote.read_manifest(i)) for i in range(50)]  # type: ignore[misc]
    rows.append(("read_manifest, p50", f"{statistics.median(lat) * 1e3:.2f} ms"))
    lat = [timed(remote.list_files) for _ in range(20)]
    label = f"list_files ({2 * nfiles + 1} files), p50"
    rows.append((label, f"{statistics.median(lat) * 1e3:.2f} ms"))
    t = timed(lambda: remote.gc(keep=1))
    rows.append(("gc(keep=1) of 50 manifests", f"{t * 1e3:.1f} ms"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--files", type=int, default=64)
    args = ap.parse_args()
    ep = services.up(kafka=False, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        remotes: dict[str, Remote] = {
            "PathRemote": PathRemote(work / "remote"),
            "MinioRemote": MinioRemote(
                ep.minio_endpoint, ep.minio_access_key, ep.minio_secret_key, "sfaas-bench",
                prefix=f"b-{uuid.uuid4().hex[:8]}",
            ),
        }
        for name, remote in remotes.items():
            data = work / f"data-{name}"
            data.mkdir()
            try:
                rows = bench(remote, data, args.mib, args.files)
            finally:
                remote.destroy()
                remote.close()
            print(f"\n{name}")
            for op, result in rows:
                print(f"  {op:<36} {result}")


if __name__ == "__main__":
    main()
