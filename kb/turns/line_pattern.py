"""The lines of documents a grep pattern matches, under a time bound (design §5, §16).

A turn's ``grep`` takes a regular expression from its caller — in ``kb serve``, from any read
token. Python's ``re`` cannot be stopped: a pattern whose backtracking explodes (``(a|aa)+$``
doubles its work with each character of a line of a's) holds the interpreter lock for hours, and
with it every thread of the server. So the pattern runs on the ``regex`` engine, which takes a
timeout: one :class:`LinePattern` may spend at most ``seconds`` matching, all its documents
together, then raises InvalidPattern.

The contract is ``re``'s syntax and answers, which ``regex`` — even in its ``re``-compatible mode
(``VERSION0``) — does not keep: it accepts what ``re`` refuses (``\\p{L}``, ``(?V1)``, ``\\L<name>``),
reads as syntax what ``re`` reads as literal text (``a{e<=1}`` is fuzzy matching there,
``[[:alpha:]]`` a POSIX class), and its ``\\s``, ``\\w``, ``\\d`` and ``\\b`` follow Unicode's
properties where ``re`` follows ``str.isspace``/``isalnum``/``isdecimal``. So the pattern is
compiled by ``re`` first (its error is the InvalidPattern, a RecursionError of a pattern nested too
deep too), and ``re``'s parse tree is written back for ``regex`` with every literal escaped and
every category spelled as ``re`` means it (:class:`_Translation`); ignoring case is re's too, not
regex's (:func:`_folded`), under the flags in force where each literal or class stands.

A line matches when the pattern matches it alone (``kb.lines.document_lines``: without its
``\\r`` or the first line's BOM). The engine's per-call cost with a timeout (~2.6 µs) made one call
a line 10× slower than ``re`` over a 6,600-page grep, so a document is searched whole instead (as
it is, or its lines joined by ``\\n`` when it has a ``\\r`` or a BOM), from the start of a line to
its next match; the line holding that match is then checked alone, and the search goes on from the
next line — one call for a document without a match, two for each matching line. A match that
runs past its line's end leaves the next line to be searched from its start, so every line the
pattern matches alone is found. What a whole document would answer otherwise than its lines alone
is matched line by line instead (read from the parse tree): ``\\A`` and ``\\Z`` mean one line's
start or end, so do ``^`` and ``$`` where a scoped ``(?-m:...)`` clears MULTILINE, a lookaround
looks past a line's end (``(?<!\\s)b`` fails on the ``b`` after a line
break in a document, though the line ``b`` alone matches), and an atomic group or possessive
repeat keeps a line break it took (``(?>(x|\\n)*)$`` never tries the end of ``a`` in ``a\\na``).

A pattern without any of the characters that make a regular expression more than its letters
(``REGEX_CHARACTERS``: no ``. ^ $ * + ? { } [ ] \\ | ( )``) is a literal: its search is linear in the
text whatever the text holds, so it runs on ``re`` — the same answers, without the timeout's cost
per call (about half a literal grep over 6,600 pages). The time budget is then checked between
searches.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
import time
from typing import Any

from kb.errors import InvalidPattern
from kb.lines import BOM, document_lines

sre: Any = importlib.import_module("re._constants")  # the parse tree re builds (3.11+), translated below
sre_parse: Any = importlib.import_module("re._parser")

REGEX_CHARACTERS = frozenset(".^$*+?{}[]\\|()")
"""Characters that make a pattern more than a literal; a pattern with none of them runs on ``re``."""
MAX_EXPANSION = 200_000
"""The most pattern items a grep pattern may stand for once its counted repeats are spelled out:
``regex`` writes ``a{1000}`` out as a thousand items when it compiles it, so ``(?:a{1000}){1000}``
took 0.4 s and ``a{1000000000}`` exhausted the memory of the process (``kb serve`` with it)."""

MAX_SPELLED = 10_000_000
"""The most characters of ``regex`` text the leaves of a grep pattern (its literals, classes and
anchors as written for ``regex``) may stand for once its counted repeats are spelled out: ``regex``
holds a copy of a class for each repeat, and ``\\w`` (9,000 characters written as re means it) took
10 GB as ``\\w{199000}``, ``(?:\\b){20000}`` 4 GB. At most about 60 MB."""
_LEAVES = frozenset((sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN, sre.AT, sre.GROUPREF))

_FLAG_I, _FLAG_M, _FLAG_S, _FLAG_A = (
    sre.SRE_FLAG_IGNORECASE,
    sre.SRE_FLAG_MULTILINE,
    sre.SRE_FLAG_DOTALL,
    sre.SRE_FLAG_ASCII,
)


def _ranges(codes) -> str:
    """The code points ``codes`` (sorted), as the inside of a character class (``\\U`` escapes)."""
    parts: list[str] = []
    start = previous = None
    for code in [*codes, None]:
        if code is not None and previous is not None and code == previous + 1:
            previous = code
            continue
        if start is not None:
            parts.append(_char(start) + (f"-{_char(previous)}" if previous != start else ""))
        start = previous = code
    return "".join(parts)


_RE_CATEGORIES = {  # re's categories for str (sre: Py_UNICODE_ISDECIMAL, ISSPACE, ISALNUM or _)
    "DIGIT": (str.isdecimal, lambda c: "0" <= c <= "9"),
    "SPACE": (str.isspace, lambda c: c in " \t\n\r\f\v"),
    "WORD": (lambda c: c.isalnum() or c == "_", lambda c: c.isascii() and (c.isalnum() or c == "_")),
}


@functools.cache
def _category(category, ascii_only: bool) -> str:
    """A ``regex`` expression for one character of one of re's categories (``\\d \\D \\s \\S \\w
    \\W``) as re defines it for ``str``. ``regex``'s own classes follow Unicode's properties (and a
    later Unicode) instead: its ``\\s`` skips ``\\x1c``-``\\x1f``, its ``\\w`` takes combining marks
    and leaves ``²``, and answered other lines. Its class is used with the code points where the
    two differ added or looked ahead for (computed once: about a second)."""
    name = str(category).removeprefix("CATEGORY_")
    negated = name.startswith("NOT_")
    name = name.removeprefix("NOT_")
    unicode_test, ascii_test = _RE_CATEGORIES[name]
    if ascii_only:
        body = _ranges(c for c in range(128) if ascii_test(chr(c)))
        return f"[^{body}]" if negated else f"[{body}]"
    import regex

    everything = "".join(map(chr, range(sys.maxunicode + 1)))
    theirs = set(regex.findall("\\" + name[0].lower(), everything, flags=regex.VERSION0))
    ours = {c for c in everything if unicode_test(c)}
    extra, missing = _ranges(sorted(map(ord, ours - theirs))), _ranges(sorted(map(ord, theirs - ours)))
    if negated:  # everything but ours: regex's complement, less our extras, with its extras
        upper = name[0].upper()
        own = f"[\\{upper}{missing}]"
        return f"(?:(?![{extra}]){own})" if extra else own
    own = f"[\\{name[0].lower()}{extra}]"
    return f"(?:(?![{missing}]){own})" if missing else own


@functools.cache
def _case_relevant() -> tuple[int, ...]:
    """The code points re's case-insensitive matching may treat otherwise than their own: those
    whose lowercase (``_sre.unicode_tolower``, re's) differs, those lowercases, and the extra cases
    re adds (``re._casefix``). Any other character matches a literal or class ignoring case exactly
    when it matches it with case (computed once: about a tenth of a second)."""
    lower = importlib.import_module("_sre").unicode_tolower  # re's own lowercasing
    casefix: Any = importlib.import_module("re._casefix")
    relevant: set[int] = set()
    for code in range(sys.maxunicode + 1):
        if (lowered := lower(code)) != code:
            relevant.update((code, lowered))
    for code, others in casefix._EXTRA_CASES.items():
        relevant.add(code)
        relevant.update(others)
    return tuple(sorted(relevant))


_FOLDED: dict[tuple[Any, str, int], str] = {}


def _folded(op, av, flags: int, with_case: str) -> str:
    """A ``regex`` expression for one literal, excluded literal or class of re's tree (``op``,
    ``av``) matched ignoring case as re matches it (``flags``: IGNORECASE, maybe ASCII).

    ``regex`` ignores case by Unicode's simple case folding, ``re`` by lowercasing
    (``_sre.unicode_tolower``, plus ``re._casefix``'s extra cases; only ASCII letters under
    ``(?a)``, which ``regex`` ignores): ``(?i)İ`` matched no ``I``, ``(?ai)ς`` matched ``σ``,
    ``(?i)[^a-z]`` matched ``ı``. So the answer is re's own: the node compiled by re alone and
    tried on every character case can concern (:func:`_case_relevant`); any other character
    matches as it does with case (``with_case``, the class's translation)."""
    key = (op, repr(av), flags)
    if key in _FOLDED:
        return _FOLDED[key]
    compiler: Any = importlib.import_module("re._compiler")
    node = sre_parse.SubPattern(sre_parse.State(), [(op, av)])
    unicode = 0 if flags & _FLAG_A else sre.SRE_FLAG_UNICODE  # a str pattern's default, as re.compile sets it
    matches = compiler.compile(node, flags | unicode).fullmatch
    relevant = _case_relevant()
    if op is sre.IN:  # a class without cased characters (\\w, [\\d_]): re matches it with case
        with_case_matches = compiler.compile(node, (flags & ~_FLAG_I) | unicode).fullmatch
        if all(bool(matches(chr(code))) == bool(with_case_matches(chr(code))) for code in relevant):
            _FOLDED[key] = with_case
            return with_case
    matched = _ranges([code for code in relevant if matches(chr(code))])
    if op is sre.LITERAL:  # a character case concerns matches only such characters
        written = f"[{matched}]" if av in relevant else _char(av)
    else:
        written = f"(?:(?![{_ranges(relevant)}]){with_case}" + (f"|[{matched}])" if matched else ")")
    _FOLDED[key] = written
    return written


def _char(code: int) -> str:
    return f"\\U{code:08x}"


class _Translation:
    """re's parse tree of a pattern written back in ``regex``'s syntax, every literal escaped and
    every class spelled out, so the two engines read the same pattern (see the module)."""

    def __init__(self) -> None:
        self.by_line = False  # an anchor of the string or a lookaround: matched line by line
        self.size = 0
        self.spelled = 0  # characters of the leaves' text, each times its repeat count

    def items(self, items, flags: int, scale: int) -> str:
        parts = []
        for op, av in items:
            parts.append(self.item(op, av, flags, scale))
            if op in _LEAVES:  # counted here, not in item: one Python frame per level of nesting
                self.spelled += scale * len(parts[-1])
                if self.spelled > MAX_SPELLED:
                    raise InvalidPattern(
                        f"its counted repeats spell out more than {MAX_SPELLED:,} characters of classes for "
                        "kb's grep engine (\\w is a class of thousands of characters, \\b two of them, each "
                        "one repeated count times); use smaller counts such as {1,100}"
                    )
        return "".join(parts)

    def item(self, op, av, flags: int, scale: int) -> str:
        self.size += scale
        if self.size > MAX_EXPANSION:
            raise InvalidPattern(
                f"its counted repeats stand for more than {MAX_EXPANSION:,} pattern items once spelled out "
                "(kb's grep engine writes them out when it compiles); use smaller counts such as {1,100}"
            )
        if op in (sre.LITERAL, sre.NOT_LITERAL, sre.IN) and flags & _FLAG_I:
            with_case = self.charset(av, flags) if op is sre.IN else f"[^{_char(av)}]"
            return _folded(op, av, flags & (_FLAG_I | _FLAG_A), with_case)
        if op is sre.LITERAL:
            return _char(av)
        if op is sre.NOT_LITERAL:
            return f"[^{_char(av)}]"
        if op is sre.ANY:
            return "[\\x00-\\U0010ffff]" if flags & _FLAG_S else "[^\\n]"
        if op is sre.IN:
            return self.charset(av, flags)
        if op is sre.BRANCH:
            return "(?:" + "|".join(self.items(branch, flags, scale) for branch in av[1]) + ")"
        if op is sre.SUBPATTERN:
            group, add, remove, body = av
            inner_flags = (flags | add) & ~remove
            inner = self.items(body, inner_flags, scale)
            # a scoped (?i) or (?a) is in ``inner_flags``, read where it matters (literals, classes)
            return f"({inner})" if group is not None else f"(?:{inner})"
        if op in (sre.ATOMIC_GROUP, sre.POSSESSIVE_REPEAT):
            self.by_line = True  # what it takes past a line's end in a document it never gives back
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            low, high, body = av
            inner = self.items(body, flags, scale * max(low, 1 if high is sre.MAXREPEAT else high, 1))
            count = f"{{{low},{'' if high is sre.MAXREPEAT else high}}}"
            return f"(?:{inner}){count}" + {sre.MAX_REPEAT: "", sre.MIN_REPEAT: "?"}.get(op, "+")
        if op is sre.ATOMIC_GROUP:
            return f"(?>{self.items(av, flags, scale)})"
        if op is sre.GROUPREF:  # regex folds case (simple folding) where re lowers: see _folded
            return f"(?i:\\g<{av}>)" if flags & _FLAG_I else f"(?:\\g<{av}>)"
        if op is sre.GROUPREF_EXISTS:
            group, yes, no = av
            otherwise = "|" + self.items(no, flags, scale) if no else ""
            return f"(?({group}){self.items(yes, flags, scale)}{otherwise})"
        if op in (sre.ASSERT, sre.ASSERT_NOT):
            self.by_line = True  # a lookaround sees past a line's end in a whole document
            direction, body = av
            kind = ("=" if op is sre.ASSERT else "!") if direction > 0 else ("<=" if op is sre.ASSERT else "<!")
            return f"(?{kind}{self.items(body, flags, scale)})"
        if op is sre.AT:
            return self.at(av, flags)
        raise InvalidPattern(f"kb's grep cannot run its {op} part")  # a node re adds in a later version

    def at(self, where, flags: int) -> str:
        word = _category(sre.CATEGORY_WORD, bool(flags & _FLAG_A))
        if where is sre.AT_BOUNDARY:
            return f"(?:(?<={word})(?!{word})|(?<!{word})(?={word}))"
        if where is sre.AT_NON_BOUNDARY:  # re's \\B never matches in an empty string
            return f"(?!\\A\\Z)(?:(?<={word})(?={word})|(?<!{word})(?!{word}))"
        multiline = bool(flags & _FLAG_M)
        if where in (sre.AT_BEGINNING_STRING, sre.AT_END_STRING) or not multiline:
            self.by_line = True  # the string's start or end: a line's when the line is alone
        if where is sre.AT_BEGINNING:
            return "^" if multiline else "\\A"
        if where is sre.AT_END:
            return "$" if multiline else "(?=\\n?\\Z)"
        return "\\A" if where is sre.AT_BEGINNING_STRING else "\\Z"

    def charset(self, items, flags: int) -> str:
        negated = bool(items) and items[0][0] is sre.NEGATE
        plain, categories = [], []
        for op, av in items[1:] if negated else items:
            if op is sre.LITERAL:
                plain.append(_char(av))
            elif op is sre.RANGE:
                plain.append(f"{_char(av[0])}-{_char(av[1])}")
            elif op is sre.CATEGORY:
                categories.append(_category(av, bool(flags & _FLAG_A)))
            else:
                raise InvalidPattern(f"kb's grep cannot run its {op} part")
        caret = "^" if negated else ""
        if not categories:
            return f"[{caret}{''.join(plain)}]"
        union = "|".join(([f"[{''.join(plain)}]"] if plain else []) + categories)
        return f"(?:(?!{union})[\\x00-\\U0010ffff])" if negated else f"(?:{union})"


def _quoted(pattern: str) -> str:
    """``pattern`` in quotes as the caller typed it (``'\\bfoo'`` shows one backslash), or its
    ``repr`` when it holds a character a message should not show raw (a control, a line break)."""
    return f"'{pattern}'" if pattern.isprintable() else repr(pattern)


def _translated(pattern: str, flags: int) -> tuple[str, int, bool]:
    """``pattern`` as re reads it (with re's ``flags``), written for ``regex``; the flags of the
    whole pattern (``re``'s, its own ``(?i)`` included); whether it must be matched line by line.
    Raises InvalidPattern where re refuses it."""
    try:
        re.compile(pattern, flags)  # re's verdict first: grep's contract is re's syntax
        tree = sre_parse.parse(pattern, flags)
        translation = _Translation()
        written = translation.items(tree, tree.state.flags, 1)
    except re.error as exc:
        escape = str(exc).startswith("bad escape")
        raise InvalidPattern(
            f"grep pattern {_quoted(pattern)} does not compile: {exc} (grep takes Python re's syntax"
            + (
                ", which has no such escape: no \\p{…} classes; a letter is [^\\W\\d_], a digit \\d"
                if escape
                else "; escape a character meant literally with \\"
            )
            + ")"
        ) from None
    except (RecursionError, OverflowError, ValueError, MemoryError) as exc:
        raise InvalidPattern(
            f"grep pattern {pattern!r} does not compile: too deeply nested or too large ({type(exc).__name__}); "
            "simplify the pattern"
        ) from None
    except InvalidPattern as exc:
        raise InvalidPattern(f"grep pattern {pattern!r} is refused: {exc}") from None
    return written, tree.state.flags, translation.by_line


class LinePattern:
    """A compiled grep pattern with its time budget (``seconds`` of matching from creation).

    Raises InvalidPattern when ``pattern`` does not compile with Python's ``re`` (the syntax grep
    takes), is nested too deep or spells out too large a pattern."""

    def __init__(self, pattern: str, *, ignore_case: bool, seconds: float) -> None:
        self._literal = not REGEX_CHARACTERS.intersection(pattern)
        re_flags = re.MULTILINE | (re.IGNORECASE if ignore_case else 0)
        self._by_line = False
        if self._literal:  # linear whatever the text: re, without a timeout (see the module)
            self._compiled: Any = re.compile(pattern, re_flags)
        else:
            import regex as engine  # the time limit re lacks

            written, whole, self._by_line = _translated(pattern, re_flags)
            flags = engine.VERSION0 | engine.MULTILINE  # case and ASCII are in the translation (_folded)
            try:
                self._compiled = engine.compile(written, flags)
            except RecursionError:
                raise InvalidPattern(
                    f"grep pattern {pattern!r} does not compile: too deeply nested for kb's grep engine; "
                    "simplify the pattern"
                ) from None
            except (engine.error, ValueError, OverflowError, MemoryError) as exc:
                raise InvalidPattern(f"grep pattern {pattern!r} does not compile: {exc}") from None
        self.pattern, self.seconds = pattern, seconds
        self._deadline = time.monotonic() + seconds

    def _search(self, text: str, pos: int, where: str):
        try:
            if self._literal:
                found = self._compiled.search(text, pos)
                if time.monotonic() > self._deadline:
                    raise TimeoutError
                return found
            return self._compiled.search(text, pos, timeout=max(self._deadline - time.monotonic(), 0.001))
        except TimeoutError:
            raise InvalidPattern(
                f"grep pattern {self.pattern!r} took more than {self.seconds:g} s to match (stopped in {where}): "
                "nested repetition such as (a+)+ or (a|aa)+ can take exponential time on a long line; "
                "simplify the pattern"
            ) from None

    def lines(self, path: str, text: str) -> list[tuple[int, str]]:
        """``(line number, line)`` of each line of ``text`` (the document at ``path``, named in
        errors) that the pattern matches alone, in order. Raises InvalidPattern past the budget."""
        if self._by_line:
            lines = document_lines(text)
            return [(n, line) for n, line in enumerate(lines, start=1) if self._search(line, 0, f"{path}, line {n}")]
        # searched as the lines are matched alone: without \r before a \n or a BOM (most
        # documents have neither, and are searched as they are)
        scanned = "\n".join(document_lines(text)) if "\r" in text or text.startswith(BOM) else text
        match = self._search(scanned, 0, path)
        if match is None:  # most documents of a grep: no line is split or counted
            return []
        lines = document_lines(text)
        index = scanned.count("\n", 0, match.start())
        found: list[tuple[int, str]] = []
        while index < len(lines):  # an empty match past the last line's end is no line's
            if self._search(lines[index], 0, f"{path}, line {index + 1}") is not None:
                found.append((index + 1, lines[index]))
            end = scanned.find("\n", match.start())
            if end < 0:
                break
            match = self._search(scanned, end + 1, path)
            if match is None:
                break
            index += 1 + scanned.count("\n", end + 1, match.start())
        return found
