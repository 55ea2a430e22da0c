"""Fuzz: peer frames, before authentication (the handshake) and after (frames on an
authenticated channel, decoded and handed to a worker's real peer handler).

Outcomes: a refused peer (counted in ``channels.REJECTED``, the handler never runs), a
``ProtocolError``/``ChannelClosed`` that closes only that channel, or messages the worker
serves — never another exception, a failed background task or a hang.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import struct
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sfaas.errors import ChannelClosed
from sfaas.runtime import channels, wire

from .budget import fuzz
from .harness import SECRET, FakeChannel, bare_worker, frames_of, message_of, raw_message_lists
from .outcomes import Outcomes
from .strategies import deep_msgpack, hostile, mutated, packed

PEER_CLASSES = [wire.Hello, wire.Call, wire.Result]
ALL_CLASSES = sorted(set(wire._TAGS.values()), key=lambda c: c.TAG)


def frame_payloads(classes: list[type[wire.Message]]) -> st.SearchStrategy[bytes]:
    return hostile(frames_of(classes), packed(raw_message_lists(classes)), deep_msgpack(),
                   packed(raw_message_lists(classes)))


def decoder_payloads(classes: list[type[wire.Message]]) -> st.SearchStrategy[bytes]:
    """:func:`frame_payloads`, and inputs made to die at each stage of the decoder (a new
    message moves the seeded sample: its stages are reached by construction)."""
    not_a_list = st.one_of(st.integers(-(1 << 63), (1 << 64) - 1), st.text(max_size=8),
                           st.dictionaries(st.text(max_size=4), st.integers(0, 9), max_size=3)).map(
        lambda v: msgpack.packb(v, use_bin_type=True))
    # a message whose every field is a map (wrong type), and one without its fields
    wrong_types = st.sampled_from(classes).map(lambda c: msgpack.packb(
        [[c.TAG, *[{"x": 1}] * len(dataclasses.fields(c))]]))
    short = st.sampled_from(classes).map(lambda c: msgpack.packb([[c.TAG]]))
    not_a_message = st.sampled_from([[[]], [["x", 1]], [5], [[None]]]).map(msgpack.packb)
    # (and valid frames as they are: a steady share reaches the end of the decoder whatever
    # the seed — mutations alone left it at 4-5 %, at the spread's edge)
    return st.one_of(frames_of(classes), frame_payloads(classes), not_a_list, wrong_types, short,
                     not_a_message)


@pytest.mark.spread(accepted=["decoded"],
                    min_accepted=0.05,
                    stages=["not valid msgpack", "frame must be a list", "message must be", "needs N fields", "has the wrong type or shape"])
@fuzz(share=0.3)
@given(payload=decoder_payloads(ALL_CLASSES))
def test_decode_frame_returns_messages_or_a_protocol_error(payload: bytes, outcomes: Outcomes) -> None:
    try:
        msgs = wire.decode_frame(payload)
    except wire.ProtocolError as exc:
        str(exc)
        outcomes.error(exc)
        return
    outcomes.add("decoded")
    # what decodes is well-typed: it survives a round trip unchanged
    assert wire.encode_frame(wire.decode_frame(wire.encode_frame(msgs))) == wire.encode_frame(msgs)  # (NaN != NaN)


class _Transport:
    """What a channel asks of its writer's transport: nothing is ever left unsent."""

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class _Writer:
    """The server side's writer: records what the server wrote; ``on_write`` may answer."""

    def __init__(self, on_write: Any = None) -> None:
        self.data = bytearray()
        self.on_write = on_write
        self.closed = False
        self.transport = _Transport()

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 4242) if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.data += data
        if self.on_write is not None:
            self.on_write(bytes(self.data))

    async def drain(self) -> None:
        await asyncio.sleep(0)

    def close(self) -> None:
        self.closed = True


def _answer(secret: bytes, server_hello: bytes, nc: bytes) -> bytes:
    ns = server_hello[len(channels.MAGIC):len(channels.MAGIC) + 16]
    return nc + hmac.new(secret, b"c" + ns + nc, hashlib.sha256).digest()


