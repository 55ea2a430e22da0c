"""A channel whose packets vanish (a partition that drops them: no FIN, no RST) ends within
seconds on both sides, instead of after the kernel's ~15 minutes of retransmissions.

Both ends run in a network namespace of their own (``unshare -n``), where an iptables rule
drops every TCP packet on the loopback once the channel carried its first message. The
sender's unacknowledged bytes end its connection after ``channels.USER_TIMEOUT``; the
receiver, which has nothing to send, learns it from its keepalive probes going unanswered.
On the receiving side that is the end a worker serving a peer's channel reports
(``wire.PeerBroken``), so the coordinator recovers instead of waiting for the epoch for ever.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sfaas.runtime import channels

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import asyncio, json, subprocess, time
    from sfaas.errors import ChannelClosed
    from sfaas.runtime import channels, wire

    async def main():
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        first = asyncio.get_running_loop().create_future()
        ended = {}

        async def handler(ch):
            try:
                while True:
                    msgs = await ch.recv()
                    if not first.done():
                        first.set_result(msgs)
            except ChannelClosed as exc:
                ended["receiver"] = (time.monotonic(), str(exc))

        server = await channels.serve("127.0.0.1", 0, "secret", handler)
        port = server.sockets[0].getsockname()[1]
        client = await channels.connect("127.0.0.1", port, "secret")
        client.send(wire.Ready(0))
        assert [type(m).__name__ for m in await asyncio.wait_for(first, 5)] == ["Ready"]
        subprocess.run(["iptables", "-A", "INPUT", "-i", "lo", "-p", "tcp", "-j", "DROP"],
                       check=True)
        t0 = time.monotonic()
        client.send(wire.Ready(1))  # never acknowledged
        while time.monotonic() < t0 + LIMIT:
            if client.lost and "sender" not in ended:
                ended["sender"] = (time.monotonic(), "lost")
            if len(ended) == 2:
                break
            await asyncio.sleep(0.05)
        print(json.dumps({k: [round(t - t0, 2), why] for k, (t, why) in ended.items()}))

    asyncio.run(main())
""")

#: how long the script watches (the kernel's own retransmissions would take ~15 min)
LIMIT = 25.0


def test_a_channel_whose_packets_vanish_ends_on_both_sides_within_seconds() -> None:
    out = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", f"LIMIT = {LIMIT}\n" + SCRIPT],
        cwd=ROOT, capture_output=True, text=True, timeout=LIMIT + 30)
    assert out.returncode == 0, out.stderr[-3000:]
    ended = json.loads(out.stdout.strip().splitlines()[-1])
    print("ended (s after the drop began):", ended)
    assert set(ended) == {"sender", "receiver"}, ended
    bound = channels.USER_TIMEOUT + channels.KEEPALIVE_IDLE + 3 * channels.KEEPALIVE_INTERVAL
    assert ended["sender"][0] <= bound, ended
    assert ended["receiver"][0] <= bound, ended


def test_a_send_on_a_connection_reset_under_the_channel_is_dropped_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    """The peer's connection is reset (it died) before the channel learns it: a message
    queued then is dropped (the channel is ``lost``), not written into uvloop's closed
    transport — which raised in the loop's callback, logged as "Exception in callback
    Channel._flush" (the faults series, seed 4242)."""
    import asyncio
    import socket
    import struct

    import uvloop

    from sfaas.runtime import wire

    async def scenario() -> channels.Channel:
        async def handler(ch: channels.Channel) -> None:
            sock = ch._writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            ch._writer.transport.abort()  # a reset, as a killed process's

        server = await channels.serve("127.0.0.1", 0, "secret", handler)
        client = await channels.connect("127.0.0.1", server.sockets[0].getsockname()[1],
                                        "secret")
        for _ in range(200):
            if client._writer.transport.is_closing():
                break
            await asyncio.sleep(0.01)
        assert client.lost
        client.send(wire.Ready(0))
        await asyncio.sleep(0.05)  # (the flush runs)
        server.close()
        return client

    with caplog.at_level("ERROR", "asyncio"):
        client = uvloop.run(scenario())
    assert client.lost
    assert not [r for r in caplog.records if "Exception in callback" in r.getMessage()]
