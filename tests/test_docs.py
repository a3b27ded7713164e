"""The docs a newcomer reads: README.md stays short, every relative link in README.md, docs/ and bench/ resolves
(file and heading), and code points at headings of docs/design.md, not at sections of the former design document."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "bench" / "RESULTS.md", ROOT / "bench" / "history.md",
        *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            lines.append(line.lstrip("#"))
    return {_slug(h) for h in lines}


def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(target)
    assert not broken, f"{doc.name}: {broken}"


def test_no_design_section_references_outside_design_md() -> None:
    pattern = re.compile(r"DESIGN (section|§|\d)")
    hits = []
    for folder in ("pitlab", "docs", "bench", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".md"} and path.name != "design.md" and path.is_file():
                hits += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1)
                         if pattern.search(line)]
    hits += [f"README.md:{n}" for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
             if pattern.search(line)]
    assert not hits, hits
