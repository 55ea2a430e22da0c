"""sfaas: transactional stateful functions.

>>> from sfaas import App, Context, Abort
>>> app = App("bank")
>>> accounts = app.operator("accounts", store="hybridlog")
>>> @accounts.function
... async def deposit(ctx: Context, amount: int) -> int:
...     ctx.put(ctx.get(default=0) + amount)
...     return ctx.get()

``deposit`` is a :class:`FunctionRef`, the typed handle of the function:
``await ctx.call(deposit, "bob", 5)`` (and ``ctx.send``, ``ctx.send_after``,
``Client.call``) are checked by mypy against its signature, like a direct call.

Run it in-process with :class:`sfaas.testing.LocalRunner`, or on a cluster
(``sfaas up module:app --workers 2``) and call it with :class:`Client`/:class:`SyncClient`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sfaas.app import App, FunctionRef, Operator
from sfaas.context import Context, effect_key
from sfaas.errors import (
    Abort,
    AuthenticationError,
    BadArguments,
    BadKey,
    BadRequest,
    ConfigError,
    EffectFailed,
    EffectThenAbortWarning,
    NondeterminismError,
    NotAwaited,
    NotSerializable,
    RequestTimeout,
    SchemaTooNew,
    SfaasError,
    TransactionAborted,
    UnknownFunction,
    UnknownOperator,
    UpcastFailed,
)

__all__ = [
    "App",
    "Operator",
    "FunctionRef",
    "Context",
    "Abort",
    "Client",
    "SyncClient",
    "TransactionAborted",
    "SfaasError",
    "UnknownOperator",
    "UnknownFunction",
    "BadArguments",
    "BadKey",
    "BadRequest",
    "NotSerializable",
    "NotAwaited",
    "NondeterminismError",
    "EffectThenAbortWarning",
    "EffectFailed",
    "SchemaTooNew",
    "UpcastFailed",
    "effect_key",
    "ConfigError",
    "AuthenticationError",
    "RequestTimeout",
]


if TYPE_CHECKING:  # (the type checker sees the clients' signatures: typed calls)
    from sfaas.client import Client, SyncClient


def __getattr__(name: str) -> Any:
    # The clients pull in aiokafka; import them only when asked for.
    if name in ("Client", "SyncClient"):
        from sfaas import client

        return getattr(client, name)
    raise AttributeError(f"module 'sfaas' has no attribute {name!r}")
