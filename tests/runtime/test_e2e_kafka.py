"""End to end against the real Kafka: a 2-worker cluster of examples/bank.py, its clients
on the Kafka path (requests on the ingress topic, replies on the egress topic; direct calls
are tests/runtime/test_direct_calls.py).

The cluster (coordinator + 2 worker processes, started like ``sfaas up``) lives for the
session in its own namespace, so runs never see each other's topics or state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import socket
from collections.abc import Iterator

import pytest

from launcher import cluster
from sfaas import (
    BadArguments,
    BadKey,
    Client,
    SyncClient,
    TransactionAborted,
    UnknownFunction,
)
from sfaas.errors import AuthenticationError
from sfaas.runtime import channels, wire
from sfaas.runtime.settings import Settings
from tests.namespaces import fresh_namespace

pytestmark = pytest.mark.timeout(300)

ACCOUNTS = [f"acct{i}" for i in range(30)]
START = 1000


@pytest.fixture(scope="session", params=[8, 0], ids=["leased", "coordinator-driven"])
def bank_cluster(kafka, tmp_path_factory, request) -> Iterator[Settings]:
    """The cluster with leased epochs (workers begin and commit epochs themselves,
    ``worker.protocols.lease``) and with the coordinator driving every epoch (the default)."""
    s = Settings.load({
        "kafka": kafka.kafka_bootstrap,
        "namespace": fresh_namespace(),
        "home": str(tmp_path_factory.mktemp("sfaas-home")),
        "store": "memonly",
        "partitions": 4,
        "epoch_lease": request.param,
    })
    cluster.up(s, "examples.bank:app", 2, timeout=90)
    try:
        yield dataclasses.replace(cluster.cluster_settings(s)[1], epoch_lease=s.epoch_lease)
    finally:
        procs = cluster.down(s)
        assert procs and all(not p.alive for p in cluster.ps(s))


async def test_concurrent_clients_conserve_money_with_one_reply_each(bank_cluster: Settings) -> None:
    s = bank_cluster
    async with Client("bank", settings=s, direct_calls=False) as setup:
        await asyncio.gather(*(setup.call("accounts", a, "deposit", START) for a in ACCOUNTS))

    async def one_client(seed: int) -> tuple[int, int, int]:
        rnd = random.Random(seed)
        ok = aborted = 0
        async with Client("bank", settings=s, direct_calls=False) as c:
            futs = []
            for _ in range(150):
                a, b = rnd.sample(ACCOUNTS, 2)
                futs.append(await c.submit("accounts", a, "transfer", b, rnd.randint(1, 400)))
            replies = await asyncio.wait_for(asyncio.gather(*futs), 120)
            for r in replies:
                if r.ok:
                    ok += 1
                else:
                    assert r.error_type == "Abort" and "insufficient funds" in r.reason
                    aborted += 1
            # exactly one reply each: no request id answered twice, none left waiting
            assert not c._waiting
            return ok, aborted, len(replies)

    results = await asyncio.gather(*(one_client(i) for i in range(4)))
    assert sum(n for _, _, n in results) == 600
    assert sum(ok for ok, _, _ in results) > 100

    async with Client("bank", settings=s, direct_calls=False) as c:
        balances = await asyncio.gather(*(c.call("accounts", a, "balance") for a in ACCOUNTS))
    assert sum(balances) == START * len(ACCOUNTS)
    assert min(balances) >= 0
    leased = "leased run from epoch" in (cluster.state_dir(s) / "coordinator.log").read_text()
    assert leased == (s.epoch_lease > 0), f"epoch_lease={s.epoch_lease} but the coordinator log says leased={leased}"


def test_sync_client_errors_are_clear(bank_cluster: Settings) -> None:
    from examples import bank

    with SyncClient("bank", settings=bank_cluster, direct_calls=False) as c:
        assert c.call("accounts", "solo", "deposit", 5) == 5
        with pytest.raises(TransactionAborted, match="insufficient funds"):
            c.call("accounts", "solo", "withdraw", 50)
        with pytest.raises(UnknownFunction):  # detected by the worker: the client has no App
            c.call("accounts", "solo", "nope")
        with pytest.raises(BadArguments):
            c.call("accounts", "solo", "deposit")
        with pytest.raises(BadKey):  # detected client-side
            c.call("accounts", 7, "deposit", 1)
        assert c.call("accounts", "solo", "balance") == 5
    with SyncClient(bank.app, settings=bank_cluster, direct_calls=False) as c:  # given the App: checked before sending
        with pytest.raises(UnknownFunction):
            c.call("accounts", "solo", "nope")


async def test_unauthenticated_peer_is_refused_and_cluster_keeps_working(bank_cluster: Settings) -> None:
    host, port = bank_cluster.coordinator_address()
    with pytest.raises(AuthenticationError):
        await channels.connect(host, port, "wrong-secret")
    # raw garbage too
    with socket.create_connection((host, port)) as sock:
        sock.sendall(b"\x00" * 64)
    async with Client("bank", settings=bank_cluster, direct_calls=False) as c:
        assert await c.call("accounts", "after-attack", "deposit", 1) == 1
    procs = cluster.ps(bank_cluster)
    assert [p.role for p in procs] == ["coordinator", "worker", "worker"]
    assert all(p.alive for p in procs)
    assert wire.Begin(1, 0.0).marker is None  # the snapshot seam exists on the barrier


def test_cli_ps_json_and_call(bank_cluster: Settings, monkeypatch, capsys) -> None:
    import json

    from launcher import main

    monkeypatch.setenv("SFAAS_HOME", bank_cluster.home)
    assert main(["ps", "--json", "--namespace", bank_cluster.namespace]) == 0
    procs = json.loads(capsys.readouterr().out)
    assert [p["role"] for p in procs] == ["coordinator", "worker", "worker"]
    assert all(p["alive"] and p["pid"] > 0 and ":" in p["address"] for p in procs)
    assert [(p["index"], p["restarts"], p["gave_up"]) for p in procs] == [(0, 0, ""), (0, 0, ""), (1, 0, "")]
    args = ["--namespace", bank_cluster.namespace, "--kafka", bank_cluster.kafka]
    assert main(["call", *args, "accounts", "cli-acct", "deposit", "12"]) == 0
    assert json.loads(capsys.readouterr().out) == 12
    assert main(["call", *args, "accounts", "cli-acct", "withdraw", "50"]) == 1
    assert "insufficient funds" in capsys.readouterr().err
    # a retry with the same idempotency key gets the first outcome: one deposit
    for _ in range(2):
        assert main(["call", *args, "--idempotency-key", "cli-dep-1", "accounts", "cli-acct",
                     "deposit", "5"]) == 0
        assert json.loads(capsys.readouterr().out) == 17


async def test_malformed_ingress_records_get_error_replies_and_the_cluster_keeps_serving(bank_cluster: Settings) -> None:
    """Records on the ingress topic that are not valid requests: each that names a request
    id and an existing reply partition gets a BadRequest error reply; the others are
    dropped (logged, counted); a request naming a reply partition that does not exist
    no longer stops its worker's replies. Correct requests around them are answered."""
    import msgpack

    from sfaas.errors import BadRequest, reply_error
    from sfaas.runtime.codec import MAX_ARGS

    nested: list[object] = [1]
    for _ in range(100):
        nested = [nested]
    async with Client("bank", settings=bank_cluster, direct_calls=False) as c:
        assert await c.call("accounts", "malformed-before", "deposit", 5) == 5
        part = c.reply_partition

        def bad(i: int, *fields: object) -> tuple[str, bytes]:
            rid = f"{c.client_id}-bad{i}"
            return rid, msgpack.packb([rid, *fields], use_bin_type=True)

        answered = [
            bad(0, 7, "k", "deposit", [1], part, 0.0),                         # operator not a str
            bad(1, "accounts", "k", "deposit", "not-a-list", part, 0.0),       # args not a list
            bad(2, "accounts", "k", "deposit", [nested], part, 0.0),           # nested too deep
            bad(3, "accounts", "k", "deposit", list(range(MAX_ARGS + 1)), part, 0.0),  # too many args
            bad(4, "accounts", "k", "deposit", [1], part, "yesterday"),        # sent_at not a number
            bad(5, "accounts", "k", "deposit", [1], part, 0.0, "idem", "x"),  # 9 fields
            bad(6, "accounts", "k", "deposit", [1], part, 0.0, 17),            # idempotency key not a str
        ]
        dropped = [b"\xc1garbage", msgpack.packb(42), msgpack.packb([1, 2, 3]), None,
                   msgpack.packb(["no-partition", "accounts", "k", "deposit", [1], 999, 0.0])]
        loop = asyncio.get_running_loop()
        futs = {}
        for rid, _ in answered:
            futs[rid] = c._waiting[rid] = loop.create_future()
        for i, (_, value) in enumerate(answered):
            await c._producer.send_and_wait(c.ingress, value, partition=i % c.partitions)
        for p in range(c.partitions):  # every worker sees the unanswerable ones
            for value in dropped:  # (a record with no value needs a key)
                await c._producer.send_and_wait(c.ingress, value, key=b"k", partition=p)
        replies = await asyncio.wait_for(asyncio.gather(*futs.values()), 60)
        for reply in replies:
            assert (reply.ok, reply.error_type) == (False, "BadRequest") and reply.reason, reply
            assert isinstance(reply_error(reply.error_type or "", reply.reason or ""), BadRequest)
        # the cluster goes on serving, on every partition
        keys = [f"malformed-after-{i}" for i in range(8)]
        assert await asyncio.gather(*(c.call("accounts", k, "deposit", 3) for k in keys)) == [3] * 8
        assert await c.call("accounts", "malformed-before", "balance") == 5
    procs = cluster.ps(bank_cluster)
    assert all(p.alive and not p.restarts for p in procs), procs


