"""The documents a newcomer reads stand on their own: every link and image resolves to a
file in the repository, nothing points outside it (no sibling checkout, no web page but a
local service), the quick start is the two commands it promises, and the architecture
page names only files — and functions in them — that exist."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "benchmarks/README.md",
        "benchmarks/REPORTS.md", "benchmarks/JOURNAL.md", "benchmarks/journal/README.md",
        "benchmarks/journal/JOURNAL.md", "benchmarks/journal/ANALYSES.md",
        "examples/README.md"] + sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))
LOCAL_HOSTS = {"localhost", "127.0.0.1"}

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
#: ``[text](target)`` and ``![alt](target)``; the text may span lines and hold code spans
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
_URL = re.compile(r"\bhttps?://[^\s)\]>`'\"]+")
#: a relative path that climbs out of its folder: ``../x``, ``../../x/y.md``
_UP = re.compile(r"(?<![\w.])((?:\.\./)+[\w.-][\w./-]*)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def _text(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def _prose(doc: str) -> str:
    """The document without its fenced code blocks (where ``[x](y)`` is not a link)."""
    return _FENCE.sub("", _text(doc))


def _targets(doc: str) -> list[str]:
    prose = _prose(doc)
    return _LINK.findall(prose) + _REF.findall(prose)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces → ``-``."""
    text = re.sub(r"`|\*\*|__", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).strip().lower()
    kept = "".join(c for c in text
                   if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, title in _HEADING.findall(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = _slug(title)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _inside(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


@pytest.mark.parametrize("doc", DOCS)
def test_every_link_and_image_resolves_inside_the_repository(doc: str) -> None:
    base = (ROOT / doc).parent
    broken = []
    for target in _targets(doc):
        url = urlparse(target)
        if url.scheme in ("http", "https"):
            if url.hostname not in LOCAL_HOSTS:
                broken.append(f"{target}: a web link (only local services may be linked)")
            continue
        if url.scheme or target.startswith("/"):
            broken.append(f"{target}: not a relative path in the repository")
            continue
        path_part, _, anchor = target.partition("#")
        path = (base / unquote(path_part)).resolve() if path_part else (ROOT / doc)
        if not _inside(path):
            broken.append(f"{target}: outside the repository")
        elif not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{target}: no heading with anchor #{anchor} in {path.name}")
    assert not broken, f"{doc}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", DOCS)
def test_no_document_points_outside_the_repository(doc: str) -> None:
    """Not even in code spans or commands: a reader of the repository alone has nothing
    outside it (a sibling folder's design notes, a web page)."""
    text = _text(doc)
    base = (ROOT / doc).parent
    outside = [p for p in _UP.findall(text) if not _inside(base / p)]
    assert not outside, f"{doc} names paths outside the repository: {outside}"
    web = [u for u in _URL.findall(text) if urlparse(u).hostname not in LOCAL_HOSTS]
    assert not web, f"{doc} links the web: {web}"


def test_the_checks_catch_a_link_to_a_sibling_checkout(tmp_path: Path) -> None:
    """The rule that keeps the map inside the repository: a design note next to the
    checkout, linked or quoted, is caught."""
    for line in ("See [the map](../shared/DESIGN.md).", "See `../shared/DESIGN.md` for the map."):
        found = _UP.findall(line)
        assert found and not _inside(ROOT / found[0]), line
    assert _LINK.findall("[the map](../shared/DESIGN.md)") == ["../shared/DESIGN.md"]


def test_the_quick_start_is_two_commands() -> None:
    text = _text("README.md")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\w*\n(.*?)```", section, re.S)
    assert blocks, "README's quick start has no command block"
    commands = [line.split("#", 1)[0].strip() for line in blocks[0].splitlines()]
    assert [c for c in commands if c] == ["./run demo", "./run test"]


#: a file path as the architecture page writes it: ``worker/service.py``,
#: ``sfaas/runtime/wire.py:encode_frame``, ``statestores/FORMAT.md``
_FILE = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.(?:py|md|toml|yml|yaml|json|sh))"
                   r"(?::([A-Za-z_][\w.]*))?")
#: a folder of the repository: ``worker/protocols/``
_FOLDER = re.compile(r"(?<![\w./-])((?:[\w-]+/)+)(?![\w.-])")


def _defines(path: Path, dotted: str) -> bool:
    source = path.read_text(encoding="utf-8")
    name = dotted.rsplit(".", 1)[-1]
    return re.search(rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b"
                     rf"|^\s*{re.escape(name)}\s*[:=]", source, re.M) is not None


def test_the_architecture_page_names_only_files_that_exist() -> None:
    text = _text("ARCHITECTURE.md")
    named = _FILE.findall(text)
    assert len(named) >= 20, "ARCHITECTURE.md should walk through the files by name"
    missing = sorted({p for p, _ in named if not (ROOT / p).is_file()})
    assert not missing, f"ARCHITECTURE.md names files that do not exist: {missing}"
    undefined = sorted({f"{p}:{name}" for p, name in named
                        if name and not _defines(ROOT / p, name)})
    assert not undefined, f"ARCHITECTURE.md names functions not in their files: {undefined}"
    tops = {p.name for p in ROOT.iterdir() if p.is_dir()}
    folders = sorted({f for f in _FOLDER.findall(text)
                      if f.split("/", 1)[0] in tops and not (ROOT / f).is_dir()})
    assert not folders, f"ARCHITECTURE.md names folders that do not exist: {folders}"


#: ``Class.method`` as the architecture page writes it, with or without its file
_MEMBER = re.compile(r"`(?:[\w/.-]+\.py:)?([A-Z]\w*)\.(\w+)`")
PRODUCT = ("sfaas", "worker", "coordinator", "statestores", "remotes", "launcher")


def test_the_architecture_page_names_only_methods_that_exist() -> None:
    """A step written as ``Class.method`` names a method of a class of the product."""
    bodies: dict[str, list[str]] = {}
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            source = path.read_text(encoding="utf-8")
            for m in re.finditer(r"^class (\w+)\b.*?(?=^class |\Z)", source, re.M | re.S):
                bodies.setdefault(m[1], []).append(m[0])
    named = set(_MEMBER.findall(_text("ARCHITECTURE.md")))
    assert named, "ARCHITECTURE.md should name the methods a path goes through"
    missing = sorted(f"{cls}.{name}" for cls, name in named
                     if not any(re.search(rf"^\s+(?:async\s+def|def)\s+{name}\b"
                                          rf"|^\s+{name}\s*[:=]", body, re.M)
                                for body in bodies.get(cls, [])))
    assert not missing, f"ARCHITECTURE.md names methods no class has: {missing}"
