"""The documentation site builds, and the guide's code does what the guide says.

The site (``mkdocs.yml``, pages in ``docs/``) is built with ``mkdocs build --strict``: a
broken link between pages, a missing anchor, a page left out of the navigation or an API
reference entry naming nothing fails the build. Every Python block of ``docs/guide/``
runs: a page's blocks in order, in one module namespace per page (so a later block uses
what an earlier one defined, and a post-commit action defined in a block is a module-level
function), and a block that raises — an ``assert`` in it included — fails the page. A
block meant only to be read (it needs a cluster, Kafka or an outside provider) says so on
the line before its fence: ``<!-- not run: needs a running cluster -->``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide"
PAGES = sorted(p.relative_to(ROOT).as_posix() for p in GUIDE.glob("*.md"))

#: a fenced block: its info string and body, with the line its body starts on
_FENCE = re.compile(r"^(?P<fence>```|~~~)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$",
                    re.M | re.S)
#: a link or a loaded resource of a built page
_OUT = re.compile(r"""(?:href|src)=["'](https?://[^"']+)""")
#: the mark of a block that is only read, on the line before its fence, with the reason
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<why>\S.*?)\s*-->\s*$")


@dataclasses.dataclass
class Block:
    page: str
    line: int          # the line of the block's first code line in the page
    code: str
    runs: bool
    why: str = ""      # the reason a block does not run


def blocks(page: str, text: str | None = None) -> list[Block]:
    """The Python blocks of ``page`` (``text``: its content, read from the file if None)."""
    if text is None:
        text = (ROOT / page).read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for m in _FENCE.finditer(text):
        info = m["info"].strip().split()
        if not info or info[0] not in ("python", "py"):
            continue
        fence_line = text.count("\n", 0, m.start())        # 0-based index of the fence
        before = lines[fence_line - 1] if fence_line > 0 else ""
        mark = _NOT_RUN.match(before.strip())
        found.append(Block(page, fence_line + 2, m["body"], runs=mark is None,
                           why=mark["why"] if mark else ""))
    return found


def run_page(page: str, text: str | None = None) -> types.ModuleType:
    """Run the runnable blocks of ``page`` in order in one fresh module; the error of the
    first block that fails names the page and the block's first line."""
    name = "sfaas_guide_" + re.sub(r"\W", "_", Path(page).stem)
    module = types.ModuleType(name)
    module.__file__ = str(ROOT / page)
    sys.modules[name] = module      # post-commit actions are found by ``module:qualname``
    try:
        for block in blocks(page, text):
            if not block.runs:
                continue
            # padded so that a traceback's line numbers are the page's own
            code = compile("\n" * (block.line - 1) + block.code, str(ROOT / page), "exec")
            try:
                exec(code, module.__dict__)
            except BaseException as exc:
                raise AssertionError(
                    f"{page}: the block at line {block.line} failed: "
                    f"{type(exc).__name__}: {exc}") from exc
    finally:
        sys.modules.pop(name, None)
        _close_runners(module)
    return module


def _close_runners(module: types.ModuleType) -> None:
    """Close what a page left open when one of its blocks failed (closing twice is fine)."""
    from sfaas.testing import LocalRunner

    for value in list(vars(module).values()):
        if isinstance(value, LocalRunner):
            value.close()