def test_ps_output_holds_no_secret(bank_cluster: Settings, monkeypatch, capsys) -> None:
    from launcher import main

    monkeypatch.setenv("SFAAS_HOME", bank_cluster.home)
    assert bank_cluster.secret and len(bank_cluster.secret) >= 16
    for args in (["ps"], ["ps", "--json"]):
        assert main([*args, "--namespace", bank_cluster.namespace]) == 0
        out = capsys.readouterr()
        assert bank_cluster.secret not in out.out + out.err


async def test_transfers_out_of_one_hot_account_commit_in_their_epochs(bank_cluster: Settings) -> None:
    """300 concurrent transfers out of one account into 20 others (keys of both workers):
    each conflicts with the others of its epoch, and the cross-worker fallback phase
    decides them all in that epoch — exact, and not one re-run in a later epoch."""
    from tests.runtime.test_metrics import scrape, total

    s = bank_cluster

    def counts() -> tuple[float, float]:
        samples = [scrape(p.metrics) for p in cluster.ps(s) if p.role == "worker" and p.alive]
        return (sum(total(x, "sfaas_transactions_rerun_total") for x in samples),
                sum(total(x, "sfaas_transactions_fallback_total") for x in samples))

    async with Client("bank", settings=s, direct_calls=False) as c:
        await c.call("accounts", "hot-e2e", "deposit", 300)
        reruns, fallbacks = counts()
        futs = [await c.submit("accounts", "hot-e2e", "transfer", f"dst-e2e{i % 20}", 1) for i in range(300)]
        replies = await asyncio.wait_for(asyncio.gather(*futs), 120)
        assert all(r.ok for r in replies), [r for r in replies if not r.ok][:3]
        assert sorted(r.value for r in replies) == list(range(300)), "each saw the balance the one before left"
        assert await c.call("accounts", "hot-e2e", "balance") == 0
        dst = await asyncio.gather(*(c.call("accounts", f"dst-e2e{i}", "balance") for i in range(20)))
        assert dst == [15] * 20
    await asyncio.sleep(1.5)  # the workers' counters reach /metrics with their next heartbeat
    reruns2, fallbacks2 = counts()
    assert fallbacks2 - fallbacks > 0 and reruns2 == reruns, (reruns, reruns2, fallbacks, fallbacks2)


