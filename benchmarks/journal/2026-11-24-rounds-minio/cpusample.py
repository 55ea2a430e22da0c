"""Sample every process's CPU (utime + stime ticks) every 20 ms for SECONDS; then show the
cores each role used in bins around a time window.

    python cpusample.py record OUT.jsonl SECONDS          # beside a bench run
    python cpusample.py show OUT.jsonl START END [BIN]    # wall-clock START/END (epoch seconds)
"""
import collections
import json
import os
import sys
import time


def record(out: str, seconds: float) -> None:
    names: dict[str, str] = {}
    end = time.time() + seconds
    with open(out, "w") as f:
        while time.time() < end:
            t, row = time.time(), {}
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    st = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                    row[pid] = int(st[11]) + int(st[12])
                    if pid not in names:
                        names[pid] = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:400]
                except OSError:
                    pass
            f.write(json.dumps([t, row]) + "\n")
            time.sleep(max(0.0, 0.02 - (time.time() - t)))
    with open(out + ".names", "w") as f:
        json.dump(names, f)


def role(cmd: str) -> str:
    for key, name in (("minio", "minio"), ("kafka.Kafka", "kafka"), ("_bgmain", "bg"), ("coordinator", "coord"),
                      ("worker", "worker"), ("bench", "loadgen")):
        if key in cmd:
            return name
    return "other"


def show(path: str, start: float, end: float, width: float = 0.1) -> None:
    rows = [json.loads(line) for line in open(path)]
    names = json.load(open(path + ".names"))
    roles = ["worker", "kafka", "loadgen", "coord", "minio", "bg", "other"]
    used: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    span: collections.Counter[int] = collections.Counter()
    for (ta, ra), (tb, rb) in zip(rows, rows[1:], strict=False):
        if start <= ta < end:
            k = int((ta - start) / width)
            span[k] += tb - ta
            for pid, ticks in rb.items():
                if pid in ra:
                    used[k][role(names.get(pid, ""))] += (ticks - ra[pid]) / 100
    print("t(s)   " + " ".join(f"{r:>7}" for r in roles))
    for k in sorted(span):
        print(f"{k * width:5.1f}  " + " ".join(f"{used[k][r] / span[k]:7.2f}" for r in roles))


if __name__ == "__main__":
    if sys.argv[1] == "record":
        record(sys.argv[2], float(sys.argv[3]))
    else:
        show(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), *(float(x) for x in sys.argv[5:6]))
