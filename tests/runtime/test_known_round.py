"""A recovery starts from the round this coordinator published, without reading MinIO.

The failover benchmark (issue 48) spent 20-50 ms of each recovery's gap reading the round
index and the newest manifest back from MinIO, though the coordinator had written both.
It uses what it published (``RoundKeeper.known_latest``) — unless it cannot be sure: no
round published by this process, a publish in flight, or one that failed midway (its
blobs may be in MinIO): then it reads MinIO as before."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coordinator.inbox import Inbox
from coordinator.protocols.recovery import Recovery
from coordinator.protocols.rounds import RoundKeeper
from coordinator.state import Layout
from remotes import PathRemote
from sfaas.runtime.protocols.rounds import RoundManifest, Rounds

pytestmark = pytest.mark.usefixtures("watchdog")  # (tests/conftest.py: a hang fails fast)


def _manifest(round_id: int, epoch: int) -> RoundManifest:
    return RoundManifest(round_id, epoch, 1, 1, (), {0: 7}, {}, {}, (), 0)


class _Failing(PathRemote):
    """MinIO refusing every write of a round's index (a publish failing midway)."""

    shareable = False  # (the publish runs on a thread here, not in the background process)

    def put_blob(self, name: str, data: bytes) -> None:
        if "index" in name:
            raise OSError("MinIO refused the write")
        super().put_blob(name, data)


def _keeper(remote: PathRemote, tmp_path: Path) -> RoundKeeper:
    return RoundKeeper(0.05, 2, lambda: Layout(1, 1, ()), lambda: remote,
                       lambda op, p: PathRemote(tmp_path / "stores"))


async def test_the_keeper_knows_what_it_published_and_not_what_failed(tmp_path: Path) -> None:
    remote = PathRemote(tmp_path / "rounds")
    keeper = _keeper(remote, tmp_path)
    await keeper._load()  # (the first marker's: the published index)
    assert keeper.known_latest() is None  # (nothing published by this process)
    await keeper._publish(_manifest(4, 40))
    known = keeper.known_latest()
    assert known is not None and known.round == 4
    latest = Rounds(remote).latest()
    assert latest is not None and (latest.round, latest.epoch) == (known.round, known.epoch)
    failing = _Failing(tmp_path / "rounds")
    keeper._rounds = Rounds(failing)
    await keeper._publish(_manifest(5, 50))
    assert keeper.failed == 1 and keeper.known_latest() is None  # round 5 may be in MinIO


def test_a_recovery_takes_the_known_round_without_reading_minio() -> None:
    reached: list[int] = []
    state: Any = SimpleNamespace(reach_epoch=reached.append)

    def unreachable() -> PathRemote:
        raise AssertionError("MinIO read though the round was known")

    rec = Recovery(state, Inbox(), SimpleNamespace(), unreachable,  # type: ignore[arg-type]
                   SimpleNamespace(), lambda: _manifest(7, 700))
    latest = asyncio.run(rec._latest_round())
    assert latest is not None and latest.round == 7
    assert reached == [700]  # live epochs go on above the round's


def test_a_recovery_reads_minio_when_the_round_is_not_known(tmp_path: Path) -> None:
    remote = PathRemote(tmp_path / "rounds")
    Rounds(remote).publish(_manifest(3, 30), 2)
    reached: list[int] = []
    state: Any = SimpleNamespace(reach_epoch=reached.append)
    rec = Recovery(state, Inbox(), SimpleNamespace(), lambda: remote,  # type: ignore[arg-type]
                   SimpleNamespace(), lambda: None)
    latest = asyncio.run(rec._latest_round())
    assert latest is not None and latest.round == 3 and reached == [30]


def test_the_recover_message_carries_the_round_and_the_worker_reads_no_minio() -> None:
    """The coordinator sends the round's manifest in ``Recover``; a worker takes it from
    there instead of MinIO (a MinIO node down made that read 3 s of a recovery in the
    nemesis, seed 101). A manifest of another round is refused, naming both."""
    from sfaas.runtime import wire
    from sfaas.runtime.protocols.rounds import RoundError
    from worker.protocols.recovery import Recovery as WorkerRecovery

    sent: list[wire.Message] = []
    member: Any = SimpleNamespace(channel=SimpleNamespace(send=sent.append), alive=True)
    state: Any = SimpleNamespace(members=[member], peers=lambda: [], owners=[0])
    rec = Recovery(state, Inbox(), SimpleNamespace(), lambda: None,  # type: ignore[arg-type]
                   SimpleNamespace(), lambda: None)

    async def roll_back() -> None:
        with pytest.raises(TimeoutError):  # (no worker answers here)
            await asyncio.wait_for(rec._roll_back(3, _manifest(7, 700)), 0.05)

    asyncio.run(roll_back())
    (msg,) = sent
    assert isinstance(msg, wire.Recover) and msg.manifest is not None
    again = wire.decode_frame(wire.encode_frame([msg]))[0]  # (the bytes on the wire)
    assert isinstance(again, wire.Recover)

    def no_minio() -> Any:
        raise AssertionError("read MinIO though the Recover sent the manifest")

    worker: Any = SimpleNamespace(_rounds_kept=no_minio, _state=SimpleNamespace(partitions=1))
    got = asyncio.run(WorkerRecovery._read_round(worker, again))
    assert (got.round, got.epoch, got.ingress) == (7, 700, {0: 7})
    other = wire.Recover(3, 8, [], [0], _manifest(7, 700).encode())
    with pytest.raises(RoundError, match="names round 8 but sent the manifest of round 7"):
        asyncio.run(WorkerRecovery._read_round(worker, other))
