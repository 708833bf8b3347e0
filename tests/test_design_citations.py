"""Every design section cited in kb's code and documentation exists in docs/design.md.

Comments and documents cite the design as ``design §7`` or ``design §2.1`` (and, from before the
design was written down, ``design §7``; both spellings number the same sections). A list continues
the citation: ``design §9, §10`` and ``design §2.2/§14`` cite both sections. A section is a heading
of docs/design.md: ``## 7. The derived index`` or ``### 2.1 Layout``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
SCANNED = [ROOT / "README.md", *(ROOT / folder for folder in ("kb", "docs", "sql", "tests", "bin"))]
SUFFIXES = {".py", ".md", ".sql", ".toml", ".txt"}

HEADING = re.compile(r"^#{2,6} +(\d+(?:\.\d+)?)\.? ", re.MULTILINE)
SECTION = r"§(\d+(?:\.\d+)?)"
CITATION = re.compile(rf"\b(?:design|SPEC) {SECTION}((?:(?:, *|/| and ){SECTION})*)")


def design_sections() -> set[str]:
    """The section numbers of docs/design.md's headings: ``{"7", "2.1", …}``."""
    return set(HEADING.findall(DESIGN.read_text(encoding="utf-8")))


def cited_sections(text: str) -> list[tuple[int, str]]:
    """``(line number, section)`` of every section ``text`` cites, lists included."""
    found = []
    for match in CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append((line, match.group(1)))
        found.extend((line, more) for more in re.findall(SECTION, match.group(2)))
    return found


def scanned_files() -> list[Path]:
    """The files whose citations are checked: README.md and kb/, docs/, sql/, tests/, bin/ (text
    files only, the test corpus and installed packages left out)."""
    files = []
    for place in SCANNED:
        candidates = [place] if place.is_file() else sorted(place.rglob("*"))
        for path in candidates:
            relative = path.relative_to(ROOT).parts
            if (
                path.is_file()
                and path.suffix in SUFFIXES
                and "corpus" not in relative
                and "node_modules" not in relative
                and "__pycache__" not in relative
            ):
                files.append(path)
    return files


def test_citations_are_recognised_in_both_spellings_and_in_lists():
    text = "see design §7 and design §2.1, §14; design §2.2/§5. Not: design §N, §3 alone, specification §9"
    assert cited_sections(text) == [(1, "7"), (1, "2.1"), (1, "14"), (1, "2.2"), (1, "5")]
    assert {"7", "2.1"} <= design_sections()


def test_every_cited_design_section_is_a_heading_of_the_design():
    sections = design_sections()
    dangling, count = [], 0
    for path in scanned_files():
        for line, section in cited_sections(path.read_text(encoding="utf-8", errors="replace")):
            count += 1
            if section not in sections:
                dangling.append(f"{path.relative_to(ROOT)}:{line}: §{section}")
    assert count > 100, f"only {count} citations found: is the pattern still how the code cites the design?"
    assert not dangling, "cited sections docs/design.md has no heading for:\n" + "\n".join(dangling)
