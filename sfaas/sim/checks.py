"""The bank workload's balance checks (``sfaas.sim.cluster``): the balances sum to the
opening deposits, and every account's final balance is its opening deposit moved by
exactly the transfers whose replies said they committed.

The first passes when a transfer runs twice — the money moves twice, the sum stays — or is
lost after its reply said it committed; the second does not: each reply is a fate the
client saw, and the state must agree with every one of them (exactly once), whatever
order the epochs ran them in.
"""

from __future__ import annotations

from collections.abc import Mapping

from sfaas.runtime import wire

__all__ = ["balances_violations"]


def balances_violations(opening: int, balances: Mapping[str, int],
                        transfers: Mapping[str, tuple[str, str, int]],
                        replies: Mapping[str, wire.Reply]) -> list[str]:
    """What is wrong with the final ``balances`` (account → balance read at the end) given
    the ``transfers`` sent (request id → ``(from, to, amount)``) and the ``replies``: their
    sum is not the opening deposits' (conservation), or an account does not hold
    ``opening`` plus what committed transfers moved into it, less what they moved out
    (exactly once). Empty when neither."""
    out = []
    total, expected = sum(balances.values()), opening * len(balances)
    if total != expected:
        out.append(f"balances sum to {total}, not {expected}")
    want = {name: opening for name in balances}
    for rid, (src, dst, amount) in transfers.items():
        reply = replies.get(rid)
        if reply is not None and reply.ok and src in want and dst in want:
            want[src] -= amount
            want[dst] += amount
    wrong = {name: (have, want[name]) for name, have in balances.items() if have != want[name]}
    if wrong:
        out.append(f"balances disagree with the committed transfers' replies (account: "
                   f"read, expected): {dict(sorted(wrong.items())[:4])}")
    return out
