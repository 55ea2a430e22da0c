"""Errors raised by remotes (re-exported by ``statestores.errors``)."""

from __future__ import annotations


class RemoteError(Exception):
    """The remote failed after retries, or lacks what was asked for."""


class SnapshotNotFoundError(RemoteError):
    """A snapshot id was asked for that the remote does not hold (complete)."""
