"""The gateway's OpenAPI document is its exact contract: schemathesis, with all its checks
and its four phases (examples, coverage, fuzzing, stateful), against a real cluster through
``sfaas gateway`` — for the gateway's test app and the example apps.

Every request goes to the gateway on 127.0.0.1 (no proxy, no redirect) and runs real
transactions, so the apps are ones whose functions take any arguments safely (the bank, the
cart, the shop with its in-memory payment provider, the test shop without its ``slow``,
which sleeps as long as it is asked to). The seed is fixed and printed
(``SFAAS_GATEWAY_CONTRACT_SEED`` replays another); the examples per operation are bounded
so one app takes well under a minute.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import APP, Gateway, app_cluster, gateway

SEED = int(os.environ.get("SFAAS_GATEWAY_CONTRACT_SEED") or 20_460_006)
#: Test cases per operation and phase: enough to cover every status an operation answers.
MAX_EXAMPLES = 12
#: A run that takes longer is stopped (and fails): a hang guard, not a speed bound (a
#: run takes 20–30 s alone; beside the gate's other lanes and a loaded machine, the shop
#: app's took over 150 s once — timing belongs in benchmarks).
RUN_TIMEOUT = 400
TOKEN = "contract-token-" + "c" * 20
SCHEMATHESIS = [sys.executable, "-m", "schemathesis.cli"]


def run_schemathesis(gw: Gateway, tmp: Path, *extra: str) -> None:
    """schemathesis against ``gw``'s ``/openapi.json``; fails showing its report unless it
    found nothing."""
    base = f"http://127.0.0.1:{gw.port}"
    cmd = [*SCHEMATHESIS, "run", f"{base}/openapi.json", "--url", base,
           "--checks", "all", "--phases", "examples,coverage,fuzzing,stateful",
           "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "1",
           "--generation-database", "none", "--request-timeout", "30", "--max-redirects", "0",
           "--no-color",
           "--header", f"Authorization: Bearer {gw.token}", *extra]
    shown = " ".join(cmd).replace(gw.token, "$TOKEN")
    print(f"schemathesis seed {SEED}: {shown}")
    t0 = time.monotonic()
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                         env={**env, "NO_PROXY": "*", "NO_COLOR": "1"})
    took = time.monotonic() - t0
    report = (out.stdout + out.stderr).replace(gw.token, "$TOKEN")
    print(f"{report}\nschemathesis took {took:.1f} s")
    assert out.returncode == 0, (
        f"schemathesis found the gateway and its document disagree (exit {out.returncode}, "
        f"seed {SEED}, replay: SFAAS_GATEWAY_CONTRACT_SEED={SEED}):\n{report[-20000:]}\n"
        f"--- gateway log:\n{gw.tail()}")
    log = gw.log.read_text()
    assert gw.token not in log and "Traceback" not in log and "internal error" not in log, log


#: The apps: every function takes any arguments safely but the test shop's ``slow``, which
#: sleeps as long as it is asked to (its 504 is by design): left out of the run.
APPS = {
    "gwshop": (APP, ("--exclude-operation-id", "misc.slow")),
    "bank": ("examples.bank:app", ()),
    "cart": ("examples.cart:app", ()),
    "shop": ("examples.shop:app", ()),
}


@pytest.mark.parametrize("name", sorted(APPS))
def test_the_gateway_keeps_its_documented_contract(name: str, kafka: Any, minio: Any,
                                                   tmp_path: Path) -> None:
    app, extra = APPS[name]
    with app_cluster(kafka, minio, tmp_path, app) as cs, \
            gateway(cs, tmp_path, token=TOKEN, app=app) as gw:
        run_schemathesis(gw, tmp_path, *extra)
