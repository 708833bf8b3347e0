"""kb's core flow, run end to end against whatever server a test arranges (design §13): init,
import, a real Procrastinate worker, search, a move, a revert. Used by the session-settings,
PgBouncer and embedded-server tests, so each proves the same user-visible behaviour."""

from __future__ import annotations

from pathlib import Path

from kb.db import database
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings
from support.commands import git
from support.named_queries import queries

WORKSPACE = 1
NOTES = {
    "Billing/Refunds.md": "# Refunds\n\nAn annual subscription is refunded in full within 30 days.\n",
    "Guides/Install.md": "# Install\n\nRun the installer, then sign in.\n",
    "Todo.md": "- [ ] ship the release\n",
}


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``{relative path: text}`` under ``root`` (a folder to import); returns ``root``."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def document_ids(url: str, workspace_id: int = WORKSPACE) -> dict[str, int]:
    """``{path: id}`` of the workspace's projected documents."""
    with database.connect(url) as conn:
        return {r["path"]: r["id"] for r in conn.execute(queries["test_document_ids"], {"workspace_id": workspace_id})}


def assert_converged(kb: KnowledgeBase, workspace_id: int = WORKSPACE) -> dict:
    """The index stamp and projection are at git HEAD with no failed document; returns the status."""
    ws = kb.status(workspace_id)["workspace"]
    assert ws["index_stamp"] == ws["head"] == ws["projected"], ws
    assert ws["failed"] == 0 and ws["pending"] == 0, ws
    return ws


def run_core_flow(settings: Settings, notes_root: Path) -> KnowledgeBase:
    """init → import → worker → search → move → worker → revert → worker, asserting each step.

    Returns the KnowledgeBase (for further checks). Raises AssertionError naming the step.
    """
    kb = KnowledgeBase.open(settings)  # `kb init`: schema, Procrastinate's schema, publication
    assert kb.import_folder(write_tree(notes_root, NOTES), WORKSPACE).added == len(NOTES)
    kb.run_worker(until_idle=True)
    assert_converged(kb)
    hits = kb.search(WORKSPACE, "refund of an annual subscription")
    assert hits and hits[0].path == "/documents/Billing/Refunds.md", [h.path for h in hits]
    assert any("refunded in full" in text for _, text in hits[0].lines)

    ids = document_ids(kb.database_url)
    with kb.transaction(WORKSPACE, "move the refunds page") as tx:
        tx.move("/documents/Billing/Refunds.md", "/documents/Policies/Refunds.md")
    moved = tx.revision
    kb.run_worker(until_idle=True)
    assert_converged(kb)
    after_move = document_ids(kb.database_url)
    assert after_move["/documents/Policies/Refunds.md"] == ids["/documents/Billing/Refunds.md"]
    assert kb.search(WORKSPACE, "refund of an annual subscription")[0].path == "/documents/Policies/Refunds.md"

    assert kb.revert(WORKSPACE, moved.id) is not None
    kb.run_worker(until_idle=True)
    assert_converged(kb)
    assert document_ids(kb.database_url) == ids
    assert kb.search(WORKSPACE, "refund of an annual subscription")[0].path == "/documents/Billing/Refunds.md"
    repo = settings.knowledge_store / str(WORKSPACE)
    git(repo, "fsck", "--strict")
    assert len(git(repo, "log", "--format=%H").split()) == 3
    return kb
