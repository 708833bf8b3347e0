"""Generators and checks of the citation fuzz (design §8), shared by the CI tests and
``bin/fuzz_citations.py``. Everything draws from one ``random.Random`` so hypothesis (CI) and a
seed (the bench) drive the same code.

Pure layer: line counting vs character offsets, envelope rendering read back by a reader,
the normalizer against an answer whose canonical form is known by construction, and ``follow``
over in-memory revision histories where each line carries an identity.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field

from kb.citations.envelope import Envelope, excerpt_lines
from kb.citations.follow import follow_history
from kb.citations.normalizer import Citation, HandleInfo, normalize
from kb.lines import document_lines, line_of, line_starts

# -- documents -------------------------------------------------------------------------------------
WORDS = ["refund", "annual", "plan", "policy", "billing", "days", "contact", "the", "a", "of"]
ODD_PIECES = [
    "\t",
    "\r",
    "\u2028",
    "\u2029",
    "\x0c",
    "\x0b",
    "\x85",
    "\x1c",
    "年度计划",
    "退款",
    "·",
    "  ",
    "#",
    "-",
    "[1]",
    "`x`",
    "é",
]


def random_line(rng: random.Random) -> str:
    """One line of text (no ``\\n``) mixing words, CJK, tabs and characters other splitters split on."""
    roll = rng.random()
    if roll < 0.12:
        return ""
    if roll < 0.17:
        return "x" * rng.randint(300, 3000)  # a very long line
    parts = [rng.choice(WORDS) for _ in range(rng.randint(1, 8))]
    for _ in range(rng.randint(0, 2)):
        parts.insert(rng.randint(0, len(parts)), rng.choice(ODD_PIECES))
    return " ".join(parts)


def random_document_lines(rng: random.Random, max_lines: int = 40) -> list[str]:
    """Lines of a document, with repeated paragraphs now and then."""
    lines: list[str] = []
    for _ in range(rng.randint(1, max_lines)):
        if lines and rng.random() < 0.15:
            start = rng.randrange(len(lines))
            lines += lines[start : start + rng.randint(1, 3)]  # a repeated paragraph
        else:
            lines.append(random_line(rng))
    return lines


def encode_document(rng: random.Random, lines: list[str]) -> str:
    """Join lines as a file would hold them: LF or CRLF per line, a BOM now and then, with or
    without a final newline. A line must not end in ``\\r`` (the counter drops a final ``\\r``)."""
    bom = "\ufeff" if rng.random() < 0.15 else ""
    crlf = rng.random() < 0.3
    ends = ["\r\n" if (crlf and rng.random() < 0.9) else "\n" for _ in lines]
    text = bom + "".join(line + end for line, end in zip(lines, ends))
    if rng.random() < 0.35 and lines and lines[-1]:  # no final newline (never after an empty last line)
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
    return text


def canonical_lines(lines: list[str]) -> list[str]:
    """Lines as the counter can read them back: no line ends in ``\\r`` (a final ``\\r`` is not
    part of a line's text, whatever the line ending)."""
    return [line.rstrip("\r") for line in lines]


# -- line counting -----------------------------------------------------------------------------------
def check_line_counting(rng: random.Random) -> None:
    """document_lines agrees with how the document was built, with bytes, and with line_of."""
    lines = canonical_lines(random_document_lines(rng))
    text = encode_document(rng, lines)
    got = document_lines(text)
    assert got == lines, (text, got, lines)
    assert document_lines(text.encode("utf-8")) == got
    starts = line_starts(text)
    offset_of_line1 = 1 if text.startswith("\ufeff") else 0
    for number, line in enumerate(got, start=1):
        begin = starts[number - 1] + (offset_of_line1 if number == 1 else 0)
        if line:
            assert line_of(starts, begin) == number
            assert text[begin : begin + len(line)] == line
            assert line_of(starts, begin + len(line) - 1) == number


# -- envelope rendering -------------------------------------------------------------------------------
def read_envelope(rendered: str) -> tuple[dict[str, str], list[tuple[int | None, str]]]:
    """A reader's view of a rendered envelope: the attributes and the ``(number, text)`` lines,
    split on ``\\n`` only (U+2028 and friends are inside lines). A numbered row is the number
    right-aligned in 6 columns and two spaces; an un-numbered row is 4 spaces and the text."""
    head, *body, tail = rendered.split("\n")
    assert tail == "</document>"
    attrs = dict(re.findall(r'(\w+)="([^"]*)"', head))
    numbered = attrs.get("numbered") != "false"
    lines: list[tuple[int | None, str]] = []
    for row in body:
        if row == "   ⋮":
            continue
        if numbered or (row[:6].strip().isdigit() and row[6:8] == "  "):
            lines.append((int(row[:6]), row[8:]))
        else:
            lines.append((None, row[4:]))
    return attrs, lines


def check_rendering(rng: random.Random) -> None:
    """Excerpt and window envelopes read back to exactly the document's lines at those numbers."""
    lines = canonical_lines(random_document_lines(rng))
    text = encode_document(rng, lines)
    doc = document_lines(text.encode("utf-8"))
    spans = []
    for _ in range(rng.randint(1, 3)):
        a = rng.randint(1, len(doc))
        spans.append((a, rng.randint(a, min(len(doc), a + 5))))
    envelope = Envelope("/documents/x.md", "x", "f" * 40, "excerpts", excerpt_lines(doc, spans), cite=1)
    _, shown = read_envelope(envelope.render())
    assert shown == envelope.lines
    for number, line in shown:
        assert doc[number - 1] == line
    full = Envelope("/documents/x.md", "x", "f" * 40, "full", list(enumerate(doc, start=1)))
    offset = rng.randint(0, len(doc))
    window = full.window(offset, rng.choice([None, rng.randint(0, 10)]))
    attrs, shown = read_envelope(window.render())
    assert shown == [(n, doc[n - 1]) for n, _ in shown]
    if window.view == "window":
        assert int(attrs["of"]) == len(doc)


# -- the normalizer ------------------------------------------------------------------------------------
@dataclass
class AnswerCase:
    """An answer and what normalizing it must give."""

    text: str
    expected_text: str
    expected_citations: list[Citation]
    expected_unknown: list[int]
    expected_degraded: int
    handles: dict[int, HandleInfo] = field(default_factory=dict)


def _written(rng: random.Random, handle: int, lo: int | None, hi: int | None) -> str:
    """One citation item in a random accepted form."""
    if lo is None:
        return str(handle)
    if lo == hi and rng.random() < 0.5:
        return f"{handle}:L{lo}"
    dash = rng.choice(["-", "-", "–", "—"])
    second = rng.choice(["L", "", "l"])
    first = rng.choice(["L", "L", "l"])
    space = rng.choice(["", "", " "])
    return f"{handle}:{space}{first}{lo}{space}{dash}{space}{second}{hi}"


DISTRACTORS = [
    "a[1]",
    "f(x)[2]",
    "m[1][2]",
    "[x]",
    "[ ]",
    "[[1]]",
    "[[Note]]",
    "[text](https://e.x/1)",
    "[1](u)",
    "`[1]`",
    "``a[2]``",
    "\\[1]",
    "[10:30]",
    "[^1]",
    "[text][1]",
    "[1a]",
    "nums[3:L2]",
]


def random_answer(rng: random.Random) -> AnswerCase:
    """An answer of prose, distractors, code and citations in every bracket form, with its
    canonical form built alongside."""
    handles = {n: HandleInfo(rng.random() < 0.75, rng.choice([0, 1, 5, 30])) for n in range(1, rng.randint(2, 7))}
    out, expected, citations, unknown, degraded = ["Answer:"], ["Answer:"], [], [], 0
    for _ in range(rng.randint(1, 12)):
        roll = rng.random()
        if roll < 0.25:
            token = rng.choice(WORDS + ["退款政策", "(see", "note).", "x,"])
            out.append(" " + token)
            expected.append(" " + token)
            continue
        if roll < 0.4:
            token = rng.choice(DISTRACTORS)
            out.append(" " + token)
            expected.append(" " + token)
            continue
        if roll < 0.45:
            block = f"\n```\n{rng.choice(DISTRACTORS)} [1:L2] [99]\n```\nok"
            out.append(block)
            expected.append(block)
            continue
        groups = [[] for _ in range(rng.randint(1, 3))]  # adjacent brackets, each with 1-3 items
        canon_groups = []
        for items in groups:
            kept: list[Citation] = []
            for _ in range(rng.randint(1, 3)):
                handle = rng.randint(1, len(handles) + 2)
                info = handles.get(handle)
                lo = hi = None
                if rng.random() < 0.7:
                    lo = rng.randint(1, 40)
                    hi = lo if rng.random() < 0.3 else rng.randint(1, 40)
                items.append(_written(rng, handle, lo, hi))
                if info is None:
                    unknown.append(handle)
                    continue
                if lo is None:
                    c = Citation(handle)
                elif not info.numbered or info.line_count == 0:
                    c = Citation(handle)
                    degraded += 1
                else:
                    a, b = sorted((lo, hi))  # a range starting past the end cites the whole document
                    c = Citation(handle) if a > info.line_count else Citation(handle, a, min(b, info.line_count))
                if c not in kept:
                    kept.append(c)
            canon_groups.append(kept)
        separators = [rng.choice([",", ", ", ";", " , "]) for _ in range(3)]
        written = "".join(
            "["
            + "".join(item + (separators[i % 3] if i < len(items) - 1 else "") for i, item in enumerate(items))
            + "]"
            for items in groups
        )
        out.append(" " + written)
        canon = "".join(str(c) for g in canon_groups for c in g)
        citations += [c for g in canon_groups for c in g]
        expected.append(" " + canon if canon else "")
    out.append(".")
    expected.append(".")
    return AnswerCase("".join(out), "".join(expected), citations, unknown, degraded, handles)


def check_normalizer(rng: random.Random) -> None:
    case = random_answer(rng)
    result = normalize(case.text, case.handles.get, drop_unknown=True)
    assert result.text == case.expected_text, (case.text, result.text, case.expected_text)
    assert result.citations == case.expected_citations
    assert result.unknown == case.expected_unknown
    assert len(result.degraded) == case.expected_degraded
    assert normalize(result.text, case.handles.get, drop_unknown=True).text == result.text  # idempotent


# -- follow over in-memory histories -------------------------------------------------------------------
@dataclass
class FollowTally:
    """Counts of (expected, answered) follow outcomes, and breaches of the hard rules."""

    confusion: Counter = field(default_factory=Counter)
    wrong_unchanged: int = 0  # answered unchanged where the text differs: must stay 0
    missed_unchanged: int = 0  # cited lines intact and unique in every version, answer not unchanged: must stay 0
    ambiguous_missed: int = 0  # intact, but their text repeats in some version: not decidable from text alone
    wrong_numbers: int = 0  # intact, cited block occurs once at HEAD, numbers differ: must stay 0
    ambiguous_numbers: int = 0  # intact, several copies at HEAD, another copy chosen (text identical)


def edit_history(
    rng: random.Random,
    lines: list[tuple[int, str]],
    cited: tuple[int, int],
    max_edits: int = 6,
) -> list[tuple[int, str]]:
    """Apply random edits to ``(identity, text)`` lines: inserts and deletes above, below and
    inside the cited range, and rewrites of lines (a rewrite keeps the identity, changes text)."""
    next_id = max((i for i, _ in lines), default=0) + 1
    lines = list(lines)
    for _ in range(rng.randint(1, max_edits)):
        roll = rng.random()
        ids = [i for i, _ in lines]
        inside = [k for k, i in enumerate(ids) if cited[0] <= i <= cited[1]]
        where = rng.choice(["above", "below", "inside", "anywhere"]) if inside else "anywhere"
        if where == "above":
            k = rng.randint(0, inside[0])
        elif where == "below":
            k = rng.randint(inside[-1] + 1, len(lines))
        elif where == "inside":
            k = rng.randint(inside[0], inside[-1])
        else:
            k = rng.randint(0, len(lines))
        if roll < 0.45:
            for _ in range(rng.randint(1, 3)):
                text = rng.choice([random_line(rng), *(t for _, t in lines[:3])])  # sometimes a copy
                lines.insert(k, (next_id, text))
                next_id += 1
        elif roll < 0.8 and lines:
            del lines[min(k, len(lines) - 1) : min(k, len(lines) - 1) + rng.randint(1, 2)]
        elif lines:
            k = min(k, len(lines) - 1)
            lines[k] = (lines[k][0], random_line(rng) + " (edited)")
    return lines


def random_history(
    rng: random.Random, old: list[tuple[int, str]], cited: tuple[int, int]
) -> list[list[tuple[int, str]] | None]:
    """Later versions of a document, oldest first: small edits (each ``edit_history``), now and
    then a removal (None) followed by a restore of the last version, and rarely a removal at the end."""
    versions: list[list[tuple[int, str]] | None] = []
    current = old
    for _ in range(rng.randint(1, 5)):
        if rng.random() < 0.1:
            versions += [None, current]  # deleted, then restored
        else:
            current = edit_history(rng, current, cited, max_edits=2)
            versions.append(current)
    if rng.random() < 0.05:
        versions.append(None)
    return versions


def check_follow(rng: random.Random, tally: FollowTally) -> None:
    """Cite a range, run a random history, map the range, and compare with the line identities."""
    old_text = canonical_lines(random_document_lines(rng, 30))
    old = list(enumerate(old_text, start=1))
    start = rng.randint(1, len(old))
    end = rng.randint(start, min(len(old), start + 4))
    history = random_history(rng, old, (start, end))
    versions = [None if v is None else [t for _, t in v] for v in history]
    mapping = follow_history(old_text, versions, start, end)
    cited = old_text[start - 1 : end]
    new = history[-1]
    new_text = versions[-1]
    positions: list[int] = []
    if new is None:
        expected = "deleted"
    else:
        positions = [k for k, (i, _) in enumerate(new) if start <= i <= end]
        intact = bool(positions) and (
            len(positions) == end - start + 1
            and positions == list(range(positions[0], positions[0] + len(positions)))
            and [t for _, t in new[positions[0] : positions[-1] + 1]] == cited
        )
        expected = "unchanged" if intact else ("deleted" if not positions else "changed")
    tally.confusion[(expected, mapping.status)] += 1
    if mapping.status == "unchanged" and new_text[mapping.start - 1 : mapping.end] != cited:
        tally.wrong_unchanged += 1
    if expected == "unchanged":
        if mapping.status != "unchanged":
            unique = all(sum(1 for _, t in v if t == c) == 1 for v in (old, *(h for h in history if h)) for c in cited)
            if unique:
                tally.missed_unchanged += 1
            else:
                tally.ambiguous_missed += 1
        elif (mapping.start - 1, mapping.end - 1) != (positions[0], positions[-1]):
            copies = sum(1 for k in range(len(new_text) - len(cited) + 1) if new_text[k : k + len(cited)] == cited)
            if copies == 1:
                tally.wrong_numbers += 1
            else:
                tally.ambiguous_numbers += 1


PURE_CHECKS = (check_line_counting, check_rendering, check_normalizer)


# -- end to end: the real store, index and registry ----------------------------------------------------
@dataclass
class Doc:
    """A document of the model: its path, lines as ``(identity, text)`` and its file style."""

    path: str
    lines: list[tuple[int, str]]
    crlf: bool
    bom: bool
    final_newline: bool

    def data(self) -> bytes:
        end = "\r\n" if self.crlf else "\n"
        text = ("\ufeff" if self.bom else "") + "".join(t + end for _, t in self.lines)
        if not self.final_newline and self.lines and self.lines[-1][1]:
            text = text[: -len(end)]
        return text.encode("utf-8")


@dataclass
class Cited:
    """A citation the reader wrote and what it must resolve to."""

    citation: Citation
    path: str
    key: int  # the model document's key (identity across moves)
    lines: list[tuple[int, str]]  # the numbered lines the reader saw; empty for a document citation
    identities: list[int]
    degrade: bool = False  # a line citation of a handle shown un-numbered: the normalizer strips it


@dataclass
class E2ETally:
    """Outcomes of the end-to-end fuzz."""

    cases: int = 0
    resolutions: int = 0
    confidently_wrong: int = 0
    degraded: int = 0
    expected_degraded: int = 0
    follow: FollowTally = field(default_factory=FollowTally)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # follow misses, for a person to look at


class E2ECase:
    """One random conversation over one fresh workspace: documents, a reader citing only what it
    was shown, histories through transactions and turns, then every resolution checked."""

    def __init__(self, kb, rng: random.Random, workspace_id: int, tally: E2ETally) -> None:
        self.kb, self.rng, self.ws, self.tally = kb, rng, workspace_id, tally
        self.docs: dict[int, Doc] = {}
        self.removed: dict[int, tuple[Doc, str]] = {}  # key → (model, a revision holding it)
        self.next_id = 1
        self.cited: list[Cited] = []
        self.seen_numbered: dict[int, bool] = {}  # handle → shown numbered lines so far
        self.versions: dict[int, list[list[str]]] = {}  # key → the lines of each edited version

    def _lines(self, n: int) -> list[tuple[int, str]]:
        texts = canonical_lines(random_document_lines(self.rng, n))
        out = [(self.next_id + k, t) for k, t in enumerate(texts)]
        self.next_id += len(out)
        return out

    def run(self) -> None:
        kb, rng = self.kb, self.rng
        kb.create_workspace(self.ws)
        with kb.transaction(self.ws, "seed", "fuzz") as tx:
            for key in range(rng.randint(2, 4)):
                doc = Doc(
                    f"/documents/d{key}.md",
                    self._lines(25),
                    rng.random() < 0.3,
                    rng.random() < 0.15,
                    rng.random() < 0.7,
                )
                self.docs[key] = doc
                tx.write(doc.path, doc.data())
        kb.index(self.ws)
        self.conv = kb.conversation(self.ws, f"chat-{self.ws}")
        for _ in range(rng.randint(1, 2)):
            self._maybe_strip_spans()
            self._show_and_cite()
            for _ in range(rng.randint(1, 3)):
                self._history_step()
            kb.index(self.ws)
        self._check_all()
        self.tally.cases += 1

    # -- showing and citing ------------------------------------------------------------------------
    def _maybe_strip_spans(self) -> None:
        from kb.db import database
        from support.named_queries import queries

        self.stripped = None
        if self.docs and self.rng.random() < 0.4:
            doc = self.stripped = self.rng.choice(list(self.docs.values()))
            with database.transaction(self.kb.database_url) as conn:
                conn.execute(queries["test_null_chunk_spans"], {"workspace_id": self.ws, "path": doc.path})

    def _key_of(self, path: str) -> int | None:
        return next((k for k, d in self.docs.items() if d.path == path), None)

    def _show_and_cite(self) -> None:
        rng = self.rng
        shown = []
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.5 and self.docs:
                doc = self.stripped if self.stripped and rng.random() < 0.6 else rng.choice(list(self.docs.values()))
                texts = [t for _, t in doc.lines if t.strip()]
                query = (
                    " ".join(rng.sample(WORDS, 2)) if not texts else " ".join(rng.choice(texts).split()[:3]) or "refund"
                )
                try:
                    shown += self.conv.search(query, k=rng.randint(1, 3))
                except Exception as exc:  # InvalidInput for a query of odd characters only
                    if type(exc).__name__ != "InvalidInput":
                        raise
            elif self.docs:
                doc = rng.choice(list(self.docs.values()))
                offset = rng.randint(0, max(0, len(doc.lines) - 1))
                shown.append(self.conv.read(doc.path, offset=offset, limit=rng.choice([None, rng.randint(1, 8)])))
        written, expected = [], []
        for envelope in shown:  # the reader answers after seeing every envelope of the round
            self.seen_numbered[envelope.cite] = self.seen_numbered.get(envelope.cite, False) or any(
                n is not None for n, _ in envelope.lines
            )
            self._check_envelope_reads_back(envelope)
        for envelope in shown:
            key = self._key_of(envelope.path)
            numbered = [(n, t) for n, t in envelope.lines if n is not None]
            if key is None:
                raise AssertionError(
                    f"search showed {envelope.path}, not a document of the model {self.docs} "
                    f"HEAD {self.kb.list_paths(self.ws)} log {[(r.message, r.changes) for r in self.kb.history(self.ws)]}"
                )
            model = self.docs[key]
            ids = (
                {n: model.lines[n - 1][0] for n, _ in numbered}
                if key is not None and self._model_matches(model, envelope)
                else {}
            )
            for _ in range(rng.randint(1, 2)):
                if numbered and rng.random() < 0.8:
                    runs = _runs(numbered)
                    run = rng.choice(runs)
                    a = rng.randrange(len(run))
                    b = rng.randrange(a, min(len(run), a + 4))
                    part = run[a : b + 1]
                    c = Citation(envelope.cite, part[0][0], part[-1][0])
                    expected.append(Cited(c, envelope.path, key, part, [ids.get(n) for n, _ in part]))
                    written.append(_written(rng, c.handle, c.start, c.end))
                elif not self.seen_numbered[envelope.cite] and rng.random() < 0.7:
                    lo = rng.randint(1, 9)
                    written.append(_written(rng, envelope.cite, lo, lo + rng.randint(0, 3)))
                    expected.append(Cited(Citation(envelope.cite), envelope.path, key, [], [], degrade=True))
                    self.tally.expected_degraded += 1
                else:
                    written.append(str(envelope.cite))
                    expected.append(Cited(Citation(envelope.cite), envelope.path, key, [], []))
        if not written:
            return
        answer, i = ["Answer"], 0
        while i < len(written):
            group = written[i : i + rng.randint(1, 3)]
            i += len(group)
            answer.append(rng.choice([" ", " see "]) + "[" + ", ".join(group) + "]" + rng.choice(["", ".", " and"]))
        result = self.conv.normalize("".join(answer))
        self.tally.degraded += len(result.degraded)
        if len(result.degraded) != sum(1 for e in expected if e.degrade):
            self._fail(
                f"normalize {''.join(answer)!r} degraded {result.degraded}, expected "
                f"{[e.citation for e in expected if e.degrade]}"
            )
        got = result.citations
        want = [e.citation for e in expected]
        if set(got) != set(want) or result.unknown:  # a repeat within one bracket is written once
            self._fail(f"normalize {''.join(answer)!r} gave {got} (unknown {result.unknown}), expected {want}")
        self.cited += expected

    def _check_envelope_reads_back(self, envelope) -> None:
        """What an envelope names is where its lines are: the document at (path, revision) reads
        back, and every numbered line is that line of it (design §8; a moved, unedited document
        once came back under its new path with the revision before the move)."""
        if envelope.revision is None:
            return
        try:
            lines = document_lines(self.kb.read_as_of(self.ws, envelope.revision, envelope.path))
        except Exception as exc:  # any failure to read it back is the finding
            self._fail(f"envelope {envelope.path} @ {envelope.revision[:12]} does not read back: {exc}")
            return
        for n, text in envelope.lines:
            if n is not None and (n > len(lines) or lines[n - 1] != text):
                self._fail(
                    f"envelope {envelope.path} @ {envelope.revision[:12]} line {n} is {text!r}, "
                    f"the document has {lines[n - 1] if n <= len(lines) else None!r}"
                )

    @staticmethod
    def _model_matches(model: Doc, envelope) -> bool:
        return all(0 < n <= len(model.lines) and model.lines[n - 1][1] == t for n, t in envelope.lines if n is not None)

    # -- history -------------------------------------------------------------------------------------
    def _commit(self, message: str, ops, via_turn: bool) -> str | None:
        if via_turn:
            turn = self.kb.turn(self.ws, f"t{self.rng.getrandbits(32)}", "fuzz")
            for op, *args in ops:
                getattr(turn, op)(*args)
            result = turn.commit(message)
            return None if result is None else result.revision
        with self.kb.transaction(self.ws, message, "fuzz") as tx:
            for op, *args in ops:
                getattr(tx, op)(*args)
        return tx.revision

    def _history_step(self) -> None:
        rng = self.rng
        roll = rng.random()
        via_turn = rng.random() < 0.35
        keys = list(self.docs)
        if roll < 0.55 and keys:
            key = rng.choice(keys)
            doc = self.docs[key]
            cited_ids = [i for c in self.cited if c.key == key for i in c.identities if i is not None]
            target = rng.choice(cited_ids) if cited_ids else None
            doc.lines = edit_history(rng, doc.lines, (target, target) if target else (0, -1), max_edits=3)
            if not doc.lines:
                doc.lines = self._lines(3)
            self.next_id = max([self.next_id, *(i + 1 for i, _ in doc.lines)])
            self._commit("edit", [("write", doc.path, doc.data())], via_turn)
            self.versions.setdefault(key, []).append(document_lines(doc.data()))
        elif roll < 0.7 and keys:
            key = rng.choice(keys)
            doc = self.docs[key]
            new_path = f"/documents/m{rng.getrandbits(24)}/{doc.path.rsplit('/', 1)[1]}"
            self._commit("move", [("move", doc.path, new_path)], via_turn)
            doc.path = new_path
        elif roll < 0.78 and len(keys) >= 2:
            a, b = rng.sample(keys, 2)
            pa, pb = self.docs[a].path, self.docs[b].path
            self._commit(
                "swap",
                [("move", pa, "/documents/swap.tmp.md"), ("move", pb, pa), ("move", "/documents/swap.tmp.md", pb)],
                False,
            )
            self.docs[a].path, self.docs[b].path = pb, pa
        elif roll < 0.86 and len(keys) >= 2:
            key = rng.choice(keys)
            doc = self.docs.pop(key)
            revision = self.kb.head(self.ws)
            self._commit("delete", [("remove", doc.path)], via_turn)
            self.removed[key] = (doc, revision)
        elif roll < 0.93 and self.removed:
            key = rng.choice(list(self.removed))
            doc, revision = self.removed.pop(key)
            if self._key_of(doc.path) is None:
                self.kb.restore(self.ws, doc.path, revision, "fuzz")
                self.docs[key] = doc
            else:
                self.removed[key] = (doc, revision)
        elif roll < 0.97:
            self.kb.reindex(self.ws)
        else:
            from kb.db import database
            from support.named_queries import queries

            with database.transaction(self.kb.database_url) as conn:
                conn.execute(queries["test_truncate_chunks"])

    def _fail(self, message: str) -> None:
        self.tally.confidently_wrong += 1
        self.tally.failures.append(f"workspace {self.ws}: {message}")

    # -- resolution ------------------------------------------------------------------------------------
    def _check_all(self) -> None:
        head_docs = {d.path: (k, d) for k, d in self.docs.items()}
        for cited in self.cited:
            res = self.conv.resolve(cited.citation, follow=True)
            self.tally.resolutions += 1
            if cited.lines:
                if res.level != "lines" or res.lines != cited.lines:
                    self._fail(f"{cited.citation} resolved to {res.lines[:5]} ({res.level}), shown {cited.lines}")
                    continue
            elif res.level != "document":
                self._fail(f"{cited.citation} should resolve to the document, got {res.level}")
                continue
            follow = res.follow
            current = self.kb.read(self.ws, follow.path) if follow.path else None
            now = document_lines(current) if current is not None else None
            cited_text = [t for _, t in res.lines]
            if (
                follow.status == "unchanged"
                and (now is None or now[follow.start - 1 : follow.end] != cited_text)
                and cited_text
            ):
                self.tally.follow.wrong_unchanged += 1
                self._fail(f"follow said unchanged for {cited.citation} but HEAD differs")
            if not cited.lines or None in cited.identities:
                continue
            entry = next(((k, d) for k, d in head_docs.values() if k == cited.key), None)
            positions = [] if entry is None else [p for p, (i, _) in enumerate(entry[1].lines) if i in cited.identities]
            intact = (
                bool(positions)
                and len(positions) == len(cited.identities)
                and positions == list(range(positions[0], positions[0] + len(positions)))
                and [t for _, t in entry[1].lines[positions[0] : positions[-1] + 1]] == cited_text
            )
            expected = "unchanged" if intact else ("deleted" if not positions else "changed")
            self.tally.follow.confusion[(expected, follow.status)] += 1
            if expected == "unchanged":
                if follow.status != "unchanged":
                    # which copy of a repeated line survived cannot be told from text: every version
                    # the document went through must hold each cited line once for a miss to count
                    at_revision = document_lines(self.kb.read_as_of(self.ws, res.handle.revision, res.handle.path))
                    versions = [at_revision, *self.versions.get(cited.key, [])]
                    if any(sum(1 for t in v if t == c) > 1 for v in versions for c in cited_text):
                        self.tally.follow.ambiguous_missed += 1
                    else:
                        self.tally.follow.missed_unchanged += 1
                        self.tally.notes.append(
                            f"workspace {self.ws}: {cited.citation} intact at {entry[1].path} lines "
                            f"{positions[0] + 1}-{positions[-1] + 1}, follow answered {follow}"
                        )
                elif (follow.start - 1, follow.end - 1) != (positions[0], positions[-1]) or follow.path != entry[
                    1
                ].path:
                    if (
                        sum(
                            1
                            for k in range(len(now) - len(cited_text) + 1)
                            if now[k : k + len(cited_text)] == cited_text
                        )
                        == 1
                    ):
                        self.tally.follow.wrong_numbers += 1
                    else:
                        self.tally.follow.ambiguous_numbers += 1


def _runs(numbered: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """Runs of consecutive line numbers, in order."""
    runs: list[list[tuple[int, str]]] = []
    for n, t in numbered:
        if runs and runs[-1][-1][0] == n - 1:
            runs[-1].append((n, t))
        else:
            runs.append([(n, t)])
    return runs


def run_e2e(kb, seed: int, cases: int, first_workspace: int = 1) -> E2ETally:
    """Run ``cases`` end-to-end cases on ``kb``, workspaces ``first_workspace``…; returns the tally."""
    tally = E2ETally()
    for k in range(cases):
        E2ECase(kb, random.Random(seed * 1_000_003 + k), first_workspace + k, tally).run()
    return tally
