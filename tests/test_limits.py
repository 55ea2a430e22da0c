"""docs/LIMITS.md is true: every limit it lists exists in the code with the value it gives,
and every module-level limit constant of the runtime is listed."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "LIMITS.md"
_ROW = re.compile(r"^\| `(?P<name>[\w.]+)` \| (?P<value>[^|]+) \|")
_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _rows() -> dict[str, str]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = _ROW.match(line)
        if m:
            rows[m["name"]] = m["value"].strip()
    return rows


def _number(text: str) -> float:
    """The leading quantity of a value cell: ``"4 MiB"`` → 4194304, ``"4,096 messages"`` → 4096."""
    m = re.match(r"([\d,.]+)\s*(KiB|MiB|GiB)?", text)
    assert m, f"no number in {text!r}"
    return float(m[1].replace(",", "")) * _UNITS.get(m[2] or "", 1)


def _constant(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_listed_limit_has_the_documented_value() -> None:
    rows = _rows()
    assert len(rows) >= 25, f"only {len(rows)} limits parsed from {DOC}"
    wrong = {name: (value, _constant(name)) for name, value in rows.items() if _number(value) != _constant(name)}
    assert not wrong, f"LIMITS.md disagrees with the code (doc, code): {wrong}"


def test_every_runtime_limit_constant_is_listed() -> None:
    """A new ``MAX_…``/``…_LIMIT``/``…_BATCHES``/``HIGH_WATER`` constant in the runtime
    must be documented with its behaviour."""
    listed = set(_rows())
    found = set()
    for package in ("sfaas", "worker", "coordinator"):
        for path in (ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for m in re.finditer(r"^(MAX_\w+|\w+_LIMIT|\w+_BATCHES|HIGH_WATER|\w+_INBOX)\s*=", path.read_text(), re.M):
                found.add(f"{module}.{m[1]}")
    missing = found - listed
    assert not missing, f"limits missing from docs/LIMITS.md: {sorted(missing)}"
