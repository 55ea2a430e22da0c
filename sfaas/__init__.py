"""sfaas: transactional stateful functions.

>>> from sfaas import App, Context, Abort
>>> app = App("bank")
>>> accounts = app.operator("accounts", store="hybridlog")
>>> @accounts.function
... async def deposit(ctx: Context, amount: int):
...     ctx.put(ctx.get(default=0) + amount)

Run it in-process with :class:`sfaas.testing.LocalRunner`, or on a cluster
(``sfaas up module:app --workers 2``) and call it with :class:`Client`/:class:`SyncClient`.
"""

from __future__ import annotations

from typing import Any

from sfaas.app import App, Operator
from sfaas.context import Context, effect_key
from sfaas.errors import (
    Abort,
    AuthenticationError,
    BadArguments,
    BadKey,
    BadRequest,
    ConfigError,
    EffectFailed,
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
    "EffectFailed",
    "SchemaTooNew",
    "UpcastFailed",
    "effect_key",
    "ConfigError",
    "AuthenticationError",
    "RequestTimeout",
]


def __getattr__(name: str) -> Any:
    # The clients pull in aiokafka; import them only when asked for.
    if name in ("Client", "SyncClient"):
        from sfaas import client

        return getattr(client, name)
    raise AttributeError(f"module 'sfaas' has no attribute {name!r}")
