"""design §16: stored text the CLI prints in its own lines — commit messages and authors in
``kb log``, titles in ``kb cite list`` and ``kb artifact``, paths in ``kb ls`` — is shown escaped,
never written raw, into a terminal or a pipe: a commit message holding ``\\x1b]0;pwned\\x07`` (set
the window title) or ``\\x1b[2J`` (clear the screen) reached the terminal as it was."""

from __future__ import annotations

from support.commands import run_cli

from kb.adapters.cli.terminal import shown

TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J"


def _clean(output: str) -> None:
    assert not set(output) & set("\x1b\x07\x9b\u202e"), output


def test_log_cite_list_artifacts_and_ls_escape_stored_text(kb, kb_env):
    kb.create_workspace(1)
    with kb.transaction(1, f"evil {TITLE} message {CLEAR}\nsecond", "Mal\u202elory\x9b <m@x>") as tx:
        tx.write("/documents/Evil.md", f"# Evil {TITLE} title\n\nbody {CLEAR}\n")
    logged = run_cli(kb_env, "log", "-w", "1").stdout
    _clean(logged)
    assert "evil \\x1b]0;pwned\\x07 message \\x1b[2J" in logged and "Mal\\u202elory\\x9b <m@x>" in logged

    run_cli(kb_env, "read", "/documents/Evil.md", "-w", "1", "--chat", "c1")
    listed = run_cli(kb_env, "cite", "list", "--chat", "c1", "-w", "1").stdout
    _clean(listed)  # (a title is cut at its first control character when the document is read)
    assert "Evil" in listed

    saved = kb.artifacts(1).save(f"Report {CLEAR}\u202eright", "# Report\n")
    for args in (("artifact", "list", "-w", "1"), ("artifact", "show", str(saved.id), "-w", "1")):
        out = run_cli(kb_env, *args).stdout
        _clean(out)
        # the title as stored is shown escaped; the path made of it holds neither (§2.1 drops both)
        assert "Report" in out and "/documents/Artifacts/Report [2Jright.md" in out, (args, out)


def test_shown_escapes_every_control_and_bidi_character():
    assert shown("a\x1b[2Jb\x07\x9b\u202e\t\n") == "a\\x1b[2Jb\\x07\\x9b\\u202e\\x09\\x0a"
    assert shown("a\tb\nc\x1b", lines=True) == "a\tb\nc\\x1b"
    assert shown("Zoë — ok") == "Zoë — ok"


def test_revert_and_restore_escape_the_paths_they_report(kb, kb_env):
    """kb revert and kb restore wrote the paths of the revision they recorded raw: a name may hold
    a right-to-left or Arabic letter mark (U+200F, U+061C; Persian needs them), which the CLI
    escapes everywhere else (kb ls, kb log) since it reorders what a terminal shows."""
    kb.create_workspace(1)
    with kb.transaction(1, "add", "a") as tx:
        tx.write("/documents/r\u200fl\u061c.md", "# R\n\nbody\n")
    revision = kb.history(1, None, 1)[0].id
    reverted = run_cli(kb_env, "revert", revision, "-w", "1").stdout
    assert "\u200f" not in reverted and "\u061c" not in reverted and "r\\u200fl\\u061c.md" in reverted
    restored = run_cli(kb_env, "restore", "/documents/r\u200fl\u061c.md", "-r", revision, "-w", "1").stdout
    assert "\u200f" not in restored and "r\\u200fl\\u061c.md" in restored
