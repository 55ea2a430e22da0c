"""A compose project on free host ports: its own containers, networks and volumes, removed
afterwards (the compose suite, tests/cluster, and the failover benchmark,
benchmarks/cluster). The host reaches Kafka, the status page, the gateway and Prometheus
through the published ports; ``docker``/``docker-compose`` do the rest."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher import containers
from launcher.cluster import free_port
from launcher.procs import ServiceSettings
from sfaas.runtime.settings import Settings

__all__ = ["Compose", "compose", "wait_ready", "override", "ROOT"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Compose:
    """A running compose project: ``ports`` the host ports of the published services."""

    project: str
    files: list[Path]
    env: dict[str, str]
    ports: dict[str, int]
    secrets: dict[str, str] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        files = [a for f in self.files for a in ("-f", str(f))]
        return ["docker-compose", "-p", self.project, *files, *args]

    def run(self, *args: str, check: bool = True, timeout: float = 300) -> str:
        res = subprocess.run(self.argv(*args), env=self.env, capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} failed: {res.stderr[-3000:]}")
        return res.stdout

    def has_service(self, service: str) -> bool:
        """Whether ``service`` runs in this project (a container of it exists)."""
        return bool(self.run("ps", "-q", service, check=False).strip())

    def container(self, service: str) -> str:
        """The container id of ``service`` (its one instance)."""
        cid = self.run("ps", "-q", service).strip()
        assert cid, f"no container for service {service}"
        return cid.splitlines()[0]

    def docker(self, *args: str, check: bool = True) -> str:
        res = subprocess.run(["docker", *args], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=120)
        if check and res.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed: {res.stderr[-2000:]}")
        return res.stdout

    def network(self, name: str) -> str:
        return f"{self.project}_{name}"

    def cut(self, service: str, net: str) -> list[str]:
        """Cut ``service`` from network ``net`` (``docker network disconnect``); returns the
        ``docker`` arguments that heal the cut: reconnecting with the same address and the
        same names. A plain ``docker network connect`` would hand the container a new
        address and drop its names (the service name, the ``ctl-*`` aliases) — a fault no
        real partition has: the brokers' KRaft quorum and the JVM's DNS cache keep the old
        address, and nobody resolves the service's name again (seen: a cut broker left
        partitions without a leader for good). The HA profile's networks have configured
        subnets and fixed addresses (docker-compose.ha.yml), so the address is still free."""
        cid, network = self.container(service), self.network(net)
        info = json.loads(self.docker("inspect", "-f", "{{json .NetworkSettings.Networks}}",
                                      cid)).get(network)
        if info is None:  # (AssertionError, like a failed docker command: nothing was cut)
            raise AssertionError(f"{service} is not on {net} now (cut already?)")
        again = ["network", "connect", "--ip", info["IPAddress"]]
        for alias in info.get("Aliases") or []:
            if not cid.startswith(alias):  # (the container's short id: docker adds it)
                again += ["--alias", alias]
        self.docker("network", "disconnect", network, cid)
        return [*again, network, cid]

    def kafka(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for k, p in sorted(self.ports.items())
                        if k.startswith("SFAAS_CLUSTER_KAFKA_PORT"))

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.ports['SFAAS_CLUSTER_STATUS_PORT']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())

    def client_settings(self, **extra: object) -> Settings:
        return Settings.load({"kafka": self.kafka(), "namespace": "sfaas",
                              "replication": 3 if "," in self.kafka() else 1, **extra})

    def logs(self, chars: int = 4000, tail: int = 300) -> str:
        """The end of every service's log (``tail`` lines, at most ``chars`` characters)."""
        out = []
        for service in self.run("ps", "--services", check=False).split():
            text = self.run("logs", "--no-color", "--tail", str(tail), service, check=False)
            text = "\n".join(line for line in text.splitlines() if " aiokafka" not in line)
            out.append(f"--- {service}\n{text[-chars:]}")
        return "\n".join(out)


