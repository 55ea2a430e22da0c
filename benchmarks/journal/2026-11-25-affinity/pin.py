"""Give the benchmark's processes CPU affinities as they appear (the experiment of README.md).

    python pin.py MODE &   # then run bench.py; kill this when the point ends

MODE: default (every process on both cores), split (broker and the first worker on CPU 0;
the second worker, the coordinator and the load generator on CPU 1), apart (broker, load
generator and coordinator on CPU 0, both workers on CPU 1), broker0 (only the broker
pinned, to CPU 0). A store's background process inherits its worker's affinity.
"""

import sys
import time

import psutil

MODES = ("default", "split", "apart", "broker0")


def role_of(cmdline: str) -> str | None:
    if "kafka.Kafka" in cmdline:
        return "broker"
    if "__main__.py worker" in cmdline:
        return "worker"
    if "__main__.py coordinator" in cmdline:
        return "coordinator"
    if "benchmarks.runtime.bench" in cmdline or "benchmarks/runtime/bench.py" in cmdline:
        return "loadgen"
    return None


def cpus_for(mode: str, role: str, worker_rank: int) -> list[int]:
    if mode == "split":
        if role == "worker":
            return [0] if worker_rank == 0 else [1]
        return [0] if role == "broker" else [1]
    if mode == "apart":
        return [1] if role == "worker" else [0]
    if mode == "broker0" and role == "broker":
        return [0]
    return [0, 1]


def place(p: psutil.Process, cpus: list[int]) -> None:
    try:
        p.cpu_affinity(cpus)
        for c in p.children(recursive=True):
            c.cpu_affinity(cpus)
    except psutil.Error:
        pass  # (a process that ended meanwhile)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in MODES:
        sys.exit(f"pin.py: MODE must be one of {', '.join(MODES)}, got {mode!r}")
    while True:
        found: list[tuple[str, psutil.Process]] = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            role = role_of(" ".join(p.info["cmdline"] or []))
            if role is not None:
                found.append((role, p))
        workers = sorted((p for role, p in found if role == "worker"), key=lambda p: p.pid)
        for role, p in found:
            rank = workers.index(p) if role == "worker" else -1
            place(p, cpus_for(mode, role, rank))
        time.sleep(0.2)


if __name__ == "__main__":
    main()
