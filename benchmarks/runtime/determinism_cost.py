"""What LocalRunner's determinism check costs: the same workload with and without it.

    python -m benchmarks.runtime.determinism_cost [--pairs 5] [--requests 2000]

Two workloads of ``examples/bank.py`` (2 workers, 8 partitions, memonly), ``--requests``
concurrent calls per run: ``transfers`` between disjoint pairs of accounts (no conflicts:
every transaction commits in its epoch, so every one is checked — the worst case) and
``contended`` transfers among 200 accounts (most conflict and commit in the fallback
phase, which the check does not re-run). Each pair runs the check off and on back to
back, alternating which goes first. Prints each pair and the median of the ratios on/off
(the target: at most 2×).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from examples import bank
from sfaas.testing import LocalRunner


async def _one(workload: str, check: bool, requests: int, seed: int) -> float:
    rng = random.Random(seed)
    accounts = 2 * requests if workload == "transfers" else 200
    async with LocalRunner(bank.app, store="memonly", check_determinism=check) as r:
        await r.agather(*[("accounts", f"a{i}", "deposit", 1000) for i in range(accounts)])
        t0 = time.perf_counter()
        calls = []
        for i in range(requests):
            a, b = (2 * i, 2 * i + 1) if workload == "transfers" else rng.sample(range(200), 2)
            calls.append(("accounts", f"a{a}", "transfer", f"a{b}", rng.randint(1, 50)))
        await r.agather(*calls, return_exceptions=True)
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    for workload in ("transfers", "contended"):
        ratios = []
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            took = {check: asyncio.run(_one(workload, check, args.requests, i))
                    for check in order}
            ratios.append(took[True] / took[False])
            print(f"{workload} pair {i + 1}: off {took[False]:.3f} s, on {took[True]:.3f} s, "
                  f"on/off {ratios[-1]:.2f}", flush=True)
        print(f"{workload}: median on/off over {args.pairs} pairs: "
              f"{statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