def wait_ready(c: Compose, workers: int, standbys: int, timeout: float = 180) -> float:
    """Wait until every slot has a ready worker and its standbys (the coordinator's
    /metrics) and a read from the host round-trips through the cluster
    (:func:`launcher.readiness.wait_serving`: up means a call succeeds); the seconds it
    took."""
    from launcher.readiness import NotServing, wait_serving

    status = f"http://127.0.0.1:{c.ports['SFAAS_CLUSTER_STATUS_PORT']}"
    gateway = (f"http://127.0.0.1:{c.ports['SFAAS_CLUSTER_GATEWAY_PORT']}"
               if c.has_service("gateway") else None)
    try:
        return wait_serving(status, c.kafka(), workers, standbys, timeout,
                            gateway=gateway).seconds
    except NotServing as e:
        raise AssertionError(f"{e}\n{c.logs()}") from None


@contextlib.contextmanager
def compose(files: Sequence[Path], *, kafka_brokers: int = 1, env: dict[str, str] | None = None,
            services: Sequence[str] = ()) -> Iterator[Compose]:
    """A compose project of ``files`` on free host ports (``services``: only these, with
    what they depend on); removed afterwards."""
    cache = ServiceSettings.from_env().cache_dir
    names = ["SFAAS_CLUSTER_STATUS_PORT", "SFAAS_CLUSTER_GATEWAY_PORT",
             "SFAAS_CLUSTER_PROMETHEUS_PORT", "SFAAS_CLUSTER_MINIO_PORT",
             "SFAAS_CLUSTER_KAFKA_PORT", "SFAAS_CLUSTER_KAFKA_PORT_2", "SFAAS_CLUSTER_KAFKA_PORT_3"]
    ports: dict[str, int] = {}
    for n in names[:5 + kafka_brokers - 1]:
        ports[n] = free_port("127.0.0.1", avoid=ports.values())
    secrets = {k: v for k, v in (line.split("=", 1) for line in
               containers.env_file(cache).read_text().splitlines() if "=" in line)}
    full_env = dict(os.environ, **secrets, **{k: str(v) for k, v in ports.items()},
                    **_subnets(), **(env or {}))  # (two projects at once: other subnets)
    c = Compose(f"sfaas-t{uuid.uuid4().hex[:8]}", list(files), full_env, ports, secrets)
    ok = False
    try:
        c.run("up", "-d", *services, timeout=600)
        yield c
        ok = True
    finally:
        if not ok:
            print(f"compose project {c.project} failed; its logs:\n{c.logs()}")
        c.run("down", "--volumes", "--remove-orphans", "-t", "5", check=False, timeout=300)


def _subnets() -> dict[str, str]:
    """Free /24s for a project's networks with fixed addresses (docker-compose.ha.yml; the
    first three octets): random in 10.128–250.x, clear of the host's routes and of every
    docker network."""
    used = subprocess.run(["ip", "-4", "route"], capture_output=True,
                          text=True).stdout if shutil.which("ip") else ""
    nets = subprocess.run(["docker", "network", "ls", "-q"], capture_output=True,
                          text=True).stdout.split()
    if nets:
        used += subprocess.run(["docker", "network", "inspect", "-f",
                                "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *nets],
                               capture_output=True, text=True).stdout
    rnd = random.SystemRandom()
    while True:
        a, b = rnd.randrange(128, 251), rnd.randrange(0, 254)
        if f"10.{a}." not in used:
            return {"SFAAS_CLUSTER_DATA_NET": f"10.{a}.{b}",
                    "SFAAS_CLUSTER_CONTROL_NET": f"10.{a}.{b + 1}"}


def override(tmp: Path, services: dict[str, dict[str, object]]) -> Path:
    """A compose override file (JSON is YAML) giving ``services`` more settings."""
    path = tmp / "override.yml"
    path.write_text(json.dumps({"services": services}, indent=1))
    return path
