"""The user-facing app model: :class:`App`, its operators and their functions.

>>> app = App("bank")
>>> accounts = app.operator("accounts", store="memonly")
>>> @accounts.function
... async def deposit(ctx, amount: int):
...     ctx.put(ctx.get(default=0) + amount)

The app is code deployed with the workers (``sfaas worker --app module:app``); nothing about
it travels over the network except operator/function names.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sfaas.errors import BadArguments, ConfigError, UnknownFunction, UnknownOperator

__all__ = ["App", "Operator", "Function", "load_app"]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")

UserFunction = Callable[..., Awaitable[Any]]


def _check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(
            f"{kind} name must be a str of letters, digits, '_', '.', '-' (starting with a "
            f"letter or '_'), got {name!r}"
        )
    return name


def _arity(sig: inspect.Signature) -> tuple[int, int]:
    """(min, max) positional arguments after ctx; max is large for ``*args``."""
    lo = hi = 0
    for p in list(sig.parameters.values())[1:]:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            hi += 1
            if p.default is p.empty:
                lo += 1
        elif p.kind is p.VAR_POSITIONAL:
            hi = 1 << 30
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            return (1 << 30, -1)  # a required keyword-only parameter can never be given
    return lo, hi


@dataclass(frozen=True)
class Function:
    """A registered user function: its name, the coroutine function and its signature."""

    name: str
    fn: UserFunction
    signature: inspect.Signature
    arity: tuple[int, int] = (0, 0)

    def check_args(self, operator: str, args: Sequence[Any]) -> None:
        """Raise :class:`BadArguments` if ``args`` do not fit (the ctx argument excluded)."""
        lo, hi = self.arity
        if lo <= len(args) <= hi:
            return  # the hot path: no Signature.bind
        try:
            self.signature.bind(None, *args)
        except TypeError as exc:
            raise BadArguments(
                f"{operator}.{self.name}{_params(self.signature)} got {len(args)} "
                f"argument(s) {list(args)!r:.120}: {exc}"
            ) from None


def _params(sig: inspect.Signature) -> str:
    params = list(sig.parameters.values())[1:]
    return "(" + ", ".join(p.name for p in params) + ")"


@dataclass
class Operator:
    """A partitioned, keyed piece of state plus the functions that run on one key of it."""

    app: App
    name: str
    store: str = "memonly"
    store_options: dict[str, Any] = field(default_factory=dict)
    functions: dict[str, Function] = field(default_factory=dict)
    #: the schema version of the values this code writes (see :mod:`sfaas.runtime.values`)
    version: int = 1
    #: ``upcast[v]`` turns a value of schema version ``v`` into one of version ``v + 1``
    upcast: dict[int, Callable[[Any], Any]] = field(default_factory=dict)
    #: seconds a value lives after its last write (None: for ever)
    ttl: float | None = None

    def function(self, fn: UserFunction | None = None, *, name: str | None = None) -> Any:
        """Decorator registering an ``async def f(ctx, *args)`` as a function of this operator."""

        def register(f: UserFunction) -> UserFunction:
            if not inspect.iscoroutinefunction(f):
                raise ConfigError(
                    f"{self.name}.{getattr(f, '__name__', f)!s} must be an 'async def' function"
                )
            fname = _check_name("function", name or f.__name__)
            sig = inspect.signature(f)
            if not sig.parameters:
                raise ConfigError(f"{self.name}.{fname} must take the context as first argument")
            if fname in self.functions:
                raise ConfigError(f"function {self.name}.{fname} is already registered")
            self.functions[fname] = Function(fname, f, sig, _arity(sig))
            return f

        if fn is not None:
            return register(fn)
        return register

    def get_function(self, name: object) -> Function:
        """The function called ``name`` or :class:`UnknownFunction`."""
        func = self.functions.get(name) if isinstance(name, str) else None
        if func is None:
            raise UnknownFunction(
                f"operator {self.name!r} of app {self.app.name!r} has no function {name!r}; "
                f"known: {sorted(self.functions)}"
            )
        return func


class App:
    """A named set of operators; the unit a cluster runs."""

    def __init__(self, name: str) -> None:
        self.name = _check_name("app", name)
        self.operators: dict[str, Operator] = {}

    def operator(
        self, name: str, store: str = "memonly", store_options: dict[str, Any] | None = None,
        *, version: int = 1, upcast: dict[int, Callable[[Any], Any]] | None = None,
        ttl: float | None = None,
    ) -> Operator:
        """Declare an operator whose state lives in a ``statestores`` engine ``store``.

        ``version``: the schema version of the values this code writes (1, the default,
        for code that never changed their shape); ``upcast``: for each older version ``v``
        (exactly ``1 .. version-1``) a plain, pure function turning a value of version ``v``
        into one of version ``v + 1`` — a read passes an older value through them before the
        function sees it. ``ttl``: seconds a value lives after its last write; an expired
        value reads as absent everywhere and merges drop it.
        """
        import statestores

        _check_name("operator", name)
        if name in self.operators:
            raise ConfigError(f"operator {name!r} is already declared in app {self.name!r}")
        if store not in statestores.ENGINES:
            raise ConfigError(
                f"operator {name!r}: unknown store {store!r}; expected one of {statestores.ENGINES}"
            )
        if store_options is not None and not isinstance(store_options, dict):
            raise ConfigError(
                f"operator {name!r}: store_options must be a dict, got {store_options!r}")
        _check_schema(name, version, upcast)
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))
                                or not math.isfinite(ttl) or not 0 < ttl <= MAX_TTL):
            raise ConfigError(f"operator {name!r}: ttl must be None or a number of seconds > 0 "
                              f"(at most {MAX_TTL:g}), got {ttl!r:.40}")
        op = Operator(self, name, store, dict(store_options or {}), version=version,
                      upcast=dict(upcast or {}), ttl=None if ttl is None else float(ttl))
        self.operators[name] = op
        return op

    def get_operator(self, name: object) -> Operator:
        """The operator called ``name`` or :class:`UnknownOperator`."""
        op = self.operators.get(name) if isinstance(name, str) else None
        if op is None:
            raise UnknownOperator(
                f"app {self.name!r} has no operator {name!r}; known: {sorted(self.operators)}"
            )
        return op

    def resolve(self, operator: object, function: object) -> Function:
        """The function ``operator.function`` (raising UnknownOperator/UnknownFunction)."""
        return self.get_operator(operator).get_function(function)

    def validate(self, operator: object, key: object, function: object, args: Any) -> Function:
        """Check a request before it is sent: names, key type, arity, serializable arguments."""
        from sfaas.errors import BadKey
        from sfaas.runtime.codec import check_arguments

        func = self.resolve(operator, function)
        if not isinstance(key, str) or not key:
            raise BadKey(f"key for operator {operator!r} must be a non-empty str, got {key!r:.80}")
        if key[0] == "\x00":
            raise BadKey(f"key for operator {operator!r} must not start with '\\x00' (reserved "
                         f"for the runtime's timers and actions), got {key!r:.80}")
        func.check_args(str(operator), tuple(args))
        check_arguments(list(args), f"arguments of {operator}.{function}")
        return func

    def __repr__(self) -> str:
        return f"App({self.name!r}, operators={sorted(self.operators)})"


#: Longest ``ttl`` (seconds): about 1,000 years.
MAX_TTL = 3.2e10


def _check_schema(name: str, version: object, upcast: object) -> None:
    """Raise :class:`ConfigError` unless ``version`` is an int in 1..MAX_VERSION and ``upcast``
    maps exactly ``1 .. version-1`` to plain (not async) callables."""
    from sfaas.runtime.codec import MAX_VERSION

    if isinstance(version, bool) or not isinstance(version, int) \
            or not 1 <= version <= MAX_VERSION:
        raise ConfigError(f"operator {name!r}: version must be an int from 1 to {MAX_VERSION}, "
                          f"got {version!r:.40}")
    if upcast is None:
        upcast = {}
    if not isinstance(upcast, dict):
        raise ConfigError(f"operator {name!r}: upcast must be a dict {{old version: function}}, "
                          f"got {upcast!r:.80}")
    want = set(range(1, version))
    if set(upcast) != want:
        missing = sorted(want - set(upcast), key=repr)
        extra = sorted(set(upcast) - want, key=repr)
        raise ConfigError(
            f"operator {name!r}: version={version} needs upcast keys exactly "
            f"{sorted(want)} (one function per older version v, turning a value of v into "
            f"one of v+1); missing {missing}, unexpected {extra}")
    for v, fn in upcast.items():
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            raise ConfigError(f"operator {name!r}: upcast[{v}] must be a plain function "
                              f"(value -> value, not async), got {fn!r:.80}")


def load_app(spec: str) -> App:
    """Import ``"package.module:attr"`` and return the :class:`App` it names."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"app must look like 'package.module:app', got {spec!r}")
    module_name, _, attr = spec.partition(":")
    # Like other app runners, import from the current directory too: the console script's
    # sys.path[0] is its bin directory, not the user's project.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import app module {module_name!r}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is not an sfaas.App (got {type(app).__name__})")
    return app
