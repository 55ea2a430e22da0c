"""No product code reads another object's private fields.

``x._name`` where ``x`` is not ``self``/``cls`` (nor ``super()``, which is ``self``) reaches
past the owner's methods: the owner can no longer change its inside without breaking a
stranger, and the dependency shows in no import and no signature. A part that needs
something of another declares it (a Protocol, a public method); see ``STYLE.md``.

No package has any, but for the one adapter that reaches into aiokafka (``ALLOWED``, file →
count): the counts may only shrink — the test fails if a file's count grows or a new file
appears, and says so when a file's count dropped, so the list is lowered with the fix.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sfaas", "statestores", "remotes", "worker", "coordinator", "launcher", "gateway")

#: Packages that must have no private access at all.
CLEAN = ("statestores",)

#: Names public by documentation though spelled with an underscore: ``os._exit`` (end a
#: process without cleanup, what a fenced worker must do), ``sys._current_frames`` (each
#: thread's stack: what held a stalled loop, ``launcher.stalls``) and the namedtuple API.
PUBLIC_UNDERSCORE = {("os", "_exit"), ("sys", "_current_frames")}
NAMEDTUPLE_API = {"_make", "_fields", "_replace", "_asdict", "_field_defaults"}

#: The one adapter that must reach into a library: file → count. Lower a count with its
#: fix; never raise one.
ALLOWED: dict[str, int] = {
    # aiokafka has no public call to refresh a consumer's metadata: the one adapter that
    # reaches into it (``consumer._client.force_metadata_update()``)
    "sfaas/runtime/kafka.py": 2,
}


def _offences(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, source)`` of every read of another object's private attribute in ``tree``."""
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if (
            isinstance(owner, ast.Call)
            and isinstance(owner.func, ast.Name)
            and owner.func.id == "super"
        ):
            continue
        if isinstance(owner, ast.Name) and (owner.id, name) in PUBLIC_UNDERSCORE:
            continue
        if name in NAMEDTUPLE_API:
            continue
        found.append((node.lineno, node.col_offset, ast.unparse(node)))
    return [(line, src) for line, _, src in sorted(found)]


def _scan() -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            hits = _offences(ast.parse(path.read_text(encoding="utf-8"), str(path)))
            if hits:
                out[path.relative_to(ROOT).as_posix()] = hits
    return out


def test_no_product_module_reads_another_objects_private_fields() -> None:
    found = _scan()
    clean = {f: h for f, h in found.items() if f.split("/")[0] in CLEAN}
    assert not clean, "private access in " + "; ".join(
        f"{f}:{line} {src}" for f, hits in clean.items() for line, src in hits
    )
    counts = Counter({f: len(h) for f, h in found.items() if f not in clean})
    grown = {
        f: (n, ALLOWED.get(f, 0)) for f, n in counts.items() if n > ALLOWED.get(f, 0)
    }
    assert not grown, "new private access (file: found, allowed): " + "; ".join(
        f"{f}: {n} > {a} ({', '.join(f'{line} {src}' for line, src in found[f])})"
        for f, (n, a) in grown.items()
    )
    shrunk = {f: (counts[f], a) for f, a in ALLOWED.items() if counts[f] < a}
    assert not shrunk, f"lower ALLOWED to what is left (file: found, allowed): {shrunk}"


def test_the_finder_tells_a_stranger_from_self() -> None:
    code = (
        "import os, helpers\n"
        "class A(B):\n"
        "    def f(self, other):\n"
        "        self._x; cls._y; super()._z(); other.__dict__; os._exit(0)\n"
        "        other._a; self.part._b; helpers._c(); type(self)._d\n"
    )
    assert [src for _, src in _offences(ast.parse(code))] == [
        "other._a", "self.part._b", "helpers._c", "type(self)._d",
    ]
