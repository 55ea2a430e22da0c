"""The services' parts stay small and their wiring explicit (issue 49 item 1).

- **At most six collaborators a part.** A collaborator is another object a part keeps: an
  instance attribute assigned straight from a method parameter whose type is not a plain
  value — whether given to the constructor or later, by the method that closes a loop once
  both ends exist (``PeerCalls.reports_to``, ``Ingress.wakes``). The process's settings, its
  state (``WorkerState``, ``ClusterState``, read by every part and written only through its
  own methods: ``tests/test_state_owners.py``) and the app are not counted, nor are plain
  values and containers of them. A part past six does two jobs: split it (as the epochs
  were into ``worker/epochs.py`` and ``worker/commits.py``) or give it a port.
  ``Worker`` and ``Coordinator`` are the roots: they build and wire the parts.
- **No lambda in the wiring.** A closure hides where an event goes; the services' wiring
  (``service.py``, ``startup.py`` of both processes) hands parts only ports and bound
  methods.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("worker", "coordinator")
MAX_COLLABORATORS = 6

#: The roots: they build every part and close the loops between them.
ROOTS = {("worker/service.py", "Worker"), ("coordinator/service.py", "Coordinator")}

#: Annotation names that are values, not collaborators.
VALUES = {
    "Settings", "WorkerState", "ClusterState", "App", "str", "int", "float", "bool", "bytes",
    "None", "object", "Path", "Any", "Sequence", "list", "dict", "set", "tuple", "Mapping",
    "Iterable", "Collection", "frozenset",
}

WIRING = ("worker/service.py", "worker/startup.py", "coordinator/service.py",
          "coordinator/startup.py")


def _names(annotation: ast.expr) -> set[str]:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return {n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(annotation) if isinstance(n, (ast.Name, ast.Attribute))}


def collaborators(cls: ast.ClassDef) -> dict[str, str]:
    """Attribute → the type of the parameter it was assigned from, in any method of ``cls``."""
    found: dict[str, str] = {}
    for fn in cls.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = fn.args
        typed = {p.arg: ast.unparse(p.annotation)
                 for p in a.posonlyargs + a.args[1:] + a.kwonlyargs
                 if p.annotation is not None and _names(p.annotation) - VALUES}
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
                    and node.value.id in typed):
                continue
            for target in node.targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == "self"):
                    found[target.attr] = typed[node.value.id]
    return found


def _parts() -> list[tuple[str, ast.ClassDef]]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.ClassDef) and (rel, node.name) not in ROOTS:
                    out.append((rel, node))
    return out


def test_no_part_holds_more_than_six_collaborators() -> None:
    over = {f"{rel}:{cls.name}": sorted(c) for rel, cls in _parts()
            if len(c := collaborators(cls)) > MAX_COLLABORATORS}
    assert not over, f"parts with more than {MAX_COLLABORATORS} collaborators: {over}"


def test_the_count_sees_the_constructor_and_the_loops_closed_later() -> None:
    src = (
        "class Part:\n"
        "    def __init__(self, settings: Settings, state: WorkerState, a: A, b: 'B',\n"
        "                 c: C | None, d: Callable[[], int], *, e: E, n: int, xs: list[int]):\n"
        "        self._settings, self._state = settings, state\n"
        "        self._a = a\n        self._b = b\n        self._c = c\n        self._d = d\n"
        "        self._e = e\n        self._n = n\n        self._xs = xs\n"
        "    def wakes(self, f: F) -> None:\n"
        "        self._f = f\n"
        "    def other(self, g: G) -> None:\n"
        "        g.go()\n"
    )
    cls = ast.parse(src).body[0]
    assert isinstance(cls, ast.ClassDef)
    assert sorted(collaborators(cls)) == ["_a", "_b", "_c", "_d", "_e", "_f"]


@pytest.mark.parametrize("rel", WIRING)
def test_the_services_wiring_has_no_lambda(rel: str) -> None:
    path = ROOT / rel
    if not path.exists():
        pytest.fail(f"{rel} is gone: update WIRING to the files that wire the parts")
    lambdas = [n.lineno for n in ast.walk(ast.parse(path.read_text(), rel))
               if isinstance(n, ast.Lambda)]
    assert not lambdas, f"{rel}: lambdas in the wiring at lines {lambdas} (use a port)"
