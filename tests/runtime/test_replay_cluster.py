"""``sfaas replay`` against a real cluster (Kafka, MinIO, ``sfaas up``): traffic through the
Kafka path with snapshot rounds every second, the cluster stopped, then the epochs after a
round re-executed in this process — with the same code every committed reply is
reproduced and the state is the cluster's; with a planted code change exactly the
requests it changes are reported, each with both replies."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster, main
from sfaas.client import Client
from sfaas.runtime import wire
from sfaas.runtime.protocols.rounds import Rounds
from sfaas.runtime.recorded import read_round
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import rounds_remote
from tests.runtime.apps import tally_changed
from tests.runtime.test_recovery import chaos_settings, log_tails
from tests.runtime.test_rounds import _read_topic

ACCOUNTS = [f"a-{i}" for i in range(6)]
COUNTERS = [f"c-{i}" for i in range(6)]


async def _load(c: Client, rnd: random.Random, seconds: float) -> list[tuple[str, str, wire.Reply]]:
    """Transfers and bumps for ``seconds``: ``(operator, key, reply)`` of each."""
    futs = []
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        for _ in range(4):
            a, b = rnd.sample(ACCOUNTS, 2)
            futs.append(("accounts", a, await c.submit("accounts", a, "transfer", b, rnd.randint(1, 80))))
            k = rnd.choice(COUNTERS)
            futs.append(("counters", k, await c.submit("counters", k, "bump")))
        await asyncio.sleep(0.03)
    replies = await asyncio.wait_for(asyncio.gather(*(f for _, _, f in futs)), 60)
    return [(op, k, r) for (op, k, _), r in zip(futs, replies, strict=True)]


async def _round_after(s: Settings, above: int, timeout: float = 20.0) -> int:
    rounds = Rounds(rounds_remote(s, "tally"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ids = await asyncio.to_thread(rounds.ids)
        if ids and ids[-1] > above:
            return ids[-1]
        await asyncio.sleep(0.2)
    raise AssertionError(f"no snapshot round above {above} within {timeout} s")


async def _committed(cs: Settings, partitions: int, rids: set[str], timeout: float = 15.0) -> None:
    """Until every reply of ``rids`` is in the egress topic for a ``read_committed`` reader."""
    deadline = time.monotonic() + timeout
    while True:
        raw = await _read_topic(cs, cs.topics("tally")[1], partitions, committed=True)
        seen = {wire.Reply.decode(v).rid for recs in raw.values() for _, v in recs}
        if rids <= seen or time.monotonic() > deadline:
            assert rids <= seen, f"{len(rids - seen)} replies never committed"
            return
        await asyncio.sleep(0.3)


def _traffic(s: Settings) -> tuple[int, list[tuple[str, str, wire.Reply]], dict[str, dict[str, int]]]:
    """Load before and after a round; the round, the replies after it and the final state."""
    cs = cluster.cluster_settings(s)[1]

    async def go() -> tuple[int, list[tuple[str, str, wire.Reply]], dict[str, dict[str, int]]]:
        rnd = random.Random(11)
        async with Client("tally", settings=cs, direct_calls=False) as c:  # (replies in Kafka)
            await asyncio.gather(*(c.call("accounts", a, "deposit", 200) for a in ACCOUNTS))
            # before the round: no bump of the planted key, so each of its bumps is after it
            await asyncio.gather(*(c.call("counters", k, "bump") for k in COUNTERS
                                   if k != tally_changed.PLANTED))
            ids = await asyncio.to_thread(Rounds(rounds_remote(s, "tally")).ids)
            round_id = await _round_after(s, ids[-1] if ids else 0)
            after = await _load(c, rnd, 2.5)
            await _committed(cs, s.partitions, {r.rid for _, _, r in after})
            state = {"accounts": {a: await c.get("accounts", a) for a in ACCOUNTS},
                     "counters": {k: await c.get("counters", k) for k in COUNTERS}}
        return round_id, after, state

    return asyncio.run(go())


def _replay(spec: str, round_id: int, directory: Path, capsys: Any, *args: str) -> tuple[int, dict[str, Any]]:
    """``sfaas replay --json``'s exit status and output (``args``, or every key's state)."""
    capsys.readouterr()
    keys = list(args) or [f"--key={k}" for k in ACCOUNTS + COUNTERS]
    code = main(["replay", "--app", spec, "--from-round", str(round_id), "--dir", str(directory),
                 "--json", *keys])
    out = capsys.readouterr()
    assert out.out.startswith("{"), (code, out.err[-3000:])
    return code, json.loads(out.out)


@pytest.mark.timeout(300)
def test_replay_reproduces_the_cluster_and_reports_exactly_a_planted_change(
        kafka: Any, minio: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    s = chaos_settings(kafka, minio, tmp_path / "home", snapshot_retain=50)
    cluster.up(s, "tests.runtime.apps.tally:app", 2, timeout=90)
    try:
        round_id, after, state = _traffic(s)
    except BaseException:
        print(log_tails(s))
        raise
    finally:
        cluster.down(s)
    for name, value in s.as_env().items():  # (the settings `sfaas replay` reads: MinIO, Kafka)
        monkeypatch.setenv(name, value)
    m, _ = read_round(s, "tally", round_id)

    # (a) the same code: every reply after the round reproduced, the cluster's final state
    code, same = _replay("tests.runtime.apps.tally:app", round_id, tmp_path / "same", capsys)
    assert (code, same["divergences"]) == (0, [])
    assert same["round"] == round_id and same["first_epoch"] > m.epoch
    assert same["compared"] >= len(after) and same["direct"] == 0, same
    assert same["state"] == state

    # (b) a planted change: exactly the bumps of the planted key are reported, with both replies
    planted = {r.rid: r for op, k, r in after if k == tally_changed.PLANTED}
    assert len(planted) >= 5, "too few bumps of the planted key to check anything"
    code, changed = _replay("tests.runtime.apps.tally_changed:app", round_id, tmp_path / "changed", capsys)
    assert code == 1
    found = {d["rid"]: d for d in changed["divergences"]}
    assert set(found) == set(planted)
    for rid, d in found.items():
        assert (d["operator"], d["function"], d["key"]) == ("counters", "bump", tally_changed.PLANTED)
        assert d["committed"]["value"] == planted[rid].value
        assert d["replayed"]["value"] == planted[rid].value + 1000
    assert changed["state"] == state  # (the change is in the replies only)

    # --epoch: the keys its epoch touched, as the cluster left them (nothing ran after it)
    last = same["last_epoch"]
    code, at = _replay("tests.runtime.apps.tally:app", round_id, tmp_path / "last", capsys, f"--epoch={last}")
    assert code == 0 and at["last_epoch"] == last and at["state"], at
    assert all(value == state[op][k] for op, values in at["state"].items() for k, value in values.items())
    # errors name what is missing and what is there
    spec = "tests.runtime.apps.tally:app"
    assert "round 99999 of app 'tally' is not in MinIO" in _fails(capsys, spec, round_id, "--from-round=99999")
    assert "cannot import app module 'tests.runtime.apps.nope'" in _fails(capsys, "tests.runtime.apps.nope:app", round_id)
    assert f"--epoch {m.epoch} is outside the epoch log after round {round_id}" in _fails(
        capsys, spec, round_id, f"--epoch={m.epoch}")
    assert "--key 'nope': no key 'nope' in any operator of app 'tally'" in _fails(capsys, spec, round_id, "--key=nope")


def _fails(capsys: Any, spec: str, round_id: int, *args: str) -> str:
    """``sfaas replay``'s error for ``args`` (exit status 2); a later flag overrides an earlier."""
    capsys.readouterr()
    assert main(["replay", "--app", spec, f"--from-round={round_id}", *args]) == 2
    return str(capsys.readouterr().err)
