"""The gateway is a client of the cluster: it imports ``sfaas`` only — never the services
(``worker``, ``coordinator``) nor the launchers."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.gateway.conftest import ROOT


def test_the_gateway_loads_no_service_or_launcher_code() -> None:
    probe = ("import sys, json, gateway.service, gateway.app, gateway.openapi\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('worker', 'coordinator', 'launcher'))))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_no_gateway_module_imports_a_service_or_the_launchers() -> None:
    wrong = [f"{p.relative_to(ROOT)}: {line.strip()}"
             for p in sorted((ROOT / "gateway").rglob("*.py"))
             for line in p.read_text().splitlines()
             if line.strip().startswith(("import ", "from "))
             and line.split()[1].split(".")[0] in ("worker", "coordinator", "launcher")]
    assert not wrong, wrong
