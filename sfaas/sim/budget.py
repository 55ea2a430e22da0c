"""A seed budget (issue 51): simulated bank clusters, one per seed, each under the faults
its seed draws (``sfaas.sim.faults.draw``), for a wall-clock budget; every seed printed,
and a failing one with the command that replays it and a shorter schedule that still
fails (faults dropped one at a time while it keeps failing).

``tests/sim/test_budget.py`` runs it in CI: ``SFAAS_SIM_BUDGET`` (wall seconds, default
:data:`DEFAULT_BUDGET`), ``SFAAS_SIM_SEED`` (one seed only), ``SFAAS_SIM_FIRST`` (the
first seed; the seeds go on from it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sfaas.app import App
from sfaas.sim.cluster import Bank, Outcome, Roles, simulate
from sfaas.sim.faults import FAULTS, HOT, HOT_RATE, Schedule, draw

__all__ = ["DEFAULT_BUDGET", "Finding", "Report", "command", "run_budget", "shrink"]

#: wall seconds a CI run spends on seeds (``SFAAS_SIM_BUDGET`` raises it)
DEFAULT_BUDGET = 45.0
#: the workload of a budget seed
TRANSFERS = 150
WORKERS = 2
APP = "examples.bank:app"


def command(seed: int, schedule: Schedule, app: str = APP) -> str:
    """The command that replays ``seed`` under ``schedule`` (``app``: its module:attribute)."""
    return " ".join(["python -m sfaas.sim --app", app, "--seed", str(seed), "--transfers",
                     str(TRANSFERS), "--workers", str(WORKERS), *schedule.args()])


def run_seed(app: App, roles: Roles, seed: int, schedule: Schedule) -> Outcome:
    """``seed`` under ``schedule`` (its faults, rounds and the workers' store engine)."""
    bank = Bank(transfers=TRANSFERS)
    if schedule.hot:
        bank = Bank(transfers=TRANSFERS, accounts=HOT, rate=HOT_RATE)
    return simulate(app, roles, seed, workers=WORKERS, bank=bank, schedule=schedule,
                    store=schedule.store)


@dataclass
class Finding:
    seed: int
    schedule: Schedule
    violations: list[str]
    #: the shortest schedule found that still fails (None: not shrunk)
    shorter: Schedule | None = None
    #: why the seed is expected to fail (a product bug reported, not fixed yet); "" if new
    known: str = ""


@dataclass
class Report:
    seeds: list[int] = field(default_factory=list)
    wall: float = 0.0
    simulated: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    #: failing seeds listed as known (``known=`` of :func:`run_budget`)
    known: list[Finding] = field(default_factory=list)


def shrink(app: App, roles: Roles, seed: int, schedule: Schedule) -> Schedule:
    """Drop faults one at a time while the seed still fails."""
    best = schedule
    for name in FAULTS:
        if not getattr(best, name):
            continue
        fewer = best.without(name)
        if run_seed(app, roles, seed, fewer).violations:
            best = fewer
    return best


def run_budget(app: App, roles: Roles, budget: float, *, first: int = 0,
               only: int | None = None, shrinking: bool = True,
               known: dict[int, str] | None = None, app_ref: str = APP,
               last: int | None = None,
               say: Callable[[str], None] = print) -> Report:
    """Seeds from ``first`` on (or ``only``), each under the faults it draws, until
    ``budget`` wall seconds are spent (at least one seed); stops at the first failing seed
    not in ``known`` (seed → the reported product bug it fails by: run and printed, not
    counted); ``last``: no seed after it."""
    report, known = Report(), known or {}
    t0 = time.perf_counter()
    seed = first if only is None else only
    while True:
        sched = draw(seed)
        t = time.perf_counter()
        o = run_seed(app, roles, seed, sched)
        wall = time.perf_counter() - t
        report.seeds.append(seed)
        report.simulated += o.simulated_seconds
        verdict = ("ok" if not o.violations else "known" if seed in known else "FAIL")
        say(f"seed {seed}: {verdict} {o.sent} sent, {len(o.replies)} answered, "
            f"{o.simulated_seconds:.1f} sim s in {wall:.2f} s; faults {sched}")
        if o.violations:
            f = Finding(seed, sched, o.violations, known=known.get(seed, ""))
            say(f"VIOLATION seed {seed}: {'; '.join(o.violations)}"
                + (f" (known: {f.known})" if f.known else ""))
            say(f"replay: {command(seed, sched, app_ref)}")
            if f.known:
                report.known.append(f)
            else:
                if shrinking and sched.faults() > 1:
                    f.shorter = shrink(app, roles, seed, sched)
                    say(f"shorter: {command(seed, f.shorter, app_ref)}")
                report.findings.append(f)
                break
        elif seed in known:
            say(f"seed {seed} is listed as known ({known[seed]}) but passes now")
        seed += 1
        if only is not None or time.perf_counter() - t0 >= budget or (
                last is not None and seed > last):
            break
    report.wall = time.perf_counter() - t0
    say(f"{len(report.seeds)} seeds ({report.seeds[0]}..{report.seeds[-1]}) in "
        f"{report.wall:.1f} wall s, {report.simulated:.1f} simulated s; "
        f"{len(report.findings)} failing, {len(report.known)} known")
    return report
