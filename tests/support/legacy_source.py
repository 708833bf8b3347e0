"""A legacy knowledge base to seed from, generated from a folder of markdown (the schema is
``legacy_schema.sql`` beside this file): the input of the seed (design §10) and span-fill (design §9)
tests.

Every markdown file becomes a legacy document in a folder tree like the source's, with chunk vectors
of the stand-in model ``legacy-hash-384`` and no spans. The quirks real legacy data has are planted
on a fixed schedule over the sorted files, so even a dozen files hold each of them; the summary
names every planted row, so tests assert exact outcomes:

  non_note         FILE documents with metadata, and one ARTIFACT
  unsafe_title     a title holding ':', '/', '?' or '"'
  unsafe_folder    the first folder whose name holds " and " gets a '/' in its name instead
  crlf             a body with CRLF line endings
  repeated_para    a body ending with one of its paragraphs twice more
  stale_chunks     chunks cut from an older body than the one stored (the span fill skips it)
  content_only     no source_markdown, the body only in content
  legacy_marker    document_metadata.virtual_path in the old "/documents/X (<id>).xml" spelling
  dup_title        an older draft with the same title in the same folder  ([document, draft])
  case_dup         a sibling whose title differs only in case             ([document, sibling])
  blank, pending   an empty body and a "Pending..." placeholder (both skipped by the seeder)
  same_created_at  two "Twin" documents created at the same instant       ([first, second])
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import psycopg

from .named_queries import queries

SCHEMA = Path(__file__).with_name("legacy_schema.sql")
MODEL = "legacy-hash-384"
DIMENSIONS = 384
CHUNK_LIMIT = 800  # characters: the legacy chunker merges paragraphs up to this length
QUIRKS = (
    "non_note",
    "unsafe_title",
    "unsafe_folder",
    "crlf",
    "repeated_para",
    "stale_chunks",
    "content_only",
    "legacy_marker",
    "dup_title",
    "case_dup",
    "blank",
    "pending",
    "same_created_at",
)
# what the i-th file (sorted) becomes, by i modulo the schedule's length
SCHEDULE = (
    "plain",
    "unsafe_title",
    "crlf",
    "repeated_para",
    "stale_chunks",
    "content_only",
    "plain",
    "legacy_marker",
    "dup_title",
    "case_dup",
    "non_note",
)
UNSAFE_SUFFIXES = (": a draft", "/v2", " — why?", ' "quoted"')


def legacy_hash_vector(text: str) -> np.ndarray:
    """The stand-in legacy model: a unit float32 vector of 384 dimensions read from sha256 blocks
    of ``f"{block}:{text}"``, each byte b mapped to (b - 127.5) / 127.5."""
    values: list[float] = []
    block = 0
    while len(values) < DIMENSIONS:
        values.extend((b - 127.5) / 127.5 for b in hashlib.sha256(f"{block}:{text}".encode()).digest())
        block += 1
    vector = np.asarray(values[:DIMENSIONS], dtype=np.float32)
    return vector / (np.linalg.norm(vector) or 1.0)


def legacy_chunks(body: str, limit: int = CHUNK_LIMIT) -> list[str]:
    """The legacy chunker: paragraphs (text between blank lines, ``\\n\\n``) merged while a chunk
    stays within ``limit`` characters; a longer paragraph is a chunk of its own. Every chunk is a
    substring of ``body``, in order; blank paragraphs are dropped."""
    spans, start = [], 0
    for separator in re.finditer(r"\n\n", body):
        spans.append((start, separator.start()))
        start = separator.end()
    spans.append((start, len(body)))
    groups: list[list[int]] = []
    for begin, end in spans:
        if not body[begin:end].strip():
            continue
        if groups and end - groups[-1][0] <= limit:
            groups[-1][1] = end
        else:
            groups.append([begin, end])
    return [body[begin:end] for begin, end in groups]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _vector_literal(vector: np.ndarray) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


class _Writer:
    """Inserts one workspace's folders, documents and chunks on one connection."""

    def __init__(self, conn: psycopg.Connection, workspace: int, seed: int) -> None:
        self.conn, self.workspace, self.rng = conn, workspace, random.Random(seed)
        self.clock = dt.datetime(2025, 3, 1, 9, 0, tzinfo=dt.UTC)
        self.folders: dict[str, int | None] = {"": None}
        self.quirks: dict[str, list] = {name: [] for name in QUIRKS}

    def tick(self) -> dt.datetime:
        """The next creation time: half a minute to an hour after the last."""
        self.clock += dt.timedelta(seconds=self.rng.randint(30, 4000))
        return self.clock

    def folder(self, relative: str) -> int | None:
        """The id of the folder at ``relative`` (``a/b``), created with its parents as needed."""
        if relative in self.folders:
            return self.folders[relative]
        parent = self.folder(relative.rpartition("/")[0])
        name = relative.rpartition("/")[2]
        if not self.quirks["unsafe_folder"] and " and " in name:
            name = name.replace(" and ", "/", 1)
            self.quirks["unsafe_folder"].append(name)
        folder_id = self.conn.execute(
            queries["test_legacy_insert_folder"],
            {
                "workspace_id": self.workspace,
                "parent_id": parent,
                "name": name,
                "position": f"a{len(self.folders):04d}",
                "created_at": self.tick(),
            },
        ).fetchone()[0]
        self.folders[relative] = folder_id
        return folder_id

    def document(
        self,
        title: str,
        folder_id: int | None,
        body: str,
        *,
        document_type: str = "NOTE",
        metadata: dict | None = None,
        status: str = "ready",
        with_markdown: bool = True,
        created_at: dt.datetime | None = None,
        chunked_from: str | None = None,
    ) -> int:
        """Insert one document and, when ready, its chunks (cut from ``chunked_from`` if given,
        else from ``body``); returns its id."""
        created = created_at or self.tick()
        unique_id = f"/documents/{title}.xml" if document_type == "NOTE" else f"{document_type}:{title}"
        document_id = self.conn.execute(
            queries["test_legacy_insert_document"],
            {
                "workspace_id": self.workspace,
                "folder_id": folder_id,
                "title": title,
                "document_type": document_type,
                "document_metadata": json.dumps(metadata or {}),
                "content": body,
                "source_markdown": body if with_markdown else None,
                "content_hash": _sha256(f"{self.workspace}:{body}"),
                "unique_identifier_hash": _sha256(f"{document_type}:{unique_id}:{self.workspace}"),
                "status": status,
                "created_by_id": f"user-{self.rng.randint(1, 5)}",
                "created_at": created,
                "updated_at": created,
            },
        ).fetchone()[0]
        if status == "ready":
            chunks = legacy_chunks(body if chunked_from is None else chunked_from)
            with self.conn.cursor() as cur:
                cur.executemany(
                    queries["test_legacy_insert_chunk"],
                    [
                        {
                            "document_id": document_id,
                            "position": i,
                            "content": text,
                            "embedding": _vector_literal(legacy_hash_vector(text)),
                            "created_at": created,
                        }
                        for i, text in enumerate(chunks)
                    ],
                )
        return document_id

    def page(self, i: int, title: str, folder_id: int | None, body: str, *, alone: bool) -> None:
        """Insert the ``i``-th markdown page with the quirk the schedule gives it. A page ``alone``
        in its folder gets no legacy marker: the marker moves it to the top level, and the folder
        left empty would be seeded as a ``.keep`` file no legacy document accounts for."""
        kind = SCHEDULE[i % len(SCHEDULE)]
        paragraphs = [p for p in body.split("\n\n") if len(p.strip()) > 40]
        if (kind == "repeated_para" and not paragraphs) or (kind == "legacy_marker" and alone):
            kind = "plain"
        if kind == "non_note":
            self.quirks[kind].append(
                self.document(
                    title,
                    folder_id,
                    body,
                    document_type="FILE",
                    metadata={"filename": f"{title}.pdf", "mime": "application/pdf"},
                )
            )
        elif kind == "unsafe_title":
            unsafe = title + UNSAFE_SUFFIXES[len(self.quirks[kind]) % len(UNSAFE_SUFFIXES)]
            self.quirks[kind].append(self.document(unsafe, folder_id, body))
        elif kind == "crlf":
            self.quirks[kind].append(self.document(title, folder_id, body.replace("\n", "\r\n")))
        elif kind == "repeated_para":
            repeated = body.rstrip("\n") + "\n\n" + paragraphs[0] + "\n\n" + paragraphs[0] + "\n"
            self.quirks[kind].append(self.document(title, folder_id, repeated))
        elif kind == "stale_chunks":
            older = body[: max(1, len(body) // 2)] + "\n\nA paragraph that a later edit removed.\n"
            self.quirks[kind].append(self.document(title, folder_id, body, chunked_from=older))
        elif kind == "content_only":
            self.quirks[kind].append(self.document(title, folder_id, body, with_markdown=False))
        else:
            document_id = self.document(title, folder_id, body)
            if kind == "legacy_marker":
                marker = f"/documents/{title} ({document_id}).xml"
                self.conn.execute(
                    queries["test_legacy_add_metadata"],
                    {"metadata": json.dumps({"virtual_path": marker}), "document_id": document_id},
                )
                self.quirks[kind].append([document_id, marker])
            elif kind == "dup_title":
                draft = self.document(
                    title,
                    folder_id,
                    body[: max(1, len(body) // 3)] + "\n\n(draft)\n",
                    created_at=dt.datetime(2025, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
                )
                self.quirks[kind].append([document_id, draft])
            elif kind == "case_dup":
                other = title.lower() if title.lower() != title else title.upper()
                sibling = self.document(other, folder_id, "# Other case\n\nThe same title in other letters.\n")
                self.quirks[kind].append([document_id, sibling])

    def rows_every_seed_must_handle(self) -> None:
        """The top-level rows the seeder skips or orders by id: blank, pending, twins, an ARTIFACT."""
        self.quirks["blank"].append(self.document("Empty note", None, ""))
        self.quirks["pending"].append(self.document("Upload in progress", None, "Pending...", status="pending"))
        same = self.tick()
        first = self.document("Twin", None, "# Twin one\n", created_at=same)
        second = self.document("Twin", None, "# Twin two\n", created_at=same)
        self.quirks["same_created_at"].append([first, second])
        self.quirks["non_note"].append(
            self.document(
                "Quarterly report",
                None,
                "# Quarterly report\n\nGenerated.\n",
                document_type="ARTIFACT",
                metadata={"format": "pdf"},
            )
        )


def fill_legacy(dsn: str, source: Path, files: list[Path], workspace: int, seed: int = 7) -> dict:
    """Add workspace ``workspace`` to the legacy database at ``dsn`` (creating schema ``legacy``
    on first use) from ``files``, markdown files under ``source``; returns the summary:
    ``{"workspace", "documents", "folders", "chunks", "embedding_model", "quirks": {name: [ids]}}``.

    Deterministic for a given ``seed``. Raises ValueError when ``files`` is empty."""
    if not files:
        raise ValueError(f"no markdown files to make a legacy knowledge base from under {source}")
    with psycopg.connect(dsn) as conn:
        if not conn.execute(queries["legacy_schema_present"]).fetchone()[0]:
            conn.execute(SCHEMA.read_text())
        conn.execute(queries["test_legacy_record_meta"], {"model": MODEL})
        writer = _Writer(conn, workspace, seed)
        folders = [path.relative_to(source).parent.as_posix().removeprefix(".") for path in files]
        pages_in = Counter(folders)
        for i, (path, folder) in enumerate(zip(files, folders)):
            writer.page(
                i, path.stem, writer.folder(folder), path.read_text(encoding="utf-8"), alone=pages_in[folder] == 1
            )
        writer.rows_every_seed_must_handle()
        documents, folders, chunks = conn.execute(queries["test_legacy_counts"], {"workspace_id": workspace}).fetchone()
    return {
        "workspace": workspace,
        "documents": documents,
        "folders": folders,
        "chunks": chunks,
        "embedding_model": MODEL,
        "quirks": writer.quirks,
    }