async def test_state_reads_answer_without_a_transaction(bank_cluster: Settings, monkeypatch,
                                                        capsys) -> None:
    """``Client.get``/``scan`` and ``sfaas state get|scan`` read committed state from the
    workers between epochs; bad reads get named errors."""
    import json

    from launcher import main
    from sfaas.errors import BadArguments, UnknownOperator

    async with Client("bank", settings=bank_cluster, direct_calls=False) as c:
        for i in range(12):
            await c.call("accounts", f"reader-{i:02d}", "deposit", 10 + i)
    # straight to the owning worker (the client knows the secret and the coordinator), and
    # through Kafka (a client without them, or told not to): the same answers
    for direct in (True, False):
        async with Client("bank", settings=bank_cluster, direct_reads=direct) as c:
            assert await c.get("accounts", "reader-03") == 13
            assert await c.get("accounts", "reader-none", "absent") == "absent"
            got = await c.scan("accounts", "reader-", limit=5)
            assert got == [(f"reader-{i:02d}", 10 + i) for i in range(5)]
            assert len(await c.scan("accounts", "reader-")) == 12
            with pytest.raises(UnknownOperator):
                await c.get("nope", "x")
            with pytest.raises(BadArguments, match="limit must be an int"):
                await c.scan("accounts", limit=10**6)
            if direct:
                assert c.direct is not None
                # 2 gets, 2 scans of 4 partitions, one unknown operator
                assert (c.direct.direct, c.direct.fell_back) == (10, 0)
            else:
                assert c.direct is None
    wrong = dataclasses.replace(bank_cluster, secret="not-the-cluster-secret")
    async with Client("bank", settings=wrong) as c:  # the direct path refuses it: Kafka answers
        assert await c.get("accounts", "reader-05") == 15
        assert c.direct is not None and (c.direct.direct, c.direct.fell_back) == (0, 1)
    monkeypatch.setenv("SFAAS_HOME", bank_cluster.home)
    args = ["--namespace", bank_cluster.namespace, "--kafka", bank_cluster.kafka]
    # (the command runs its own event loop: in a thread here)
    assert await asyncio.to_thread(main, ["state", *args, "get", "accounts", "reader-04"]) == 0
    assert json.loads(capsys.readouterr().out) == 14
    assert await asyncio.to_thread(
        main, ["state", *args, "scan", "accounts", "--prefix", "reader-1", "--limit", "2"]) == 0
    assert json.loads(capsys.readouterr().out) == [["reader-10", 20], ["reader-11", 21]]
