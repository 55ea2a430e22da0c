"""Run an :class:`~sfaas.App` in-process, with the cluster's transaction semantics, no Kafka.

One testing model: every verb has a **blocking form**, for plain code, that returns the
value, and an **``a*`` twin**, a coroutine for ``async`` code on any event loop::

    with LocalRunner(app) as runner:                          # a plain test, a script
        runner.call("accounts", "alice", "deposit", 100)      # -> 100
        runner.gather(("accounts", "a", "deposit", 1), ("accounts", "b", "deposit", 2))

    async with LocalRunner(app) as runner:                    # a coroutine, any event loop
        await runner.acall("accounts", "alice", "deposit", 100)
        await runner.agather(("accounts", "a", "deposit", 1), ("accounts", "b", "deposit", 2))

The verbs::

    blocking              async                     what
    call                  acall                     one request as a transaction: its result
    gather(*requests)     agather(*requests)        (operator, key, function, *args) tuples,
                                                    queued together: their results in order
    get, scan             aget, ascan               like Client.get, Client.scan
    state, items          astate, aitems            a committed value; all of an operator's
    advance(seconds)      aadvance(seconds)         move the clock, run the timers due
    drain()               adrain()                  wait until nothing is left to do
    close(), with         aclose(), async with      stop the runner and its thread

Both forms work on one runner in any order: one made by a sync fixture serves an ``async``
test and the other way round. In ``async`` code use the twins: a blocking form works there
too, but stops the caller's event loop until it returns. The runner keeps its own event
loop on a daemon thread (started on first use, ended by ``close``), where the engines,
``ctx.run`` effects, post-commit actions and ``on_epoch_committed`` run
(:mod:`sfaas.testing.runner` says why).

``LocalRunner`` simulates ``workers`` workers, each an :class:`~sfaas.runtime.txn.engine.Engine`
owning its partitions of every operator's store, and drives the same deterministic epochs
as the coordinator: requests queued together (``gather``) run in one epoch, conflicting
ones re-run, and a failed call raises :class:`~sfaas.errors.TransactionAborted` (or one of
its subclasses) — the caller's exception, chained to nothing of the runner's. Values cross
a (simulated) wire between workers, so they are copied exactly as msgpack would (tuples
become lists).
"""

from sfaas.testing.cluster import RunnerStats
from sfaas.testing.runner import LocalRunner

__all__ = ["LocalRunner", "RunnerStats"]
