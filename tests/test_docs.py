"""The docs hold together: the README stays a front door (at most 200 lines), every relative link in it and in
docs/ leads to a file that exists, and every block a page marks ``bash runnable`` runs as printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


RUNNABLE = re.compile(r"^( *)```bash runnable\n(.*?)^\1```", re.M | re.S)


def runnable() -> list[tuple[str, str]]:
    """(page:line, commands) of every ``bash runnable`` block in the docs."""
    found = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for match in RUNNABLE.finditer(text):
            body = "\n".join(line[len(match.group(1)):] for line in match.group(2).splitlines())
            found.append((f"{page.relative_to(ROOT)}:{text[:match.start()].count(chr(10)) + 1}", body))
    return found


def test_some_blocks_are_marked_runnable() -> None:
    assert len(runnable()) >= 3  # the marker is in use (a renamed marker would skip every block silently)


@pytest.mark.slow
@pytest.mark.parametrize(("where", "commands"), runnable(), ids=[w for w, _ in runnable()])
def test_every_runnable_block_runs_as_printed(where: str, commands: str, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "FLOWSTATE_DB": str(tmp_path / "docs.db")}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{where}:\n{commands}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def test_every_results_page_names_the_command_that_reproduces_it() -> None:
    pages = sorted((ROOT / "docs" / "results").glob("*.md"))
    silent = [p.name for p in pages if not re.search(r"```bash\n[^`]*flowstate |`flowstate [a-z]", p.read_text(encoding="utf-8"))]
    assert pages and silent == []