@st.composite
def handshakes(draw: st.DrawFn) -> tuple[str, Any]:
    """Garbage instead of the answer, or the right answer mutated, or a wrong secret's."""
    kind = draw(st.sampled_from(["garbage", "mutated", "wrong-secret", "right"]))
    if kind == "garbage":
        return kind, draw(st.binary(max_size=100))
    nc = draw(st.binary(min_size=16, max_size=16))
    secret = b"not-the-secret" if kind == "wrong-secret" else SECRET.encode()
    mutation = draw(mutated(st.just(b"\0" * 48))) if kind == "mutated" else None
    return kind, (secret, nc, mutation)


@pytest.mark.spread(accepted=["authenticated"], min_accepted=0.1, each=["refused"])
@fuzz(share=0.3)
@given(case=handshakes(), after=st.binary(max_size=64))
async def test_handshake_refuses_every_peer_without_the_secret(case: tuple[str, Any], after: bytes,
                                                               outcomes: Outcomes) -> None:
    kind, spec = case
    reader = asyncio.StreamReader()
    ran: list[channels.Channel] = []

    async def handler(chan: channels.Channel) -> None:
        ran.append(chan)

    fed = bytearray()  # everything the peer sent, in order
    hello = bytearray()  # the server's hello, whose nonce the answer must cover

    def on_write(written: bytes) -> None:
        if len(written) != len(channels.MAGIC) + 16 or reader.at_eof():
            return
        hello[:] = written
        if kind == "garbage":
            fed.extend(spec)
        else:
            secret, nc, mutation = spec
            answer = _answer(secret, written, nc)
            if mutation is not None:  # the mutation's flips, applied to the right answer
                answer = bytes(a ^ b for a, b in zip(answer, mutation.ljust(48, b"\0"), strict=False)) + mutation[48:]
                answer = answer[:len(mutation)] if len(mutation) < 48 else answer
            fed.extend(answer)
        fed.extend(after)
        reader.feed_data(bytes(fed))
        reader.feed_eof()

    writer = _Writer(on_write)
    before = channels.REJECTED["unauthenticated"]
    await asyncio.wait_for(channels.accept(reader, writer, SECRET.encode(), handler), 10)  # type: ignore[arg-type]
    refused = channels.REJECTED["unauthenticated"] - before
    # The exact oracle: the server reads 48 bytes (a nonce and the MAC over both nonces);
    # whatever produced them (a truncated mutation may be completed by the bytes after it),
    # the peer is in exactly when they are the right answer under the cluster secret.
    right = len(fed) >= 48 and bytes(fed[:48]) == _answer(SECRET.encode(), bytes(hello), bytes(fed[:16]))
    if ran:
        outcomes.add("authenticated")
        assert right and refused == 0 and kind != "wrong-secret"
    else:
        outcomes.add("refused")
        assert not right and kind != "right" and refused == 1 and writer.closed


def _framed(payload: bytes, length: int | None = None) -> bytes:
    return struct.pack(">I", len(payload) if length is None else length) + payload


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    """What an authenticated peer sends: frames with honest, hostile or huge length prefixes."""
    out = b""
    for _ in range(draw(st.integers(1, 4))):
        payload = draw(st.one_of(frames_of(PEER_CLASSES), decoder_payloads(PEER_CLASSES)))
        length = draw(st.one_of(st.none(), st.none(), st.integers(0, 1 << 32 - 1),
                                st.sampled_from([channels.MAX_FRAME, channels.MAX_FRAME + 1, 0xFFFFFFFF])))
        out += _framed(payload, length)
    if draw(st.booleans()):
        out = draw(mutated(st.just(out)))
    return out


@pytest.mark.spread(accepted=["frame"],
                    min_accepted=0.02,
                    stages=["exceeds", "not valid msgpack", "message must be", "needs N fields", "has the wrong type or shape"])
@fuzz(share=0.2)
@given(data=streams())
async def test_channel_recv_yields_messages_or_a_named_error(data: bytes, outcomes: Outcomes) -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    chan = channels.Channel(reader, _Writer(), "fuzz")  # type: ignore[arg-type]
    while True:
        try:
            msgs = await asyncio.wait_for(chan.recv(), 5)
        except (wire.ProtocolError, ChannelClosed) as exc:
            outcomes.error(exc)
            return
        outcomes.add("frame")
        assert all(isinstance(m, wire.Message) for m in msgs)


