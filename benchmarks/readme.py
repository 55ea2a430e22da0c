"""Writes a benchmark's report into benchmarks/REPORTS.md, between its own markers.

Each script owns a block ``<!-- NAME:start -->`` … ``<!-- NAME:end -->``: re-running the
script replaces that block (the command, the link to the raw points, the report) and
nothing else; a block not there yet is appended under ``title``.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the full reports; benchmarks/README.md, the page a user reads first, is written by hand
README = ROOT / "benchmarks" / "REPORTS.md"


def publish(name: str, title: str, text: str, out: Path, command: str, raw: str, images: tuple[str, ...] = ()) -> None:
    """Write ``text`` to ``out/REPORT.md`` and into README's block ``name``; ``raw`` is the
    raw points' file name in ``out``; ``images`` (file names in ``out``) are re-linked."""
    (out / "REPORT.md").write_text(text + "\n")
    rel = out.resolve().relative_to(ROOT / "benchmarks") if out.resolve().is_relative_to(ROOT / "benchmarks") else out
    for image in images:
        text = text.replace(f"]({image})", f"]({rel}/{image})")
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n```bash\n{command}\n```\n\nRaw points: [`{rel}/{raw}`]({rel}/{raw}).\n\n{text}\n{end}"
    body = README.read_text()
    if start in body and end in body:
        head, rest = body.split(start, 1)
        body = head + block + rest.split(end, 1)[1]
    else:
        body = body.rstrip() + f"\n\n## {title}\n\n" + block + "\n"
    README.write_text(body)
