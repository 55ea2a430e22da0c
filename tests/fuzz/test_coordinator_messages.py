"""Fuzz: what workers send the coordinator — frames decoded and handed to its real
connection handler (``Listener.on_connection``), then its epoch barrier and the snapshot
round they may complete.

Outcomes: a ``ProtocolError`` (the frame does not decode, or a message contradicts the
membership: the worker is then treated as lost and the cluster recovers) or messages the
coordinator acts on — never another exception, a crashed epoch loop or a failed round task.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.inbox import Interrupted, Lost
from sfaas.errors import ChannelClosed
from sfaas.runtime import wire

from .budget import fuzz
from .harness import FakeChannel, bare_coordinator, frames_of, raw_message_lists
from .outcomes import Outcomes
from .strategies import deep_msgpack, hostile, packed

FROM_WORKERS = [wire.Ready, wire.Report, wire.Wakeup, wire.Heartbeat, wire.Snapshotted, wire.Recovered,
                wire.Register]
ALL = sorted(set(wire._TAGS.values()), key=lambda c: c.TAG)


def payloads() -> st.SearchStrategy[bytes]:
    return hostile(frames_of(FROM_WORKERS), packed(raw_message_lists(FROM_WORKERS)), deep_msgpack(),
                   frames_of(ALL))


@st.composite
def sessions(draw: st.DrawFn) -> list[bytes]:
    """A worker's connection: a Register (mostly for the free slot 1), then frames."""
    reg = draw(st.one_of(
        st.builds(lambda i, sb: wire.encode_frame([wire.Register("fuzz", "127.0.0.1", 9, 9, i, sb, 0)]),
                  st.sampled_from([1, 1, 1, -1, 0, 5]), st.sampled_from([-1, -1, 0, 7])),
        payloads()))
    valid = frames_of(FROM_WORKERS)
    # a well-formed beat claiming another slot than the one registered (1): the check that
    # a worker speaks only for itself is reached by construction, not by a lucky draw
    # (a new message field once shifted the seeded sample off it)
    impostor = st.builds(lambda i: wire.encode_frame([wire.Heartbeat(i, 0)]),
                         st.sampled_from([0, 2, 5]))
    rest = draw(st.lists(st.one_of(valid, valid, payloads(), impostor), max_size=5))
    return [reg, *rest]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-coordinator")


# (not a required stage: "sent Heartbeat as worker" — a beat for another slot is refused,
# but whether the session ends on that refusal or on the barrier's "a worker was lost"
# is a race, so a seeded sample may record none; tests/runtime/test_inbound.py checks it)
@pytest.mark.spread(accepted=["handler returned"],
                    min_accepted=0.03,
                    stages=["not valid msgpack", "message must be", "needs N fields", "has the wrong type or shape"])
@fuzz(share=1.0)
@given(frames=sessions())
async def test_coordinator_handles_or_refuses_worker_messages(frames: list[bytes], home: Path,
                                                              outcomes: Outcomes) -> None:
    c = bare_coordinator(str(home))
    c.rounds.on_report(wire.Snapshotted(1, 0, 3, [["kv", 0, 1, 1, 1, "memonly"]], {0: 1}, {}, {0: 0}, [], 0, ""))
    chan = FakeChannel(frames, peer="fuzz-worker")
    try:
        await asyncio.wait_for(c.listener.on_connection(chan), 10)  # type: ignore[arg-type]
        outcomes.add("handler returned")
    except (wire.ProtocolError, ChannelClosed) as exc:
        outcomes.error(exc)
    # the epoch loop's barrier takes what reached the inbox: it finishes, or is
    # interrupted by a lost worker (one is put last, so it never waits) — it never fails
    c.inbox.put_nowait(Lost())
    try:
        await asyncio.wait_for(c.barrier.wait(c.state.epoch), 10)
        outcomes.add("barrier finished")
    except Interrupted as exc:
        outcomes.error(exc)
    publishing = c.rounds._publishing
    if publishing is not None:
        await asyncio.wait_for(publishing, 10)
        outcomes.add("round published")
    await c.rounds.close()
