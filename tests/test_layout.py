"""The layers point one way: ``worker``, ``coordinator`` → the runtime core
(``sfaas.runtime``) → ``statestores`` → ``remotes``; ``sfaas`` itself is what apps import, and
the launchers (``launcher``: the command, local services, clusters, the demo) sit on top.

``import sfaas`` must load no launcher, worker or coordinator module (checked in a fresh
interpreter, where nothing else was imported before), and the source says the same: no
module of ``sfaas`` imports ``launcher``, ``launcher`` imports the services only inside the
commands that run them, and no package has an import cycle among its modules (imports inside
functions and under ``TYPE_CHECKING`` included: a cycle there is a part reaching back into
whatever holds it).
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
             "('sfaas', 'worker', 'coordinator', 'launcher', 'statestores', 'remotes'))))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def _launcher_or_service(modules: list[str]) -> list[str]:
    return [m for m in modules if m == "launcher" or m.startswith(("launcher.", "worker", "coordinator"))]


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
    loaded = _loaded_by("import launcher, launcher.cluster, launcher.services, launcher.supervisor, "
                        "launcher.demo, launcher.loadgen, launcher.procs, launcher.kafka_broker, "
                        "launcher.minio_server, launcher.jaeger_server")
    assert "launcher.cluster" in loaded
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
        if path.name != "__main__.py":  # ``python -m sfaas`` is the command
            wrong += [f"{path.relative_to(ROOT)}:{n} imports {m}" for n, m in _imports(path, False)
                      if m == "launcher" or m.startswith(("launcher.", *SERVICES))]
    for path in sorted((ROOT / "launcher").rglob("*.py")):
        wrong += [f"{path.relative_to(ROOT)}:{n} imports {m} at module level"
                  for n, m in _imports(path, True) if m.startswith(SERVICES)]
    for service in SERVICES:
        for path in sorted((ROOT / service).rglob("*.py")):
            wrong += [f"{path.relative_to(ROOT)}:{n} imports {m}" for n, m in _imports(path, False)
                      if m == "launcher" or m.startswith("launcher.")]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


# What each lower package may import of this repository's packages.
_BELOW = {
    "statestores": ("statestores", "remotes"),
    "remotes": ("remotes",),
}


@pytest.mark.parametrize("package", sorted(_BELOW))
def test_the_lower_floors_import_nothing_above_them(package: str) -> None:
    ours = ("sfaas", "worker", "coordinator", "launcher", "statestores", "remotes")
    wrong = [f"{path.relative_to(ROOT)}:{n} imports {m}"
             for path in sorted((ROOT / package).rglob("*.py"))
             for n, m in _imports(path, False)
             if m.split(".")[0] in ours and m.split(".")[0] not in _BELOW[package]]
    assert not wrong, "\n".join(wrong)


def test_the_runtime_core_imports_neither_the_clients_nor_the_local_runner() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{n} imports {m}"
             for path in sorted((ROOT / "sfaas" / "runtime").rglob("*.py"))
             for n, m in _imports(path, False)
             if m.startswith(("sfaas.client", "sfaas.testing"))]
    assert not wrong, "\n".join(wrong)


PACKAGES = ("sfaas", "worker", "coordinator", "launcher", "statestores", "remotes")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports anywhere in its source. ``from p import
    name`` is an edge to ``p.name`` when that is a module, else to ``p``."""
    modules = {_module_name(p): p for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        own = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = own.split(".")
                    parent = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{parent}.{base}" if base else parent
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_a_package(package: str) -> None:
    cycles = _cycles(_import_graph(package))
    assert not cycles, f"import cycles in {package}:\n" + "\n".join(" <-> ".join(c) for c in cycles)
