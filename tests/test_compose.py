"""docker-compose.yml and docker-compose.ha.yml stay true to the code, checked statically
(tests/cluster runs them for real) — every sfaas service's command parses with our CLI, every ``SFAAS_*``
variable is a real setting, and the settings it describes load and validate; Prometheus
scrapes exactly the sfaas services at their metrics ports, Grafana is provisioned with
that Prometheus and the dashboard, and the dashboard's queries name only metrics (and
labels) a running cluster exports."""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.settings import GatewaySettings
from launcher import cluster
from launcher.commands import _parser
from sfaas.runtime.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DASHBOARD = ROOT / "monitoring" / "grafana" / "dashboards" / "sfaas.json"


FILES = ["docker-compose.yml", "docker-compose.ha.yml"]


def _compose(file: str = "docker-compose.yml") -> dict[str, Any]:
    return yaml.safe_load((ROOT / file).read_text())  # type: ignore[no-any-return]


def _ours(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in doc["services"].items() if svc.get("build")}


def _resolve(value: object) -> str:
    """``${VAR:-default}`` → ``default`` (what compose uses when VAR is unset)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))


@pytest.mark.parametrize("file", FILES)
def test_the_compose_file_runs_a_coordinator_workers_and_standbys(file: str) -> None:
    commands = [svc["command"][0] for svc in _ours(_compose(file)).values()]
    assert commands.count("coordinator") == 1 and commands.count("worker") >= 2


@pytest.mark.parametrize(("file", "service"), [(f, s) for f in FILES for s in sorted(_ours(_compose(f)))])
def test_every_service_command_parses_with_the_cli(file: str, service: str) -> None:
    svc = _ours(_compose(file))[service]
    ns = _parser().parse_args(svc["command"])  # exits (fails the test) on an unknown flag
    assert ns.command == svc["command"][0]


@pytest.mark.parametrize("file", FILES)
def test_every_sfaas_variable_is_a_setting_and_the_settings_load(file: str) -> None:
    known = {f"SFAAS_{f.name.upper()}" for f in dataclasses.fields(Settings)} \
        | {f"SFAAS_GATEWAY_{f.name.upper()}" for f in dataclasses.fields(GatewaySettings)}
    workers = 3 if "ha" in file else 2
    for name, svc in _ours(_compose(file)).items():
        env = {k: _resolve(v) for k, v in svc["environment"].items()}
        unknown = sorted(k for k in env if k.startswith("SFAAS_") and k not in known)
        assert not unknown, f"{name}: {unknown} are not settings (known: SFAAS_ + a field of sfaas.runtime.settings.Settings)"
        s = Settings.load(env=env)  # raises ConfigError naming a bad value
        assert s.workers == workers and s.standbys == 1 and s.snapshot_interval > 0
        assert s.replication == (3 if workers == 3 else 1)
        standby_of = [svc["command"][i + 1] for i, a in enumerate(svc["command"]) if a == "--standby-of"]
        if standby_of:
            assert 0 <= int(standby_of[0]) < s.workers, f"{name} stands by for a worker that does not exist"


def _settings_of(svc: dict[str, Any]) -> Settings:
    return Settings.load(env={k: _resolve(v) for k, v in svc["environment"].items()})


def _mounts(svc: dict[str, Any]) -> dict[str, Path]:
    """A service's bind mounts: container path → the repo path mounted there (which must exist)."""
    out = {}
    for vol in svc.get("volumes", []):
        src, dst = vol.split(":")[:2]
        if src.startswith("./"):
            path = ROOT / src
            assert path.exists(), f"{vol}: {path} is not in the repository"
            out[dst] = path
    return out


def _in_container(mounts: dict[str, Path], path: str) -> Path:
    """The repo file a container sees at ``path``."""
    for dst, src in mounts.items():
        if path == dst or path.startswith(dst.rstrip("/") + "/"):
            return src / path[len(dst):].lstrip("/")
    raise AssertionError(f"{path} is not mounted from the repository ({mounts})")


