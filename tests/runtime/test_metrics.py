"""Prometheus metrics of a running cluster (real Kafka and MinIO, ``sfaas up``): every process
serves ``/metrics`` at the URL ``sfaas ps --json`` gives, in the exposition format
``prometheus_client`` renders, with conventional names, and the numbers move with the load:
the committed counter grows by at least the transactions a client saw commit."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from launcher import cluster
from launcher.loadgen import LoadResult, run_open_loop
from sfaas.client import Client
from sfaas.errors import ClusterError, ConfigError
from sfaas.runtime.metrics import LATENCY_BOUNDS, Buckets, HttpServer, new_registry, quantile
from sfaas.runtime.settings import Settings

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of ``url``'s exposition: ``(name, labels) → value``."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=")
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def names(samples: Samples) -> set[str]:
    return {n for n, _ in samples}


def drive(client_settings: Settings, rate: float, seconds: float) -> LoadResult:
    """Deposits (commit), transfers from empty accounts (abort: insufficient funds) and
    counter bumps (commit) at ``rate`` per second; returns once every reply is in."""
    rnd = random.Random(7)

    def request(i: int) -> tuple[str, str, str, list[object]]:
        kind = i % 3
        if kind == 0:
            return "accounts", f"a{rnd.randrange(50)}", "deposit", [1]
        if kind == 1:
            return "accounts", f"empty{rnd.randrange(50)}", "transfer", ["a0", 5]
        return "counters", f"c{rnd.randrange(20)}", "bump", []

    async def go() -> LoadResult:
        async with Client("ledger", settings=client_settings, timeout=60) as c:
            return await run_open_loop(c, request, rate, seconds, drain_timeout=60)

    res = asyncio.run(go())
    assert res.lost == 0 and res.committed and res.aborted, res.summary()
    return res


def urls(s: Settings) -> dict[str, str]:
    return {f"{p.role}-{p.index}": p.metrics for p in cluster.ps(s)}


@pytest.mark.timeout(180)
def test_every_process_serves_metrics_that_move_with_the_load(observed_cluster, monkeypatch, capsys) -> None:
    s, cs = observed_cluster
    from launcher import main

    monkeypatch.setenv("SFAAS_HOME", s.home)
    capsys.readouterr()
    assert main(["ps", "--json", "--namespace", s.namespace]) == 0
    listed = {f"{p['role']}-{p['index']}": p["metrics"] for p in json.loads(capsys.readouterr().out)}
    assert sorted(listed) == ["coordinator-0", "worker-0", "worker-1"], listed
    assert all(u.startswith("http://127.0.0.1:") and u.endswith("/metrics") for u in listed.values()), listed
    coord_url, worker_urls = listed["coordinator-0"], [listed["worker-0"], listed["worker-1"]]

    before = [scrape(u) for u in worker_urls]
    c_before = scrape(coord_url)
    res = drive(cs, rate=300, seconds=2.0)
    # the coordinator's round counter moves within a few intervals of the load, and a round
    # holds the counters' state (the first round after c_before may have been cut before the
    # load's first bump: rounds come every second here)
    deadline = time.monotonic() + 20
    while total(c := scrape(coord_url), "sfaas_snapshot_rounds_completed_total") <= \
            total(c_before, "sfaas_snapshot_rounds_completed_total") \
            or not total(c, "sfaas_operator_state_bytes", operator="counters"):
        assert time.monotonic() < deadline, "no snapshot round completed after the load"
        time.sleep(0.3)
    after = [scrape(u) for u in worker_urls]
    c_after = scrape(coord_url)

    def delta(name: str, **labels: str) -> float:
        return sum(total(a, name, **labels) - total(b, name, **labels) for a, b in zip(after, before, strict=True))

    assert delta("sfaas_transactions_committed_total") >= res.committed > 0
    assert delta("sfaas_transactions_aborted_total") >= res.aborted > 0
    assert delta("sfaas_request_latency_seconds_count") >= res.committed + res.aborted
    assert delta("sfaas_request_latency_seconds_bucket", le="+Inf") >= res.committed + res.aborted
    assert 0 < delta("sfaas_request_latency_seconds_sum") < 60 * (res.committed + res.aborted)
    assert delta("sfaas_epoch_phase_seconds_count", phase="execute") > 0
    assert delta("sfaas_epoch_phase_seconds_count", phase="commit") > 0
    assert delta("sfaas_channel_sent_bytes_total") > 0  # transfers call the other worker; heartbeats
    assert sum(total(a, "sfaas_store_keys", operator="counters") for a in after) >= 1
    assert sum(total(a, "sfaas_store_disk_bytes") for a in after) > 0
    lag = sorted(dict(ls)["partition"] for a in after for (n, ls) in a if n == "sfaas_ingress_lag_records")
    assert lag == ["0", "1", "2", "3"], lag  # each partition once, from its owner
    for a in after:
        assert {"sfaas_store_background_cpu_seconds_total", "sfaas_queue_depth", "sfaas_worker_info",
                "sfaas_transactions_rerun_total", "sfaas_transactions_fallback_total",
                "process_resident_memory_bytes"} <= names(a)

    assert total(c_after, "sfaas_epochs_total") > total(c_before, "sfaas_epochs_total")
    assert total(c_after, "sfaas_epoch_phase_seconds_count", phase="barrier") > \
        total(c_before, "sfaas_epoch_phase_seconds_count", phase="barrier")
    assert total(c_after, "sfaas_snapshot_round_seconds_count") >= 1
    assert 0 <= total(c_after, "sfaas_snapshot_last_complete_age_seconds") < 20
    assert total(c_after, "sfaas_snapshot_last_bytes") > 0
    assert total(c_after, "sfaas_operator_state_bytes", operator="counters") > 0
    assert total(c_after, "sfaas_worker_up", worker="0") == total(c_after, "sfaas_worker_up", worker="1") == 1
    assert {"sfaas_recoveries_total", "sfaas_recovery_phase_seconds_bucket", "sfaas_snapshot_rounds_failed_total",
            "sfaas_coordinator_info"} <= names(c_after)

    # Prometheus conventions: our names are sfaas_*, counters end in _total, units are base units
    for url in listed.values():
        with urllib.request.urlopen(url, timeout=10) as r:
            families = list(text_string_to_metric_families(r.read().decode()))
        for fam in families:
            if fam.name.startswith(("process_", "python_")):
                continue
            assert fam.name.startswith("sfaas_"), fam.name
            assert not any(unit in fam.name for unit in ("_ms", "millis", "_kb", "_mb")), fam.name
            if fam.type == "counter":
                assert all(x.name.endswith(("_total", "_created")) for x in fam.samples), fam.name
    assert any("commit" in n and n.endswith("_total") for n in names(after[0]))


def test_a_bad_metrics_port_is_refused_naming_the_setting(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"SFAAS_METRICS_PORT must be an integer, got 'nine'"):
        Settings.load(env={"SFAAS_METRICS_PORT": "nine"})
    with pytest.raises(ConfigError, match=r"metrics_port \(SFAAS_METRICS_PORT\) must be a TCP port 1\.\.65535.*70000"):
        Settings.load(env={"SFAAS_METRICS_PORT": "70000"})
    with pytest.raises(ClusterError, match=r"--metrics-port \(SFAAS_METRICS_PORT\) must leave room for 3 ports"):
        cluster.up(Settings.load({"home": str(tmp_path)}), "tests.runtime.apps.ledger:app", 2, metrics_port=65534)
    assert not list(tmp_path.iterdir())  # refused before anything was written


async def test_the_server_answers_get_only_and_says_which_port_is_taken() -> None:
    server = HttpServer(new_registry(), {"/hello": lambda: ("text/plain", b"hi\n")})
    port = await server.start("127.0.0.1", 0)
    try:
        def get(path: str, method: str = "GET") -> tuple[int, bytes]:
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as e:
                return e.code, e.read()

        assert await asyncio.to_thread(get, "/hello") == (200, b"hi\n")
        status, body = await asyncio.to_thread(get, "/metrics")
        assert status == 200 and b"process_cpu_seconds_total" in body
        assert (await asyncio.to_thread(get, "/nothing"))[0] == 404
        assert (await asyncio.to_thread(get, "/hello", "POST"))[0] == 405
        with socket.create_connection(("127.0.0.1", port)) as sock:  # a head beyond the bound
            sock.sendall(b"GET /" + b"x" * 20000 + b" HTTP/1.1\r\n\r\n")
            assert (await asyncio.to_thread(sock.recv, 100)).startswith(b"HTTP/1.1 431")
        other = HttpServer(new_registry())
        with pytest.raises(ClusterError, match=rf"cannot serve metrics on 127.0.0.1:{port} \(SFAAS_METRICS_PORT\)"):
            await other.start("127.0.0.1", port)
    finally:
        await server.close()


def _quantiles(values: Iterable[float]) -> tuple[float | None, float | None]:
    b = Buckets(LATENCY_BOUNDS)
    for v in values:
        b.observe(v)
    return quantile(b.bounds, b.counts, 0.5), quantile(b.bounds, b.counts, 0.99)


def test_quantiles_of_the_latency_buckets_land_in_the_right_bucket() -> None:
    assert _quantiles([]) == (None, None)
    p50, p99 = _quantiles([0.003] * 98 + [0.7, 0.8])
    assert p50 is not None and 0.0025 < p50 <= 0.005
    assert p99 is not None and 0.5 < p99 <= 1.0
    assert _quantiles([100.0]) == (30.0, 30.0)  # beyond the last bound: the last bound


def test_sfaas_status_says_why_there_is_no_page(tmp_path, monkeypatch, capsys) -> None:
    from launcher import main

    monkeypatch.setenv("SFAAS_HOME", str(tmp_path))
    assert main(["status", "--no-browser", "--namespace", "nothing"]) == 2
    assert "no local cluster in" in capsys.readouterr().err
    s = Settings.load({"home": str(tmp_path), "namespace": "quiet"})
    cluster.state_dir(s).mkdir(parents=True)
    (cluster.state_dir(s) / "cluster.json").write_text(json.dumps({"coordinator": "127.0.0.1:1", "processes": [
        {"role": "coordinator", "index": 0, "pid": 0, "log": "", "metrics": ""}]}))
    assert main(["status", "--no-browser", "--namespace", "quiet"]) == 2
    assert "runs without metrics ('sfaas up --metrics-port 0')" in capsys.readouterr().err


def test_store_metrics_count_an_lsm_store_files_per_level(tmp_path) -> None:
    """An LSM store reports its levels' file names: /metrics gives their count (a list as a
    gauge value made the whole endpoint answer 500 once a store had a run file)."""
    import statestores
    from worker.metrics import store_metrics

    db = statestores.open("lsm", tmp_path / "lsm", memtable_bytes=4096)
    try:
        for i in range(400):
            db.put(f"k{i:04}".encode(), b"v" * 64)
        db.settle()
        levels = db.stats()["files_per_level"]
        assert sum(len(names) for names in levels.values()) >= 1
        fams = {f.name: f for f in store_metrics({("acc", 0): db})}
        got = {s.labels["level"]: s.value for s in fams["sfaas_store_files"].samples}
        assert got == {lv: len(names) for lv, names in levels.items()}
    finally:
        db.close()
