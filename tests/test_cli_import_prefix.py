"""design §2: ``kb import --prefix`` in Unicode NFD (decomposed accents, as macOS file names and
some keyboards give them) is stored under its composed (NFC) spelling. The CLI said
``into /documents/Café (--prefix 'Café' made safe for every OS …)``: on a terminal both spellings
look the same, so nothing said what was wrong or what to write. It now names the decomposition,
the form kb stores and the path to use."""

from __future__ import annotations

import unicodedata

from support.commands import run_cli


def test_an_nfd_prefix_is_named_as_such_with_the_spelling_to_use(kb_env, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# A\n")
    nfd = unicodedata.normalize("NFD", "Café/Été")
    said = run_cli(kb_env, "import", str(notes), "--workspace", "1", "--prefix", nfd).stdout
    assert "Unicode NFD" in said and "U+0301" in said, said  # what was wrong, visibly
    assert "names are stored composed (NFC)" in said and "into /documents/Café/Été" in said, said
    assert 'kb ls "/documents/Café/Été" -w 1' in said, said  # what to write from now on
    listed = run_cli(kb_env, "ls", "/documents/Café/Été", "-w", "1").stdout
    assert "/documents/Café/Été/a.md" in listed

    forbidden = run_cli(kb_env, "import", str(notes), "--workspace", "1", "--prefix", "a:b").stdout
    assert "into /documents/a_b" in forbidden and "characters some OS forbid" in forbidden, forbidden
    assert "NFD" not in forbidden
