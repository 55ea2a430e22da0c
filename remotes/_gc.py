"""Retention: which manifests and files :meth:`Remote.gc` removes (shared by all remotes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .manifest import Manifest

__all__ = ["GcPlan", "check_keep", "plan_gc"]


@dataclass(frozen=True)
class GcPlan:
    """Manifests to unpublish and files to delete, decided before anything is deleted."""

    drop_snapshots: list[int]
    drop_files: dict[str, int]  # name -> size


def check_keep(keep: object) -> int:
    """Return ``keep`` if it is an int >= 1, else raise (naming ``keep``)."""
    if isinstance(keep, bool) or not isinstance(keep, int):
        raise TypeError(f"keep must be an int >= 1, got {type(keep).__name__}: {keep!r}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (gc never deletes the newest snapshot), got {keep}")
    return keep


def plan_gc(
    snapshots: list[int],
    keep: int,
    read_manifest: Callable[[int], Manifest],
    files: Iterable[tuple[str, int, float]],
    manifest_mtime: Callable[[int], float],
) -> GcPlan:
    """Decide what ``gc(keep)`` deletes.

    ``files`` yields ``(name, size, mtime)`` of every data file. A file is deleted when no
    retained manifest references it *and* it is not newer than the newest retained
    manifest: a newer unreferenced file may belong to a snapshot whose upload is still in
    flight (its manifest is written last), and deleting it would break that snapshot. Such
    files are collected by the first ``gc`` after the next manifest is published.
    """
    keep = check_keep(keep)
    ordered = sorted(snapshots)
    retained = ordered[-keep:]
    dropped = ordered[:-keep] if len(ordered) > keep else []
    referenced: set[str] = set()
    for sid in retained:
        referenced.update(read_manifest(sid).files)
    horizon = manifest_mtime(retained[-1]) if retained else float("-inf")
    drop_files = {
        name: size
        for name, size, mtime in files
        if name not in referenced and mtime <= horizon
    }
    return GcPlan(drop_snapshots=dropped, drop_files=drop_files)
