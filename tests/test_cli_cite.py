"""``kb search/read --chat`` and ``kb cite …`` as a newcomer runs them (README, design §8)."""

from __future__ import annotations

import json
import subprocess
import sys

from support.commands import run_cli

POLICY = "# Refund policy\n\n## Annual plans\nAnnual subscriptions may be refunded within 30 days.\nMonthly plans are not refunded.\n"


def test_newcomer_flow_search_cite_edit_resolve_follow(kb_env, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "Refund policy.md").write_text(POLICY)
    run_cli(kb_env, "import", str(notes), "--workspace", "1")
    run_cli(kb_env, "index", "--workspace", "1")
    out = run_cli(kb_env, "search", "annual subscriptions refunded", "-w", "1", "--chat", "c1").stdout
    assert 'cite="[1]"' in out and "     4  Annual subscriptions may be refunded within 30 days." in out
    answer = tmp_path / "answer.md"
    answer.write_text("Annual plans are refundable for 30 days [1:L3-4]; see also [9].\n")
    normalized = run_cli(kb_env, "cite", "normalize", str(answer), "--chat", "c1", "-w", "1", "--drop-unknown")
    assert normalized.stdout == "Annual plans are refundable for 30 days [1:L3-L4]; see also.\n"
    assert "[9]" in normalized.stderr
    # the document is edited: two lines above the cited ones, so they shift down by 2
    (notes / "Refund policy.md").write_text(
        "# Refund policy\n\nUpdated 2026.\nAsk billing.\n" + POLICY.split("\n", 2)[2]
    )
    run_cli(kb_env, "import", str(notes), "--workspace", "1")
    resolved = run_cli(kb_env, "cite", "resolve", "[1:L3-L4]", "--chat", "c1", "-w", "1", "--follow").stdout
    assert "     3  ## Annual plans\n     4  Annual subscriptions may be refunded within 30 days." in resolved
    assert "now: unchanged — /documents/Refund policy.md" in resolved and "lines 5-6" in resolved
    data = json.loads(
        run_cli(kb_env, "cite", "resolve", "[1:L4]", "--chat", "c1", "-w", "1", "--follow", "--json").stdout
    )
    assert data["lines"] == [[4, "Annual subscriptions may be refunded within 30 days."]]
    assert (data["follow"]["status"], data["follow"]["start"]) == ("unchanged", 6)
    window = run_cli(
        kb_env, "read", "/documents/Refund policy.md", "-w", "1", "--chat", "c1", "--offset", "4", "--limit", "2"
    ).stdout
    assert 'cite="[2]"' in window and 'lines="5-6" of="7"' in window
    listed = run_cli(kb_env, "cite", "list", "--chat", "c1", "-w", "1").stdout
    assert listed.count("numbered") == 2
    assert "forgot 2 handles" in run_cli(kb_env, "cite", "forget", "--chat", "c1", "-w", "1").stdout
    failed = run_cli(kb_env, "cite", "resolve", "[1]", "--chat", "c1", "-w", "1", check=False)
    assert failed.returncode == 1 and failed.stderr.startswith("kb: error: chat 'c1' has no handle [1]")
    answer.write_bytes(b"caf\xe9 [1]")
    bad = run_cli(kb_env, "cite", "normalize", str(answer), "--chat", "c1", "-w", "1", check=False)
    assert bad.returncode == 1 and "is not UTF-8 text" in bad.stderr


def test_normalize_help_is_truthful_and_in_place_rewrites_the_file(kb_env, tmp_path):
    """`kb cite normalize --help` said "Rewrite the citations in FILE" while it printed them and
    left FILE alone. The help now says it prints, with examples; --in-place rewrites FILE (its
    permissions kept) and refuses standard input with a KbError."""
    helped = run_cli(kb_env, "cite", "normalize", "--help").stdout
    assert "Rewrite the citations in FILE" not in helped and "[FILE]" in helped
    assert "Print FILE" in helped and "left as it is unless --in-place" in helped
    assert "Examples: echo" in helped and "--in-place --chat c1" in " ".join(helped.split())
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "Refund policy.md").write_text(POLICY)
    run_cli(kb_env, "import", str(notes), "--workspace", "1")
    run_cli(kb_env, "read", "/documents/Refund policy.md", "-w", "1", "--chat", "c1")  # handle [1], numbered
    (tmp_path / "answers").mkdir()
    answer = tmp_path / "answers" / "answer.md"
    answer.write_text("Refunds within 30 days [1:L3-4] [9].\n")
    answer.chmod(0o640)
    printed = run_cli(kb_env, "cite", "normalize", str(answer), "--chat", "c1", "-w", "1", "--drop-unknown")
    assert printed.stdout == "Refunds within 30 days [1:L3-L4].\n"
    assert answer.read_text() == "Refunds within 30 days [1:L3-4] [9].\n"  # printing leaves FILE alone
    rewritten = run_cli(
        kb_env, "cite", "normalize", str(answer), "--in-place", "--chat", "c1", "-w", "1", "--drop-unknown"
    )
    assert rewritten.stdout == "" and f"kb: {answer}: citations normalized" in rewritten.stderr
    assert "[9]" in rewritten.stderr  # the dropped handle is still reported
    assert answer.read_text() == "Refunds within 30 days [1:L3-L4].\n" and answer.stat().st_mode & 0o777 == 0o640
    again = run_cli(kb_env, "cite", "normalize", str(answer), "-i", "--chat", "c1", "-w", "1", "--json")
    assert json.loads(again.stdout)["text"] == answer.read_text() and "unchanged" in again.stderr
    assert [p.name for p in answer.parent.iterdir()] == ["answer.md"]  # no temporary file left
    piped = subprocess.run(
        [sys.executable, "-m", "kb.adapters.cli", "cite", "normalize", "--in-place", "-c", "c1", "-w", "1"],
        input="[1:L3]",
        env=kb_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 1 and piped.stderr.startswith("kb: error: --in-place needs a FILE to rewrite")


def test_a_one_line_span_is_said_as_one_line(kb_env, tmp_path):
    """`kb cite resolve --follow` printed "lines 6-6" for a one-line span: it says "line 6". A
    citation past the end says "names line 9" and suggests a normalize carrying chat and workspace."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "Refund policy.md").write_text(POLICY)
    run_cli(kb_env, "import", str(notes), "--workspace", "2")
    run_cli(kb_env, "read", "/documents/Refund policy.md", "-w", "2", "--chat", "c1")
    (notes / "Refund policy.md").write_text(
        "# Refund policy\n\nUpdated 2026.\nAsk billing.\n" + POLICY.split("\n", 2)[2]
    )
    run_cli(kb_env, "import", str(notes), "--workspace", "2")
    resolved = run_cli(kb_env, "cite", "resolve", "[1:L4]", "--chat", "c1", "-w", "2", "--follow").stdout
    assert "now: unchanged — /documents/Refund policy.md" in resolved and resolved.count(" line 6\n") == 1, resolved
    assert "lines 6-6" not in resolved
    past = run_cli(kb_env, "cite", "resolve", "[1:L9]", "--chat", "c1", "-w", "2", check=False)
    assert past.returncode == 1 and "names line 9 but /documents/Refund policy.md has 5 lines" in past.stderr
    assert "(`kb cite normalize FILE --chat c1 --workspace 2`)" in past.stderr, past.stderr
