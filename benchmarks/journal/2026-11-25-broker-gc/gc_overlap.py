"""Do the slowest requests of a bench point overlap the broker's collector pauses?

    python gc_overlap.py TIMELINE.json GC.log

``TIMELINE.json``: ``bench.py --timeline``'s file (each reply's wall-clock arrival and
latency); ``GC.log``: the broker's ``-Xlog:gc`` file (``{home}/kafka/logs/gc.log``), whose
``[time]`` decoration is when a pause ended.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime

PAUSE = re.compile(r"^\[([^\]]+)\].*Pause.* (\d+\.\d+)ms$")


def main(timeline: str, gc_log: str) -> None:
    with open(timeline) as f:
        tl = json.load(f)
    tl = tl.get("_timeline", tl)
    reqs = sorted((a - ms / 1000, a, ms) for a, ms in zip(tl["arrivals"], tl["latencies_ms"], strict=True))
    lo, hi = reqs[0][0], reqs[-1][1]
    pauses = []
    with open(gc_log) as f:
        for line in f:
            m = PAUSE.match(line.strip())
            if m:
                end = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
                ms = float(m.group(2))
                if lo <= end <= hi:
                    pauses.append((end - ms / 1000, end, ms))
    print(f"{len(reqs)} requests over {hi - lo:.1f} s; {len(pauses)} GC pauses in it: "
          + ", ".join(f"{p[2]:.1f}" for p in pauses) + " ms")

    def overlaps(r: tuple[float, float, float]) -> bool:
        return any(r[0] < p[1] and p[0] < r[1] for p in pauses)

    p99 = sorted(r[2] for r in reqs)[int(0.99 * len(reqs))]
    slow = [r for r in reqs if r[2] >= p99]
    print(f"p99 {p99:.1f} ms; requests overlapping a pause: all {sum(map(overlaps, reqs)) / len(reqs):.2%}, "
          f"slowest 1% {sum(map(overlaps, slow)) / max(1, len(slow)):.2%}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
