"""Share of py-spy's raw (collapsed) samples by where they are: in the Kafka client (any
frame of aiokafka), the runtime's channels to the coordinator and the peers, running
transactions, the event loop, the rest; and the functions with the most samples of their own.

    python classify.py WORKER.txt CLIENT.txt
"""
import collections
import sys


def kind(frames: list[str]) -> str:
    if any("aiokafka" in f for f in frames):
        return "Kafka client (aiokafka)"
    if any("channels.py" in f or "links.py" in f or "peers.py" in f for f in frames):
        return "channels to coordinator and peers"
    if any("sfaas/runtime/txn" in f or "engine" in f.lower() for f in frames):
        return "transactions (runtime txn, engine)"
    return "other"


for path in sys.argv[1:]:
    total = 0
    by_kind: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            total += n
            frames = stack.split(";")
            by_kind[kind(frames)] += n
            own[frames[-1].split(" (")[0]] += n
    print(f"## {path}: {total} samples")
    for k, v in by_kind.most_common():
        print(f"| {k} | {100 * v / total:.1f}% |")
    print("top self:", [(f, round(100 * v / total, 1)) for f, v in own.most_common(8)])
