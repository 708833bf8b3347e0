"""kb's own test corpus (``tests/corpus/``): a few dozen small markdown pages written for the tests
— headings, lists, tables, fenced code, front matter, nested folders, and pages in German,
Japanese and Arabic — so no test needs anything outside the repository.

Layout: one folder per language (``en``, ``de``, ``ja``, ``ar``); ``en`` is the largest and nests
folders three deep. Tests that count or search pages derive what they expect from the files."""

from __future__ import annotations

from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "corpus"


def corpus_path(*parts: str) -> Path:
    """A folder or file of ``tests/corpus``; raises FileNotFoundError naming it when it is absent
    (the corpus is part of the repository, so a missing one is a broken checkout, not a skip)."""
    path = CORPUS.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from kb's test corpus (tests/corpus)")
    return path


def markdown_files(folder: Path) -> list[Path]:
    """The ``.md`` files under ``folder``, sorted, hidden ones left out (as ``kb import`` does)."""
    return sorted(
        p for p in folder.rglob("*.md") if not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
