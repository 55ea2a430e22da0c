"""``./run cluster up`` returns only once a call from the host would succeed, and ``./run
cluster down`` stops whichever profile runs (issue 48, "Up means up") — here with Docker
and the cluster faked (``subprocess`` and the readiness probe are the seams); the real
probe runs against a real cluster in tests/cluster/test_compose_cluster.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher import containers, readiness

METRICS = """\
sfaas_coordinator_info{app="bank",namespace="sfaas"} 1.0
sfaas_worker_up{worker="0"} 1.0
sfaas_worker_up{worker="1"} 1.0
sfaas_standbys{worker="0"} 1.0
sfaas_standbys{worker="1"} 1.0
"""


class FakeDocker:
    """``docker ps`` reports the containers of ``projects``; ``docker-compose`` succeeds."""

    def __init__(self, projects: list[str]) -> None:
        self.projects = projects
        self.composed: list[list[str]] = []

    def run(self, argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        assert argv[:2] == ["docker", "ps"], argv
        project = argv[-1].rsplit("=", 1)[1]
        return subprocess.CompletedProcess(argv, 0, "abc123\n" if project in self.projects else "")

    def call(self, argv: list[str], **_: object) -> int:
        assert argv[0] == "docker-compose", argv
        self.composed.append(argv)
        return 0

    def actions(self) -> list[tuple[str, str]]:
        """(project, action) of each docker-compose run."""
        return [(argv[2], argv[argv.index("--env-file") + 2]) for argv in self.composed]


@pytest.fixture
def docker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeDocker:
    fake = FakeDocker([])
    monkeypatch.setenv("SFAAS_CACHE", str(tmp_path))
    monkeypatch.setattr(containers, "ensure_docker", lambda cache: None)
    monkeypatch.setattr(containers, "_have", lambda image: True)
    monkeypatch.setattr(containers.subprocess, "run", fake.run)
    monkeypatch.setattr(containers.subprocess, "call", fake.call)
    return fake


def test_down_without_ha_stops_the_ha_cluster_that_runs(docker: FakeDocker) -> None:
    docker.projects = ["sfaas-ha"]
    assert containers.cluster("down", None) == 0
    assert docker.actions() == [("sfaas-ha", "down")]
    docker.composed.clear()
    docker.projects = ["sfaas", "sfaas-ha"]
    assert containers.cluster("down", None) == 0
    assert docker.actions() == [("sfaas", "down"), ("sfaas-ha", "down")]
    docker.composed.clear()
    docker.projects = []  # nothing runs: the default profile, as before
    assert containers.cluster("down", None) == 0
    assert docker.actions() == [("sfaas", "down")]


def test_ps_without_ha_shows_the_profile_that_runs_and_up_refuses_the_other(
        docker: FakeDocker) -> None:
    docker.projects = ["sfaas-ha"]
    assert containers.cluster("ps", None) == 0
    assert docker.actions() == [("sfaas-ha", "ps")]
    with pytest.raises(containers.ServiceError, match="the sfaas-ha cluster is running"):
        containers.cluster("up", None)


def test_up_returns_only_once_a_call_round_trips(docker: FakeDocker,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe fails twice (Kafka not reachable from the host yet), then answers: ``up``
    returns after the third try, not right after ``docker-compose up -d``."""
    from sfaas.errors import ClusterError

    tries: list[tuple[str, str, str]] = []

    async def round_trip(kafka: str, app: str, namespace: str, timeout: float) -> str:
        tries.append((kafka, app, namespace))
        if len(tries) < 3:
            raise ClusterError("cannot reach Kafka at 127.0.0.1:9092: KafkaConnectionError")
        return "a worker answered"

    gateways: list[str] = []

    def gateway_answers(url: str) -> str | None:
        gateways.append(url)
        return None

    monkeypatch.setattr(readiness, "_metrics", lambda url: METRICS)
    monkeypatch.setattr(readiness, "round_trip", round_trip)
    monkeypatch.setattr(readiness, "_gateway_answers", gateway_answers)
    monkeypatch.setattr(readiness.time, "sleep", lambda s: None)
    monkeypatch.setenv("SFAAS_CLUSTER_KAFKA_PORT", "19092")
    assert containers.cluster("up", None) == 0
    assert docker.actions() == [("sfaas", "up")]
    assert tries == [("127.0.0.1:19092", "bank", "sfaas")] * 3
    assert gateways == ["http://127.0.0.1:8080"]  # (the gateway answers too: up means up)


def test_up_fails_when_the_cluster_never_serves(docker: FakeDocker,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(readiness, "_metrics", lambda url: METRICS.replace(
        'sfaas_worker_up{worker="1"} 1.0', 'sfaas_worker_up{worker="1"} 0.0'))
    assert containers.cluster("up", None, timeout=0.5) == 1
    err = capsys.readouterr().err
    assert "did not serve a call within 0 s (1 of 2 workers up, 2 of 2 standbys)" in err, err


def test_the_metrics_name_the_app_only_when_every_worker_and_standby_is_up() -> None:
    assert readiness.metrics_status(METRICS, 2, 1) == ("bank", "sfaas")
    assert readiness.metrics_status(METRICS, 3, 1) == "2 of 3 workers up, 2 of 3 standbys"
    assert readiness.metrics_status(METRICS.splitlines()[1], 1, 0) == \
        "1 of 1 workers up, 0 of 0 standbys"  # (no app named yet)


def test_a_gateway_that_does_not_answer_keeps_the_cluster_not_ready(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Docker's port proxy accepts a connection before the gateway listens (CI saw a broken
    pipe on the first POST): with a gateway, ready waits for its /healthz too."""
    import http.server
    import socket
    import threading

    monkeypatch.setattr(readiness, "_metrics", lambda url: METRICS)

    async def answered(*args: object) -> None:
        return None

    monkeypatch.setattr(readiness, "round_trip", answered)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(readiness.NotServing, match=f"gateway {closed}"):
        readiness.wait_serving("http://status", "kafka:9092", 2, 1, timeout=1.5, gateway=closed)

    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the handler's name)
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ready = readiness.wait_serving("http://status", "kafka:9092", 2, 1, timeout=5,
                                       gateway=f"http://127.0.0.1:{server.server_port}")
        assert ready.app == "bank"
    finally:
        server.shutdown()
