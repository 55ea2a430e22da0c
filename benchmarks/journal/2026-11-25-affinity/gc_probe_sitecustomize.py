"""Python's collector in every process of a benchmark point (the experiment of README.md).

Put this file as ``sitecustomize.py`` in a directory on PYTHONPATH; every Python process
started with it (load generator, coordinator, workers, stores' background processes)
appends to ``/tmp/gcprobe/out.PID`` each collection longer than 2 ms, and its running
counts (collections, total ms, longest ms, per generation) every 500 collections.
"""

import gc
import os
import sys
import time

_started = [0.0]
_stats = {0: [0, 0.0, 0.0], 1: [0, 0.0, 0.0], 2: [0, 0.0, 0.0]}
_path = f"/tmp/gcprobe/out.{os.getpid()}"
_count = [0]


def _callback(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    took = time.perf_counter() - _started[0]
    s = _stats[info["generation"]]
    s[0] += 1
    s[1] += took
    s[2] = max(s[2], took)
    _count[0] += 1
    if took > 0.002 or _count[0] % 500 == 0:
        counts = {g: (v[0], round(v[1] * 1e3, 1), round(v[2] * 1e3, 2)) for g, v in _stats.items()}
        who = " ".join(sys.argv[:3])[-60:]
        with open(_path, "a") as f:
            f.write(f"{who} {time.time():.3f} gen{info['generation']} dur_ms={took * 1e3:.2f} stats={counts}\n")


gc.callbacks.append(_callback)
