"""The Helm chart (deploy/helm/sfaas) renders what Kubernetes accepts and what sfaas runs.

No cluster runs here, so the chart is checked offline: ``helm lint``, then ``helm template``
with the default values and an HA-like set piped to ``kubeconform -strict`` against JSON
schemas made from Kubernetes' own API definitions (``scripts/helm_tools.sh`` builds the
pinned tools and the schemas; if it cannot, these tests FAIL). The rendered objects are
then read back: the worker StatefulSets, the Services the processes find each other by,
every ``SFAAS_*`` variable a real setting that loads, every command line one our CLI
parses, the credentials only ever read from a Secret, and bad values refused by
``helm template`` with a message naming the value.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import importlib.util
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.settings import GatewaySettings
from launcher.commands import _parser
from sfaas.runtime.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "sfaas"
TOOLS = ROOT / "scripts" / "helm_tools.sh"
RELEASE = "demo"

#: The first run builds helm from source (about two minutes on this machine's two cores).
pytestmark = pytest.mark.timeout(1800)

HA = ["--set", "workers=3,standbys=1,partitions=12,gateway.enabled=true,"
      "metrics.serviceMonitor.enabled=true"]
#: More environment, as a user would give it on the command line (a number, a field ref).
EXTRA = ["--set", "extraEnv[0].name=SFAAS_HEARTBEAT_TIMEOUT,extraEnv[0].value=5,"
         "extraEnv[1].name=NODE,extraEnv[1].valueFrom.fieldRef.fieldPath=spec.nodeName"]
#: Tracing on, to the chart's own Jaeger, 1 % head sampling.
TRACING = ["--set", "tracing.enabled=true,tracing.jaeger.enabled=true,"
           "tracing.sampler=parentbased_traceidratio,tracing.samplerArg=0.01,"
           "tracing.jaegerUi=http://127.0.0.1:16686"]
#: Credential variables: never a plain value in a manifest.
CREDENTIALS = {"SFAAS_SECRET", "SFAAS_MINIO_ACCESS_KEY", "SFAAS_MINIO_SECRET_KEY",
               "SFAAS_GATEWAY_TOKEN"}
KNOWN = {f"SFAAS_{f.name.upper()}" for f in dataclasses.fields(Settings)} \
    | {f"SFAAS_GATEWAY_{f.name.upper()}" for f in dataclasses.fields(GatewaySettings)}


@dataclasses.dataclass(frozen=True)
class Tools:
    helm: str
    kubeconform: str
    kube_version: str
    schema_location: str


@pytest.fixture(scope="module")
def tools() -> Tools:
    proc = subprocess.run(["bash", str(TOOLS)], capture_output=True, text=True, timeout=1700)
    if proc.returncode != 0:
        pytest.fail("scripts/helm_tools.sh could not install helm, kubeconform and the "
                    f"Kubernetes schemas (exit {proc.returncode}):\n{proc.stderr[-4000:]}",
                    pytrace=False)
    out = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return Tools(out["HELM"], out["KUBECONFORM"], out["KUBE_VERSION"],
                 out["KUBE_SCHEMA_LOCATION"])


def _template(tools: Tools, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tools.helm, "template", RELEASE, str(CHART), *args],
                          capture_output=True, text=True, timeout=120)


@functools.cache
def _render(tools: Tools, *args: str) -> str:
    """The manifests ``helm template`` renders with ``args``, once per module and set of
    values: the chart does not change under the tests, and each test parses its own copy
    (``_objects``), so none sees another's edits. (36 ``helm template`` runs a module
    before, 21 now: the rest render values of their own.)"""
    proc = _template(tools, *args)
    assert proc.returncode == 0, f"helm template {' '.join(args)} failed:\n{proc.stderr}"
    return proc.stdout


def _objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _kubeconform(tools: Tools, manifests: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tools.kubeconform, "-strict", "-summary", "-kubernetes-version", tools.kube_version,
         "-schema-location", tools.schema_location, "-"],
        input=manifests, capture_output=True, text=True, timeout=120)


def _containers(objs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """``(workload, container)`` of every pod template."""
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet"):
            for c in o["spec"]["template"]["spec"]["containers"]:
                yield o, c


def _expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of ``$(VAR)`` in a command line (``$$`` is a ``$``)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _plain_env(container: dict[str, Any], pod: str) -> dict[str, str]:
    """The container's environment, a Secret's value standing in for each secretKeyRef."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = _expand(e["value"], env)  # (as the kubelet: earlier ones only)
        elif "secretKeyRef" in e["valueFrom"]:
            env[e["name"]] = "s3cr3t-from-a-kubernetes-secret"
        elif e["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[e["name"]] = pod
    return env


def _run_command(command: list[str], args: list[str], env: dict[str, str]) -> list[str]:
    """The arguments the container's command hands to ``sfaas``: run by /bin/sh with stand-ins
    for ``sfaas`` (prints its arguments) and ``getent`` (the pod's DNS name resolves)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, body in (("sfaas", 'printf "%s\\n" "$@"'), ("getent", "exit 0")):
            (Path(tmp) / name).write_text(f"#!/bin/sh\n{body}\n")
            (Path(tmp) / name).chmod(0o755)
        proc = subprocess.run([_expand(a, env) for a in command] + args, capture_output=True,
                              text=True, timeout=30, env={**env, "PATH": f"{tmp}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def unknown_variables(objs: list[dict[str, Any]]) -> set[str]:
    """``SFAAS_*`` variables of the manifests that no setting reads."""
    return {e["name"] for _, c in _containers(objs) for e in c.get("env", [])
            if e["name"].startswith("SFAAS_") and e["name"] not in KNOWN}


# -- the tools and the schemas --------------------------------------------------------------

def test_the_chart_lints(tools: Tools) -> None:
    for args in ([], HA):
        proc = subprocess.run([tools.helm, "lint", "--strict", str(CHART), *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("values", [[], HA, HA + EXTRA, HA + TRACING],
                         ids=["default-values", "ha-values", "extra-env", "tracing"])
def test_every_rendered_object_validates_strictly(tools: Tools, values: list[str]) -> None:
    text = _render(tools, *values)
    n = len(_objects(text))
    proc = _kubeconform(tools, text)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{n} resources found" in proc.stdout
    assert f"Valid: {n}, Invalid: 0, Errors: 0, Skipped: 0" in proc.stdout, proc.stdout
    kinds = {o["kind"] for o in _objects(text)}
    assert {"Deployment", "StatefulSet", "Service", "Secret"} <= kinds
    if values:
        assert "ServiceMonitor" in kinds  # validated against its CRD's schema, not skipped


@pytest.mark.parametrize("kind,path,typo", [
    ("StatefulSet", ["spec", "template", "spec", "containers", 0], "imagePullPolcy"),
    ("Deployment", ["spec", "template", "spec"], "serviceAcountName"),
    ("Service", ["spec"], "publishNotReadyAdresses"),
    ("ServiceMonitor", ["spec", "endpoints", 0], "intervall"),
])
def test_kubeconform_rejects_a_misspelt_field(tools: Tools, kind: str, path: list[Any],
                                             typo: str) -> None:
    objs = _objects(_render(tools, *HA))
    target = next(o for o in objs if o["kind"] == kind)
    node: Any = target
    for step in path:
        node = node[step]
    node[typo] = "x"
    proc = _kubeconform(tools, yaml.safe_dump_all(objs))
    assert proc.returncode != 0
    assert f"additional properties '{typo}' not allowed" in proc.stdout, proc.stdout


def test_kubeconform_rejects_a_wrong_type_and_a_missing_required_field(tools: Tools) -> None:
    objs = _objects(_render(tools, *HA))
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    sts["spec"]["replicas"] = "3"
    del sts["spec"]["template"]["spec"]["containers"][0]["name"]
    proc = _kubeconform(tools, yaml.safe_dump_all(objs))
    assert proc.returncode != 0
    assert "at '/spec/replicas': got string, want null or integer" in proc.stdout, proc.stdout
    assert "missing property 'name'" in proc.stdout, proc.stdout


def test_the_schema_files_are_named_as_kubeconform_looks_for_them() -> None:
    spec = importlib.util.spec_from_file_location(
        "openapi2jsonschema", ROOT / "deploy" / "helm" / "openapi2jsonschema.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.kind_file("", "v1", "Service") == "service-v1.json"
    assert gen.kind_file("apps", "v1", "StatefulSet") == "statefulset-apps-v1.json"
    assert gen.kind_file("monitoring.coreos.com", "v1", "ServiceMonitor") \
        == "servicemonitor-monitoring-v1.json"


# -- what the manifests say -----------------------------------------------------------------

def test_the_workers_are_statefulsets_with_a_volume_each(tools: Tools) -> None:
    objs = _objects(_render(tools, *HA))
    headless = _one(objs, "Service", f"{RELEASE}-sfaas-workers")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    for name, replicas in (("worker", 3), ("standby", 3)):  # 3 workers × 1 standby each
        sts = _one(objs, "StatefulSet", f"{RELEASE}-sfaas-{name}")
        spec = sts["spec"]
        assert spec["replicas"] == replicas
        assert spec["serviceName"] == headless["metadata"]["name"]
        assert spec["podManagementPolicy"] == "Parallel"
        (claim,) = spec["volumeClaimTemplates"]
        assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
        labels = spec["template"]["metadata"]["labels"]
        assert headless["spec"]["selector"].items() <= labels.items()
        (c,) = spec["template"]["spec"]["containers"]
        assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in c["volumeMounts"]
        pod = f"{RELEASE}-sfaas-{name}-2"
        env = _plain_env(c, pod)
        assert env["SFAAS_HOME"] == "/data"
        assert env["SFAAS_WORKERS"] == "3" and env["SFAAS_STANDBYS"] == "1"
        args = [_expand(a, env) for a in c["args"]]
        ns = _parser().parse_args(args)
        assert ns.command == "worker"
        assert ns.host == f"{pod}.{RELEASE}-sfaas-workers"  # the pod's stable DNS name
        assert ns.name == pod and ns.port == 7701
        # the coordinator makes registrants beyond the primaries standbys: no flag needed
        assert ns.standby_of is None
        assert _run_command(c["command"], args, env) == args
    assert not [o for o in _objects(_render(tools)) if o["kind"] == "StatefulSet"
                and o["metadata"]["name"].endswith("-standby")], "standbys: 0 runs no standby"


def test_the_coordinator_is_one_pod_ready_once_a_call_would_succeed(tools: Tools) -> None:
    objs = _objects(_render(tools, *HA))
    dep = _one(objs, "Deployment", f"{RELEASE}-sfaas-coordinator")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = _plain_env(c, "coordinator-pod")
    ns = _parser().parse_args(c["args"])
    assert ns.command == "coordinator" and ns.coordinator == "0.0.0.0:7700"
    # ready = a client's call would succeed: `sfaas ready` (launcher/ready.py) reads a key
    # from every partition's owner through this coordinator
    probe = c["readinessProbe"]
    ready = _parser().parse_args(probe["exec"]["command"][1:])
    assert probe["exec"]["command"][0] == "sfaas" and ready.command == "ready"
    assert ready.coordinator == "127.0.0.1:7700" and ready.timeout == 5.0
    assert probe["timeoutSeconds"] > ready.timeout and "checkSeconds" not in probe
    assert c["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    svc = _one(objs, "Service", f"{RELEASE}-sfaas-coordinator")
    assert {p["port"] for p in svc["spec"]["ports"]} == {7700, 9400}
    assert svc["spec"]["publishNotReadyAddresses"] is True  # workers join before it is ready
    host, port = env["SFAAS_COORDINATOR"].rsplit(":", 1)
    assert host == svc["metadata"]["name"] and int(port) == 7700


def test_every_sfaas_variable_is_a_setting_and_the_settings_load(tools: Tools) -> None:
    for values in ([], HA, HA + ["--set", "existingSecret=mine,s3.secretKey=x"], HA + EXTRA):
        objs = _objects(_render(tools, *values))
        assert not unknown_variables(objs)
        for workload, c in _containers(objs):
            env = _plain_env(c, "pod-0")
            if c["name"] == "gateway":
                gw = GatewaySettings.load(env=env)
                assert gw.max_in_flight == 1000
            s = Settings.load(env=env)  # validates every value
            assert s.app == "examples.bank:app", workload["metadata"]["name"]
            assert s.shared_secret()  # beyond loopback: refused without a secret
            assert s.heartbeat_timeout == (5.0 if values[-2:] == EXTRA else Settings().heartbeat_timeout)
    # a misspelt variable is caught
    bad = [{"kind": "Deployment", "spec": {"template": {"spec": {"containers": [
        {"name": "x", "env": [{"name": "SFAAS_WORKRES", "value": "2"}]}]}}}}]
    assert unknown_variables(bad) == {"SFAAS_WORKRES"}


def test_the_gateway_serves_http_with_a_token_from_the_secret(tools: Tools) -> None:
    objs = _objects(_render(tools, *HA))
    dep = _one(objs, "Deployment", f"{RELEASE}-sfaas-gateway")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    ns = _parser().parse_args(c["args"])
    assert ns.command == "gateway" and ns.listen == "0.0.0.0:8080"
    token = next(e for e in c["env"] if e["name"] == "SFAAS_GATEWAY_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": f"{RELEASE}-sfaas-secret",
                                                 "key": "gateway-token"}
    env = _plain_env(c, "gw")
    # direct state reads (sfaas/reads.py): the coordinator's address and the secret
    assert env["SFAAS_COORDINATOR"] == f"{RELEASE}-sfaas-coordinator:7700"
    assert "SFAAS_SECRET" in env
    secret = _one(objs, "Secret", f"{RELEASE}-sfaas-secret")
    assert "gateway-token" in secret["data"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert not [o for o in _objects(_render(tools)) if "gateway" in o["metadata"]["name"]]


def test_the_service_monitor_scrapes_every_process_at_its_metrics_port(tools: Tools) -> None:
    objs = _objects(_render(tools, *HA))
    (sm,) = [o for o in objs if o["kind"] == "ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    selector = sm["spec"]["selector"]["matchLabels"]
    scraped = [o for o in objs if o["kind"] == "Service"
               and selector.items() <= o["metadata"]["labels"].items()]
    assert len(scraped) == 3  # coordinator, workers (primaries and standbys), gateway
    for svc in scraped:
        (port,) = [p for p in svc["spec"]["ports"] if p["name"] == "metrics"]
        assert port["targetPort"] == "metrics"
    for _, c in _containers(objs):  # the port named "metrics" is SFAAS_METRICS_PORT
        (port,) = [p for p in c["ports"] if p["name"] == "metrics"]
        assert str(port["containerPort"]) == _plain_env(c, "p")["SFAAS_METRICS_PORT"]


def test_tracing_is_off_by_default_and_on_sends_every_process_to_the_charts_jaeger(
        tools: Tools) -> None:
    plain = _objects(_render(tools, *HA))
    assert not [o for o in plain if "jaeger" in o["metadata"]["name"]]
    for _, c in _containers(plain):
        assert not {"SFAAS_TRACING", "OTEL_EXPORTER_OTLP_ENDPOINT"} & set(_plain_env(c, "p"))
    objs = _objects(_render(tools, *HA, *TRACING))
    dep = _one(objs, "Deployment", f"{RELEASE}-sfaas-jaeger")
    (j,) = dep["spec"]["template"]["spec"]["containers"]
    assert j["image"] == "jaegertracing/all-in-one:1.76.0"
    svc = _one(objs, "Service", f"{RELEASE}-sfaas-jaeger")
    assert {p["port"] for p in svc["spec"]["ports"]} == {16686, 4317, 4318}
    names = set()
    for workload, c in _containers(objs):
        if c["name"] == "jaeger":
            continue
        names.add(workload["metadata"]["name"])
        env = _plain_env(c, "p")
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://{RELEASE}-sfaas-jaeger:4318"
        assert (env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"]) == \
            ("parentbased_traceidratio", "0.01")
        s = Settings.load(env=env)
        assert s.tracing and s.trace_slow == 0.1 and s.jaeger_ui == "http://127.0.0.1:16686"
    assert len(names) >= 3  # the coordinator, the workers (and standbys), the gateway
    # on without anywhere to send the spans: refused, naming the values
    proc = _template(tools, "--set", "tracing.enabled=true")
    assert proc.returncode != 0 and "tracing.otlpEndpoint" in proc.stderr
    own = _objects(_render(tools, "--set", "tracing.enabled=true,"
                           "tracing.otlpEndpoint=http://collector:4318"))
    assert not [o for o in own if "jaeger" in o["metadata"]["name"]]


def test_the_install_notes_say_how_to_reach_the_cluster(tools: Tools, tmp_path: Path) -> None:
    # `helm template` leaves NOTES.txt out: render it through a copy of the chart
    chart = tmp_path / "sfaas"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "NOTES.txt").rename(chart / "NOTES.txt")
    (chart / "templates" / "notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n'
        'data: {notes: {{ tpl (.Files.Get "NOTES.txt") . | toJson }}}\n')
    proc = subprocess.run([tools.helm, "template", RELEASE, str(chart), *HA, "--show-only",
                           "templates/notes.yaml"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    notes = yaml.safe_load(proc.stdout)["data"]["notes"]
    assert f"rollout status deployment/{RELEASE}-sfaas-coordinator" in notes
    assert f"port-forward svc/{RELEASE}-sfaas-coordinator 9400" in notes
    assert "gateway-token" in notes  # how to read the generated token
    assert "no S3 secret key is set" in notes


@pytest.mark.parametrize("existing", [False, True], ids=["chart-secret", "existing-secret"])
def test_credentials_are_only_read_from_a_secret(tools: Tools, tmp_path: Path,
                                                 existing: bool) -> None:
    given = {"secret": "channel-secret-0123456789abcdef", "s3": "minio-secret-0123456789",
             "token": "gateway-token-0123456789abcdef"}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "existingSecret": "my-sfaas-credentials" if existing else "",
        "secret": {"value": given["secret"]}, "s3": {"secretKey": given["s3"]},
        "gateway": {"enabled": True, "token": given["token"]}}))
    text = _render(tools, *HA, "-f", str(values))
    objs = _objects(text)
    secrets = [o for o in objs if o["kind"] == "Secret"]
    for _, c in _containers(objs):
        for e in c.get("env", []):
            if e["name"] in CREDENTIALS:
                assert "value" not in e, f"{e['name']} is in plain text"
                assert e["valueFrom"]["secretKeyRef"]["name"] == (
                    "my-sfaas-credentials" if existing else f"{RELEASE}-sfaas-secret")
        names = {e["name"] for e in c["env"]}
        assert "SFAAS_SECRET" in names
        assert "SFAAS_MINIO_SECRET_KEY" in names or c["name"] == "gateway"
    if existing:
        assert not secrets  # the user's Secret is used as it is
        for value in given.values():
            assert value not in text
    else:
        (secret,) = secrets
        assert secret["data"]["sfaas-secret"] == base64.b64encode(given["secret"].encode()).decode()


def test_the_topic_replication_factor_reaches_every_process(tools: Tools) -> None:
    assert "SFAAS_REPLICATION" in KNOWN
    for values, expected in ([], None), (["--set", "kafka.replication=3"], "3"):
        objs = _objects(_render(tools, *values))
        for _, c in _containers(objs):
            env = _plain_env(c, "p")
            assert env.get("SFAAS_REPLICATION") == expected
            assert Settings.load(env=env).replication == int(expected or 1)


def test_the_s3_secret_key_may_come_from_a_secret_of_its_own(tools: Tools) -> None:
    objs = _objects(_render(tools, "--set", "s3.existingSecret.name=minio-tenant,"
                                            "s3.existingSecret.key=secretkey"))
    for _, c in _containers(objs):
        ref = next(e for e in c["env"] if e["name"] == "SFAAS_MINIO_SECRET_KEY")
        assert ref["valueFrom"]["secretKeyRef"] == {"name": "minio-tenant", "key": "secretkey"}


@pytest.mark.parametrize("values,named", [
    ("workers: 0\n", "workers must be a whole number >= 1"),
    ("workers: 2.5\n", "workers must be a whole number >= 1"),
    ("app:\n  module: ''\n", "app.module is required"),
    ("app:\n  module: bank\n", "app.module must be package.module:attr"),
    ("workers: 4\npartitions: 2\n", "partitions must be a whole number >= 4"),
    ("standbys: 1\nsnapshotInterval: 0\n", "snapshotInterval must be > 0"),
    ("kafka:\n  bootstrapServers: ''\n", "kafka.bootstrapServers is required"),
    ("s3:\n  endpoint: ''\n", "s3.endpoint is required"),
    ("gateway:\n  enabled: true\n  token: short\n", "gateway.token must be at least 16"),
    ("namespace: 'a b'\n", "namespace must be 1-100 letters"),
    ("kafka:\n  replication: 0\n", "kafka.replication must be a whole number >= 1"),
    ("worker:\n  persistance: {size: 1Gi}\n", "additional properties 'persistance' not allowed"),
    ("gateway:\n  maxInFlight: 0\n", "/gateway/maxInFlight"),
], ids=["no-workers", "half-a-worker", "no-app", "app-without-attr", "few-partitions",
        "standbys-without-rounds", "no-kafka", "no-s3", "short-token", "bad-namespace",
        "no-replicas", "misspelt-key", "no-gateway-requests"])
def test_bad_values_fail_naming_the_value(tools: Tools, tmp_path: Path, values: str,
                                          named: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(values)
    proc = _template(tools, "-f", str(path))
    assert proc.returncode != 0, f"helm template accepted {values!r}"
    assert named in proc.stderr, proc.stderr
