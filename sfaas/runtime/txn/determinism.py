"""The determinism check: every transaction about to commit runs a second time against the
same state, and the two runs must agree.

Re-runs after a conflict, the fallback phase and a recovery's replay all assume that a
function given the same state, arguments, ``ctx.now()`` and ``ctx.random()`` does the same
thing. A function that reads the wall clock, draws from ``random`` or otherwise depends on
something outside its transaction breaks that silently: after a recovery the stored values
differ from the replies already sent. The check runs the epoch's committing roots again —
after their votes are in and before anything is applied, so the stores still hold the
state both runs read — with a fresh access log on every engine, and compares each root's
outcome, the keys it read and the values it wrote, on every engine. A root whose runs
differ is aborted with :class:`~sfaas.errors.NondeterminismError` instead of committed.

Only roots that commit in the epoch that ran them are checked; those decided in the
fallback phase ran against another state and are not run a third time.

On a cluster (setting ``check_determinism``) each worker checks, before it reports, the
roots of its batch whose calls stayed on it (:func:`check_local`), on a *shadow* engine —
the same stores and journals, its own access log, no router — so the calls peers make
meanwhile are not disturbed. Roots reaching other workers are not checked there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from typing import Any

from sfaas.runtime.codec import unpack
from sfaas.runtime.txn.engine import Engine, Outcome, RootCall
from sfaas.runtime.txn.epochs import AccessLog, Key

__all__ = ["second_run", "roots_to_check", "check_local", "HINT"]

#: What the error suggests.
HINT = ("values that may differ between runs must come from ctx.now() and ctx.random() "
        "(the same on every run of a transaction), not from time.time(), random or "
        "anything else outside the transaction")

#: A root to check: (the engine that ran it, tid, now, its root call, its first outcome).
Root = tuple[Engine, int, float, RootCall, Outcome]


async def second_run(engines: Sequence[Engine], roots: Sequence[Root],
                     first_logs: Sequence[AccessLog] | None = None,
                     ) -> dict[int, tuple[str, str]]:
    """Run ``roots`` again on ``engines`` (all of the cluster's: calls cross between them)
    and return ``tid → ("NondeterminismError", reason)`` for each root whose second run
    differs from its first. ``first_logs``: the first run's access logs when ``engines``
    are shadows (their own logs are then the second run's)."""
    if not roots:
        return {}
    shadows = first_logs is not None
    first = list(first_logs) if first_logs is not None else [e.log for e in engines]
    again = [e.log for e in engines] if shadows else [AccessLog() for _ in engines]
    for e, log in zip(engines, again, strict=True):
        e.log = log
    try:
        outcomes = await asyncio.gather(*(
            engine.run_root(tid, now, root) for engine, tid, now, root, _ in roots))
    finally:
        if not shadows:
            for e, log in zip(engines, first, strict=True):
                e.log = log
    bad: dict[int, tuple[str, str]] = {}
    for (_, tid, _, request, outcome), outcome2 in zip(roots, outcomes, strict=True):
        diff = _difference(outcome, outcome2, [(a.reads.get(tid, set()), b.reads.get(tid, set()))
                                               for a, b in zip(first, again, strict=True)],
                           [(a.writes.get(tid, {}), b.writes.get(tid, {}))
                            for a, b in zip(first, again, strict=True)])
        if diff is not None:
            operator, key, function, _ = request
            bad[tid] = ("NondeterminismError",
                        f"{operator}.{function} on key {key!r} is not deterministic: run twice "
                        f"against the same state, it {diff}; {HINT}")
    return bad


def _value(raw: bytes | None) -> str:
    return "nothing (deleted)" if raw is None else f"{unpack(raw)!r:.80}"


def _difference(one: Outcome, two: Outcome, reads: list[tuple[set[Key], set[Key]]],
                writes: list[tuple[dict[Key, bytes | None], dict[Key, bytes | None]]],
                ) -> str | None:
    """How the second run differs from the first, or None."""
    for w1, w2 in writes:
        for key in sorted(w1.keys() | w2.keys(), key=_order):
            if key not in w2:
                return f"wrote {_name(key)} only the first time ({_value(w1[key])})"
            if key not in w1:
                return f"wrote {_name(key)} only the second time ({_value(w2[key])})"
            if w1[key] != w2[key]:
                return (f"wrote {_name(key)} = {_value(w1[key])} the first time and "
                        f"{_value(w2[key])} the second")
    for r1, r2 in reads:
        if r1 != r2:
            key = sorted(r1 ^ r2, key=_order)[0]
            which = "first" if key in r1 else "second"
            return f"read {_name(key)} only the {which} time"
    if one != two:
        return f"gave {_outcome(one)} the first time and {_outcome(two)} the second"
    return None


def _order(key: Key) -> tuple[str, str]:
    return key[0], str(key[1])


def _name(key: Key) -> str:
    return f"{key[0]}/{key[1]!r}"


def _outcome(outcome: Outcome) -> str:
    ok, value = outcome
    return f"the result {value!r:.80}" if ok else f"the error {value[1]!r:.80}"


async def check_local(engine: Engine, batch: Sequence[tuple[int, Any]],
                      outcomes: Sequence[Outcome],
                      request_of: Callable[[Any], RootCall]) -> int:
    """(a worker, before it reports) Run the roots of ``batch`` that stayed on ``engine``
    and did not fail again on a shadow of it; record each that differs as aborted with
    :class:`~sfaas.errors.NondeterminismError`. Returns how many were checked."""
    skip = set(engine.log.user_aborts)
    roots = [r for r in roots_to_check(engine, batch, outcomes, request_of, skip)
             if engine.local_only(r[1])]
    if not roots:
        return 0
    shadow = engine.shadow()
    bad = await second_run([shadow], [(shadow, *r[1:]) for r in roots], [engine.log])
    for tid, (etype, reason) in bad.items():
        engine.log.record_abort(tid, etype, reason)
    return len(roots)


def roots_to_check(engine: Engine, batch: Sequence[tuple[int, Any]],
                   outcomes: Sequence[Outcome],
                   request_of: Callable[[Any], RootCall],
                   skip: Collection[int]) -> list[Root]:
    """The roots of one participant's batch that are about to commit (not in ``skip``: the
    epoch's conflicts and aborts)."""
    return [(engine, tid, item.now, request_of(item), outcome)
            for (tid, item), outcome in zip(batch, outcomes, strict=True) if tid not in skip]
