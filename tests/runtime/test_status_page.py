"""The coordinator's status page in a real headless Chromium (Selenium + Debian's ``chromium``
and ``chromium-driver``, which ``./run test`` installs when missing): ``sfaas status`` gives
its URL, the page shows both workers with their partitions and health, and its numbers
move under load without a reload (its script polls ``/status.json``), and its slow-request
view lists the slowest and the aborted requests of the last minute with their phases.

``SFAAS_STATUS_SCREENSHOT=some.png`` saves the page, as the test last saw it, there;
otherwise the screenshot goes to the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from tests.runtime.test_metrics import drive

#: Flags a headless Chromium needs here: no sandbox (root, containers), and nothing that
#: reaches out to the network on its own (without them it stalls on a closed network).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1100,1250")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A fresh headless Chromium driven by Selenium (its own profile directory)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        pytest.fail("the status page test needs Chromium and its driver: apt-get install chromium chromium-driver "
                    "(./run test installs them)", pytrace=False)
    opts = Options()
    opts.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(flag)
    d = webdriver.Chrome(options=opts, service=Service(driver))
    d.set_page_load_timeout(30)
    try:
        yield d
    finally:
        d.quit()


def _wait(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"the status page did not show {what} within {timeout:.0f} s")
        time.sleep(0.2)


def _card(d: Any, key: str) -> str:
    from selenium.webdriver.common.by import By

    return str(d.find_element(By.CSS_SELECTOR, f'.card[data-key="{key}"] .value').text)


def _rows(d: Any, table: str) -> list[list[str]]:
    # (read in one script: the page refills its tables every poll, and elements found in
    # one call may be gone by the next)
    rows: list[list[str]] = d.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(tr => Array.from(tr.cells).map(td => td.innerText.trim()))",
        f"table#{table} tbody tr:not(.empty)")
    return rows


@pytest.mark.timeout(240)
def test_the_status_page_shows_both_workers_and_its_numbers_move_under_load(
        observed_cluster, browser, monkeypatch, capsys, tmp_path: Path) -> None:
    s, cs = observed_cluster
    from launcher import main

    monkeypatch.setenv("SFAAS_HOME", s.home)
    capsys.readouterr()
    assert main(["status", "--no-browser", "--namespace", s.namespace]) == 0
    url = capsys.readouterr().out.strip()
    assert url == cluster.status_url(s) and url.startswith("http://127.0.0.1:") and url.endswith("/")

    # plain HTML first: the rows are there without any script
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/html")
        served = r.read().decode()
    assert served.count("<td>primary</td>") == 2 and "<table id=\"workers\"" in served

    d = browser
    d.get(url)
    assert "ledger" in d.title
    workers = _wait("two healthy workers", lambda: (rows := _rows(d, "workers")) and len(rows) == 2
                    and all(r[6] == "healthy" for r in rows) and rows)
    assert sorted((r[0], r[1], r[5]) for r in workers) == [("0", "primary", "0, 2"), ("1", "primary", "1, 3")]
    assert _card(d, "workers") == "2 of 2"

    answered = int(_card(d, "answered").replace(",", ""))
    epochs = int(_card(d, "epochs").replace(",", ""))
    res = drive(cs, rate=300, seconds=3.0)
    replies = res.committed + res.aborted
    _wait(f"at least {answered + replies} answered requests",
          lambda: int(_card(d, "answered").replace(",", "")) >= answered + replies)
    assert int(_card(d, "epochs").replace(",", "")) > epochs
    rate = _wait("a throughput", lambda: _card(d, "throughput") not in ("–", "0.0") and _card(d, "throughput"))
    assert float(rate.replace(",", "")) > 0
    assert _card(d, "p50").endswith("ms") and _card(d, "p99").endswith(("ms", " s"))
    answered_by = {r[0]: int(r[8].replace(",", "")) for r in _rows(d, "workers")}
    assert sum(answered_by.values()) >= replies and all(n > 0 for n in answered_by.values()), answered_by
    rounds = _wait("a snapshot round", lambda: _rows(d, "rounds"))
    assert int(rounds[0][0]) >= 1 and _card(d, "round").startswith("#")
    assert {r[0] for r in _wait("the operators' state", lambda: _rows(d, "stores"))} == {"accounts", "counters"}
    # the slow-request view: the slowest and the aborted requests of the load, with phases
    slow = _wait("slow and aborted requests", lambda: (rows := _rows(d, "slow"))
                 and any(r[3].startswith("Abort") for r in rows)
                 and any(r[3] == "committed" for r in rows) and rows)
    assert len(slow) <= 2 * 20  # (each worker: its 10 slowest and 10 newest aborted)
    for r in slow:
        assert r[1] in ("accounts.deposit", "accounts.transfer", "counters.bump"), r
        assert r[2] in ("0", "1") and all(c.endswith("ms") for c in r[4:9]), r
        assert float(r[4].split()[0]) >= float(r[6].split()[0]), r  # latency ≥ executed
    aborted = [r for r in slow if r[3] != "committed"]
    assert all(r[1] == "accounts.transfer" and "insufficient" in r[3] for r in aborted), aborted
    committed = [float(r[4].split()[0]) for r in slow if r[3] == "committed"]
    assert committed == sorted(committed, reverse=True)
    points = d.execute_script("return document.querySelectorAll('#chart polyline')[0].getAttribute('points')")
    assert len(points.split()) >= 2, points

    data = json.loads(urllib.request.urlopen(url + "status.json", timeout=10).read())
    assert data["raw"]["answered"] >= answered + replies
    assert not any(secret in json.dumps(data) for secret in (cs.secret, s.minio_secret_key))
    shot = Path(os.environ.get("SFAAS_STATUS_SCREENSHOT") or tmp_path / "status.png")
    d.execute_script("window.scrollTo(0, 0)")
    assert d.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_text_from_the_network_is_escaped_in_the_page() -> None:
    from coordinator.status import _table

    html = _table({"id": "workers", "title": "Workers", "empty": "none", "columns": ["name"],
                   "rows": [['<script>alert("x")</script>']]})
    assert "<script>" not in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html


def test_a_request_links_to_its_trace_when_the_jaeger_ui_is_set() -> None:
    from coordinator.slowview import SlowView
    from coordinator.status import _table
    from sfaas.runtime import wire

    view, now = SlowView(), time.time()
    row = wire.SlowRequest("r-1", "accounts.transfer", "Abort: no", now - 1, 7, 0.25, 0.1,
                           0.1, 0.03, 0.02, 1, True, 0, "ab" * 16)
    old = row._replace(rid="r-old", at=now - 120, trace_id="")
    view.heartbeat(1, wire.Heartbeat(1, 0, slow=[row, old], slow_fresh=True))
    view.heartbeat(1, wire.Heartbeat(1, 0))  # (unchanged: the view stays)
    (cells,) = view.rows(now, "http://127.0.0.1:16686/")  # (the old one is past the minute)
    assert cells[0] == ["r-1", "http://127.0.0.1:16686/trace/" + "ab" * 16]
    assert cells[1:12] == ["accounts.transfer", "1", "Abort: no", "250.0 ms", "100.0 ms",
                           "100.0 ms", "30.0 ms", "20.0 ms", "1", "yes", "0"]
    assert view.rows(now)[0][0] == "r-1"  # no UI: no link
    html = _table({"id": "slow", "title": "Slow", "empty": "none", "columns": ["request"],
                   "rows": [[cells[0]]]})
    assert f'<a href="http://127.0.0.1:16686/trace/{"ab" * 16}"' in html
