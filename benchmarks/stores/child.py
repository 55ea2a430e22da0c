"""Child-process entry point: run one task, report over stdout as JSON lines.

``python -m benchmarks.stores.child '<json task>'``. Lines are ``{"phase": ...}`` while it
runs and one ``{"result": ...}`` at the end; a failure exits non-zero with the traceback on
stderr (the parent puts its last line in the table). One process per task keeps engines
from disturbing each other's memory numbers and lets a hung engine be killed.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from . import tasks

__all__ = ["main", "run_task"]


def _emit(phase: str) -> None:
    sys.stdout.write(json.dumps({"phase": phase}) + "\n")
    sys.stdout.flush()


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Dispatch ``task`` (a dict with ``kind`` and the task's arguments)."""
    kind = task["kind"]
    args = {k: v for k, v in task.items() if k != "kind"}
    fns = {
        "kv": tasks.run_kv,
        "build": tasks.run_build,
        "reopen": tasks.run_reopen,
        "snapshots": tasks.run_snapshots,
        "profile": tasks.run_profile,
    }
    if kind not in fns:
        raise ValueError(f"unknown task kind {kind!r}; expected one of {', '.join(fns)}")
    return fns[kind](emit=_emit, **args)  # type: ignore[operator]


def main(argv: list[str] | None = None) -> int:
    """Run the task given as the single JSON argument."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m benchmarks.stores.child '<json task>'\n")
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    result = run_task(json.loads(argv[0]))
    sys.stdout.write(json.dumps({"result": result}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