async def test_an_oversized_frame_is_refused_before_its_body_arrives() -> None:
    """The length is checked before anything is read or allocated: a 4 GiB announcement
    with no body behind it fails at once (a wait for the body would time out)."""
    reader = asyncio.StreamReader()
    reader.feed_data(struct.pack(">I", 0xFFFFFFFF))
    chan = channels.Channel(reader, _Writer(), "fuzz")  # type: ignore[arg-type]
    with pytest.raises(wire.ProtocolError, match="exceeds"):
        await asyncio.wait_for(chan.recv(), 1)


def _peer_frames(draw: st.DrawFn) -> tuple[int, list[bytes]]:
    """The receiver's epoch, and a peer's frames: valid ones (calls and results to serve;
    in ``valid`` mode one call of this epoch from the channel's peer first, which the
    handler serves), possibly ending in a hostile frame, or a hostile first frame (instead
    of the Hello)."""
    epoch = draw(st.integers(0, 3))
    mode = draw(st.sampled_from(["valid", "valid", "hostile-last", "hostile-first", "impostor",
                                 "short"]))
    hello = wire.encode_frame([wire.Hello(draw(st.sampled_from([1] * 9 + [0, 2, -1])))])
    if mode == "hostile-first":
        hello = draw(st.one_of(frames_of([wire.Hello]), frame_payloads(PEER_CLASSES)))
    rest = draw(st.lists(frames_of(PEER_CLASSES), max_size=4))
    if mode == "valid":  # (random calls name another epoch almost always: one that does not)
        call = draw(message_of([wire.Call]))
        assert isinstance(call, wire.Call)
        call.epoch, call.src, call.recovery, call.fallback, call.depth = epoch, 1, 0, False, 0
        rest.insert(0, wire.encode_frame([call]))
    if mode == "hostile-last":
        rest.append(draw(frame_payloads(PEER_CLASSES)))
    if mode == "impostor":  # worker 1's channel carrying a call from another worker
        call = draw(message_of([wire.Call]))
        assert isinstance(call, wire.Call)
        call.src = draw(st.sampled_from([0, 2, 3]))
        rest.append(wire.encode_frame([call]))
    if mode == "short":  # a message missing fields
        cls = draw(st.sampled_from(PEER_CLASSES))
        rest.append(msgpack.packb([[cls.TAG, *range(draw(st.integers(0, 2)))]]))
    return epoch, [wire.encode_frame([wire.Hello(1)]) if mode in ("impostor", "short") else hello,
                   *rest]


peer_inputs = st.composite(_peer_frames)


@pytest.fixture(scope="module")
def worker_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-worker")


@pytest.mark.spread(accepted=["calls answered"],
                    min_accepted=0.04,
                    stages=["not valid msgpack", "needs N fields", "says it is worker", "sent a Call as worker"])
@fuzz(share=0.2)
@given(inputs=peer_inputs())
async def test_worker_peer_handler_serves_or_refuses(inputs: tuple[int, list[bytes]], worker_home: Path,
                                                     outcomes: Outcomes) -> None:
    epoch, frames = inputs
    w = bare_worker(str(worker_home / "w"))
    try:
        w.state.engine.begin(epoch)  # type: ignore[union-attr]
        chan = FakeChannel(frames, peer="worker-1")
        try:
            await asyncio.wait_for(w.calls.serve(chan), 10)  # type: ignore[arg-type]
            outcomes.add("handler returned")
        except (wire.ProtocolError, ChannelClosed) as exc:
            outcomes.error(exc)
        # every call the worker took on runs to its end without failing
        results = await asyncio.wait_for(asyncio.gather(*w.tasks.running, return_exceptions=True), 10)
        failed = [r for r in results if isinstance(r, BaseException)]
        assert not failed, failed
        w.calls.flush_late() if w.calls._late else None
        served = sum(isinstance(m, wire.Result) for m in w.links.channels[1].sent)
        if served:
            outcomes.add("calls answered")
    finally:
        w.state.engine.close()  # type: ignore[union-attr]


def test_strategies_reach_every_message_class() -> None:
    """(A guard on the generators: every class of the wire can come out of them.)"""
    seen = set()

    @fuzz(share=0.25)  # enough draws to meet most of the wire's classes
    @given(m=message_of(ALL_CLASSES))
    def probe(m: wire.Message) -> None:
        seen.add(type(m))
        msgpack.packb(wire.encode_frame([m]))

    probe()
    assert len(seen) >= len(ALL_CLASSES) // 2