@pytest.mark.parametrize("file", FILES)
def test_prometheus_scrapes_every_sfaas_process_at_its_metrics_port(file: str) -> None:
    doc = _compose(file)
    prom = doc["services"]["prometheus"]
    config = yaml.safe_load(_in_container(_mounts(prom), "/etc/prometheus/prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    expected = set()
    for name, svc in _ours(doc).items():
        port = _settings_of(svc).metrics_port
        assert port > 0, f"{name} serves no metrics (SFAAS_METRICS_PORT)"
        expected.add(f"{name}:{port}")
        cmd = svc["command"]
        if cmd[0] == "worker":  # it serves on its --host, which must be the name Prometheus scrapes
            assert cmd[cmd.index("--host") + 1] in (name, f"ctl-{name}"), \
                f"{name} listens on another host than its name"
        else:  # the status page reaches the user's browser
            assert any(_resolve(p).endswith(f":{port}:{port}") for p in svc.get("ports", [])), \
                f"{name}: the status page port is not published"
    assert targets == expected


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard() -> None:
    doc = _compose()
    graf = doc["services"]["grafana"]
    mounts = _mounts(graf)
    (ds,) = yaml.safe_load(_in_container(mounts, "/etc/grafana/provisioning/datasources/prometheus.yml")
                           .read_text())["datasources"]
    prom_port = _resolve(doc["services"]["prometheus"]["ports"][0]).split(":")[-1]  # (in-network)
    assert ds["type"] == "prometheus" and ds["url"] == f"http://prometheus:{prom_port}"
    (provider,) = yaml.safe_load(_in_container(mounts, "/etc/grafana/provisioning/dashboards/sfaas.yml")
                                 .read_text())["providers"]
    assert _in_container(mounts, provider["options"]["path"]) == DASHBOARD.parent
    assert _in_container(mounts, graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]) == DASHBOARD
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 20 and all(p["targets"] for p in panels)
    uids = {p["datasource"]["uid"] for p in panels} | {t["datasource"]["uid"] for p in panels for t in p["targets"]}
    assert uids == {ds["uid"]}


def _exported(url: str) -> dict[str, set[str]]:
    """Metric names (families and samples) of ``url`` → the labels their samples carry."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, set())
        for sample in fam.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
            out[fam.name].update(sample.labels)
    return out


def test_the_dashboard_queries_only_metrics_a_running_cluster_exports(observed_cluster) -> None:
    s, _ = observed_cluster
    exported: dict[str, set[str]] = {}
    for p in cluster.ps(s):
        for name, labels in _exported(p.metrics).items():
            exported.setdefault(name, set()).update(labels)
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\b((?:sfaas|process)_[a-z0-9_]+)\b", e)}
    assert len(used) >= 25
    assert not used - set(exported), f"the dashboard names metrics nobody exports: {sorted(used - set(exported))}"
    # the labels it groups by are labels of the metric (Prometheus adds instance and job; le is the bucket's)
    for e in exprs:
        for labels, metric in re.findall(r"by \(([\w, ]+)\) \((?:\w+\()?(\w+)", e):
            wanted = {x.strip() for x in labels.split(",")} - {"instance", "job", "le"}
            if exported[metric]:  # (a family without samples yet says nothing about its labels)
                assert wanted <= exported[metric], (e, wanted, exported[metric])


@pytest.mark.parametrize("file", FILES)
def test_jaeger_is_an_optional_service_every_process_sends_its_spans_to(file: str) -> None:
    doc = _compose(file)
    jaeger = doc["services"]["jaeger"]
    assert jaeger["profiles"] == ["tracing"]  # off unless `--profile tracing`
    assert jaeger["image"] == "jaegertracing/all-in-one:1.76.0"
    assert any(_resolve(p).endswith(":16686:16686") for p in jaeger["ports"])
    for name, svc in _ours(doc).items():
        env = {k: _resolve(v) for k, v in svc["environment"].items()}
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318", name
        assert _settings_of(svc).tracing is False  # (SFAAS_TRACING=1 turns it on)
        s = Settings.load(env={**env, "SFAAS_TRACING": "1"})
        assert s.tracing and s.trace_slow == 0.1
    if "ha" in file:  # on the network the processes reach Kafka and MinIO on
        assert jaeger["networks"] == ["data"]
