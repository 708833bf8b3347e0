#!/usr/bin/env python
"""How many chunks a one-line edit re-embeds (design §7), kb's anchored chunker vs the
reference: chonkie's RecursiveChunker run over the whole document with the same rules, tokenizer and
chunk size (what kb did before sections were anchored).

For each of the largest markdown documents of a corpus, ``--edits`` random one-line edits are made
(a line grows by a few words, loses its last word, has a word replaced by a longer one, or a new
line is inserted after it). Both legs cut the document before and after; a chunk is *re-embedded*
when its text is not among the old chunk texts (the embedding cache is keyed by the chunk text, so
exactly those miss it). *Touched* = the new chunks whose line span covers the edited line(s).
Reported per leg: distribution of re-embedded chunks, edits with more than 3, edits re-embedding more
than touched + 1, chunk counts and mean chunk size, and chunking time (medians, legs interleaved
per document; anchored/reference ratio).

Usage: python bin/bench_chunk_stability.py [--corpus DIR] [--documents 12] [--edits 20]
       [--chunk-size 240] [--seed 13]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kb.index.chunking import Chunker, line_starts, mask_fenced_blank_lines  # noqa: E402

WORDS = ["alpha", "configuration", "synchronisation", "the", "vault", "plugin", "markdown", "internationalization"]


def reference_texts(chunker: Chunker, text: str) -> list[tuple[str, int, int]]:
    """The reference leg: chonkie over the whole (fence-masked) document, stripped like kb does."""
    masked = mask_fenced_blank_lines(text)
    starts = line_starts(text)
    out = []
    for piece in chunker._chunker.chunk(masked):
        body = text[piece.start_index : piece.end_index]
        if body.strip():
            start = piece.start_index + len(body) - len(body.lstrip())
            end = start + len(body.strip())
            out.append((body.strip(), _line(starts, start), _line(starts, end - 1)))
    return out


def anchored_texts(chunker: Chunker, text: str) -> list[tuple[str, int, int]]:
    return [(c.text, c.start_line, c.end_line) for c in chunker.chunk(text)]


def _line(starts: list[int], offset: int) -> int:
    import bisect

    return bisect.bisect_right(starts, offset)


def one_line_edit(text: str, rng: random.Random) -> tuple[str, int, int]:
    """``(new text, first edited line, last edited line)`` (1-based, in the new text)."""
    lines = text.split("\n")
    candidates = [i for i, line in enumerate(lines) if len(line.split()) >= 2]
    i = rng.choice(candidates)
    words = lines[i].split(" ")
    kind = rng.randrange(4)
    if kind == 0:
        lines[i] = lines[i] + " " + " ".join(rng.choices(WORDS, k=rng.randint(2, 6)))
    elif kind == 1:
        lines[i] = " ".join(words[:-1])
    elif kind == 2:
        j = rng.randrange(len(words))
        words[j] = rng.choice(WORDS) + words[j]
        lines[i] = " ".join(words)
    else:
        lines.insert(i + 1, " ".join(rng.choices(WORDS, k=rng.randint(4, 12))))
        return "\n".join(lines), i + 1, i + 2
    return "\n".join(lines), i + 1, i + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus" / "obsidian-help")
    parser.add_argument("--documents", type=int, default=12)
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--chunk-size", type=int, default=240)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--anchor-every", type=int, default=None, help="override Chunker's anchor_every")
    parser.add_argument("--min-fraction", type=float, default=None, help="override Chunker's min_fraction")
    args = parser.parse_args()
    if not args.corpus.is_dir():
        sys.exit(f"corpus {args.corpus} not found (pass --corpus DIR)")
    overrides = {
        k: v for k, v in (("anchor_every", args.anchor_every), ("min_fraction", args.min_fraction)) if v is not None
    }
    chunker = Chunker(args.chunk_size, **overrides)
    files = sorted(args.corpus.rglob("*.md"), key=lambda p: p.stat().st_size, reverse=True)[: args.documents]
    rng = random.Random(args.seed)
    legs = {"reference": reference_texts, "anchored": anchored_texts}
    reembedded = {leg: [] for leg in legs}
    over_touched = Counter()
    chunk_counts = {leg: [] for leg in legs}
    chunk_sizes = {leg: [] for leg in legs}
    seconds = {leg: [] for leg in legs}
    for cut in legs.values():  # warm up the tokenizer and chonkie before timing
        cut(chunker, files[-1].read_text(encoding="utf-8"))
    for number, path in enumerate(files):
        text = path.read_text(encoding="utf-8")
        before = {}
        order = list(legs.items()) if number % 2 == 0 else list(reversed(legs.items()))
        for leg, cut in order:  # interleaved per document, alternating which leg goes first
            started = time.perf_counter()
            before[leg] = cut(chunker, text)
            seconds[leg].append(time.perf_counter() - started)
            chunk_counts[leg].append(len(before[leg]))
            chunk_sizes[leg].extend(len(t) for t, _, _ in before[leg])
        for _ in range(args.edits):
            edited, first, last = one_line_edit(text, rng)
            for leg, cut in legs.items():
                after = cut(chunker, edited)
                old = Counter(t for t, _, _ in before[leg])
                new = [t for t, _, _ in after]
                missed = sum(1 for t in new if old[t] == 0)
                touched = sum(1 for _, a, b in after if a <= last and b >= first)
                reembedded[leg].append(missed)
                if missed > touched + 1:
                    over_touched[leg] += 1
    total = len(reembedded["anchored"])
    print(
        f"{len(files)} documents (largest of {args.corpus}), {total} one-line edits, chunk size "
        f"{args.chunk_size} {chunker.unit}"
    )
    for leg in legs:
        values = sorted(reembedded[leg])
        print(
            f"{leg:>9}: re-embedded per edit median {statistics.median(values)}, "
            f"p95 {values[int(0.95 * (len(values) - 1))]}, max {values[-1]}; edits > 3: "
            f"{sum(v > 3 for v in values)}; edits > touched + 1: {over_touched[leg]}; "
            f"chunks/document median {statistics.median(chunk_counts[leg])}, "
            f"mean chunk {statistics.mean(chunk_sizes[leg]):.0f} chars; "
            f"chunking median {statistics.median(seconds[leg]) * 1000:.1f} ms/document"
        )
    ratio = statistics.median(seconds["anchored"]) / statistics.median(seconds["reference"])
    print(f"chunking time anchored/reference (medians): {ratio:.2f}")
    print(
        "distribution (re-embedded: edits) anchored",
        dict(sorted(Counter(reembedded["anchored"]).items())),
        "reference",
        dict(sorted(Counter(reembedded["reference"]).items())),
    )


if __name__ == "__main__":
    main()
