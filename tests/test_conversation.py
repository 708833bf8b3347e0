"""Conversations (design §8): handles, windows, normalize, resolve and follow through the
real store, index and registry."""

from __future__ import annotations

import threading

import pytest
from support.named_queries import queries

from kb.citations.normalizer import Citation
from kb.db import database
from kb.errors import InvalidChat, InvalidCitation, InvalidInput, UnknownHandle

POLICY = "# Refund policy\n\nIntro line.\n\n## Annual plans\nAnnual subscriptions may be refunded within 30 days.\nContact billing.\n"


def _seed(kb, docs: dict[str, str]) -> None:
    with kb.transaction(1, "seed", "alice") as tx:
        for path, text in docs.items():
            tx.write(path, text)
    kb.index(1)


def test_search_registers_handles_and_keeps_them_across_unrelated_commits(kb):
    kb.create_workspace(1)
    _seed(kb, {"/documents/Refund policy.md": POLICY, "/documents/Other.md": "# Other\nGardening notes.\n"})
    conv = kb.conversation(1, "chat-a")
    first = conv.search("annual subscriptions refunded", k=2)
    assert [e.cite for e in first] == [1, 2]
    by_path = {e.path: e.cite for e in first}
    with kb.transaction(1, "unrelated", "alice") as tx:
        tx.write("/documents/Third.md", "# Third\nnothing about refunds\n")
    kb.index(1)
    again = conv.search("annual subscriptions refunded", k=3)
    for e in again:
        if e.path in by_path:
            assert e.cite == by_path[e.path]
    assert sorted(h.n for h in conv.handles()) == list(range(1, len(conv.handles()) + 1))
    # another chat numbers from 1 on its own
    assert kb.conversation(1, "chat-b").search("gardening", k=1)[0].cite == 1


def test_changed_content_gets_a_new_handle_and_old_one_still_resolves(kb):
    kb.create_workspace(1)
    _seed(kb, {"/documents/Refund policy.md": POLICY})
    conv = kb.conversation(1, "c")
    env = conv.read("/documents/Refund policy.md")
    assert env.cite == 1 and env.view == "full"
    with kb.transaction(1, "edit", "alice") as tx:
        tx.write("/documents/Refund policy.md", "New first line\n" + POLICY)
    assert conv.read("/documents/Refund policy.md").cite == 2
    old = conv.resolve("[1:L6]")
    assert old.lines == [(6, "Annual subscriptions may be refunded within 30 days.")]
    followed = conv.resolve("[1:L6]", follow=True).follow
    assert (followed.status, followed.start, followed.end) == ("unchanged", 7, 7)


def test_windowed_read_shows_true_numbers_and_tells_the_window(kb):
    kb.create_workspace(1)
    _seed(kb, {"/documents/Refund policy.md": POLICY})
    conv = kb.conversation(1, "c")
    env = conv.read("/documents/Refund policy.md", offset=4, limit=2)
    assert env.lines == [(5, "## Annual plans"), (6, "Annual subscriptions may be refunded within 30 days.")]
    assert env.view == "window" and env.total_lines == 7
    assert 'lines="5-6" of="7"' in env.render()
    with pytest.raises(InvalidInput):
        conv.read("/documents/Refund policy.md", offset=-1)


def test_normalize_and_resolve_after_reindex_move_delete_and_truncated_chunks(kb):
    kb.create_workspace(1)
    _seed(kb, {"/documents/Refund policy.md": POLICY})
    conv = kb.conversation(1, "c")
    conv.read("/documents/Refund policy.md")
    out = conv.normalize("Refunds [1:L6-5] and [7] and `[1:L2]`, see [1, 1:L99].", drop_unknown=True)
    # [1:L99] of a 7-line document names no line of it: the whole document, written once
    assert out.text == "Refunds [1:L5-L6] and and `[1:L2]`, see [1]."
    assert out.unknown == [7]
    with kb.transaction(1, "move", "alice") as tx:
        tx.move("/documents/Refund policy.md", "/documents/Policies/Refunds.md")
    kb.reindex(1)
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["test_truncate_chunks"])
    res = conv.resolve(out.citations[0], follow=True)
    assert res.text == "## Annual plans\nAnnual subscriptions may be refunded within 30 days."
    assert res.follow.status == "unchanged" and res.follow.path == "/documents/Policies/Refunds.md"
    with kb.transaction(1, "edit inside", "alice") as tx:
        tx.write("/documents/Policies/Refunds.md", POLICY.replace("30 days", "14 days"))
    changed = conv.resolve("[1:L5-L6]", follow=True).follow
    assert changed.status == "changed" and changed.lines[-1] == (
        6,
        "Annual subscriptions may be refunded within 14 days.",
    )
    with kb.transaction(1, "delete", "alice") as tx:
        tx.remove("/documents/Policies/Refunds.md")
    gone = conv.resolve("[1:L5-L6]", follow=True)
    assert gone.text.endswith("30 days.") and gone.follow.status == "deleted"


