"""The cuts series' fault (benchmarks/cluster/cut.py): a process cut off a port keeps
running, its open connection to that port stalls and a new one never connects, other
processes are untouched, and the heal lets the stalled connection go on. On a listener of
this test's own (a free port), with a child process as the victim; needs root, iptables
and cgroup v2, which the project's machines and CI have."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from benchmarks.cluster.cut import Cut, CutUnsupported, cgroup_root, open_connections

pytestmark = pytest.mark.usefixtures("watchdog")

# the victim: connects, then echoes what the listener sends; on "new" from its stdin it
# tries a second connection and prints whether it connected
CHILD = r"""
import socket, sys, threading
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port))
def echo():
    while data := s.recv(100):
        s.sendall(data)
threading.Thread(target=echo, daemon=True).start()
print("connected", flush=True)
for line in sys.stdin:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        print("new connected", flush=True)
    except OSError as exc:
        print(f"new failed {type(exc).__name__}", flush=True)
"""


@pytest.fixture
def victim() -> Iterator[tuple[subprocess.Popen[str], socket.socket, int]]:
    try:
        cgroup_root()
    except CutUnsupported as exc:
        pytest.skip(f"cannot cut a process here: {exc}")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(port)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    conn, _ = server.accept()
    assert child.stdout is not None and child.stdout.readline().strip() == "connected"
    try:
        yield child, conn, port
    finally:
        child.kill()
        child.wait()
        conn.close()
        server.close()


def _echoed(conn: socket.socket, timeout: float) -> bool:
    conn.settimeout(timeout)
    conn.sendall(b"x")
    try:
        return conn.recv(10) == b"x"
    except TimeoutError:
        return False


def test_a_cut_process_stalls_on_the_port_until_healed_and_others_are_untouched(
        victim: tuple[subprocess.Popen[str], socket.socket, int]) -> None:
    child, conn, port = victim
    assert child.stdin is not None and child.stdout is not None
    assert _echoed(conn, 2.0)
    assert open_connections(child.pid, [port]) == [(conn.getpeername()[1], port)]
    cut = Cut(child.pid, [port])
    try:
        assert cut.apply() == 1
        assert cut.in_effect() is not None
        assert child.poll() is None  # up, only cut
        assert not _echoed(conn, 1.0), "the open connection still carries packets"
        child.stdin.write("new\n")
        child.stdin.flush()
        assert child.stdout.readline().startswith("new failed")
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            pass  # (this process is not cut)
    finally:
        cut.heal()
    assert cut.in_effect() is None
    assert not os.path.exists(cut.group)
    conn.settimeout(10.0)  # the stalled byte and its echo arrive with TCP's retransmission
    assert conn.recv(10) == b"x"
    child.stdin.write("new\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "new connected"


def test_a_cut_of_a_process_that_exits_heals_cleanly(
        victim: tuple[subprocess.Popen[str], socket.socket, int]) -> None:
    child, _conn, port = victim
    cut = Cut(child.pid, [port])
    cut.apply()
    child.kill()
    child.wait()
    time.sleep(0.1)
    cut.heal()
    assert cut.rules == [] and not os.path.exists(cut.group)
    rules = subprocess.run(["iptables", "-S", "OUTPUT"], capture_output=True, text=True).stdout
    assert f"sfaas-cut-{child.pid}" not in rules and f"--dport {port}" not in rules
