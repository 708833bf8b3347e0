"""Editor saves (``kb edit``, design §5): a person edits one document in a private turn, and a
change is recorded as one revision — merged three-way with whatever landed meanwhile."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kb.db import database
from kb.db.sql import queries
from kb.errors import ArtifactReadOnly, DocumentNotFound
from kb.paths import StorePath

if TYPE_CHECKING:
    from kb.turns.turn import CommitResult, Turn


def edit_document(
    database_url: str,
    workspace_id: int,
    open_turn: Callable[[str], Turn],
    path: str,
    editor: Callable[[Path], None],
    message: str | None = None,
    idempotency_key: str | None = None,
) -> CommitResult | None:
    """Materialize ``path`` in a fresh turn (``open_turn(turn_id)`` opens one for the editing
    person), call ``editor(file_path)`` (which edits the file in place), and commit when the bytes
    changed (design §5), with ``idempotency_key`` when given (design §3: a save interrupted
    mid-commit is settled by it, ``KnowledgeStore.write_outcome``).

    A missing document starts empty (saving creates it); a document changed meanwhile is merged
    three-way. Returns the CommitResult, or None when nothing changed (the turn is discarded).
    Raises ArtifactReadOnly for ARTIFACT documents (design §11), InvalidPath, WorkspaceNotFound,
    and whatever ``editor`` raises (turn discarded).
    """
    target = StorePath.parse(path)
    with database.connect(database_url) as conn:
        row = conn.execute(
            queries["document_by_path"], {"workspace_id": workspace_id, "path": target.virtual}
        ).fetchone()
    if row and row["document_type"] == "ARTIFACT":
        refused = f"{target.virtual} is an ARTIFACT document (id {row['id']}); editor saves refuse artifacts:"
        raise ArtifactReadOnly(
            f"{refused} use artifacts({workspace_id}).revise({row['id']}, generation, markdown)",
            cli=f"{refused} use `kb artifact revise {row['id']} --generation N FILE -w {workspace_id}`",
        )
    turn = open_turn(f"edit-{uuid.uuid4().hex}")
    try:
        try:
            turn.read(target.virtual, limit=0)
            created = False
        except DocumentNotFound:
            turn.write(target.virtual, b"")
            created = True
        editor(turn.path / target.repo_path)
        turn.forget_untracked()  # editor swap/backup files never become documents
        if created and not turn.read_bytes(target.virtual):
            turn.abort()
            return None
    except BaseException:
        turn.abort()
        raise
    return turn.commit(message or f"Edit {target.virtual}", idempotency_key)
