"""The layers point one way: ``worker``, ``coordinator`` → ``sfaas`` (what apps import), and
the launchers (``sfaas.cli``: the command, local services, clusters, the demo) sit on top.

``import sfaas`` must load no launcher, worker or coordinator module (checked in a fresh
interpreter, where nothing else was imported before), and the source says the same: no
core module of ``sfaas`` imports ``sfaas.cli``, and ``sfaas.cli`` imports the services only
inside the commands that run them.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("worker", "coordinator")


def _loaded_by(code: str) -> list[str]:
    """The modules of this repo's packages a fresh interpreter holds after running ``code``."""
    probe = (f"import sys\n{code}\nimport json\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('sfaas', 'worker', 'coordinator', 'statestores', 'remotes'))))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def _launcher_or_service(modules: list[str]) -> list[str]:
    return [m for m in modules if m == "sfaas.cli" or m.startswith(("sfaas.cli.", "worker", "coordinator"))]


@pytest.mark.parametrize("code", [
    "import sfaas",
    "from sfaas import App, Context, Abort, Client, SyncClient",
    "import sfaas.testing",
], ids=["import-sfaas", "clients", "local-runner"])
def test_importing_the_sdk_loads_no_launcher_worker_or_coordinator_code(code: str) -> None:
    loaded = _loaded_by(code)
    assert "sfaas" in loaded
    assert not _launcher_or_service(loaded), f"{code!r} loaded {_launcher_or_service(loaded)}"


def test_the_launchers_load_the_services_only_when_a_command_runs_them() -> None:
    loaded = _loaded_by("import sfaas.cli, sfaas.cli.cluster, sfaas.cli.services, sfaas.cli.supervisor, "
                        "sfaas.cli.demo, sfaas.cli.loadgen, sfaas.cli.procs, sfaas.cli.kafka_broker, "
                        "sfaas.cli.minio_server")
    assert "sfaas.cli.cluster" in loaded
    assert not [m for m in loaded if m.startswith(SERVICES)], loaded


def _imports(path: Path, top_level_only: bool) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``path`` (only the module body's with
    ``top_level_only``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: list[tuple[int, str]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            out += [(node.lineno, f"{base}.{a.name}" if not node.module else base) for a in node.names]
    return out


def test_no_core_module_imports_the_launchers_and_no_launcher_imports_a_service_eagerly() -> None:
    wrong: list[str] = []
    for path in sorted((ROOT / "sfaas").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] == "cli":
            wrong += [f"{rel}:{n} imports {m} at module level" for n, m in _imports(path, True)
                      if m.startswith(SERVICES)]
        elif rel.name != "__main__.py":  # ``python -m sfaas`` is the command
            wrong += [f"{rel}:{n} imports {m}" for n, m in _imports(path, False)
                      if m == "sfaas.cli" or m.startswith(("sfaas.cli.", *SERVICES))]
    for service in SERVICES:
        for path in sorted((ROOT / service).rglob("*.py")):
            wrong += [f"{path.relative_to(ROOT)}:{n} imports {m}" for n, m in _imports(path, False)
                      if m == "sfaas.cli" or m.startswith("sfaas.cli.")]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)
