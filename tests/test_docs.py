"""The docs hold together and say only what is true: the README stays a front door (at most 200 lines), every relative
link in it and in docs/ leads to a file (and heading) that exists, every ``--option`` a page shows for a command is
one of that command's (as docs/cli.md, written from the code, lists them), every environment variable the code or
the tests read is documented, no page names an issue, a work session or a path outside the repository, and the
README's headline figures link to the results section they come from, which names its commit. That every command a
page prints runs: test_docs_commands.py."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
ANCHORED = re.compile(r"\]\(([^)#\s]+)#([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower-cased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(page: Path) -> dict[str, str]:
    """anchor -> that heading and the text under it (to the next heading of any level)."""
    sections: dict[str, str] = {}
    anchor = ""
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if line.startswith("#"):
            anchor = slug(line.lstrip("#"))
            sections[anchor] = line + "\n"
        elif anchor:
            sections[anchor] += line + "\n"
    return sections


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


def test_every_link_to_a_heading_finds_it() -> None:
    broken = [f"{page.relative_to(ROOT)} -> {target}#{anchor}" for page in pages()
              for target, anchor in ANCHORED.findall(page.read_text(encoding="utf-8"))
              if not target.startswith(("http://", "https://")) and (page.parent / target).is_file()
              and anchor not in headings(page.parent / target)]
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


def test_every_results_page_names_the_command_that_reproduces_it() -> None:
    pages = sorted((ROOT / "docs" / "results").glob("*.md"))
    silent = [p.name for p in pages
              if not re.search(r"```bash\n[^`]*flowstate |`flowstate [a-z]", p.read_text(encoding="utf-8"))]
    assert pages and silent == []


# --- every --option shown is one of its command's ---------------------------------------------------------------

FENCE = re.compile(r"^ *```[a-z ]*\n(.*?)^ *```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
SHELL_BREAK = re.compile(r"\|\||&&|[|;#)]|\$\(")


def cli_options() -> dict[str, set[str]]:
    """command path ("eval", "bench repo") -> its options, read from docs/cli.md."""
    options: dict[str, set[str]] = {}
    command = None
    for line in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").splitlines():
        if heading := re.match(r"^## `flowstate ?(.*)`$", line):
            command = heading.group(1)
            options[command] = {"--help"}
        elif command is not None and line.startswith("| `-"):
            options[command] |= set(re.findall(r"--[a-z0-9][a-z0-9-]*", line.split("|")[1]))
    return options


def snippets(text: str) -> list[str]:
    """Each command line of a page: the lines of its code blocks (continuations joined) and its inline code."""
    lines = [line for block in FENCE.findall(text) for line in block.replace("\\\n", " ").splitlines()]
    return lines + INLINE.findall(FENCE.sub("", text))


def shown_options(snippet: str, commands: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(command, --option) for each ``flowstate COMMAND … --option`` in one command line."""
    shown = []
    for mention in re.finditer(r"(?<![\w./-])flowstate((?: [a-z][a-z-]*)*)(.*)", snippet):
        words = mention.group(1).split()
        for n in range(len(words), -1, -1):
            if " ".join(words[:n]) in commands:
                rest = SHELL_BREAK.split(" ".join(words[n:]) + mention.group(2))[0]
                shown += [(" ".join(words[:n]), o) for o in re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", rest)]
                break
    return shown


def test_every_option_shown_is_its_commands() -> None:
    commands = cli_options()
    assert {"eval", "serve", "demo", "bench capacity"} <= set(commands) and "--strategy" in commands["eval"]
    found = [(page.relative_to(ROOT), command, option) for page in pages() if page.name != "cli.md"
             for snippet in snippets(page.read_text(encoding="utf-8"))
             for command, option in shown_options(snippet, commands)]
    assert len(found) > 300  # the pages do show commands with options (a broken reader would find none)
    wrong = [f"{page}: flowstate {command} {option}" for page, command, option in found
             if option not in commands[command]]
    assert wrong == []


def test_the_option_reader_catches_a_wrong_option() -> None:
    commands = cli_options()
    assert shown_options("flowstate eval --suite hotel --speculate ngram:4 | tee x --nope", commands) == [
        ("eval", "--suite"), ("eval", "--speculate")]
    assert shown_options("flowstate bench repo --sizes 10", commands) == [("bench repo", "--sizes")]


# --- every environment variable read is documented --------------------------------------------------------------

READ = re.compile(r"""(?:environ\.get\(|environ\[|getenv\(|envvar=|_listed\(|_engine_spec\([^)]*?,\s*|ENV\w* = )"""
                  r"""["']([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)["']""")
OURS = re.compile(r"""["']((?:FLOWSTATE|OTEL)_[A-Z0-9_]+)["']""")


def variables_read() -> set[str]:
    sources = [p for d in ("engine", "grammars", "flowstate", "serving", "tests") for p in (ROOT / d).rglob("*.py")]
    names = set()
    for path in sources:
        text = path.read_text(encoding="utf-8")
        names |= set(READ.findall(text)) | set(OURS.findall(text))
    return names


def test_every_environment_variable_read_is_documented() -> None:
    names = variables_read()
    assert {"FLOWSTATE_DB", "FLOWSTATE_TEST_PG_URL", "TAU2_DATA_DIR", "OTEL_SERVICE_NAME"} <= names
    documented = "\n".join(page.read_text(encoding="utf-8") for page in pages())
    assert sorted(n for n in names if f"`{n}`" not in documented and f"${n}" not in documented) == []


# --- no page names an issue, a work session, or a path outside the repository -----------------------------------

HOUSEKEEPING = re.compile(r"\bissues? #?\d+|\bthe issue\b|\ban issue of its own|\b(?:this|that|the|a|our|last|"
                          r"previous|next|later|earlier) (?:work )?session's (?:commits|time|work)|\bwave \d|"
                          r"(?<![\w.])\.\./(?:shared|\.\.)/|/work/", re.I)


def test_no_page_names_an_issue_a_session_or_a_path_outside() -> None:
    named = [f"{page.relative_to(ROOT)}: {m.group(0)!r}" for page in pages()
             for m in HOUSEKEEPING.finditer(page.read_text(encoding="utf-8"))]
    assert named == []
    outside = [f"{page.relative_to(ROOT)} -> {target}" for page in pages()
               for target in LINK.findall(page.read_text(encoding="utf-8"))
               if not target.startswith(("http://", "https://", "mailto:"))
               and not (page.parent / target).resolve().is_relative_to(ROOT)]
    assert outside == []


def test_the_housekeeping_reader_catches_what_it_should() -> None:
    assert HOUSEKEEPING.findall("as issue 54 asks, at ../shared/DESIGN.md, the session's time ran out") == [
        "issue 54", "../shared/", "the session's time"]
    assert not HOUSEKEEPING.findall("the session's requests; a session's states; ../README.md")


# --- the README's figures come from a results section that names its commit ------------------------------------

COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
FIGURE = re.compile(r"(?<![\w.^])(\d[\d,]*(?:\.\d+)?)(?=×| ms|%)")


def measured_bullets() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Where it stands, measured", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.split(r"\n(?=- )", section) if b.startswith("- ")]


def test_every_headline_figure_links_to_its_section_and_its_commit() -> None:
    bullets = measured_bullets()
    assert len(bullets) >= 6
    for bullet in bullets:
        links = [(ROOT / target, anchor) for target, anchor in ANCHORED.findall(bullet)]
        assert links, f"a headline with no link to the section it comes from: {bullet[:80]}"
        sections = [headings(page).get(anchor, "") for page, anchor in links]
        assert all(COMMIT.search(s) for s in sections), f"a linked section names no commit: {bullet[:80]}"
        body = re.sub(r"\]\([^)]*\)", "]", bullet)  # the figures in the prose, not in the links
        sources = "\n".join(sections).replace(",", "")
        missing = [f for f in FIGURE.findall(body) if f.replace(",", "") not in sources]
        where = [str(p.name) + "#" + a for p, a in links]
        assert missing == [], f"figures not in the linked sections {where}: {missing}"
