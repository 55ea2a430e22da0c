"""CPU of one small PUT to the local MinIO: the client's (this process) and MinIO's.

    python benchmarks/results/2026-11-24-rounds-minio/putcost.py     # MinIO running (sfaas services up)
"""
import os
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from remotes.minio import MinioRemote  # noqa: E402

server = next(p for p in psutil.process_iter(["name", "cmdline"])
              if "minio" in (p.info["name"] or "") and "server" in " ".join(p.info["cmdline"] or []))
remote = MinioRemote("127.0.0.1:9000", os.environ.get("SFAAS_MINIO_ACCESS_KEY", "sfaas"),
                     os.environ.get("SFAAS_MINIO_SECRET_KEY", "sfaas-local-secret"), "sfaas", prefix="putcost")
try:
    for size in (1024, 50 * 1024):
        path = Path(f"/tmp/putcost-{size}")
        path.write_bytes(os.urandom(size))
        for i in range(20):
            remote.put_file(f"w{i}", path)  # warm the connection pool
        n, me = 200, psutil.Process()
        c0, m0, t0 = me.cpu_times(), server.cpu_times(), time.perf_counter()
        for i in range(n):
            remote.put_file(f"f{i}", path)
        c1, m1, t1 = me.cpu_times(), server.cpu_times(), time.perf_counter()
        client = (c1.user + c1.system - c0.user - c0.system) / n * 1e3
        minio = (m1.user + m1.system - m0.user - m0.system) / n * 1e3
        print(f"{size // 1024} KiB PUT: wall {(t1 - t0) / n * 1e3:.2f} ms, client CPU {client:.2f} ms, MinIO CPU {minio:.2f} ms")
        path.unlink()
finally:
    remote.destroy()
