"""Standby workers in a simulated run (``--standbys``, ``sfaas.sim.replicas``): each
follows its primary's stores over the simulated replica transport, on the virtual loop,
and is promoted to the slot when its primary dies — deterministically."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys

from examples.bank import app
from sfaas.sim.__main__ import ROLES
from sfaas.sim.cluster import Bank, Outcome, simulate
from sfaas.sim.faults import STANDBYS, Schedule, draw


def _at(line: str) -> float:
    return float(line.split()[0])


def _run(standbys: int) -> Outcome:
    crash = Schedule(crash=(0.5, 3.0), rounds=0.2, standbys=standbys)
    return simulate(app, ROLES, 1, workers=2, bank=Bank(transfers=300), schedule=crash)


def test_a_standby_serves_a_crashed_workers_slot_before_the_worker_comes_back() -> None:
    """Worker 1 crashes 0.5 s in and is back 3 s later. Without a standby the cluster
    answers nothing meanwhile; with one, its standby held the primary's stores (the
    rounds' files, shipped as written) and is promoted: the replies go on."""
    with_standby, without = _run(1), _run(0)
    for o in (with_standby, without):
        assert o.violations == [] and len(o.replies) == o.sent == 316
    shipped = [line for line in with_standby.trace if " replica standby-" in line]
    assert any(" mark " in line and _at(line) < 0.5 for line in shipped)  # (rounds held)
    assert not any("replica worker-" in line for line in with_standby.trace
                   if _at(line) < 0.5)  # (the workers took the slots: worker 1 a primary)

    def gap(o: Outcome) -> int:
        return sum(1 for line in o.trace if " reply " in line and 0.6 < _at(line) < 3.4)

    print(f"replies while worker 1 is down: {gap(with_standby)} with a standby, "
          f"{gap(without)} without")
    assert gap(without) == 0 and gap(with_standby) > 100


def test_a_run_with_standbys_prints_the_same_trace_twice() -> None:
    """The followers run on the loop (no thread, no socket): the trace, the replica lines
    included, is a function of the seed — also in two processes."""
    args = [sys.executable, "-m", "sfaas.sim", "--app", "examples.bank:app", "--seed", "3",
            "--standbys", "1", "--crash", "0.5,0.3", "--rounds", "0.05", "--store",
            "appendlog", "--trace"]
    outs = [subprocess.run(args, capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert outs[0] == outs[1]
    assert outs[0].count(" replica ") > 20 and "sent 216, answered 216" in outs[0]


def test_without_standbys_a_run_is_the_run_it_was() -> None:
    """A run without standbys uses the simulated replica server (rounds on) instead of a
    real socket, and prints the digest it printed before (main at 03e3caa)."""
    run = subprocess.run([sys.executable, "-m", "sfaas.sim", "--app", "examples.bank:app",
                          "--seed", "1", "--crash", "0.5,0.3"],
                         capture_output=True, text=True, check=True)
    assert "digest 5885b26cc18ade88" in run.stdout and " replica " not in run.stdout


#: sha256 of ``str(draw(seed))`` for seeds 0–199, each on its line, before the standbys were
#: drawn (main at 03e3caa): every earlier draw of every seed, pinned
BEFORE_STANDBYS = "7d5b31f41c02b1dffd495ab4650684c4f82e6baa35720aa72b4719aa1889d1b3"


def test_the_standbys_are_drawn_last_and_changed_no_earlier_draw() -> None:
    schedules = [draw(seed) for seed in range(200)]
    without = "\n".join(str(dataclasses.replace(s, standbys=0, kafka_cut=None)) for s in schedules)
    assert hashlib.sha256(without.encode()).hexdigest() == BEFORE_STANDBYS
    drawn = sum(1 for s in schedules if s.standbys)
    assert abs(drawn - 200 * STANDBYS) < 30 and {s.standbys for s in schedules} == {0, 1}
    assert all(str(s).endswith("--standbys 1") == bool(s.standbys) for s in schedules)



#: runs seeds one after the other with a standby each, in a fresh OS process: prints the
#: last one's digest
_SEEDS_IN_ONE_PROCESS = """
import dataclasses, hashlib, logging, sys
logging.disable(logging.CRITICAL)
from examples.bank import app
from sfaas.sim.__main__ import ROLES
from sfaas.sim.budget import run_seed
from sfaas.sim.faults import draw
for seed in map(int, sys.argv[1:]):
    o = run_seed(app, ROLES, seed, dataclasses.replace(draw(seed), standbys=1))
print(hashlib.sha256("\\n".join(o.trace).encode()).hexdigest()[:16])
"""


def test_a_seed_replays_alike_whatever_ran_before_it_in_the_process() -> None:
    """A budget runs seeds one after the other in one OS process; its replay command runs
    one alone. A crash ends a process's tasks in the order they were made, not in their
    addresses' (which depend on what ran before): seed 107's standby followers, polling at
    the same virtual time, swapped places after seed 105 (digest aefaeac7f07dfbd2 there)."""
    digests = [subprocess.run([sys.executable, "-c", _SEEDS_IN_ONE_PROCESS, *seeds],
                              capture_output=True, text=True, check=True).stdout.strip()
               for seeds in (["107"], ["105", "107"])]
    assert digests == ["108a99d7cd3fed6d"] * 2  # (since a recovery's flush watches the lease)
