"""Per request and per record: least squares of ``kafka_floor.py``'s points, cost per record
= per_record + per_request × (requests per record). A producer sends one request per k
records; a reader's requests per record are the raw reader's of the same run (both readers
long-poll the same topic).

    python fit.py floor.jsonl
"""
import json
import sys


def fit(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b  # (per record, per request)


rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
runs = {}
for r in rows:
    runs.setdefault((r["k"], r["durable"], r.get("raw_producer", False)), []).append(r)
series = {}
for (k, durable, raw), rs in sorted(runs.items()):
    by = {r["role"]: r for r in rs}
    rate = by["read raw"]["requests"] / by["read raw"]["records"]
    who = "raw producer (acks=1)" if raw else "aiokafka producer, workers' settings" if durable else "aiokafka producer, client's settings"
    series.setdefault(who, []).append((1 / k, by["produce"]["user_us"] + by["produce"]["sys_us"]) if "produce" in by
                                      else (1 / k, by["produce raw"]["user_us"] + by["produce raw"]["sys_us"]))
    for role in ("read aiokafka", "read raw"):
        series.setdefault(role.replace("read", "reader:"), []).append((rate, by[role]["user_us"] + by[role]["sys_us"]))
print("| who | µs per request | µs per record |")
print("|---|---|---|")
for who, pts in series.items():
    a, b = fit([p[0] for p in pts], [p[1] for p in pts])
    print(f"| {who} | {b:.0f} | {a:.0f} |")
