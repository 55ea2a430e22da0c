"""Up means up (issue 48): ``launcher.cluster.up`` — ``sfaas up`` and every local cluster
of the tests — returns only once a client's call would succeed: after the coordinator's
ready file, the owner of every partition must answer a direct read (``ReadProbe``). The
probe writes nothing to Kafka; a cluster that does not answer is stopped, and the error
names the worker and partition that stayed silent."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from launcher import cluster
from sfaas.client import Client
from sfaas.errors import ClusterError
from sfaas.runtime import wire
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.protocols.membership import Peer
from sfaas.runtime.settings import Settings
from tests.runtime.test_recovery import PARTITIONS, chaos_settings, log_tails

APP = "tests.runtime.apps.ledger:app"


async def _ingress_records(s: Settings, app: str, partitions: int) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=s.kafka, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(s.topics(app)[0], p) for p in range(partitions)]
        return sum((await consumer.end_offsets(tps)).values())
    finally:
        await consumer.stop()


@pytest.mark.timeout(240)
def test_right_after_up_a_get_and_a_call_succeed_directly_and_nothing_went_through_kafka(
        kafka: Any, minio: Any, tmp_path: Path) -> None:
    s = chaos_settings(kafka, minio, tmp_path)
    cluster.up(s, APP, 2, timeout=90)
    try:
        cs = cluster.cluster_settings(s)[1]

        async def first_calls() -> tuple[Any, ...]:
            # no retry, no sleep: the first read and the first call of a fresh client
            async with Client("ledger", settings=cs, timeout=10) as c:
                before = await c.get("accounts", "up-alice")
                after_deposit = await c.call("accounts", "up-alice", "deposit", 7)
                after = await c.get("accounts", "up-alice")
                assert c.direct is not None and c.calls is not None
                return (before, after_deposit, after, c.direct.direct, c.direct.fell_back,
                        c.direct.why_not, c.calls.answered, c.calls.fell_back)

        before, deposited, after, direct, fell_back, why_not, answered, calls_fell_back = \
            asyncio.run(first_calls())
        assert (before, deposited, after) == (None, 7, 7)
        # answered by the owning workers: the cluster served when ``up`` returned (before the
        # probe, the first read came too early for the workers and went through Kafka)
        assert (direct, fell_back) == (2, 0), why_not
        assert (answered, calls_fell_back) == (1, 0)
        # neither the probe nor these wrote a request to the ingress topic
        assert asyncio.run(_ingress_records(s, "ledger", PARTITIONS)) == 0
        # `sfaas ready` (the chart's readiness probe) runs the same check, once
        ready = _sfaas_ready(cs)
        assert ready.returncode == 0, ready.stderr
        assert f"the owners of all {PARTITIONS} partitions answered" in ready.stdout
    except BaseException:
        print(log_tails(s))
        raise
    finally:
        cluster.down(s)
    gone = _sfaas_ready(cs)  # (the cluster is down: its coordinator does not answer)
    assert gone.returncode == 1 and "not ready" in gone.stderr
    assert cs.coordinator in gone.stderr, gone.stderr


def _sfaas_ready(cs: Settings) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SFAAS_SECRET": cs.secret, "SFAAS_NAMESPACE": cs.namespace}
    return subprocess.run([sys.executable, "-m", "sfaas", "ready", "--app", APP,
                           "--coordinator", cs.coordinator, "--timeout", "10"],
                          capture_output=True, text=True, env=env, timeout=60)


# -- the probe against an in-memory stand-in of the client's reads (``sfaas.reads``) ---------

class _Reads:
    """``DirectReads`` as the probe uses it: worker 0 answers every read (a missing key:
    None), worker 1 never does."""

    PEERS = [Peer("127.0.0.1", 7001), Peer("127.0.0.1", 7002)]
    made: list[_Reads] = []

    def __init__(self, settings: Settings, app: str, owners: list[int] | None = None) -> None:
        self.owners = [0, 1, 0, 1] if owners is None else owners
        self.read_keys: list[tuple[str, int, str]] = []
        self.closed = False
        self.why_not = ""
        _Reads.made.append(self)

    async def where(self, fresh: bool = False) -> wire.Placement:
        return wire.Placement(list(self.PEERS), list(self.owners))

    async def read(self, operator: str, partition: int, key: str) -> tuple[bool, Any]:
        self.read_keys.append((operator, partition, key))
        if self.owners[partition] == 1:
            await asyncio.Event().wait()  # silent
        return True, None

    async def close(self) -> None:
        self.closed = True


def _started_cluster(tmp_path: Path) -> Settings:
    """A state directory as ``up`` leaves it once the coordinator wrote its ready file (this
    process stands in for the coordinator and the supervisor: alive, never restarted)."""
    s = Settings.load({"home": str(tmp_path), "namespace": "probe"})
    sd = cluster.state_dir(s)
    sd.mkdir(parents=True)
    (sd / "cluster.json").write_text(json.dumps({"processes": [
        {"role": "coordinator", "pid": os.getpid(), "log": str(sd / "coordinator.log")}]}))
    (sd / "ready").write_text(json.dumps({"recovering": False, "workers": []}))
    return s


def test_a_silent_worker_is_named_and_the_cluster_stopped_when_up_times_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _started_cluster(tmp_path)
    stopped: list[str] = []
    monkeypatch.setattr(cluster, "down", lambda settings, timeout=15.0: stopped.append("down"))
    monkeypatch.setattr(cluster, "_signal", lambda pid, sig: stopped.append(f"signal {sig}"))
    monkeypatch.setattr(cluster, "_wait_gone", lambda procs, timeout: None)
    _Reads.made.clear()
    probe = cluster.ReadProbe(s, "ledger", "accounts", reads=_Reads)
    said: list[str] = []
    with pytest.raises(ClusterError) as err:
        cluster._await_ready(s, os.getpid(), 2.0, probe, said.append)
    message = str(err.value)
    assert "not ready after 2 s" in message, message
    # worker 0 answered partition 0; worker 1 owns partition 1 and stayed silent
    assert "worker 1 at 127.0.0.1:7002 (partition 1) did not answer within" in message, message
    assert stopped == ["signal 15", "down"], "a cluster that did not serve was left running"
    assert _Reads.made and all(r.closed for r in _Reads.made)
    assert not any(line.startswith("serving") for line in said)


def test_the_probe_reads_a_key_of_every_partition_from_its_owner() -> None:
    s = Settings.load({"namespace": "probe", "coordinator": "127.0.0.1:7000"})
    _Reads.made.clear()
    probe = cluster.ReadProbe(s, "ledger", "accounts",
                              reads=lambda settings, app: _Reads(settings, app, [0] * 8))
    assert probe.serving(5.0) and probe.lacking == "" and probe.partitions == 8
    (reads,) = _Reads.made
    assert [p for _, p, _ in reads.read_keys] == list(range(8))
    assert all(op == "accounts" and partition_of(op, key, 8) == p
               for op, p, key in reads.read_keys), reads.read_keys
    assert reads.closed


def test_the_probe_says_what_lacks_when_a_worker_turns_reads_away_or_no_placement() -> None:
    s = Settings.load({"namespace": "probe", "coordinator": "127.0.0.1:7000"})

    class TurnedAway(_Reads):
        async def read(self, operator: str, partition: int, key: str) -> tuple[bool, Any]:
            self.why_not = f"worker 0 does not serve partition {partition} now"
            return False, None

    probe = cluster.ReadProbe(s, "ledger", "accounts", reads=TurnedAway)
    assert not probe.serving(5.0)
    assert probe.lacking == ("worker 0 at 127.0.0.1:7001 (partition 0) did not answer a read: "
                             "worker 0 does not serve partition 0 now")
    probe = cluster.ReadProbe(s, "ledger", "accounts",
                              reads=lambda settings, app: _Reads(settings, app, []))
    assert not probe.serving(5.0)
    assert probe.lacking.startswith("the coordinator at 127.0.0.1:7000 has no placement yet")


def test_an_app_without_operators_is_not_probed() -> None:
    """Nothing to read: ``up`` waits for the ready file only, as before the probe."""
    def no_reads(settings: Settings, app: str) -> Any:
        raise AssertionError("the probe read an app with no operator")

    probe = cluster.ReadProbe(Settings.load({"namespace": "probe"}), "empty", None,
                              reads=no_reads)
    assert probe.serving(5.0) and probe.partitions == 0
