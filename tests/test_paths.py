"""Tests of the path law (design §2.2, §2.3, §2.4): kb/paths.py."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kb.errors import InvalidPath, InvalidWorkspace, KbError
from kb.paths import (
    BIDI_CONTROLS,
    MAX_SEGMENT_BYTES,
    NameRegistry,
    StorePath,
    author_path,
    blob_id,
    check_new_segment,
    name_key,
    safe_filename,
    safe_folder_segment,
    suffixed_from,
    unique_identifier_hash,
    unique_name,
)

JA_300 = "日本語の長いタイトル" * 10  # 100 characters × 3 bytes = 300 bytes
JA_CLAMPED = ("日本語の長いタイトル" * 9)[:84] + ".md"  # 84 × 3 = 252 bytes + ".md" = 255
EMOJI = "\U0001f600\U0001f680\U0001f44d\U0001f3fd"  # 😀🚀👍🏽

FILENAME_CASES = [
    # (title, expected file name)
    ("Node.js", "Node.js.md"),
    ("v1.2", "v1.2.md"),
    ("Refund policy", "Refund policy.md"),
    ("notes.md", "notes.md"),
    ("Report.MD", "Report.MD"),
    ("Report.Md", "Report.Md"),
    ("a/b", "a_b.md"),
    ("a\\b", "a_b.md"),
    ('Q: "why?"', "Q_ _why__.md"),
    ("<x>|*", "_x___.md"),
    ("..", "untitled.md"),
    (".", "untitled.md"),
    ("...", "untitled.md"),
    (".git", "_.git.md"),
    (".gitignore", "_.gitignore.md"),
    (".keep", "_.keep.md"),
    (".hidden", "_.hidden.md"),
    (".md", "_.md"),
    ("  .x", "_.x.md"),
    ("CON", "CON_.md"),
    ("con", "con_.md"),
    ("con.txt", "con_.txt.md"),  # device check is on the stem before the first dot
    ("CON.md", "CON_.md"),
    ("COM1.md", "COM1_.md"),
    ("lpt9", "lpt9_.md"),
    ("Nul", "Nul_.md"),
    ("aux.tar.gz", "aux_.tar.gz.md"),
    ("PRN ", "PRN_.md"),
    ("COM10", "COM10.md"),
    ("CONSOLE", "CONSOLE.md"),
    ("COM0", "COM0.md"),
    ("com\u00b9.txt", "com\u00b9_.txt.md"),  # Windows also reserves COM¹²³/LPT¹²³
    ("conout$", "conout$_.md"),
    ("\uff23\uff2f\uff2e", "\uff23\uff2f\uff2e.md"),  # fullwidth ＣＯＮ is not a device
    ("con_", "con_.md"),
    ("", "untitled.md"),
    ("   ", "untitled.md"),
    ("\t\n", "untitled.md"),
    ("\x00", "untitled.md"),
    ("a\x00b", "ab.md"),
    ("\x1b[31mred\x1b[0m", "[31mred[0m.md"),
    ("a\x7fb\x9fc", "abc.md"),
    ("trailing dots...", "trailing dots.md"),
    ("trailing . . ", "trailing.md"),
    ("multiple    spaces", "multiple spaces.md"),
    ("tabs\tand\nnewlines\r\n", "tabs and newlines.md"),
    ("  padded  ", "padded.md"),
    ("non\u00a0breaking", "non breaking.md"),
    ("Cafe\u0301", "Caf\u00e9.md"),  # NFD in, NFC out
    ("Caf\u00e9", "Caf\u00e9.md"),
    ("e\x00\u0301", "\u00e9.md"),  # removed NUL no longer blocks composition
    ("\u212b", "\u00c5.md"),  # ANGSTROM SIGN → Å (NFC singleton)
    (EMOJI, EMOJI + ".md"),
    ("🙂", "🙂.md"),
    (JA_300, JA_CLAMPED),
    ("x" * 300, "x" * 252 + ".md"),
    ("x" * 251 + " y" * 10, "x" * 251 + ".md"),  # cut leaves a trailing space: stripped
    ("é" * 200, "é" * 126 + ".md"),
    ("Licenses & payment", "Licenses & payment.md"),
    ("report\u202egnp.exe", "reportgnp.exe.md"),  # a right-to-left override would show reportexe.png
    ("a\u2066b\u2069c\u202a", "abc.md"),  # isolates and embeddings too
    ("\u0645\u200f\u0627", "\u0645\u200f\u0627.md"),  # the right-to-left mark stays
    (
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645.md",
    ),  # Persian's ZWNJ stays
]


@pytest.mark.parametrize(("title", "expected"), FILENAME_CASES)
def test_safe_filename_table(title: str, expected: str) -> None:
    got = safe_filename(title)
    assert got == expected
    assert safe_filename(got) == got
    assert len(got.encode()) <= MAX_SEGMENT_BYTES


FOLDER_CASES = [
    ("Licenses & payment", "Licenses & payment"),
    ("", "folder"),
    ("  ", "folder"),
    ("..", "folder"),
    (".git", "_.git"),
    ("CON", "CON_"),
    ("con.d", "con_.d"),
    ("a/b:c", "a_b_c"),
    ("x.md", "x.md"),
    ("v1.2", "v1.2"),
    ("Cafe\u0301", "Caf\u00e9"),
    ("dots...", "dots"),
    ("x" * 300, "x" * 255),
    (JA_300, JA_300[:85]),
]


@pytest.mark.parametrize(("name", "expected"), FOLDER_CASES)
def test_safe_folder_segment_table(name: str, expected: str) -> None:
    got = safe_folder_segment(name)
    assert got == expected
    assert safe_folder_segment(got) == got


def test_non_str_titles_are_type_errors() -> None:
    with pytest.raises(TypeError):
        safe_filename(b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        safe_folder_segment(None)  # type: ignore[arg-type]


# --- collisions ---------------------------------------------------------------------------------


def test_name_key_case_and_normalization() -> None:
    assert name_key("Caf\u00e9.md") == name_key("Cafe\u0301.md") == name_key("CAFÉ.MD")
    assert name_key("Roadmap.md") == name_key("roadmap.md")
    assert name_key("a.md") != name_key("b.md")
    assert name_key("\u0131.md") == name_key("I.md") == name_key("i.md")  # NTFS upper-cases
    assert name_key("Stra\u00dfe") == name_key("STRASSE")


def test_nfc_nfd_collide() -> None:
    reg = NameRegistry()
    assert reg.claim(safe_filename("Caf\u00e9")) == "Caf\u00e9.md"
    assert reg.claim(safe_filename("Cafe\u0301")) == "Caf\u00e9 (2).md"


def test_case_only_collision() -> None:
    assert unique_name("roadmap.md", ["Roadmap.md"]) == "roadmap (2).md"
    assert unique_name("roadmap.md", {"other.md"}) == "roadmap.md"
    assert unique_name("roadmap.md", ["Roadmap.md", "ROADMAP (2).md"]) == "roadmap (3).md"


def test_unique_name_accepts_keys_and_registries() -> None:
    keys = {name_key("Roadmap.md")}
    assert unique_name("roadmap.md", keys) == "roadmap (2).md"
    reg = NameRegistry(["Roadmap.md"])
    assert unique_name("roadmap.md", reg) == "roadmap (2).md"
    assert unique_name("roadmap.md", reg) == "roadmap (2).md"  # queried, not recorded
    assert len(reg) == 1


def test_folder_segment_collisions_have_no_extension() -> None:
    reg = NameRegistry(["Notes"])
    assert reg.claim("notes") == "notes (2)"
    assert reg.claim("NOTES") == "NOTES (3)"


def test_empty_titles_claim_distinct_names() -> None:
    reg = NameRegistry()
    got = [reg.claim(safe_filename(t)) for t in ["", "   ", "\t\n", "\x00"]]
    assert got == ["untitled.md", "untitled (2).md", "untitled (3).md", "untitled (4).md"]


def test_explicitly_taken_suffixes_are_skipped() -> None:
    reg = NameRegistry(["a.md", "a (2).md", "A (4).md"])
    assert reg.claim("a.md") == "a (3).md"
    assert reg.claim("a.md") == "a (5).md"
    assert "A (5).MD" in reg


def test_long_names_shortened_to_fit_suffix() -> None:
    name = safe_filename(JA_300)
    assert len(name.encode()) == 255
    reg = NameRegistry([name])
    second = reg.claim(name)
    assert second.endswith(" (2).md") and len(second.encode()) <= 255
    assert second.encode().decode() == second  # cut on a character boundary
    assert second[: -len(" (2).md")] == name[: len(second) - len(" (2).md")]
    assert safe_filename(second) == second
    for _ in range(200):  # suffix growth ( (10), (100)) keeps shortening the stem
        got = reg.claim(name)
        assert len(got.encode()) <= 255 and safe_filename(got) == got


def test_registry_ten_thousand_claims() -> None:
    reg = NameRegistry()
    names = [reg.claim("untitled.md") for _ in range(10_000)]
    assert len(set(map(name_key, names))) == 10_000
    assert names[-1] == "untitled (10000).md"
    more = [reg.claim(f"Doc {i}.md") for i in range(10_000)]
    assert more == [f"Doc {i}.md" for i in range(10_000)]
    assert len(reg) == 20_000


def test_retitle_case_only_is_same_key() -> None:
    # design §2.2: a case/NFC-only retitle is a move of the same document; the key says so.
    assert name_key(safe_filename("refund policy")) == name_key(safe_filename("Refund Policy"))


# --- author_path --------------------------------------------------------------------------------


def test_author_path() -> None:
    assert author_path(("Licenses & payment", "Refund policy.md")) == ("Licenses & payment", "Refund policy.md")
    assert author_path(["..", ".git", "CON", "x:y"]) == ("folder", "_.git", "CON_", "x_y.md")
    assert author_path(("a",), prefix=("Imports", "Batch 1")) == ("Imports", "Batch 1", "a.md")
    sp = StorePath.from_parts(author_path(("..", "..", "etc", "passwd")))
    assert sp.virtual == "/documents/folder/folder/etc/passwd.md"


def test_author_path_rejects_bad_input() -> None:
    with pytest.raises(InvalidPath):
        author_path(())
    with pytest.raises(InvalidPath):
        author_path("a.md")  # a str is not a sequence of segments here
    with pytest.raises(InvalidPath):
        author_path(("a",), prefix=("..",))
    with pytest.raises(InvalidPath):
        author_path(("a",), prefix=(".git",))


# --- StorePath ----------------------------------------------------------------------------------


def test_store_path_forms() -> None:
    v = StorePath.parse("/documents/a/b.md")
    r = StorePath.parse("documents/a/b.md")
    assert v == r and hash(v) == hash(r)
    assert v.repo_path == "documents/a/b.md"
    assert v.virtual == "/documents/a/b.md" == str(v)
    assert v.parts == ("a", "b.md") and v.name == "b.md" and v.folder_parts == ("a",)
    assert v.parent == StorePath.parse("/documents/a")
    assert v.parent.parent == StorePath.parse("/documents", allow_root=True)
    assert v.parent.parent.parent is None
    assert StorePath.from_repo_path("documents/a/b.md") == v
    assert StorePath(("a",)).child("b.md") == v
    with pytest.raises(AttributeError):
        v.parts = ()  # type: ignore[misc]


def test_store_path_root() -> None:
    with pytest.raises(InvalidPath):
        StorePath.parse("/documents")
    root = StorePath.parse("/documents", allow_root=True)
    assert root.parts == () and root.virtual == "/documents"
    assert root.repo_path == "documents" and root.name == "documents" and root.parent is None
    assert StorePath.parse("documents/", allow_root=True) == root


def test_store_path_trailing_slash_is_dropped() -> None:
    assert StorePath.parse("/documents/a/") == StorePath.parse("/documents/a")


def test_store_path_keeps_exact_names() -> None:
    nfd = StorePath.parse("/documents/Cafe\u0301.md")
    assert nfd.name == "Cafe\u0301.md" and nfd != StorePath.parse("/documents/Caf\u00e9.md")
    assert StorePath.parse("/documents/Node.js").name == "Node.js"  # not rewritten
    assert StorePath.parse("/documents/日本語/😀 notes.md").parts == ("日本語", "😀 notes.md")
    assert StorePath.parse("/documents/a..b/.hidden.md").parts == ("a..b", ".hidden.md")


BAD_PATHS = [
    ("/documents/../etc/passwd", "'..'"),
    ("/documents/a/../../x.md", "'..'"),
    ("../documents/x.md", "under /documents"),
    ("/etc/passwd", "under /documents"),
    ("/", "under /documents"),
    ("", "under /documents"),
    ("/Documents/a.md", "under /documents"),
    ("/documentsx/a.md", "under /documents"),
    ("//documents/a.md", "under /documents"),
    ("documents/.git/config", ".git"),
    ("/documents/a/.GIT/HEAD", ".git"),
    ("/documents/.git", ".git"),
    ("/documents/.git./x", ".git"),
    ("/documents/a/.keep", ".keep"),
    ("/documents/a/.KEEP", ".keep"),
    ("/documents/a\x00b.md", "control"),
    ("/documents/a\nb.md", "control"),
    ("/documents/a\x1bb.md", "control"),
    ("/documents//a.md", "empty"),
    ("/documents/a//", "empty"),
    ("/documents/./a.md", "'.'"),
    ("/documents/a\\b.md", "backslash"),
    ("documents\\a.md", "backslash"),
    ("/documents/" + "x" * 256, "exceeds 255"),
    ("/documents/" + "日" * 86, "exceeds 255"),
    ("/documents/\udc80.md", "surrogate"),
]


@pytest.mark.parametrize(("path", "reason"), BAD_PATHS)
def test_store_path_rejects(path: str, reason: str) -> None:
    with pytest.raises(InvalidPath) as info:
        StorePath.parse(path)
    assert info.value.path == path
    assert reason in info.value.reason
    assert isinstance(info.value, KbError)


def test_store_path_edge_acceptance() -> None:
    assert StorePath.parse("/documents/" + "x" * 255).name == "x" * 255
    assert StorePath.parse("/documents/a/.keep", allow_keep=True).name == ".keep"
    assert StorePath.parse("/documents/.keep/a.md").parts == (".keep", "a.md")  # only final
    assert StorePath.parse("/documents/.github/x.md").parts == (".github", "x.md")


@pytest.mark.parametrize("bad", [None, 3, b"/documents/a.md", ["documents", "a"]])
def test_store_path_non_str(bad: object) -> None:
    with pytest.raises(InvalidPath):
        StorePath.parse(bad)


def test_store_path_constructor_validates() -> None:
    for parts in [("..",), ("a", ""), (".git", "x"), ("a/b",), ("a\x00",), ["a"], (1,)]:
        with pytest.raises(InvalidPath):
            StorePath(parts)  # type: ignore[arg-type]
    with pytest.raises(InvalidPath):
        StorePath.from_repo_path("/documents/a.md")
    with pytest.raises(InvalidPath):
        StorePath(("a",)).child("..")


def test_store_path_ordering() -> None:
    paths = [StorePath.parse(p) for p in ["/documents/b", "/documents/a/z", "/documents/a"]]
    assert [p.virtual for p in sorted(paths)] == ["/documents/a", "/documents/a/z", "/documents/b"]


# --- identity -----------------------------------------------------------------------------------


def test_unique_identifier_hash() -> None:
    expected = hashlib.sha256(b"NOTE:/documents/a.md:7").hexdigest()
    assert unique_identifier_hash("NOTE", "/documents/a.md", 7) == expected
    for bad in (0, -1, True, "7", 1.0, 2**31, 2**63):
        with pytest.raises(InvalidWorkspace):
            unique_identifier_hash("NOTE", "x", bad)  # type: ignore[arg-type]
    assert unique_identifier_hash("NOTE", "x", 2**31 - 1)  # the largest Postgres integer


BLOBS = [b"", b"hello\n", b"a\x00b", b"\r\n\r\n", "Café ☕\n".encode(), bytes(range(256)) * 40]


@pytest.mark.skipif(shutil.which("git") is None, reason="git CLI not installed")
@pytest.mark.parametrize("data", BLOBS)
def test_blob_id_matches_git(data: bytes) -> None:
    out = subprocess.run(["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True)
    assert blob_id(data) == out.stdout.decode().strip()
    assert blob_id(bytearray(data)) == blob_id(memoryview(data)) == blob_id(data)


def test_blob_id_known_value_and_type() -> None:
    assert blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    with pytest.raises(TypeError):
        blob_id("text")  # type: ignore[arg-type]


# --- properties ---------------------------------------------------------------------------------

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300)
NASTY = st.text(
    alphabet=st.sampled_from(
        list(' .\t\n\x00\x1b\x7f\x85\x1c\u00a0\u0301\u0338\u0327e<>:/\\|?*"COMNULPTcon1日😀ßı\u212b\u1100\u1161\u11a8')
    ),
    max_size=300,
)
ANY_TEXT = st.one_of(TEXT, NASTY, st.text(max_size=600))


def _check_safe(name: str) -> None:
    assert name and len(name.encode("utf-8")) <= MAX_SEGMENT_BYTES
    assert unicodedata.is_normalized("NFC", name)
    assert not name.startswith(".") and not name.endswith((".", " ")) and name == name.strip()
    assert "  " not in name and not set(name) & set('\\/:*?"<>|')
    assert not any(unicodedata.category(c) == "Cc" for c in name)
    assert not BIDI_CONTROLS.intersection(name)
    check_new_segment(name, name)
    StorePath((name,))  # every safe name is a valid path segment


@settings(max_examples=800, deadline=None)
@given(ANY_TEXT)
def test_safe_filename_idempotent(title: str) -> None:
    name = safe_filename(title)
    assert safe_filename(name) == name
    assert name.lower().endswith(".md")
    _check_safe(name)


@settings(max_examples=800, deadline=None)
@given(ANY_TEXT)
def test_safe_folder_segment_idempotent(name: str) -> None:
    seg = safe_folder_segment(name)
    assert safe_folder_segment(seg) == seg
    _check_safe(seg)


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT)
def test_name_key_idempotent_and_nfc_insensitive(name: str) -> None:
    key = name_key(name)
    assert name_key(key) == key
    assert name_key(unicodedata.normalize("NFD", name)) == key
    assert name_key(name.upper()) == key == name_key(name.lower()) == name_key(name.casefold())


@settings(max_examples=200, deadline=None)
@given(st.lists(ANY_TEXT, max_size=30), st.lists(ANY_TEXT, max_size=10))
def test_registry_claims_are_distinct_and_safe(titles: list[str], existing: list[str]) -> None:
    taken = [safe_filename(t) for t in existing]
    reg = NameRegistry(taken)
    claimed = [reg.claim(safe_filename(t)) for t in titles]
    keys = [name_key(n) for n in claimed]
    assert len(set(keys)) == len(keys)
    assert not set(keys) & {name_key(n) for n in taken}
    for name in claimed:
        assert safe_filename(name) == name
        _check_safe(name)


@pytest.mark.parametrize(
    "segment",
    [
        ".git",
        ".GIT",
        ".git.",
        ".git ",
        "GIT~1",
        "git~1",
        ".g\u200cit",
        ".git\u200d",
        ".git::$INDEX_ALLOCATION",
        ".gitattributes",
        ".GitIgnore",
        ".gitmodules",
        "\ufeff.gitmodules",
    ],
)
def test_git_interpreted_names_are_refused_as_caller_paths(segment):
    """A caller path may not create a file git interprets, on any file system (git fsck --strict
    rejects GIT~1 and HFS/NTFS spellings of .git; .gitattributes would change checkouts)."""
    with pytest.raises(InvalidPath):
        StorePath.parse(f"/documents/{segment}/x.md")
    with pytest.raises(InvalidPath):
        StorePath.parse(f"/documents/a/{segment}")


@pytest.mark.parametrize("segment", ["git", "gitlab.md", ".github", "git~2", "my.gitignore.md"])
def test_names_near_git_names_are_fine(segment):
    assert StorePath.parse(f"/documents/{segment}").name == segment


def test_folder_named_like_git_short_name_is_made_safe():
    assert safe_folder_segment("GIT~1") == "GIT~1_"
    assert safe_folder_segment(safe_folder_segment("git~1")) == "git~1_"
    assert safe_filename("GIT~1") == "GIT~1.md"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="/.aD~ \u00e9", max_size=16))
def test_a_suggested_path_always_parses(path: str) -> None:
    """A refused path's "did you mean …?" names a path that parses: ``../etc/passwd`` was told to
    try ``/documents/../etc/passwd``, which is refused in turn (design §2, the path law)."""
    import re

    try:
        StorePath.parse(path)
    except InvalidPath as exc:
        suggested = re.search(r"did you mean '(.*)'\?\)$", str(exc))
        if suggested:
            StorePath.parse(suggested.group(1))


def test_a_parent_segment_gets_no_suggestion() -> None:
    with pytest.raises(InvalidPath) as refused:
        StorePath.parse("../etc/passwd")
    assert "did you mean" not in str(refused.value) and "must be under /documents" in str(refused.value)


@pytest.mark.parametrize("mark", sorted(BIDI_CONTROLS))
def test_a_new_name_with_a_bidirectional_control_is_refused_and_an_existing_one_parses(mark: str) -> None:
    """(design §2.3) a right-to-left override shows ``report\u202egnp.exe`` as ``reportexe.png``."""
    name = f"report{mark}gnp.exe.md"
    with pytest.raises(InvalidPath, match=f"bidirectional control character \\(U\\+{ord(mark):04X}\\)"):
        check_new_segment(name, "/documents/" + name)
    assert StorePath.parse("/documents/" + name).name == name  # an existing document stays addressable


@pytest.mark.parametrize("name", ["a:b.md", "star*.md", "lt<>.md", "q?.md", 'say "hi".md', "pipe|.md", "Team: notes"])
def test_a_new_name_windows_forbids_is_refused_as_a_device_name_is(name):
    """design §2.3: a path a write creates must fit every file system kb's users check out on.
    Windows device names were refused at the API while `a:b.md`, `star*.md` and `q?.md` — which
    Windows cannot hold either — were written; the importer turns the same characters into `_`.
    The refusal names a safe name to use instead."""
    with pytest.raises(InvalidPath, match="which Windows forbids in file names; choose another") as refused:
        check_new_segment(name, "/documents/" + name)
    suggested = refused.value.reason.rsplit("(for example ", 1)[1].strip("')")
    check_new_segment(suggested, suggested)  # the name it suggests is one it takes


def test_suffixed_from_names_the_name_a_collision_suffix_came_from():
    assert suffixed_from("Notes (3).md") == name_key("notes.md")
    assert suffixed_from("Plans (2)") == name_key("Plans")
    assert suffixed_from("a_b (2).MD") == name_key("a_b.md")
    for plain in ("Notes.md", "Notes (1).md", "Notes (02).md", "Notes(2).md", "(2).md"):
        assert suffixed_from(plain) is None, plain
