"""Per-epoch phases of two workers from the traces ``probe.patch`` writes.

    python trace_analysis.py "/tmp/trace_*.json"
"""

import glob
import json
import statistics as st
import sys

PHASES = ("begin", "roots", "report", "commit", "done")


def q(v: list[float]) -> str:
    v = sorted(v)
    n = len(v)
    return f"n={n} mean={1000 * st.mean(v):.3f} p50={1000 * v[n // 2]:.3f} p90={1000 * v[int(n * .9)]:.3f}"


def main() -> None:
    traces = []
    for f in sorted(glob.glob(sys.argv[1])):
        with open(f) as fh:
            traces.append({int(k): v for k, v in json.load(fh).items()})
    common = sorted(set(traces[0]) & set(traces[1]))
    common = common[len(common) // 5:]  # skip the warm-up
    for i, t in enumerate(traces):
        es = [e for e in common if all(k in t[e] for k in PHASES)]
        print(f"worker file {i}:")
        print("  exec begin->roots   ", q([t[e]["roots"] - t[e]["begin"] for e in es]))
        print("  ack roots->report   ", q([t[e]["report"] - t[e]["roots"] for e in es]))
        print("  wait report->commit ", q([t[e]["commit"] - t[e]["report"] for e in es]))
        print("  commit              ", q([t[e]["done"] - t[e]["commit"] for e in es]))
        gaps = [t[e + 1]["begin"] - t[e]["done"] for e in es if "begin" in t.get(e + 1, {})]
        print("  done->next begin    ", q([x for x in gaps if x < 0.05]),
              f"(idle gaps of 50 ms or more: {sum(x >= 0.05 for x in gaps)})")
        cycles = [t[e + 1]["begin"] - t[e]["begin"] for e in es if "begin" in t.get(e + 1, {})]
        print("  cycle begin->begin  ", q([x for x in cycles if x < 0.05]))
    a, b = traces
    es = [e for e in common if "begin" in a[e] and "begin" in b[e]]
    print("begin skew |a-b|      ", q([abs(a[e]["begin"] - b[e]["begin"]) for e in es]))
    print("batch sizes", st.mean(a[e].get("n", 0) for e in es), st.mean(b[e].get("n", 0) for e in es))


if __name__ == "__main__":
    main()