def test_errors_are_kb_errors(kb):
    kb.create_workspace(1)
    _seed(kb, {"/documents/Refund policy.md": POLICY})
    with pytest.raises(InvalidChat):
        kb.conversation(1, "")
    conv = kb.conversation(1, "c")
    with pytest.raises(UnknownHandle):
        conv.resolve("[1]")
    conv.read("/documents/Refund policy.md")
    with pytest.raises(InvalidCitation):
        conv.resolve("[1:L40]")
    with pytest.raises(InvalidCitation):
        conv.resolve("see [1]")
    assert conv.resolve(Citation(1)).level == "document"
    assert conv.forget() == 1
    assert conv.handles() == []


def test_concurrent_searches_in_one_chat_never_share_a_number(kb):
    kb.create_workspace(1)
    _seed(kb, {f"/documents/d{i}.md": f"# Doc {i}\nshared words about topic {i}\n" for i in range(12)})
    errors = []

    def run(i: int) -> None:
        try:
            kb.conversation(1, "busy").search(f"topic {i} shared words", k=6)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    handles = kb.conversation(1, "busy").handles()
    assert [h.n for h in handles] == list(range(1, len(handles) + 1))
    assert len({(h.path, h.content_id) for h in handles}) == len(handles)


def test_expiry_deletes_unused_chats(kb):
    kb.create_workspace(1)
    _seed(kb, {"/documents/Refund policy.md": POLICY})
    kb.conversation(1, "old").read("/documents/Refund policy.md")
    kb.conversation(1, "new").read("/documents/Refund policy.md")
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["test_age_citation_chat"], {"workspace_id": 1, "chat_id": "old", "days": 40})
    assert kb.expire_citations() == 1
    assert kb.conversation(1, "old").handles() == []
    assert len(kb.conversation(1, "new").handles()) == 1


def test_the_expiry_task_runs_in_a_real_worker(kb):
    kb.create_workspace(1)
    _seed(kb, {"/documents/Refund policy.md": POLICY})
    kb.conversation(1, "old").read("/documents/Refund policy.md")
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["test_age_citation_chat"], {"workspace_id": 1, "chat_id": "old", "days": 40})
    from kb.jobs import tasks as jobs

    with jobs.app.replace_connector(jobs.connector_for(kb)) as app, app.open():
        jobs.expire_citations.defer(timestamp=0)
    kb.run_worker(until_idle=True)
    assert kb.conversation(1, "old").handles() == []


def test_an_envelope_shows_a_path_as_it_is_but_what_would_end_its_attribute():
    """design §8: a path's apostrophe was shown as ``&#x27;`` (``Procédure d&#x27;escalade.md``),
    which copied from a search into ``kb read`` named no document. Only what would end or
    confuse a double-quoted attribute (``"``, ``&``, ``<``, ``>``) is escaped."""
    from html import unescape

    from kb.citations.envelope import Envelope

    path = '/documents/Procédure d\'escalade & <co> "v2".md'
    head = Envelope(path, "Procédure d'escalade", "abc", "full", [(1, "x")]).render().splitlines()[0]
    assert 'path="/documents/Procédure d\'escalade &amp; &lt;co&gt; &quot;v2&quot;.md"' in head
    assert 'title="Procédure d\'escalade"' in head
    assert unescape(head.split('path="')[1].split('"')[0]) == path
