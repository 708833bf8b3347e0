"""Artifact sidecar rows inside a revision's transaction (design §11), below the store.

The store calls :func:`guard` for every revision, under the workspace write lock: a plain
transaction, a turn or an editor save that touches an ARTIFACT document's file is refused
(``ArtifactReadOnly``); ``revert``/``restore`` bump the generation of the artifacts they touch (and
drop the rows of one whose file they remove); the artifact layer (``kb.workspace.artifacts``) writes its own
rows through :func:`write_manifest` / :func:`delete_rows`.

Every artifact revision carries its manifest as a commit trailer (``Kb-Artifact: {json}``), so a
revision git recorded but Postgres did not (a writer killed between the ref update and the
Postgres commit, design §3) is completed by :func:`recover` when the store catches up: the artifact
is then whole — markdown in git, rows in Postgres, blobs already durable on disk.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kb.db.locks import chunk_lock
from kb.db.sql import queries
from kb.errors import ArtifactReadOnly
from kb.paths import unique_identifier_hash
from kb.store.history import json_column
from kb.store.projection import EVENTS_CHANNEL, event_payload

if TYPE_CHECKING:
    from kb.db.database import Connection

TRAILER = "Kb-Artifact: "
ACCESS_REFUSE, ACCESS_BUMP, ACCESS_ARTIFACT = "refuse", "bump", "artifact"
"""Draft access modes: plain writes refuse artifacts; revert/restore bump; the artifact layer owns."""


@dataclass(frozen=True)
class ArtifactFile:
    """One attached file: its role (name), size in bytes and sha256 (its blob address)."""

    role: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What one artifact revision recorded: ``op`` is ``save``, ``revise`` or ``delete``."""

    op: str
    path: str
    title: str
    format: str
    generation: int
    files: tuple[ArtifactFile, ...] = ()

    def trailer(self) -> str:
        """The one-line commit trailer carrying this manifest."""
        body = {
            "op": self.op,
            "path": self.path,
            "title": self.title,
            "format": self.format,
            "generation": self.generation,
            "files": [[f.role, f.size, f.sha256] for f in self.files],
        }
        return TRAILER + json.dumps(body, ensure_ascii=True, separators=(",", ":"))

    @classmethod
    def from_message(cls, message: str) -> Manifest | None:
        """The manifest in a commit message, or None (not an artifact revision, or unreadable)."""
        for line in reversed(message.splitlines()):
            if line.startswith(TRAILER):
                try:
                    body = json.loads(line[len(TRAILER) :])
                    return cls(
                        body["op"],
                        body["path"],
                        body["title"],
                        body["format"],
                        int(body["generation"]),
                        tuple(ArtifactFile(r, int(s), h) for r, s, h in body["files"]),
                    )
                except (ValueError, KeyError, TypeError):
                    return None
        return None


def _virtual(repo_path: str) -> str:
    return repo_path if repo_path.startswith("/") else "/" + repo_path


def artifacts_at(conn: Connection, workspace_id: int, paths: Iterable[str]) -> dict[str, int]:
    """``{virtual path: document id}`` of the ARTIFACT documents among ``paths`` (virtual or repo
    paths): what only the artifact layer may change (design §11)."""
    rows = conn.execute(
        queries["artifact_documents_at"],
        {"workspace_id": workspace_id, "paths": json_column([_virtual(p) for p in paths])},
    ).fetchall()
    return {row["path"]: row["id"] for row in rows}


def guard(
    conn: Connection,
    workspace_id: int,
    effective: Mapping[str, str | None],
    access: str,
    revision_id: str | None = None,
) -> None:
    """Apply the artifact rule to a revision about to be recorded (under the write lock).

    ``effective``: ``{repo path: new blob id or None (removed)}``; ``revision_id``: the commit
    about to be recorded. ``access``: ``refuse`` raises
    ArtifactReadOnly naming the first ARTIFACT path; ``bump`` increments those artifacts'
    generations (a sidecar-less row becomes generation 2, its implicit 1 bumped) and drops the rows
    of any whose file is removed; ``artifact`` does nothing (the artifact layer's hooks do it).
    """
    if access == ACCESS_ARTIFACT or not effective:
        return
    rows = conn.execute(
        queries["artifact_documents_at"],
        {
            "workspace_id": workspace_id,
            "paths": json_column([_virtual(p) for p in effective]),
        },
    ).fetchall()
    if not rows:
        return
    if access == ACCESS_REFUSE:
        path = rows[0]["path"]
        refused = f"{path} is an ARTIFACT (id {rows[0]['id']}); plain writes, turns and editor saves refuse it: use"
        raise ArtifactReadOnly(
            f"{refused} artifacts({workspace_id}).revise({rows[0]['id']}, …) or .delete({rows[0]['id']})",
            cli=(
                f"{refused} `kb artifact revise {rows[0]['id']} --generation N FILE -w {workspace_id}` or "
                f"`kb artifact delete {rows[0]['id']} -w {workspace_id}`"
            ),
        )
    # Lock order (kb.locks): the chunk lock before the first document row. Dropping a removed
    # artifact's row cascades to its chunks and their statistics, and the bump locks several
    # document rows in one statement: a projection or an index run of the workspace doing the same
    # in another order would otherwise wait for this transaction while it waits for them.
    chunk_lock(conn, workspace_id)
    removed = [r for r in rows if effective.get(r["path"][1:]) is None]
    for row in removed:
        delete_rows(conn, workspace_id, row["id"])
        announce_deleted(conn, workspace_id, row["id"], row["path"], revision_id)
    kept = [r["id"] for r in rows if r not in removed]
    if kept:
        conn.execute(queries["bump_artifact_generations"], {"workspace_id": workspace_id, "document_ids": kept})


