"""Anchored chunk boundaries (design §7): a one-line edit re-cuts only nearby chunks."""

from __future__ import annotations

import random
from collections import Counter

from kb.index.chunking import Chunker

WORDS = [
    "vault",
    "note",
    "plugin",
    "sync",
    "graph",
    "canvas",
    "link",
    "embed",
    "property",
    "template",
    "query",
    "filter",
    "sort",
    "folder",
    "heading",
    "block",
    "callout",
    "table",
    "code",
    "theme",
    "snippet",
]


def _document(rng: random.Random, sections: int = 40) -> str:
    """A markdown document with headings, paragraphs, lists, tables and fenced code."""
    parts = ["# Handbook\n"]
    for s in range(sections):
        parts.append(f"{'#' * rng.choice((2, 3))} Section {s} {rng.choice(WORDS)}\n")
        for _ in range(rng.randint(1, 5)):
            kind = rng.randrange(4)
            if kind == 0:
                parts.append(" ".join(rng.choices(WORDS, k=rng.randint(15, 60))) + ".\n")
            elif kind == 1:
                parts.append(
                    "\n".join(
                        f"- {' '.join(rng.choices(WORDS, k=rng.randint(3, 9)))}" for _ in range(rng.randint(2, 8))
                    )
                    + "\n"
                )
            elif kind == 2:
                parts.append(
                    "| a | b |\n|---|---|\n"
                    + "\n".join(
                        f"| {rng.choice(WORDS)} | {' '.join(rng.choices(WORDS, k=4))} |"
                        for _ in range(rng.randint(2, 6))
                    )
                    + "\n"
                )
            else:
                parts.append(
                    "```bash\n# not a heading\n"
                    + "\n\n".join(f"kb {rng.choice(WORDS)} --{rng.choice(WORDS)}" for _ in range(rng.randint(2, 6)))
                    + "\n```\n"
                )
    return "\n".join(parts)


def _edit(text: str, rng: random.Random) -> tuple[str, int]:
    lines = text.split("\n")
    i = rng.choice([n for n, line in enumerate(lines) if len(line.split()) >= 2])
    kind = rng.randrange(3)
    if kind == 0:
        lines[i] += " " + " ".join(rng.choices(WORDS, k=rng.randint(2, 8)))
    elif kind == 1:
        lines[i] = lines[i].rsplit(" ", 1)[0]
    else:
        lines.insert(i + 1, " ".join(rng.choices(WORDS, k=rng.randint(3, 10))))
    return "\n".join(lines), i + 1


def test_one_line_edits_re_embed_at_most_the_touched_chunks_plus_one():
    rng = random.Random(13)
    chunker = Chunker(64)
    text = _document(rng)
    before = chunker.chunk(text)
    assert len(before) > 60
    old = Counter(c.text for c in before)
    worst = []
    for _ in range(60):
        edited, line = _edit(text, rng)
        after = chunker.chunk(edited)
        missed = sum(1 for c in after if old[c.text] == 0)
        touched = sum(1 for c in after if c.start_line <= line + 1 and c.end_line >= line)
        worst.append(missed)
        assert missed <= 3 and missed <= touched + 1, (line, missed, touched)
    assert max(worst) >= 1


def test_chunks_tile_the_document_in_order_with_exact_offsets():
    text = _document(random.Random(7), sections=15)
    chunks = Chunker(64).chunk(text)
    end = 0
    for chunk in chunks:
        assert chunk.start_char >= end and text[chunk.start_char : chunk.end_char] == chunk.text
        assert text[end : chunk.start_char].strip() == ""  # nothing but whitespace is left out
        end = chunk.end_char
    assert text[end:].strip() == ""


def test_fenced_code_with_hash_lines_and_blank_lines_stays_one_chunk():
    code = "```bash\n# install\npip install kb\n\n# run\nkb init\n```"
    text = f"## Setup\n\nSome words first.\n\n{code}\n\n## Next\n\nMore.\n"
    texts = [c.text for c in Chunker(64).chunk(text)]
    assert any(code in t for t in texts)
    assert not any(t.startswith("# install") or t.startswith("# run") for t in texts)
