"""``sfaas replay``: re-run a real cluster's epochs after a snapshot round in this process.

The round's stores are restored from MinIO into a local directory, the epochs logged after
it are re-executed with the app's *current* code (``sfaas.testing.replay``: in this
process and thread, so a breakpoint in a function stops there), and every reply that
differs from the one the cluster committed is reported. ``--epoch E`` stops after epoch
``E`` and ``--until E`` before it; either prints the state of ``--key`` (or of the keys the
epoch touched) and leaves the stores in the directory for a ``LocalRunner`` to open.
Exit status: 0, 1 when a reply diverged, 2 on an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sfaas.errors import ConfigError, ReplayError, SfaasError
from sfaas.runtime import wire
from sfaas.runtime.epochlog import EpochRecord
from sfaas.runtime.protocols.rounds import RoundManifest
from sfaas.runtime.settings import Settings

if TYPE_CHECKING:
    from sfaas.app import App
    from sfaas.testing.replay import Divergence, LogReplay, Replayed

__all__ = ["HELP", "add_arguments", "run"]

HELP = ("re-run the epochs logged after a snapshot round with the app's current code, in "
        "this process, and report every reply that differs from the cluster's")

_ABSENT = object()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``sfaas replay`` (beside ``--kafka``, ``--namespace``, ``--log-level``)."""
    p.add_argument("--app", help="MODULE:APP, the code to replay with (SFAAS_APP)")
    p.add_argument("--from-round", dest="from_round", type=int, required=True,
                   help="the snapshot round to start from (sfaas snapshots); 0: the empty "
                        "state and the whole epoch log")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--epoch", type=int, help="replay up to and including this epoch")
    stop.add_argument("--until", type=int, help="stop before this epoch")
    p.add_argument("--key", action="append", default=[],
                   help="print this key's state at the end (repeatable)")
    p.add_argument("--operator", help="the operator of --key (default: every operator)")
    p.add_argument("--dir", dest="directory",
                   help="where to restore the round (default: a new temporary directory)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


@dataclass
class _Report:
    """What a replay found, as printed."""

    app: str
    round: int
    round_epoch: int
    directory: str
    engine: str | None
    partitions: int
    replayed: list[int] = field(default_factory=list)
    decided: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    compared: int = 0
    direct: int = 0
    unanswered: int = 0
    state: dict[str, dict[str, Any]] = field(default_factory=dict)


def run(ns: argparse.Namespace) -> int:
    """Run ``sfaas replay`` for the parsed flags ``ns``; the exit status."""
    s = Settings.load({"kafka": ns.kafka, "namespace": ns.namespace, "log_level": ns.log_level,
                       "app": ns.app})
    if not s.app:
        raise ConfigError("sfaas replay needs the app's code: --app MODULE:APP (or SFAAS_APP)")
    if ns.from_round < 0:
        raise ConfigError(f"--from-round must be a round id >= 0, got {ns.from_round}")
    if ns.log_level:  # (else warnings only, on stderr beside the progress bar)
        logging.basicConfig(level=getattr(logging, s.log_level.upper(), logging.INFO),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = _load(s.app)
    report = asyncio.run(_replay(s, app, ns))
    if ns.json:
        print(json.dumps(_as_json(report), default=repr, indent=2))
    else:
        _print(report, ns)
    return 1 if report.divergences else 0


def _load(spec: str) -> App:
    """The app ``spec`` names; any error importing it names the spec."""
    from sfaas.app import load_app

    try:
        return load_app(spec)
    except SfaasError:
        raise
    except Exception as exc:  # (the module's own error: a syntax error, a failing import)
        raise ConfigError(f"app {spec!r} does not load: {type(exc).__name__}: {exc}") from exc


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _replay(s: Settings, app: App, ns: argparse.Namespace) -> _Report:
    from sfaas.runtime.recorded import empty_round, read_recorded, read_round
    from sfaas.runtime.state import store_remote
    from sfaas.testing.replay import LogReplay

    if ns.from_round > 0:
        m, maps = await asyncio.to_thread(read_round, s, app.name, ns.from_round)
    else:
        m, maps = empty_round(s.partitions, 1), []
    rec = await read_recorded(s, app.name, m, maps, _say)
    m = rec.manifest
    engine = _engine(app, m, s)
    epochs = sorted({r.epoch for r in rec.records})
    todo = _epochs_to_run(epochs, m, ns)
    directory = ns.directory or tempfile.mkdtemp(prefix=f"sfaas-replay-{app.name}-r{m.round}-")
    report = _Report(app.name, m.round, m.epoch, directory, engine, m.partitions)
    replay = LogReplay(app, m, rec.records, rec.requests, directory, maps=maps, store=engine,
                       fallback=s.fallback_phase(),
                       idempotency_retention=s.idempotency_retention)
    try:
        await asyncio.to_thread(replay.restore, lambda op, p: store_remote(s, app.name, op, p))
        _say(f"restored round {m.round} of app {app.name!r} (epoch {m.epoch}) into {directory}; "
             f"replaying {len(todo)} of the {len(epochs)} epochs logged after it")
        await _run_epochs(replay, rec.replies, todo, report, ns)
        report.state = _state(replay, report, ns)
    finally:
        await replay.close()
    return report


def _engine(app: App, m: RoundManifest, s: Settings) -> str | None:
    """The engine to open the round's stores with: the operators' own when the round's
    stores were written with them, else the one the round names for all."""
    used = {st.operator: st.engine for st in m.stores if st.engine}
    gone = sorted(set(used) - set(app.operators))
    if gone:
        raise ReplayError(f"round {m.round} holds operators {gone} that app {app.name!r} no "
                          f"longer declares (it declares {sorted(app.operators)})")
    if not used:
        return s.store or None
    if all(app.operators[op].store == e for op, e in used.items()):
        return None
    if len(set(used.values())) == 1:
        return next(iter(used.values()))
    raise ReplayError(f"round {m.round}'s stores were written with engines {used}, which "
                      "neither the app declares nor one override gives")


def _epochs_to_run(epochs: list[int], m: RoundManifest, ns: argparse.Namespace) -> list[int]:
    """The logged epochs ``--epoch`` / ``--until`` ask for; ReplayError outside the log."""
    target = ns.epoch if ns.epoch is not None else ns.until
    if target is None:
        return epochs
    flag = "--epoch" if ns.epoch is not None else "--until"
    if not epochs or not m.epoch < target <= epochs[-1]:
        held = f"epochs {m.epoch + 1}..{epochs[-1]}" if epochs else "no epoch"
        raise ReplayError(f"{flag} {target} is outside the epoch log after round {m.round} "
                          f"(which was cut at epoch {m.epoch}): the log holds {held}")
    return [e for e in epochs if e <= target] if ns.epoch is not None else \
        [e for e in epochs if e < target]


async def _run_epochs(replay: LogReplay, replies: dict[str, wire.Reply], todo: list[int],
                      report: _Report, ns: argparse.Namespace) -> None:
    """Replay ``todo`` with a progress bar, comparing each decided request's reply."""
    from tqdm import tqdm

    from sfaas.testing.replay import Comparison, compare

    found = Comparison()
    last = todo[-1] if todo else None
    watch = ns.epoch is not None and not ns.key
    with tqdm(total=len(todo), unit="epoch", disable=None, file=sys.stderr) as bar:
        for epoch in todo:
            before = replay.state() if watch and epoch == last else None
            decided = await replay.run_epoch(epoch)
            report.decided += len(decided)
            compare(decided, replies, found)
            if before is not None:
                report.state = _touched(replay, before, decided)
            report.replayed.append(epoch)
            bar.update(1)
            bar.set_postfix(diverged=len(found.divergences), refresh=False)
    report.divergences = found.divergences
    report.compared, report.direct, report.unanswered = found.compared, found.direct, \
        found.unanswered


def _touched(replay: LogReplay, before: dict[str, dict[str, Any]],
             decided: list[Replayed]) -> dict[str, dict[str, Any]]:
    """The keys an epoch touched (its roots' and those whose value changed), their values
    after it (a deleted one: None)."""
    after = replay.state()
    keys = {(str(d.item.request[0]), d.item.request[1]) for d in decided if not d.item.runtime}
    for op in after:
        keys |= {(op, k) for k in set(before[op]) | set(after[op])
                 if before[op].get(k, _ABSENT) != after[op].get(k, _ABSENT)}
    out: dict[str, dict[str, Any]] = {}
    for op, k in sorted(keys):
        if op in after:
            out.setdefault(op, {})[k] = after[op].get(k)
    return out


def _state(replay: LogReplay, report: _Report, ns: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The state to print: ``--key``'s, else what ``--epoch``'s epoch touched, else (with
    ``--until``) the keys the next logged epoch's requests name (None: no value)."""
    if ns.operator and ns.operator not in replay.app.operators:
        raise ReplayError(f"--operator {ns.operator!r}: app {report.app!r} has no such operator "
                          f"(it has {sorted(replay.app.operators)})")
    ops = [ns.operator] if ns.operator else list(replay.app.operators)
    if not ns.key and ns.until is not None:
        nxt = [e for e in replay.epochs if e >= ns.until][:1]
        keys = _roots(replay, replay.by_epoch[nxt[0]].values()) if nxt else set()
        return {op: {k: replay.items(op).get(k) for o, k in sorted(keys) if o == op}
                for op in ops if any(o == op for o, _ in keys)}
    if not ns.key:
        return report.state
    out: dict[str, dict[str, Any]] = {}
    for key in ns.key:
        for op in ops:
            value = replay.items(op).get(key, _ABSENT)
            if value is not _ABSENT:
                out.setdefault(op, {})[key] = value
        if not any(key in vals for vals in out.values()):
            within = f"operator {ns.operator!r}" if ns.operator else "any operator"
            raise ReplayError(f"--key {key!r}: no key {key!r} in {within} of app "
                              f"{report.app!r} {_where(report)}")
    return out


def _where(r: _Report) -> str:
    return f"after epoch {r.replayed[-1]}" if r.replayed else f"at round {r.round}"


def _roots(replay: LogReplay, records: Iterable[EpochRecord]) -> set[tuple[str, str]]:
    """``(operator, key)`` of the client requests the epoch-log ``records`` name."""
    out: set[tuple[str, str]] = set()
    for rec in records:
        direct = dict(rec.direct)
        for tid, p, o in rec.batch:
            if p < 0:
                continue
            req = wire.Request.decode(direct[tid]) if o < 0 else replay.requests.get((p, o))
            if req is not None:
                out.add((req.operator, req.key))
    return out


def _as_json(r: _Report) -> dict[str, Any]:
    def reply(x: wire.Reply) -> dict[str, Any]:
        return {"ok": x.ok, "value": x.value, "error_type": x.error_type, "reason": x.reason}

    return {
        "app": r.app, "round": r.round, "round_epoch": r.round_epoch, "directory": r.directory,
        "epochs": len(r.replayed), "first_epoch": r.replayed[0] if r.replayed else None,
        "last_epoch": r.replayed[-1] if r.replayed else None, "decided": r.decided,
        "compared": r.compared, "direct": r.direct, "unanswered": r.unanswered,
        "divergences": [{"rid": d.rid, "operator": d.operator, "function": d.function,
                         "key": d.key, "epoch": d.epoch, "committed": reply(d.committed),
                         "replayed": reply(d.replayed)} for d in r.divergences],
        "state": r.state,
    }


def _print(r: _Report, ns: argparse.Namespace) -> None:
    from sfaas.testing.replay import describe_reply

    span = f"epochs {r.replayed[0]}..{r.replayed[-1]}" if r.replayed else "no epoch"
    print(f"replayed {span} ({len(r.replayed)} logged epochs after round {r.round}, cut at "
          f"epoch {r.round_epoch}): {r.decided} requests decided")
    for d in r.divergences:
        print(f"DIVERGED request {d.rid}: {d.operator}.{d.function} on key {d.key!r}, "
              f"epoch {d.epoch}\n  cluster: {describe_reply(d.committed)}\n"
              f"  replay:  {describe_reply(d.replayed)}")
    print(f"{r.compared} replies compared, {len(r.divergences)} diverged; {r.direct} direct "
          "calls not compared (their replies went to the client, not the egress topic); "
          f"{r.unanswered} requests without a committed reply")
    if r.state or ns.key or ns.epoch is not None or ns.until is not None:
        print(f"state {_where(r)}" + (f", before epoch {ns.until}:" if ns.until else ":"))
        for op, values in r.state.items():
            for k, v in values.items():
                print(f"  {op}[{k!r}] = {json.dumps(v, default=repr)}")
        store = f", store={r.engine!r}" if r.engine else ""
        print(f"the stores are in {r.directory}: LocalRunner(app, partitions={r.partitions}"
              f"{store}, directory={r.directory!r}) opens them")
