"""Credentials of remotes, kept out of pickles, ``repr`` and messages.

A :class:`~remotes.minio.MinioRemote` travels to a store's background ``upload`` process
as a pickle with every argument but its secret key; in its place is a *reference* (random,
per process and credential) that the receiving process resolves here:

1. the secrets this process registered (every ``MinioRemote`` it constructed) or was
   handed by its parent: ``statestores.background`` sends :func:`export`'s mapping to
   each of its worker processes over their private pipe, as JSON — never in a pickle —
   before a task that may need it;
2. else the environment: ``SFAAS_MINIO_SECRET_KEY``, when the access key is
   ``SFAAS_MINIO_ACCESS_KEY`` (default ``sfaas``) — how a process started by ``sfaas``
   gets its credentials.
"""

from __future__ import annotations

import os
import secrets
import threading

__all__ = ["register", "lookup", "export", "install"]

_lock = threading.Lock()
_by_ref: dict[str, str] = {}
_refs: dict[tuple[str, str, str], str] = {}
_generation = 0


def register(endpoint: str, access_key: str, secret_key: str) -> str:
    """The reference of ``secret_key`` (for ``access_key`` at ``endpoint``) in this process."""
    global _generation
    with _lock:
        ref = _refs.get((endpoint, access_key, secret_key))
        if ref is None:
            ref = _refs[(endpoint, access_key, secret_key)] = secrets.token_hex(12)
            _by_ref[ref] = secret_key
            _generation += 1
        return ref


def lookup(ref: str, access_key: str) -> str | None:
    """The secret behind ``ref`` (see the module docstring), or None."""
    with _lock:
        secret = _by_ref.get(ref)
    if secret:
        return secret
    env_secret = os.environ.get("SFAAS_MINIO_SECRET_KEY")
    if env_secret and (os.environ.get("SFAAS_MINIO_ACCESS_KEY") or "sfaas") == access_key:
        return env_secret
    return None


def export() -> tuple[int, dict[str, str]]:
    """``(generation, reference → secret)``: what a child process needs to resolve this
    process's references; the generation changes whenever a secret is registered."""
    with _lock:
        return _generation, dict(_by_ref)


def install(mapping: dict[str, str]) -> None:
    """Take a parent's :func:`export` (in a child process)."""
    with _lock:
        _by_ref.update({str(k): str(v) for k, v in mapping.items()})
