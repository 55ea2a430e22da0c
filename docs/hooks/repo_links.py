"""MkDocs hook: the site shows links to repository files outside ``docs/`` as their paths.

The pages are written to be read in the repository, where ``[ARCHITECTURE.md](../ARCHITECTURE.md)``
or ``[the shop](../../examples/shop.py)`` opens the file. The site is built from ``docs/``
alone, so such a link would lead nowhere there: this hook renders it as its text and
the file's path (``the shop (examples/shop.py)``), and leaves every link inside ``docs/``
to MkDocs, whose strict build checks it. It also shortens the Sphinx roles of the
docstrings the API reference renders (``:class:`~sfaas.errors.Abort``` → ``Abort``).
Nothing is fetched: the hook only rewrites text.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

#: a fenced code block, left alone (``[x](y)`` there is code)
_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
#: ``[text](target)`` with a relative target (no scheme, no leading ``/`` or ``#``)
_LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>:#][^)\s>]*)>?\s*\)")
#: ``:class:`~a.b.C``` as rendered: ``:class:<code>~a.b.C</code>``
_ROLE = re.compile(r":(?:class|meth|func|attr|exc|mod|data|obj|py:\w+):<code>(~?)([^<]+)</code>")


def _outside(page_src: str, target: str) -> str | None:
    """The repository path of ``target`` if it leaves ``docs/``, else None."""
    path = target.split("#", 1)[0]
    if not path:
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(page_src), path))
    if not joined.startswith("../"):
        return None
    return joined[3:] or "."


def _plain(text: str, repo_path: str) -> str:
    shown = text.replace("`", "").strip()
    if shown.rstrip("/") in (repo_path.rstrip("/"), posixpath.basename(repo_path.rstrip("/"))):
        return text
    return f"{text} (`{repo_path}`)"


def rewrite(markdown: str, page_src: str) -> str:
    """``markdown`` with its links out of ``docs/`` made plain text (outside code blocks)."""
    out, last = [], 0
    for fence in _FENCE.finditer(markdown):
        out.append(_rewrite_prose(markdown[last:fence.start()], page_src))
        out.append(fence.group(0))
        last = fence.end()
    out.append(_rewrite_prose(markdown[last:], page_src))
    return "".join(out)


def _rewrite_prose(prose: str, page_src: str) -> str:
    def one(m: re.Match[str]) -> str:
        repo_path = _outside(page_src, m.group(2))
        return m.group(0) if repo_path is None else _plain(m.group(1), repo_path)
    return _LINK.sub(one, prose)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return rewrite(markdown, page.file.src_uri)


def on_page_content(html: str, **_: Any) -> str:
    def short(m: re.Match[str]) -> str:
        name = m.group(2)
        return f"<code>{name.rsplit('.', 1)[-1] if m.group(1) else name}</code>"
    return _ROLE.sub(short, html)
