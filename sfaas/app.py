"""The user-facing app model: :class:`App`, its operators and their functions.

>>> app = App("bank")
>>> accounts = app.operator("accounts", store="memonly")
>>> @accounts.function
... async def deposit(ctx, amount: int) -> int:
...     ctx.put(ctx.get(default=0) + amount)
...     return ctx.get()

The decorator returns a :class:`FunctionRef`: ``deposit`` stays callable like the function
it wraps, and is also the typed handle of ``accounts.deposit`` —
``await ctx.call(deposit, "bob", 5)`` is checked by mypy against ``deposit``'s signature,
where ``await ctx.call("accounts", "bob", "deposit", 5)`` is not (both work).
:func:`call_target` turns either form into names and arguments.

The app is code deployed with the workers (``sfaas worker --app module:app``); nothing about
it travels over the network except operator/function names.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from sfaas.errors import BadArguments, ConfigError, UnknownFunction, UnknownOperator

__all__ = ["App", "Operator", "Function", "FunctionRef", "call_target", "load_app"]

P = ParamSpec("P")
R = TypeVar("R")

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

    def positional(self, operator: str, args: Sequence[Any],
                   kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        """``args`` with ``kwargs`` put at their parameters' positions (a call carries
        positional arguments only; a parameter skipped before the last one given gets its
        default): :class:`BadArguments` for a keyword that names no positional parameter."""
        if not kwargs:
            return tuple(args)
        where = f"{operator}.{self.name}{_params(self.signature)}"
        try:
            self.signature.bind(None, *args, **kwargs)
        except TypeError as exc:
            raise BadArguments(f"{where}: {exc}") from None
        params = list(self.signature.parameters.values())[1:]
        order = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        named = {p.name: i for i, p in enumerate(order) if p.kind is p.POSITIONAL_OR_KEYWORD}
        stray = sorted(set(kwargs) - set(named))
        if stray:
            raise BadArguments(
                f"{where}: keyword argument(s) {stray} name no positional parameter; a call "
                "carries positional arguments only (keyword-only and **kwargs parameters "
                "cannot be given through one)")
        out = list(args)
        for p in order[len(args):max(named[k] for k in kwargs) + 1]:
            out.append(kwargs[p.name] if p.name in kwargs else p.default)
        return tuple(out)


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

    @overload
    def function(self, fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]], *,
                 name: str | None = None) -> FunctionRef[P, R]: ...

    @overload
    def function(self, fn: None = None, *, name: str | None = None) -> Callable[
            [Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]], FunctionRef[P, R]]: ...

    def function(self, fn: Any = None, *, name: str | None = None) -> Any:
        """Decorator registering an ``async def f(ctx, *args)`` as a function of this
        operator (as ``name``, by default ``f``'s); returns its :class:`FunctionRef`,
        callable like ``f`` and the typed handle of calls to it."""

        def register(f: Any) -> FunctionRef[Any, Any]:
            if isinstance(f, FunctionRef):  # (one coroutine function in two operators)
                f = f.fn
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
            func = self.functions[fname] = Function(fname, f, sig, _arity(sig))
            return FunctionRef(f, self, func)

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


class FunctionRef(Generic[P, R]):
    """What ``@operator.function`` returns: the registered ``async def f(ctx, ...)``,
    callable exactly like it (``await deposit(ctx, 5)`` runs it directly, as before), and
    the typed handle of calls to it — ``ctx.call(deposit, key, 5)``, ``ctx.send``,
    ``ctx.send_after``, ``Client.call``, ``SyncClient.call`` — which mypy checks against
    ``f``'s parameters after ``ctx`` and its result type.

    ``operator`` and ``name`` are the names it is registered under, ``app`` its
    :class:`App`; ``fn`` is ``f`` itself.
    """

    __name__: str  # (``f``'s, as are ``__qualname__``, ``__doc__`` and ``__module__``)

    def __init__(self, fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
                 operator: Operator, function: Function) -> None:
        self.fn = fn
        #: the operator's and the function's registered names
        self.operator = operator.name
        self.name = function.name
        self.app = operator.app
        self._function = function
        functools.update_wrapper(self, fn)  # __name__, __doc__, __wrapped__ (the signature)
        mark = getattr(inspect, "markcoroutinefunction", None)  # (Python >= 3.12)
        if mark is not None:
            mark(self)

    def __call__(self, ctx: Any, /, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        return self.fn(ctx, *args, **kwargs)

    def positional(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The arguments of a call of this function, keyword ones put at their parameters'
        positions (:meth:`Function.positional`)."""
        return self._function.positional(self.operator, args, kwargs)

    def check_app(self, app: str) -> None:
        """Raise :class:`UnknownFunction` unless this is a function of the app named ``app``
        (a call goes by names: another app's handle would reach whatever this one has
        under the same names)."""
        if self.app.name != app:
            raise UnknownFunction(
                f"{self.__name__} is the handle of {self.operator}.{self.name} of app "
                f"{self.app.name!r}; this is app {app!r}: call functions of app {app!r} "
                "(a handle calls a function of its own app only)")

    def __repr__(self) -> str:
        return f"<FunctionRef {self.operator}.{self.name} of app {self.app.name!r}>"


def call_target(target: FunctionRef[..., Any] | str, /, *rest: Any,
                **kwargs: Any) -> tuple[str, str, str, tuple[Any, ...]]:
    """``(operator, key, function, args)`` of a call written in either form:

    * by name — ``call_target("accounts", key, "deposit", *args)``: ``target`` is the
      operator's name and ``rest`` is ``key, function, *args``; keyword arguments raise
      (this form carries positional arguments only);
    * by handle — ``call_target(deposit, key, *args, **kwargs)``: ``target`` is a
      :class:`FunctionRef` and ``rest`` is ``key, *args``; ``kwargs`` are put at their
      parameters' positions (:meth:`Function.positional`), so ``args`` is positional.

    Only the shape is checked here, raising :class:`~sfaas.errors.BadArguments` (a
    ``TypeError``): a target that is neither a str nor a handle (a plain function names
    the fix), a key or function name missing, keyword arguments the form cannot carry.
    The values — the key's type, the names, the arity, serializable arguments — are
    checked where they were before (:meth:`App.validate`, the engine); that a handle
    belongs to the app being called is :meth:`App.call_target`'s check.
    """
    if isinstance(target, FunctionRef):
        if not rest:
            raise BadArguments(f"a call of {target.operator}.{target.name} needs a key: "
                               f"({target.__name__}, key, *args)")
        return (target.operator, rest[0], target.name, target.positional(rest[1:], kwargs))
    if isinstance(target, str):
        if len(rest) < 2:
            raise BadArguments(f"a call of operator {target!r:.60} by name needs "
                               f"(operator, key, function, *args), got {1 + len(rest)} "
                               "argument(s)")
        if kwargs:
            raise BadArguments(
                f"keyword argument(s) {sorted(kwargs)} in a call of {target}.{rest[1]!s:.60} "
                "by name: that form carries positional arguments only (a call through the "
                "function's handle takes keywords for its positional parameters)")
        return target, rest[0], rest[1], tuple(rest[2:])
    if callable(target) and hasattr(target, "__qualname__"):
        raise BadArguments(
            f"call target {getattr(target, '__module__', '?')}.{target.__qualname__} is a "
            "plain function, not a function handle: pass what @operator.function returned "
            "for it (registering it by calling operator.function(f) returns the handle too)")
    raise BadArguments(f"a call target must be an operator name (str) or a function handle "
                       f"(what @operator.function returned), got {target!r:.80}")


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

    def call_target(self, target: FunctionRef[..., Any] | str, /, *rest: Any,
                    **kwargs: Any) -> tuple[str, str, str, tuple[Any, ...]]:
        """:func:`call_target` for a call into this app: also raises
        :class:`UnknownFunction` for the handle of another app's function, naming both."""
        if isinstance(target, FunctionRef):
            target.check_app(self.name)
        return call_target(target, *rest, **kwargs)

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
