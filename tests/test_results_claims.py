"""What a results page's prose says agrees with its own tables: every quotient written out (``A ÷ B = C``) is
right, every ``× undrafted`` cell is its row's speed over the undrafted row's, and the speculation page's sentence
on parted outputs counts what its ``same text`` column counts (it once said the reverse)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUOTIENT = re.compile(r"([\d,]+(?:\.\d+)?) ÷ ([\d,]+(?:\.\d+)?) =\s*\**([\d,]+(?:\.\d+)?)")
SPECULATION = ROOT / "docs" / "results" / "speculation.md"


def number(text: str) -> float:
    return float(text.replace(",", ""))


def tables(text: str) -> list[list[dict[str, str]]]:
    """Each markdown table of ``text`` as rows of column -> cell (bold marks and spaces stripped)."""
    found: list[list[dict[str, str]]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and line.startswith("|") and re.fullmatch(r"\|(\s*-+\s*\|)+", lines[i + 1].strip()):
            names = [c.strip() for c in line.strip().strip("|").split("|")]
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = [c.strip().replace("**", "") for c in row.strip().strip("|").split("|")]
                rows.append(dict(zip(names, cells, strict=True)))
            found.append(rows)
    return found


def quotients(text: str) -> list[tuple[str, float, float, float]]:
    return [(m[0], number(m[1]), number(m[2]), number(m[3])) for m in QUOTIENT.finditer(text)]


@pytest.mark.parametrize("page", sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"], ids=lambda p: p.name)
def test_every_quotient_written_out_is_right(page: Path) -> None:
    for claim, a, b, c in quotients(page.read_text(encoding="utf-8")):
        digits = len(claim.rsplit(".", 1)[1].rstrip("*")) if "." in claim.rsplit("=", 1)[1] else 0
        assert abs(a / b - c) <= 0.5 * 10 ** -digits + 0.005 * c, f"{page.name}: {claim} (it is {a / b:.4f})"


def test_the_quotient_check_catches_a_wrong_one() -> None:
    (claim, a, b, c), = quotients("FlowState ÷ full context is 150.3 ÷ 458.2 = **0.38** without drafting")
    assert abs(a / b - c) > 0.005 + 0.005 * c, claim


def test_every_times_undrafted_cell_is_its_rows_speed_over_the_undrafted_rows() -> None:
    checked = 0
    for rows in tables(SPECULATION.read_text(encoding="utf-8")):
        if not rows or "× undrafted" not in rows[0]:
            continue
        base = {r["mode"]: number(r["decode tok/s"]) for r in rows if r["engine"] in ("undrafted", "vllm")}
        for r in rows:
            speed = r["decode tok/s"]
            own = re.search(r"\(([\d.]+) undrafted\)", speed)  # a mode with its own undrafted figure in the cell
            undrafted = number(own[1]) if own else base[r["mode"]]
            ratio = number(speed.split()[0]) / undrafted
            assert abs(ratio - number(r["× undrafted"])) <= 0.011, (r, round(ratio, 3))
            checked += 1
    assert checked >= 17


def test_the_parted_outputs_sentence_counts_what_the_table_counts() -> None:
    text = SPECULATION.read_text(encoding="utf-8")
    model = next(rows for rows in tables(text) if any(r["mode"] == "none" for r in rows))  # the 1.5B table
    parted = {r["mode"]: 3 - int(r["same text"].split("/")[0]) for r in model if r["same text"]}
    assert set(parted) == {"static", "step", "none"}
    sentence = re.search(r"(\d) of 3 calls under either grammar\s+parts? .*?, and (\d) of 3 without one", text, re.S)
    assert sentence, "the sentence on parted outputs is gone or reworded: keep it checked"
    assert {parted["static"], parted["step"]} == {int(sentence[1])}, parted
    assert parted["none"] == int(sentence[2]), parted
