"""``launcher.compose_project``: a partition heals with the container's address and names.

The docker commands are recorded by a fake (``Compose.run`` and ``Compose.docker`` are the
seam); the real thing runs in tests/cluster (the nemesis cuts and heals under load).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher import compose_project
from launcher.compose_project import Compose

CID = "3f2a9c1b7d4e8f00112233445566778899aabbccddeeff001122334455667788"


class FakeCompose(Compose):
    def __init__(self, networks: dict[str, object]) -> None:
        super().__init__("proj", [Path("docker-compose.ha.yml")], {}, {})
        self.networks = networks
        self.calls: list[tuple[str, ...]] = []

    def run(self, *args: str, check: bool = True, timeout: float = 300) -> str:
        assert args == ("ps", "-q", "worker-1")
        return CID + "\n"

    def docker(self, *args: str, check: bool = True) -> str:
        self.calls.append(args)
        if args[0] == "inspect":
            return json.dumps(self.networks)
        return ""


def test_a_cut_heals_with_the_same_address_and_every_name_but_the_short_id() -> None:
    c = FakeCompose({"proj_control": {"IPAddress": "10.213.2.41",
                                      "Aliases": ["ctl-worker-1", "worker-1", CID[:12]]},
                     "proj_data": {"IPAddress": "10.213.1.41", "Aliases": ["worker-1"]}})
    heal = c.cut("worker-1", "control")
    assert ("network", "disconnect", "proj_control", CID) in c.calls
    assert heal == ["network", "connect", "--ip", "10.213.2.41", "--alias", "ctl-worker-1",
                    "--alias", "worker-1", "proj_control", CID]


def test_cutting_a_service_that_is_not_on_the_network_cuts_nothing() -> None:
    c = FakeCompose({"proj_data": {"IPAddress": "10.213.1.41", "Aliases": ["worker-1"]}})
    with pytest.raises(AssertionError, match="worker-1 is not on control now"):
        c.cut("worker-1", "control")
    assert not [a for a in c.calls if a[:2] == ("network", "disconnect")]


def test_each_project_gets_subnets_clear_of_the_hosts_routes_and_docker_networks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    taken = {f"10.{a}." for a in range(128, 251) if a != 200}  # only 10.200.x is free

    class Done:
        def __init__(self, stdout: str) -> None:
            self.stdout = stdout

    def fake_run(argv: list[str], **_: object) -> Done:
        if argv[:2] == ["ip", "-4"]:
            return Done(" ".join(f"{t}0.0/24 dev x" for t in sorted(taken)))
        return Done("")

    monkeypatch.setattr(compose_project.subprocess, "run", fake_run)
    monkeypatch.setattr(compose_project.shutil, "which", lambda _: "/sbin/ip")
    nets = compose_project._subnets()
    assert nets["SFAAS_CLUSTER_DATA_NET"].startswith("10.200.")
    a, b, c = nets["SFAAS_CLUSTER_DATA_NET"].split(".")
    assert nets["SFAAS_CLUSTER_CONTROL_NET"] == f"{a}.{b}.{int(c) + 1}"