def write_manifest(conn: Connection, workspace_id: int, manifest: Manifest, document_id: int | None = None) -> int:
    """Write an artifact's rows as ``manifest`` records them; returns the document id.

    A ``save`` (or ``document_id`` None) claims the document row at ``manifest.path`` as ARTIFACT;
    the sidecar gets the manifest's format and generation and exactly its files; blobs no longer
    referenced get a purge entry.
    """
    if document_id is None:
        document_id = conn.execute(
            queries["claim_artifact_document"],
            {
                "workspace_id": workspace_id,
                "path": manifest.path,
                "title": manifest.title,
                "uid_hash": unique_identifier_hash("ARTIFACT", manifest.path, workspace_id),
            },
        ).fetchone()["id"]
    conn.execute(
        queries["upsert_artifact"],
        {
            "document_id": document_id,
            "workspace_id": workspace_id,
            "format": manifest.format,
            "generation": manifest.generation,
        },
    )
    dropped = [r["sha256"] for r in conn.execute(queries["delete_artifact_files"], {"document_id": document_id})]
    for file in manifest.files:
        conn.execute(
            queries["insert_artifact_file"],
            {
                "document_id": document_id,
                "workspace_id": workspace_id,
                "role": file.role,
                "size": file.size,
                "sha256": file.sha256,
            },
        )
    request_purges(conn, workspace_id, dropped)
    return document_id


def delete_rows(conn: Connection, workspace_id: int, document_id: int) -> list[str]:
    """Delete an artifact's document row (sidecar, file, chunk and term rows cascade) and request
    the purge of blobs nothing references any more; returns the sha256s it referenced. The caller
    holds the workspace's chunk lock, taken before it locked any document row (``kb.db.locks``)."""
    shas = [r["sha256"] for r in conn.execute(queries["delete_artifact_files"], {"document_id": document_id})]
    conn.execute(queries["delete_artifact_document"], {"workspace_id": workspace_id, "document_id": document_id})
    request_purges(conn, workspace_id, shas)
    return shas


def announce_deleted(conn: Connection, workspace_id: int, document_id: int, path: str, revision_id: str | None) -> None:
    """Send the ``document_deleted`` event (``kb_events``, on commit) for an artifact whose row this
    transaction deleted: projection will find no row to delete, so it would not announce it (design §6)."""
    event = {
        "event": "document_deleted",
        "workspace_id": workspace_id,
        "revision": revision_id,
        "id": document_id,
        "path": path,
    }
    conn.execute(queries["notify_event"], {"channel": EVENTS_CHANNEL, "payload": event_payload(event)})


def request_purges(conn: Connection, workspace_id: int, shas: Iterable[str]) -> None:
    """Record a purge entry for each of ``shas`` that no artifact file row references."""
    shas = sorted(set(shas))
    if shas:
        conn.execute(queries["request_blob_purges"], {"workspace_id": workspace_id, "shas": shas})


def recover(conn: Connection, workspace_id: int, messages: Iterable[str]) -> int:
    """Complete the rows of artifact revisions git recorded and Postgres lacked, oldest first
    (called by the store's catch-up under the write lock). Returns how many were applied."""
    applied = 0
    for message in messages:
        manifest = Manifest.from_message(message)
        if manifest is None:
            continue
        if manifest.op == "delete":
            row = conn.execute(
                queries["delete_artifact_document_at"], {"workspace_id": workspace_id, "path": manifest.path}
            ).fetchone()
            request_purges(conn, workspace_id, [f.sha256 for f in manifest.files])
            applied += row is not None
            continue
        write_manifest(conn, workspace_id, manifest)
        applied += 1
    return applied
