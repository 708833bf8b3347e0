"""Normalizing never loses an answer's text silently (design §8): an unknown chat is an error that
leaves the text untouched, and citations of handles the chat lacks are kept unless the caller
asks to drop them."""

from __future__ import annotations

import pytest
from support.commands import run_cli

from kb.errors import UnknownChat

POLICY = "# Refund policy\n\n## Annual plans\nAnnual subscriptions may be refunded within 30 days.\n"
ANSWER = "Annual plans are refundable for 30 days [1:L3-4]; see also [9].\n"


@pytest.fixture
def searched(kb_env, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "Refund policy.md").write_text(POLICY)
    run_cli(kb_env, "import", str(notes), "-w", "1")
    run_cli(kb_env, "index", "-w", "1")
    run_cli(kb_env, "search", "annual subscriptions refunded", "-w", "1", "--chat", "c1")
    return kb_env


def test_a_chat_that_does_not_exist_is_an_error_and_the_file_is_untouched(searched, tmp_path):
    answer = tmp_path / "answer.md"
    answer.write_text(ANSWER)
    for extra in ((), ("--in-place",), ("--json",)):
        result = run_cli(searched, "cite", "normalize", str(answer), "--chat", "c-typo", "-w", "1", *extra, check=False)
        assert result.returncode == 1, extra
        assert result.stdout == "" and "chat 'c-typo' has no handles in workspace 1" in result.stderr
        assert "nothing was changed" in result.stderr
        assert answer.read_text() == ANSWER


def test_unknown_handles_are_kept_and_reported_unless_dropped(searched, tmp_path):
    answer = tmp_path / "answer.md"
    answer.write_text(ANSWER)
    kept = run_cli(searched, "cite", "normalize", str(answer), "--chat", "c1", "-w", "1")
    assert kept.stdout == "Annual plans are refundable for 30 days [1:L3-L4]; see also [9].\n"
    assert "kb: kept, unknown to this chat: [9]" in kept.stderr
    dropped = run_cli(searched, "cite", "normalize", str(answer), "--chat", "c1", "-w", "1", "--drop-unknown")
    assert dropped.stdout == "Annual plans are refundable for 30 days [1:L3-L4]; see also.\n"
    assert "kb: dropped: [9]" in dropped.stderr


def test_python_conversation_keeps_unknown_in_groups_and_refuses_an_empty_chat(kb):
    kb.create_workspace(1)
    with kb.transaction(1, "seed", "alice") as tx:
        tx.write("/documents/Refund policy.md", POLICY)
    conv = kb.conversation(1, "c")
    with pytest.raises(UnknownChat):
        conv.normalize("see [1]")
    conv.read("/documents/Refund policy.md")
    out = conv.normalize("See [1:L4, 7, 1:L4] and [8:L2-3].")
    assert out.text == "See [1:L4][7] and [8:L2-3]."
    assert out.unknown == [7, 8] and [str(c) for c in out.citations] == ["[1:L4]"]
    assert conv.normalize(out.text).text == out.text  # idempotent with kept unknowns
