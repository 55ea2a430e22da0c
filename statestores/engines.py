"""The engine registry: which class implements each engine name.

A module of its own (not the package ``__init__``) so that parts of the package that open
stores by name — a replica's :meth:`~statestores.replica.Follower.promote` — reach it
without importing the package that imports them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .appendlog import AppendLogStore
    from .base import Store
    from .engine import Engine
    from .hybridlog import HybridLogStore
    from .lsm import LSMStore
    from .memonly import MemOnlyStore

    #: mypy checks here that every engine class implements the one engine Protocol.
    _IMPLEMENT_ENGINE: tuple[type[Engine], ...] = (
        LSMStore, AppendLogStore, HybridLogStore, MemOnlyStore,
    )

__all__ = ["ENGINES", "engine_class"]

ENGINES = ("lsm", "appendlog", "hybridlog", "memonly")

_MODULES = {
    "lsm": ("statestores.lsm", "LSMStore"),
    "appendlog": ("statestores.appendlog", "AppendLogStore"),
    "hybridlog": ("statestores.hybridlog", "HybridLogStore"),
    "memonly": ("statestores.memonly", "MemOnlyStore"),
}


def engine_class(engine: str) -> type[Store]:
    """The :class:`Store` subclass implementing ``engine``."""
    if not isinstance(engine, str):
        raise TypeError(
            f"engine must be a str, one of {ENGINES}, got {type(engine).__name__}"
        )
    if engine not in _MODULES:
        raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    module, cls = _MODULES[engine]
    found: type[Store] = getattr(importlib.import_module(module), cls)
    return found
