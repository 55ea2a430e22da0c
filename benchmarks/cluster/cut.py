"""Cut one local process off some TCP ports (Kafka's and MinIO's), leaving it up and
connected to everything else (the coordinator, its peers): the fault "a worker cut from
Kafka and MinIO" of issue 48, on a local cluster. Needs root, ``iptables`` and a cgroup v2
hierarchy (``/sys/fs/cgroup/unified`` or ``/sys/fs/cgroup``).

Every packet of the process to or from those ports is dropped — a cut, not a refusal:
connections hang, as behind a broken switch:

- its connections already open to them (found in ``/proc``: the process's socket inodes
  in its network namespace's TCP table), by their local port, both ways (on the loopback
  both directions pass ``OUTPUT``);
- any connection it opens later: the process is moved into a cgroup of its own, and
  ``-m cgroup --path`` matches the sockets it creates from then on.

:meth:`Cut.heal` deletes the rules and moves the process back. A process that exits
meanwhile (the coordinator replaced it) leaves an empty group, removed by the heal.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

__all__ = ["Cut", "CutUnsupported", "cgroup_root", "open_connections"]

#: where cgroup v2 is mounted on this machine (hybrid hosts mount it under "unified")
_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


class CutUnsupported(RuntimeError):
    """This machine cannot cut a process off a port (not root, no iptables, no cgroup v2)."""


def cgroup_root() -> Path:
    """The cgroup v2 hierarchy's root; :class:`CutUnsupported` if there is none."""
    for root in _ROOTS:
        if (root / "cgroup.procs").exists() and (root / "cgroup.controllers").exists():
            return root
    raise CutUnsupported("no cgroup v2 hierarchy at /sys/fs/cgroup/unified or /sys/fs/cgroup")


def open_connections(pid: int, ports: Iterable[int]) -> list[tuple[int, int]]:
    """``(local port, remote port)`` of each TCP connection of ``pid`` to one of ``ports``."""
    wanted = set(ports)
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # (closed meanwhile)
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, remote, inode = int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), f[9]
            if inode in inodes and remote in wanted:
                out.append((local, remote))
    return out


class Cut:
    """Process ``pid`` cut off ``ports`` (see the module docstring) until :meth:`heal`."""

    def __init__(self, pid: int, ports: Iterable[int]) -> None:
        self.pid = pid
        self.ports = sorted(set(ports))
        self.group = cgroup_root() / f"sfaas-cut-{pid}"
        self.rules: list[list[str]] = []

    def apply(self) -> int:
        """Cut it now; the number of open connections cut (new ones are cut too)."""
        self.group.mkdir(exist_ok=True)
        (self.group / "cgroup.procs").write_text(str(self.pid))
        rel = str(self.group.relative_to(cgroup_root()))
        for port in self.ports:  # (first: a connection opened while the rest are added)
            self._add(["-m", "cgroup", "--path", rel, "-p", "tcp", "--dport", str(port)])
        conns = open_connections(self.pid, self.ports)
        for local, remote in conns:
            self._add(["-p", "tcp", "--sport", str(local), "--dport", str(remote)])
            self._add(["-p", "tcp", "--sport", str(remote), "--dport", str(local)])
        return len(conns)

    def in_effect(self) -> str | None:
        """What shows the cut holds (every rule in place, the process in its group), or None."""
        for rule in self.rules:
            if subprocess.run(["iptables", "-C", "OUTPUT", *rule, "-j", "DROP"],
                              capture_output=True).returncode != 0:
                return None
        try:
            procs = (self.group / "cgroup.procs").read_text().split()
        except OSError:
            return None
        if str(self.pid) not in procs:
            return None
        return f"pid {self.pid} cut off ports {self.ports} ({len(self.rules)} rules)"

    def heal(self) -> None:
        """Delete the rules; the process (if it still runs) back in the root group."""
        for rule in self.rules:
            subprocess.run(["iptables", "-D", "OUTPUT", *rule, "-j", "DROP"], capture_output=True)
        self.rules.clear()
        try:
            (cgroup_root() / "cgroup.procs").write_text(str(self.pid))
        except OSError:  # (gone: the group is empty)
            pass
        try:
            self.group.rmdir()
        except OSError:
            pass

    def _add(self, rule: list[str]) -> None:
        try:
            done = subprocess.run(["iptables", "-I", "OUTPUT", *rule, "-j", "DROP"],
                                  capture_output=True, text=True)
        except FileNotFoundError as exc:
            raise CutUnsupported("iptables is not installed") from exc
        if done.returncode != 0:
            raise CutUnsupported(f"iptables refused {' '.join(rule)}: {done.stderr.strip()}")
        self.rules.append(rule)
