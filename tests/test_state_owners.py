"""One owner per piece of state: a process's shared state is written only by its module.

``coordinator/state.py`` says every field of the cluster state (and of a member) changes
only through its methods, so each change is made in one place. This holds it: mypy types
every expression of the package, and any assignment to an attribute of an instance of the
state's classes (``x.field = …``, ``x.field += …``, ``x.a, x.b = …``, ``x.field[k] = …``)
outside the state's module fails the test, naming the file, the line and the field.
A method called on a field (``m.ready.set()``) is not an assignment and is not counted.

The worker's ``WorkerState`` and ``Pending`` take the same check (issue 49): their fields
change only through ``worker/state.py``'s methods.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mypy import build
from mypy.modulefinder import BuildSource
from mypy.nodes import (
    AssignmentStmt,
    Expression,
    IndexExpr,
    ListExpr,
    MemberExpr,
    MypyFile,
    OperatorAssignmentStmt,
    StarExpr,
    Statement,
    TupleExpr,
)
from mypy.options import Options
from mypy.types import Instance, Type, get_proper_type

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Owned:
    """The state of ``package``: ``classes`` of module ``owner``, written only there."""

    package: str
    owner: str
    classes: tuple[str, ...]


COORDINATOR = Owned("coordinator", "coordinator.state", ("ClusterState", "Member"))
WORKER = Owned("worker", "worker.state", ("WorkerState", "Pending"))


#: where a statement holds other statements (blocks, bodies, branches, definitions)
_NESTED = ("defs", "body", "else_body", "finally_body", "handlers", "bodies", "items", "impl",
           "func")


def _statements(node: object) -> Iterator[Statement]:
    """Every statement in ``node``, nested ones included (mypy's visitors are compiled
    traits a test cannot subclass)."""
    if isinstance(node, list):
        for item in node:
            yield from _statements(item)
        return
    if isinstance(node, Statement):
        yield node
    if isinstance(node, (Statement, MypyFile)):
        for attr in _NESTED:
            child = getattr(node, attr, None)
            if isinstance(child, (list, Statement)):
                yield from _statements(child)


def _targets(e: Expression) -> Iterator[MemberExpr]:
    """The attributes an assignment to ``e`` writes (``x.f[k] = …`` writes ``x.f``)."""
    if isinstance(e, (TupleExpr, ListExpr)):
        for item in e.items:
            yield from _targets(item)
    elif isinstance(e, StarExpr):
        yield from _targets(e.expr)
    elif isinstance(e, IndexExpr) and isinstance(e.base, MemberExpr):
        yield e.base
    elif isinstance(e, MemberExpr):
        yield e


def _writes(tree: MypyFile, types: dict[Expression, Type],
            classes: set[str]) -> Iterator[tuple[int, str]]:
    """``(line, Class.field)`` of each assignment in ``tree`` to an attribute of an
    instance of ``classes`` (full names)."""
    for stmt in _statements(tree):
        if isinstance(stmt, AssignmentStmt):
            lvalues = stmt.lvalues
        elif isinstance(stmt, OperatorAssignmentStmt):
            lvalues = [stmt.lvalue]
        else:
            continue
        for lvalue in lvalues:
            for e in _targets(lvalue):
                typ = types.get(e.expr)
                owner = get_proper_type(typ) if typ is not None else None
                if isinstance(owner, Instance) and owner.type.fullname in classes:
                    yield e.line, f"{owner.type.name}.{e.name}"


def outside_writes(root: Path, owned: Owned) -> list[str]:
    """``file:line Class.field`` of every write to ``owned``'s state outside its module."""
    package = root / owned.package
    sources = [BuildSource(str(path), _module(root, path), None, str(root))
               for path in sorted(package.rglob("*.py"))]
    options = Options()
    options.export_types = True
    options.preserve_asts = True  # (else the trees are emptied once checked)
    options.incremental = False
    options.ignore_missing_imports = True
    options.follow_imports = "silent"
    options.python_version = (3, 11)
    result = build.build(sources, options)
    classes = {f"{owned.owner}.{name}" for name in owned.classes}
    out = []
    for source in sources:
        assert source.module is not None and source.path is not None
        if source.module == owned.owner:
            continue
        out += [f"{Path(source.path).relative_to(root)}:{line} {field}"
                for line, field in _writes(result.files[source.module], result.types, classes)]
    return out


def _module(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("owned", [
    pytest.param(COORDINATOR, id="coordinator"),
    pytest.param(WORKER, id="worker"),
])
def test_only_the_owner_module_writes_the_state(owned: Owned) -> None:
    writes = outside_writes(ROOT, owned)
    assert not writes, (f"{owned.owner}'s state is written outside it (add a method there "
                        "and call it):\n" + "\n".join(writes))


def test_the_check_finds_a_write_outside_the_owner(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "state.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass, field

        @dataclass
        class Cell:
            value: int = 0
            items: dict[int, int] = field(default_factory=dict)

            def bump(self) -> None:
                self.value += 1  # the owner: allowed
    """))
    (pkg / "part.py").write_text(textwrap.dedent("""
        from pkg.state import Cell

        class Other:
            value = 0

        def poke(c: Cell, o: Other, cells: list[Cell]) -> None:
            c.bump()
            c.value = 1
            c.value += 2
            o.value = 3  # another class's field of the same name: not counted
            for x in cells:
                x.value, x.items[0] = 4, 5
    """))
    found = outside_writes(tmp_path, Owned("pkg", "pkg.state", ("Cell",)))
    assert found == ["pkg/part.py:9 Cell.value", "pkg/part.py:10 Cell.value",
                     "pkg/part.py:13 Cell.value", "pkg/part.py:13 Cell.items"], found
