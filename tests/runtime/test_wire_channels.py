"""Codec, wire messages, authenticated channels, settings."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sfaas.errors import AuthenticationError, BadRequest, ConfigError, NotSerializable
from sfaas.runtime import channels, wire
from sfaas.runtime.codec import pack, unpack
from sfaas.runtime.partitioning import partition_of
from sfaas.runtime.settings import Settings


def test_codec_round_trips_msgpack_values_and_rejects_others() -> None:
    value = {"a": [1, 2.5, None, True, b"\x00", "é"], "n": -(2**63)}
    assert unpack(pack(value)) == value
    assert unpack(pack((1, 2))) == [1, 2]
    for bad in (object(), {1, 2}, 2**70, lambda: 0):
        with pytest.raises(NotSerializable, match="not serializable"):
            pack(bad, "state")


def test_frames_round_trip_and_garbage_is_a_protocol_error() -> None:
    msgs = [wire.Begin(3, 1.5, None), wire.Call(3, 0, 9, 77, 1.0, "op", "k", "f", [1, "x"], 0, 2),
            wire.Result(9, False, ["Abort", "no"])]
    assert wire.decode_frame(wire.encode_frame(msgs)) == msgs
    for payload in (b"\xc1", pack({"x": 1}), pack([[999, 1]]), pack([[wire.Begin.TAG, 1]])):
        with pytest.raises(wire.ProtocolError):
            wire.decode_frame(payload)
    with pytest.raises(BadRequest):
        wire.Request.decode(pack(["only", "three", "fields"]))


def test_rows_decode_typed_and_encode_the_same_given_as_lists() -> None:
    """A field of rows is a list of msgpack arrays whichever way the sender built its rows,
    and decodes into the row class; a row of the wrong shape is a protocol error."""
    typed = wire.Report(4, 1, 2, [wire.Conflict(7, 3)], [wire.Aborted(9, "Abort", "no")],
                        [0, 1], [1, 0], 0)
    plain = wire.Report(4, 1, 2, [[7, 3]], [(9, "Abort", "no")], [0, 1], [1, 0], 0)  # type: ignore[list-item]
    assert wire.encode_frame([typed]) == wire.encode_frame([plain])
    [got] = wire.decode_frame(wire.encode_frame([plain]))
    assert got == typed and isinstance(got, wire.Report)
    assert type(got.conflicts[0]) is wire.Conflict and got.conflicts[0].blocker == 3
    assert got.aborts[0].reason == "no"
    move = wire.Move(2, 3, [["h", 7, [0, 4]]], [["kv", 4, 11]])  # type: ignore[list-item]
    [m] = wire.decode_frame(wire.encode_frame([move]))
    assert isinstance(m, wire.Move)
    assert m.sources == [wire.Source("h", 7, [0, 4])] and m.seqs[0].version == 11
    for bad in ([[7]], [[7, "3"]], [[7, 3, 1]], [7, 3], [{"tid": 7}]):
        with pytest.raises(wire.ProtocolError, match="conflicts"):
            wire.decode_frame(pack([[wire.Report.TAG, 4, 1, 2, bad, [], [0], [0], 0, 0]]))


def test_partitioning_is_stable_across_processes() -> None:
    # fixed values: a change here would send requests to the wrong worker after an upgrade
    assert [partition_of("accounts", k, 8) for k in ("alice", "bob", "carol")] == [3, 6, 2]
    assert [partition_of("accounts", k, 1000) for k in ("alice", "bob", "carol")] == [163, 670, 362]
    assert len({partition_of("o", str(i), 8) for i in range(200)}) == 8


async def test_channel_auth_accepts_the_secret_and_refuses_others(caplog) -> None:
    got: list[wire.Message] = []

    async def handler(chan: channels.Channel) -> None:
        for m in await chan.recv():
            got.append(m)
            chan.send(wire.Hello(42))
        await chan.drain()

    server = await channels.serve("127.0.0.1", 0, "s3cret", handler)
    port = server.sockets[0].getsockname()[1]
    try:
        with caplog.at_level(logging.WARNING, logger="sfaas.runtime.channels"):
            with pytest.raises(AuthenticationError):
                await channels.connect("127.0.0.1", port, "wrong")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await reader.readexactly(len(channels.MAGIC) + 16)
            writer.write(b"x" * 48)  # garbage answer to the challenge
            await writer.drain()
            assert await reader.read() == b""  # disconnected
            writer.close()
            await asyncio.sleep(0.05)
        assert sum("refused unauthenticated peer" in r.getMessage() for r in caplog.records) >= 2
        # the server still serves authenticated peers
        chan = await channels.connect("127.0.0.1", port, "s3cret")
        chan.send(wire.Heartbeat(1, 5))
        assert await chan.recv() == [wire.Hello(42)]
        chan.close()
        assert got == [wire.Heartbeat(1, 5)]
    finally:
        server.close()
        await server.wait_closed()


def test_settings_from_env_and_flags_with_clear_errors() -> None:
    s = Settings.load({"workers": 3}, env={"SFAAS_PARTITIONS": "6", "SFAAS_NAMESPACE": "x"})
    assert (s.workers, s.partitions, s.namespace) == (3, 6, "x")
    assert s.topics("bank") == ("x.bank.in", "x.bank.out")
    with pytest.raises(ConfigError, match="SFAAS_PARTITIONS"):
        Settings.load(env={"SFAAS_PARTITIONS": "many"})
    with pytest.raises(ConfigError, match="partitions"):
        Settings.load({"workers": 4, "partitions": 2}, env={})
    with pytest.raises(ConfigError, match="store"):
        Settings.load({"store": "oracle"}, env={})
    assert "secret" not in repr(Settings.load({"secret": "hunter2"}, env={}))


def test_the_insecure_default_secret_is_refused_beyond_loopback() -> None:
    from coordinator.service import Coordinator

    for over in ({"host": "0.0.0.0"}, {"coordinator": "10.0.0.7:7700"}, {"host": "worker-0"},
                 {"host": "0.0.0.0", "secret": "sfaas-dev-secret-change-me"}):
        with pytest.raises(ConfigError, match="SFAAS_SECRET"):
            Coordinator(Settings.load(over, env={}), "bank")
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):  # loopback: the laptop default works
        assert Settings.load({"host": host}, env={}).shared_secret()
    assert Settings.load({"host": "0.0.0.0", "secret": "a-long-random-secret"}, env={}).shared_secret()


def test_settings_repr_and_pickles_hold_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    s = Settings.load({"secret": "cluster-S3CRET-1", "minio_access_key": "KEY-ID-77",
                       "minio_secret_key": "minio-S3CRET-2"}, env={})
    blob = pickle.dumps(s)
    for secret in ("cluster-S3CRET-1", "KEY-ID-77", "minio-S3CRET-2"):
        assert secret not in repr(s) and secret.encode() not in blob
    monkeypatch.setenv("SFAAS_SECRET", "from-the-environment")
    monkeypatch.delenv("SFAAS_MINIO_SECRET_KEY", raising=False)
    t = pickle.loads(blob)  # the receiving process completes them from its environment
    assert (t.secret, t.minio_secret_key, t.workers) == ("from-the-environment", "sfaas-local-secret", s.workers)
