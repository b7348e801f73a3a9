"""The docs hold together: the README stays a front door (at most 200 lines), and every relative link in it and in
docs/ leads to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
    assert any(line.startswith("pip install") for line in lines[:12]) and "pytest" in "\n".join(lines[:12])


def test_every_relative_link_resolves() -> None:
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in pages()
              for target in LINK.findall(page.read_text(encoding="utf-8"))
              if not target.startswith(("http://", "https://", "mailto:")) and not (page.parent / target).exists()]
    assert broken == []


def test_every_docs_page_is_indexed() -> None:
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    unlisted = [str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")
                if p.name != "README.md" and f"({p.relative_to(ROOT / 'docs')})" not in index]
    assert unlisted == []


def test_the_cli_reference_is_current() -> None:
    from flowstate.cli import main
    from flowstate.cli.reference import render

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert page == render(main), "docs/cli.md is stale: python -m flowstate.cli.reference > docs/cli.md"