@pytest.mark.timeout(120)   # a page takes seconds; a hang fails with its stack, not at 600 s
@pytest.mark.parametrize("page", PAGES)
def test_the_guide_page_runs(page: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        run_page(page)


def test_the_readme_example_runs() -> None:
    """The front page's example is code too."""
    assert [b for b in blocks("README.md") if b.runs], "README.md shows no Python example"
    run_page("README.md")


@pytest.mark.parametrize("page", PAGES)
def test_every_guide_page_has_a_block_that_runs_and_says_why_one_does_not(page: str) -> None:
    found = blocks(page)
    running = [b for b in found if b.runs]
    assert running, f"{page} has no Python block that runs"
    assert any("assert" in b.code for b in running), \
        f"{page}: its blocks show no result with an assert"
    read_only = [b for b in found if not b.runs]
    assert len(read_only) <= len(running), \
        f"{page}: more blocks only read ({len(read_only)}) than run ({len(running)})"


def test_the_guide_pages_are_the_ones_in_the_site() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert PAGES and all(p.removeprefix("docs/") in nav for p in PAGES)


def test_a_failing_block_fails_its_page() -> None:
    """The runner catches a block whose assert fails, runs blocks in order in one
    namespace, and skips a block marked as only read."""
    page = "docs/guide/example.md"
    text = ("# x\n\n```python\nx = 1\n```\n\n<!-- not run: needs a cluster -->\n"
            "```python\nraise SystemExit('never runs')\n```\n\n```python\nassert x == 2\n```\n")
    assert [(b.line, b.runs, b.why) for b in blocks(page, text)] == [
        (4, True, ""), (9, False, "needs a cluster"), (13, True, "")]
    with pytest.raises(AssertionError, match="line 13 failed") as err:
        run_page(page, text)
    assert err.value.__cause__ is not None
    assert "example.md\", line 13" in "".join(
        __import__("traceback").format_tb(err.value.__cause__.__traceback__))
    assert run_page(page, text.replace("x == 2", "x == 1")).x == 1


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: every page, link, anchor and API entry resolves."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    pages = {p.relative_to(tmp_path / "site").as_posix()
             for p in (tmp_path / "site").rglob("*.html")}
    for page in PAGES + ["docs/reference/sfaas.md", "docs/reference/testing.md",
                         "docs/reference/pytest-plugin.md"]:
        assert page.removeprefix("docs/").replace(".md", ".html") in pages, page
    api = (tmp_path / "site" / "reference" / "testing.html").read_text(encoding="utf-8")
    assert "LocalRunner" in api and "RunnerStats" in api, "the API reference is empty"
    import sfaas

    api = (tmp_path / "site" / "reference" / "sfaas.html").read_text(encoding="utf-8")
    undocumented = [name for name in sfaas.__all__
                    if not re.search(rf'id="sfaas\.(?:\w+\.)?{name}"', api)]
    assert not undocumented, f"the API reference leaves out what sfaas exports: {undocumented}"
    outside = sorted({f"{p.name}: {url}" for p in (tmp_path / "site").rglob("*.html")
                      for url in _OUT.findall(p.read_text(encoding="utf-8"))
                      if urlparse(url).hostname not in ("localhost", "127.0.0.1")})
    assert not outside, f"the site links or loads from outside the repository: {outside}"
    print(f"mkdocs build --strict: {took:.1f} s")


def test_the_site_has_no_link_out_of_it(tmp_path: Path) -> None:
    """A link from a page to a repository file outside ``docs/`` works in the repository;
    the site shows it as the file's path instead of a link that leads nowhere."""
    hook = types.ModuleType("repo_links")
    exec(compile((ROOT / "docs/hooks/repo_links.py").read_text(encoding="utf-8"),
                 "repo_links.py", "exec"), hook.__dict__)
    text = ("See [ARCHITECTURE.md](../../ARCHITECTURE.md), [the shop](../../examples/shop.py),"
            " [reads](reads.md#a) and [ops](../operations/index.md).\n\n"
            "```python\n[a](../../x.py)\n```\n")
    assert hook.rewrite(text, "guide/x.md") == (
        "See ARCHITECTURE.md, the shop (`examples/shop.py`), [reads](reads.md#a) and "
        "[ops](../operations/index.md).\n\n```python\n[a](../../x.py)\n```\n")


# -- the settings table ----------------------------------------------------------------------
_ROW = re.compile(r"^\|\s*`(SFAAS_[A-Z_]+)`\s*\|\s*`([^`]*)`\s*\|", re.M)


def _defaults(cls: type, prefix: str) -> dict[str, object]:
    """``SFAAS_<NAME>`` → the field's default (None when a factory makes it per host)."""
    return {f"{prefix}{f.name.upper()}": None if f.default is dataclasses.MISSING else f.default
            for f in dataclasses.fields(cls)}  # type: ignore[arg-type]


def _same(written: str, value: object) -> bool:
    """Whether the page's ``written`` default is the code's ``value``."""
    if value is None:                                    # made per host
        return True
    if isinstance(value, bool):
        return written.lower() in (("1", "true", "yes", "on") if value
                                   else ("0", "false", "no", "off"))
    if isinstance(value, (int, float)):
        try:
            return float(written) == value
        except ValueError:
            return False
    return written == (value or '""')


def test_the_configuration_page_lists_every_setting_with_its_default() -> None:
    from gateway.settings import GatewaySettings
    from sfaas.runtime.settings import Settings

    page = (ROOT / "docs/operations/configuration.md").read_text(encoding="utf-8")
    rows = dict(_ROW.findall(page))
    wanted = {**_defaults(Settings, "SFAAS_"), **_defaults(GatewaySettings, "SFAAS_GATEWAY_")}
    missing = sorted(set(wanted) - set(rows))
    assert not missing, f"docs/operations/configuration.md lacks the settings {missing}"
    wrong = sorted((name, rows[name], repr(value)) for name, value in wanted.items()
                   if not _same(rows[name], value))
    assert not wrong, f"settings whose default the page gives wrong (page, code): {wrong}"
