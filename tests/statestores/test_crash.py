"""Fault injection at every mutating file-system call (write, fsync, rename, remove, …).

For each engine, one fixed history is run once to count its calls, then once per call
index with a :class:`FaultyFS` that dies there (tearing the write). Reopening the
directory must give the acknowledged writes, plus possibly the one in flight — whole, for a
batch — and nothing else: no torn batch, no resurrected delete, no lost acknowledged write.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import remotes
import statestores
from statestores.testing import FaultyFS, InjectedFault

from .engines import TINY

Op = tuple[str, Any]


def history(seed: int) -> list[Op]:
    rng = random.Random(seed)
    keys = [b"key%02d" % i for i in range(12)]
    ops: list[Op] = []
    for i in range(36):
        r = rng.random()
        if r < 0.45:
            ops.append(("put", (rng.choice(keys), b"v%03d-" % i + b"x" * rng.choice([0, 5, 120]))))
        elif r < 0.6:
            ops.append(("delete", rng.choice(keys)))
        elif r < 0.8:
            ops.append(("batch", [(rng.choice(keys), None if rng.random() < 0.3 else b"b%03d" % i) for _ in range(3)]))
        elif r < 0.9:
            ops.append(("flush", None))
        else:
            ops.append(("snapshot", None))
    return ops


def apply(model: dict[bytes, bytes], op: Op) -> None:
    kind, arg = op
    if kind == "put":
        model[arg[0]] = arg[1]
    elif kind == "delete":
        model.pop(arg, None)
    elif kind == "batch":
        for k, v in arg:
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v


def run(store: statestores.Store, ops: list[Op], model: dict[bytes, bytes], sid: list[int]) -> Op | None:
    """Run ``ops``; return the op in flight when the fault hit (None if none hit)."""
    for op in ops:
        kind, arg = op
        try:
            if kind == "put":
                store.put(*arg)
            elif kind == "delete":
                store.delete(arg)
            elif kind == "batch":
                store.write_batch(arg)
            elif kind == "flush":
                store.flush()
            elif kind == "snapshot":
                sid[0] += 1
                store.snapshot(sid[0])
        except (InjectedFault, statestores.RemoteError):
            return op
        apply(model, op)
    return None


@pytest.mark.parametrize("engine", statestores.ENGINES)
@pytest.mark.parametrize("tiny", [False, True], ids=["default", "tiny"])
def test_crash_at_every_call_keeps_acknowledged_writes(engine: str, tiny: bool, tmp_path: Path) -> None:
    options: dict[str, Any] = dict(TINY[engine]) if tiny else {"sync": "os"}
    ops = history(seed=7)
    # count the calls of a clean run
    probe = FaultyFS()
    with statestores.open(engine, tmp_path / "probe", remote=remotes.PathRemote(tmp_path / "r0"), fs=probe, **options) as s:
        run(s, ops, {}, [0])
    total = probe.calls
    assert total > len(ops) // 2
    step = max(1, total // 60)  # at most ~60 crash points per configuration, spread evenly
    for fail_at in range(1, total + 1, step):
        d = tmp_path / f"db{fail_at}"
        remote = remotes.PathRemote(tmp_path / f"r{fail_at}")
        fs = FaultyFS(fail_at, torn=True, seed=fail_at)
        model: dict[bytes, bytes] = {}
        try:
            s = statestores.open(engine, d, remote=remote, fs=fs, **options)
        except InjectedFault:
            s = None
        in_flight = run(s, ops, model, [0]) if s is not None else None
        fs.crash()
        with statestores.open(engine, d, remote=remote, **options) as reopened:
            got = dict(reopened.items())
            for k, v in got.items():
                assert reopened.get(k) == v
        allowed = [model]
        if in_flight is not None:
            with_it = dict(model)
            apply(with_it, in_flight)
            allowed.append(with_it)
        assert got in allowed, f"{engine} crashed at call {fail_at}/{total} during {in_flight}: {got} not in {allowed}"
