"""The background merge of an ``lsm`` store: at most one in flight, started, abandoned and
finished here; the store decides when to merge and installs the result
(:meth:`~.engine.LSMStore._install_merge`).

A part the store holds (``LSMStore._merges``), built on the store's parts: the file set
(names, pins), the tasks (the done-callback hands the result to the maintainer thread),
used under the store lock.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any, NamedTuple, Protocol

from .. import background
from ..errors import BackgroundBusy
from ..files import FileSet
from ..fs import FileSystem
from ..tasks import Tasks
from . import merge as merge_mod
from .runfile import RunReader

__all__ = ["MergeJob", "Merges", "MergesHost"]

log = logging.getLogger("statestores.lsm")


class MergeJob(NamedTuple):
    """A merge in flight: ``inputs`` (oldest first) into run ``name`` at level ``target``."""

    future: concurrent.futures.Future[dict[str, Any]]
    target: int
    inputs: list[RunReader]
    name: str


class MergesHost(Protocol):
    """What :class:`Merges` needs of the store holding it."""

    def merge_ended(self, fut: concurrent.futures.Future[dict[str, Any]]) -> None:
        """(maintainer thread) The merge ``fut`` ended: install it (:meth:`Merges.take`)."""


class Merges:
    """The one merge of an lsm store in flight, if any, and what merges did so far."""

    def __init__(
        self, fs: FileSystem, files: FileSet, tasks: Tasks, run_opts: dict[str, Any],
        host: MergesHost,
    ) -> None:
        #: constant after construction
        self.fs = fs
        self.files = files
        self.tasks = tasks
        self.run_opts = run_opts
        self._host = host
        self.job: MergeJob | None = None
        self.done = 0
        self.errors = 0
        self.expired_dropped = 0  # values merges found expired (dropped or made tombstones)

    def start(
        self,
        inputs: list[RunReader],
        target: int,
        *,
        drop: bool,
        horizon: int | None,
        bg_fs: FileSystem | None,
        local: bool,
    ) -> bool:
        """(lock held, no merge running) Merge ``inputs`` (oldest first) into one run of
        level ``target`` in the background; the host's ``merge_ended(future)`` runs on the
        maintainer thread when it ends. False if the lane is full. ``drop``: nothing older than the
        inputs exists, so tombstones — and values expired at ``horizon`` — vanish."""
        assert self.job is None, "one merge at a time"
        name = f"lsm-L{target}-{self.files.next_seq():010d}.run"
        o = self.run_opts
        try:
            fut = background.submit(
                merge_mod.merge_runs, bg_fs, [r.path for r in reversed(inputs)],
                self.files.path(name) + ".tmp", drop, o["density_factor"], o["block_bytes"],
                o["bloom_fpr"], o["fsync"], horizon, lane="merge", local=local,
            )
        except BackgroundBusy as exc:
            log.debug("merge of %s postponed: %s", self.files.directory, exc)
            return False
        self.job = MergeJob(fut, target, inputs, name)
        fut.add_done_callback(self.tasks.on_done(self._host.merge_ended))
        return True

    def abandon(self) -> None:
        """(lock held) Forget the merge in flight (a restore replaces the runs; at 50M keys
        a merge can run for tens of seconds). Its inputs stay pinned until it ends; then
        its output is deleted, never installed."""
        job, self.job = self.job, None
        if job is None:
            return
        names = [r.name for r in job.inputs]
        self.files.pin(names)
        log.info("a restore abandons the merge into %s", job.name,
                 extra={"store": self.files.directory})
        tmp = self.files.path(job.name) + ".tmp"

        def ended(_fut: concurrent.futures.Future[dict[str, Any]]) -> None:
            with self.tasks.lock:
                self.fs.remove(tmp)
                self.files.unpin(names)

        job.future.add_done_callback(self.tasks.on_done(ended))

    def take(
        self, fut: concurrent.futures.Future[dict[str, Any]], *, closed: bool
    ) -> tuple[MergeJob, dict[str, Any]] | None:
        """(lock held) The job ``fut`` ended and its result, to install; None if there is
        nothing to install (an abandoned or failed merge, a closed store: its output is
        deleted here)."""
        job = self.job
        if job is None or job.future is not fut:
            return None
        self.job = None
        tmp = self.files.path(job.name) + ".tmp"
        try:
            result = fut.result()
        except Exception as exc:
            self.errors += 1
            log.error("merge into %s failed: %s", job.name, exc,
                      extra={"store": self.files.directory})
            self.fs.remove(tmp)
            return None
        if closed:
            self.fs.remove(tmp)
            return None
        self.expired_dropped += result.get("expired", 0)
        return job, result
