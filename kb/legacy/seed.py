"""Seeding a workspace from a legacy knowledge base (design §10).

The legacy source is a Postgres schema ``legacy`` (folders and documents as rows, chunks with
vectors and no spans). A seed:

1. **plans** every path from the legacy rows without reading a body (one streamed pass): the
   folder chain from display names through the path law (design §2.2), the file name from the
   title, collisions suffixed `` (2)``, `` (3)`` in ``created_at`` then id order. A recorded
   legacy path (``document_metadata.virtual_path``, also the old ``X.xml`` and ``X (<id>).xml``
   spellings) is honoured: converted to ``X.md`` and claimed before the derived names. Blank bodies
   and ``pending`` placeholders are skipped and reported. A dry run stops here.
2. **writes one revision** (author ``kb-migration``) that makes ``documents/`` exactly the planned
   set: bodies (``source_markdown``, else ``content``) stream from a server-side cursor into the
   object store batch by batch, so memory holds ids, not bodies; bytes are kept exactly (CRLF).
3. **checks byte parity** of the planned set against the revision's tree (missing, extra and
   mismatched paths listed) and only then allows ``flip``.
4. **adopts identity** (title, type, metadata, the legacy id in ``kb.legacy_documents``) and, when
   the legacy model is the active one, **adopts chunks**: legacy vectors copied into ``kb.chunks``
   with NULL spans and computed tsvectors, the documents marked indexed and the index stamp set to
   the seed revision, so nothing is embedded. The embedding cache is never warmed from them (design
   §7). When the models differ the documents stay pending and the index job re-embeds them.

The workspace's index lock is held from before the commit until adoption is done, so a worker's
index job meanwhile skips instead of embedding what is about to be adopted.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import psycopg
from psycopg.rows import dict_row

from kb.db import database
from kb.db.locks import chunk_lock, index_lock
from kb.db.sql import queries
from kb.errors import LegacySourceError, LockTimeout, SeedRefused
from kb.index.chunk_context import context_line
from kb.index.languages import detect_language, lexical_text, text_config
from kb.paths import NameRegistry, name_key, safe_filename, safe_folder_segment, unique_identifier_hash
from kb.store.job_deferral import INDEX_TASK, defer_job
from kb.store.projection import PATH_KEYED_TYPES

if TYPE_CHECKING:
    from kb.db.database import Connection
    from kb.store.stores import Stores

MIGRATION_AUTHOR = "kb-migration"
BLOB_BATCH_BYTES = 8 * 2**20
"""Bodies are written to the object store in batches of about this many bytes (one pack each):
memory holds at most one batch of bodies, and few packs keep later blob reads fast."""
CURSOR_ROWS = 1000
_LEGACY_NAME = re.compile(r"^(?P<stem>.*?)(?: \((?P<id>\d+)\))?\.(?P<ext>xml|md)$", re.IGNORECASE)


@dataclass
class ParityReport:
    """Byte parity of the planned set against a revision's tree: paths listed per kind."""

    checked: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the tree holds exactly the planned paths with exactly the planned bytes."""
        return not (self.missing or self.extra or self.mismatched)


@dataclass
class SeedEntry:
    """What the seed does with one legacy document (a line of ``--out report.jsonl``).

    ``outcome``: ``seeded`` or ``skipped`` (``reason``: ``blank`` or ``pending``); ``renamed`` is
    True when a collision suffixed the name; ``legacy_path`` is the recorded path honoured.
    """

    legacy_id: int
    title: str
    document_type: str
    outcome: str
    path: str | None = None
    reason: str | None = None
    renamed: bool = False
    legacy_path: str | None = None
    body_source: str | None = None
    bytes: int = 0
    chunks: int = 0
    content_id: str | None = None
    metadata: dict = field(default_factory=dict)
    legacy_uid_hash: str | None = None


@dataclass
class SeedReport:
    """Outcome of ``seed`` (dry run or not). Counts are of legacy documents unless named otherwise."""

    workspace_id: int
    legacy_workspace: int
    source: str
    dry_run: bool
    legacy_model: str | None = None
    active_model: str | None = None
    entries: list[SeedEntry] = field(default_factory=list)
    folders: int = 0
    keeps: list[str] = field(default_factory=list)
    revision: str | None = None
    head: str | None = None
    parity: ParityReport | None = None
    not_adopted: list[str] = field(default_factory=list)
    """Seeded paths a later revision removed or moved before their identity was adopted (a writer
    racing the seed): no legacy mapping yet; seeding again adopts them."""
    flipped: bool = False
    unflipped: bool = False
    documents_adopted: int = 0
    chunks_adopted: int = 0
    documents_to_index: int = 0
    chunks_to_reembed: int = 0
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds per step: plan, blobs, commit, parity, projection, identity, chunks."""

    @property
    def seeded(self) -> list[SeedEntry]:
        """Entries written to the workspace (in created_at, id order)."""
        return [e for e in self.entries if e.outcome == "seeded"]

    @property
    def skipped(self) -> list[SeedEntry]:
        """Entries skipped (``reason``: blank or pending)."""
        return [e for e in self.entries if e.outcome == "skipped"]

    @property
    def collisions(self) -> list[SeedEntry]:
        """Entries whose name a collision suffixed (`` (2)``, …)."""
        return [e for e in self.entries if e.renamed]

    @property
    def bytes(self) -> int:
        """Bytes of the seeded bodies (UTF-8)."""
        return sum(e.bytes for e in self.seeded)

    @property
    def models_match(self) -> bool:
        """True when the legacy model is the active one: vectors are adopted, nothing embedded."""
        return self.legacy_model is not None and self.legacy_model == self.active_model

    def summary(self) -> dict:
        """A JSON-able summary (the last line of ``--out``, ``kb seed --json``)."""
        return {
            "workspace": self.workspace_id,
            "legacy_workspace": self.legacy_workspace,
            "source": self.source,
            "dry_run": self.dry_run,
            "documents": len(self.seeded),
            "skipped": len(self.skipped),
            "collisions": len(self.collisions),
            "folders": self.folders,
            "bytes": self.bytes,
            "legacy_model": self.legacy_model,
            "active_model": self.active_model,
            "revision": self.revision,
            "head": self.head,
            "parity": None if self.parity is None else {**asdict(self.parity), "ok": self.parity.ok},
            "not_adopted": self.not_adopted,
            "flipped": self.flipped,
            "unflipped": self.unflipped,
            "documents_adopted": self.documents_adopted,
            "chunks_adopted": self.chunks_adopted,
            "documents_to_index": self.documents_to_index,
            "chunks_to_reembed": self.chunks_to_reembed,
            "seconds": round(self.seconds, 3),
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
        }

    def write_jsonl(self, path) -> None:
        """One JSON line per legacy document, then ``{"summary": …}``."""
        with open(path, "w", encoding="utf-8") as out:
            for entry in self.entries:
                out.write(json.dumps(asdict(entry), ensure_ascii=False) + "\n")
            out.write(json.dumps({"summary": self.summary()}, ensure_ascii=False, default=str) + "\n")


# -- the legacy source ------------------------------------------------------------------------
@contextlib.contextmanager
def legacy_connection(dsn: str) -> Iterator[Connection]:
    """A read-only connection to the legacy database; raises LegacySourceError (DSN redacted)."""
    try:
        conn = psycopg.connect(dsn, row_factory=dict_row)
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LegacySourceError(f"cannot connect to the legacy database {database.redact(dsn)}: {reason}") from None
    try:
        conn.read_only = True
        database.configure_connection(conn)  # kb's session settings, whatever the role's defaults
        conn.commit()
        if not conn.execute(queries["legacy_schema_present"]).fetchone()["present"]:
            raise LegacySourceError(
                f"{database.redact(dsn)} has no legacy.documents table; point --from-dsn at the legacy database"
            )
        yield conn
    finally:
        conn.close()


def _stream(conn: Connection, query: str, params: dict) -> Iterator[dict]:
    """Rows of ``query`` through a server-side cursor (memory flat in the number of rows)."""
    with conn.transaction(), conn.cursor(name=f"kb_seed_{time.monotonic_ns()}", row_factory=dict_row) as cur:
        cur.itersize = CURSOR_ROWS
        cur.execute(query, params)
        yield from cur


# -- 1. the path plan -------------------------------------------------------------------------
class _Namespace:
    """Names taken per folder (files and folders share one namespace, design §2.2)."""

    def __init__(self) -> None:
        self.registries: dict[tuple[str, ...], NameRegistry] = {}
        self.folder_names: dict[tuple[str, ...], dict[str, str]] = {}  # parent -> key -> spelling

    def folder(self, parent: tuple[str, ...], name: str, *, reuse: bool) -> tuple[str, ...]:
        """Claim a folder segment under ``parent``; ``reuse`` joins an existing folder whose name
        differs only in case/normalization (a recorded path names the folder, not a new one)."""
        safe = safe_folder_segment(name)
        known = self.folder_names.setdefault(parent, {})
        if reuse and name_key(safe) in known:
            return (*parent, known[name_key(safe)])
        chosen = self.registries.setdefault(parent, NameRegistry()).claim(safe)
        known.setdefault(name_key(chosen), chosen)
        return (*parent, chosen)

    def file(self, parent: tuple[str, ...], name: str) -> str:
        return self.registries.setdefault(parent, NameRegistry()).claim(name)


def legacy_path_parts(virtual_path: object, legacy_id: int) -> tuple[tuple[str, ...], str] | None:
    """Convert a recorded legacy path to ``(folder display names, file name)`` (design §2.2):
    ``/documents/A/X.xml`` and ``/documents/A/X (<legacy_id>).xml`` → ``(("A",), "X.md")``; a
    ``.md`` path is taken as written. ``(<n>)`` with another id is part of the title. None when the
    value is not such a path (it is then ignored and the folder chain is used)."""
    if not isinstance(virtual_path, str) or not virtual_path.startswith("/documents/"):
        return None
    *folders, last = virtual_path[len("/documents/") :].split("/")
    match = _LEGACY_NAME.match(last)
    if match is None or any(not f.strip() for f in folders):
        return None
    stem = match["stem"]
    if match["id"] is not None and int(match["id"]) != legacy_id:
        stem = f"{stem} ({match['id']})"
    if not stem.strip():
        return None
    return tuple(folders), safe_filename(stem)


def plan(conn: Connection, legacy_workspace: int) -> tuple[list[SeedEntry], int, list[str]]:
    """Plan every legacy document of ``legacy_workspace`` (no bodies read).

    Returns ``(entries in created_at/id order, number of legacy folders, .keep paths)``; seeded
    entries carry their virtual path; a legacy folder that ends up holding no document keeps a
    ``.keep`` file so the folder tree survives (design §1). Recorded legacy paths are claimed first, then the derived ones, each in
    ``created_at`` then id order; legacy folders are claimed before any file.
    """
    folders = {r["id"]: r for r in conn.execute(queries["legacy_folders"], {"workspace": legacy_workspace})}
    names = _Namespace()
    folder_parts: dict[int, tuple[str, ...]] = {}

    def chain(folder_id: int | None, seen: frozenset = frozenset()) -> tuple[str, ...]:
        if folder_id is None or folder_id not in folders or folder_id in seen:
            return ()
        if folder_id not in folder_parts:
            row = folders[folder_id]
            parent = chain(row["parent_id"], seen | {folder_id})
            folder_parts[folder_id] = names.folder(parent, row["name"], reuse=False)
        return folder_parts[folder_id]

    for folder_id in folders:  # created_at, id order
        chain(folder_id)
    entries: list[SeedEntry] = []
    recorded: list[tuple[SeedEntry, tuple[tuple[str, ...], str]]] = []
    derived: list[tuple[SeedEntry, dict]] = []
    for row in _stream(conn, queries["legacy_document_plan"], {"workspace": legacy_workspace}):
        entry = SeedEntry(
            row["id"],
            row["title"],
            row["document_type"],
            "seeded",
            body_source=row["body_source"],
            bytes=row["bytes"],
            chunks=row["chunks"],
        )
        entries.append(entry)
        if row["status"] == "pending" or row["placeholder"]:
            entry.outcome, entry.reason, entry.bytes = "skipped", "pending", 0
            continue
        if row["blank"]:
            entry.outcome, entry.reason, entry.bytes = "skipped", "blank", 0
            continue
        metadata = row["metadata"] if isinstance(row["metadata"], dict) else {}
        converted = legacy_path_parts(metadata.get("virtual_path"), row["id"])
        entry.metadata, entry.legacy_uid_hash = metadata, row["unique_identifier_hash"]
        if converted is not None:
            entry.legacy_path = metadata["virtual_path"]
            recorded.append((entry, converted))
        else:
            derived.append((entry, row))
    for entry, (folder_names, name) in recorded:
        parent: tuple[str, ...] = ()
        for folder_name in folder_names:
            parent = names.folder(parent, folder_name, reuse=True)
        _place(entry, names, parent, name)
    for entry, row in derived:
        _place(entry, names, chain(row["folder_id"]), safe_filename(row["title"]))
    used = {tuple(e.path.split("/")[2:i]) for e in entries if e.path for i in range(3, e.path.count("/") + 1)}
    keeps = sorted(
        "/" + "/".join(("documents", *parts, ".keep")) for parts in folder_parts.values() if parts not in used
    )
    return entries, len(folders), keeps


def _place(entry: SeedEntry, names: _Namespace, parent: tuple[str, ...], name: str) -> None:
    final = names.file(parent, name)
    entry.renamed = final != name
    entry.path = "/" + "/".join(("documents", *parent, final))


# -- the seed ---------------------------------------------------------------------------------
class Seeder:
    """One seed of ``workspace_id`` from ``legacy_workspace`` at ``dsn`` (see the module docstring)."""

    def __init__(
        self,
        stores: Stores,
        dsn: str,
        legacy_workspace: int,
        workspace_id: int,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.stores, self.dsn, self.legacy_workspace, self.workspace_id = stores, dsn, legacy_workspace, workspace_id
        self.progress = progress or (lambda message: None)
        self.store = stores.store(workspace_id)

    def run(self, *, yes: bool, flip: bool, force: bool, active_model: str | None) -> SeedReport:
        started = time.perf_counter()
        report = SeedReport(
            self.workspace_id,
            self.legacy_workspace,
            database.redact(self.dsn),
            dry_run=not yes,
            active_model=active_model,
        )
        seed_row = self._seed_row()
        if yes and seed_row is not None and seed_row["flipped"] and not force:
            flipped = (
                f"workspace {self.workspace_id} is flipped: kb is its authority since "
                f"{seed_row['flipped_at']:%Y-%m-%d %H:%M}; re-seeding would revert edits made in kb."
            )
            raise SeedRefused(
                f"{flipped} Pass force=True to seed anyway, or set_authority({self.workspace_id}, flipped=False) first",
                cli=f"{flipped} Pass --force to seed anyway, or --unflip first",
            )
        if yes and seed_row is None and not force and self.store.exists() and self.store.head() is not None:
            unseeded = (
                f"workspace {self.workspace_id} already has documents that no seed wrote; seeding makes "
                "its tree exactly the legacy documents and would remove them. Seed into a new workspace, or pass"
            )
            raise SeedRefused(f"{unseeded} force=True", cli=f"{unseeded} --force")
        if flip and not yes:
            raise SeedRefused(
                "flip=True needs yes=True: authority moves only after a seed whose byte parity passed",
                cli="--flip needs --yes: authority moves only after a seed whose byte parity passed",
            )
        with legacy_connection(self.dsn) as legacy:
            meta = {r["key"]: r["value"] for r in legacy.execute(queries["legacy_meta"])}
            report.legacy_model = meta.get("embedding_model")
            with _phase(report, "plan"):
                report.entries, report.folders, report.keeps = plan(legacy, self.legacy_workspace)
            if not report.entries:
                raise LegacySourceError(f"legacy workspace {self.legacy_workspace} has no documents at {report.source}")
            seeded = report.seeded
            if not report.models_match:
                report.chunks_to_reembed = sum(e.chunks for e in seeded)
                report.documents_to_index = len(seeded)
            self.progress(
                f"planned {len(seeded)} documents, {len(report.skipped)} skipped, "
                f"{len(report.collisions)} renamed by collisions"
            )
            if not report.models_match:
                self.progress(
                    f"legacy model {report.legacy_model!r} is not the active model {active_model!r}: "
                    f"{report.chunks_to_reembed} legacy chunks are not adopted; the index job "
                    f"re-embeds {report.documents_to_index} documents (through the embedding cache)"
                )
            if not yes:
                report.seconds = time.perf_counter() - started
                return report
            if not self.store.exists():
                self.store.create()
            try:
                with self._index_lock():
                    self._write_and_adopt(legacy, report)
            finally:
                # a seed revision always gets its kb.seeds row, even when a later phase failed,
                # so that seeding again is a re-seed, not refused as "documents no seed wrote"
                if report.head is not None:
                    self._record_seed(report)
        if flip:
            if report.not_adopted:
                raise SeedRefused(
                    f"{len(report.not_adopted)} seeded documents were removed or moved by another writer before "
                    f"their identity was adopted (e.g. {report.not_adopted[0]}); not flipping. Seed again"
                )
            if not report.parity.ok:
                raise SeedRefused(
                    f"byte parity failed ({len(report.parity.missing)} missing, {len(report.parity.extra)} extra, "
                    f"{len(report.parity.mismatched)} mismatched); not flipping. See the report and seed again"
                )
            report.flipped = set_authority(self.stores, self.workspace_id, flipped=True)
        report.seconds = time.perf_counter() - started
        return report

    def _write_and_adopt(self, legacy: Connection, report: SeedReport) -> None:
        """Under the index lock: blobs, the revision, parity, projection, identity, chunks."""
        seeded = report.seeded
        with _phase(report, "blobs"):
            desired = self._write_blobs(legacy, seeded, report.keeps)
        with _phase(report, "commit"):
            revision, unchanged_at = self._commit(report, desired)
        report.revision = revision.id if revision else None
        # the seed's own revision: a writer may commit on top of it before the checks below
        report.head = report.revision or unchanged_at
        with _phase(report, "parity"):
            report.parity = self.check_parity(desired, report.head)
        self.progress(f"parity: {'ok' if report.parity.ok else 'FAILED'} over {report.parity.checked} paths")
        with _phase(report, "projection"):
            self.stores.project(self.workspace_id)
        with _phase(report, "identity"):
            rows = self._adopt_identity(seeded, report)
        if report.models_match:
            with _phase(report, "chunks"):
                self._adopt_chunks(legacy, report, rows)
        else:  # the index job embeds them with the active model, through the cache
            report.documents_to_index = sum(
                1 for row in rows.values() if row["indexed_content_id"] != row["content_id"]
            )

    def _record_seed(self, report: SeedReport) -> None:
        """Record the seed (``kb.seeds``) and defer the index job for documents to re-embed."""
        with database.transaction(self.stores.database_url) as conn:
            conn.execute(
                queries["record_seed"],
                {
                    "workspace_id": self.workspace_id,
                    "source": report.source,
                    "legacy_workspace": self.legacy_workspace,
                    "legacy_model": report.legacy_model,
                    "seed_revision": report.head,
                    "documents": len(report.seeded),
                    "parity_ok": report.parity is not None and report.parity.ok and not report.not_adopted,
                },
            )
            if report.documents_to_index:
                defer_job(conn, "index", INDEX_TASK, self.workspace_id)

    def _seed_row(self) -> dict | None:
        with database.transaction(self.stores.database_url) as conn:
            return conn.execute(queries["get_seed"], {"workspace_id": self.workspace_id}).fetchone()

    @contextlib.contextmanager
    def _index_lock(self) -> Iterator[None]:
        """Hold the workspace's index lock (the indexer's, ``kb.db.locks.index_lock``, design §4),
        waiting up to ``lock_timeout`` seconds for a running index job; raises LockTimeout."""
        with index_lock(self.stores.database_url, self.workspace_id, wait=self.stores.settings.lock_timeout) as locked:
            if not locked:
                raise LockTimeout(
                    self.workspace_id,
                    self.stores.settings.lock_timeout,
                    lock="index",
                    holder="an index run holds the index lock; seed again when it has finished",
                )
            yield

    def _write_blobs(self, legacy: Connection, seeded: list[SeedEntry], keeps: list[str]) -> dict[str, str]:
        """Stream the bodies into the object store; ``{virtual path: blob id}`` of the planned set
        (documents and the ``.keep`` files of folders left without documents)."""
        by_id = {e.legacy_id: e for e in seeded}
        repo = self.store.repository
        batch: list[tuple[SeedEntry, bytes]] = []
        size = 0

        def flush() -> None:
            for (entry, data), blob in zip(batch, repo.add_blobs(data for _, data in batch)):
                entry.content_id = blob
                entry.bytes = len(data)
            batch.clear()

        for row in _stream(legacy, queries["legacy_document_bodies"], {"workspace": self.legacy_workspace}):
            entry = by_id.get(row["id"])
            if entry is not None:
                batch.append((entry, row["body"].encode("utf-8")))
                size += len(batch[-1][1])
                if size >= BLOB_BATCH_BYTES:
                    flush()
                    size = 0
        flush()
        desired = {e.path: e.content_id for e in seeded}
        if keeps:
            desired.update(dict.fromkeys(keeps, repo.add_blobs([b""])[0]))
        return desired

    def _commit(self, report: SeedReport, desired: dict[str, str]):
        """One revision making ``documents/`` exactly ``desired`` and the head it started from;
        the revision is None when the tree already was ``desired`` (then that head is the seed's
        revision). A legacy
        document whose planned path changed since the last seed (a retitle) is moved, so its kb
        document id and history follow it."""
        head = self.store.head()
        current = self.store.list_paths(head) if head else {}
        with database.transaction(self.stores.database_url) as conn:
            previous = {
                r["legacy_id"]: r["path"]
                for r in conn.execute(queries["legacy_document_paths"], {"workspace_id": self.workspace_id})
            }
        message = (
            f"seed workspace {self.workspace_id} from legacy workspace {self.legacy_workspace}\n\n"
            f"Source: {report.source}\nDocuments: {len(report.seeded)}, skipped: {len(report.skipped)}"
        )
        with self.store.transaction(message, MIGRATION_AUTHOR) as draft:
            for entry in report.seeded:
                old = previous.get(entry.legacy_id)
                if old and old != entry.path and old in current and old not in desired and not draft.exists(entry.path):
                    draft.move(old, entry.path)
            for path in sorted(set(current) - set(desired)):
                if draft.exists(path):
                    draft.remove(path)
            for path, blob in desired.items():
                if current.get(path) != blob:
                    draft.write_blob(path, blob, allow_keep=True)
        return draft.revision, head

    def check_parity(self, desired: dict[str, str], revision: str | None) -> ParityReport:
        """Compare ``desired`` ({virtual path: blob id}) with ``revision``'s ``documents/`` tree."""
        tree = self.store.list_paths(revision) if revision else {}
        parity = ParityReport(checked=len(desired))
        parity.missing = sorted(p for p in desired if p not in tree)
        parity.extra = sorted(p for p in tree if p not in desired)
        parity.mismatched = sorted(p for p, blob in desired.items() if p in tree and tree[p] != blob)
        return parity

    def _adopt_identity(self, seeded: list[SeedEntry], report: SeedReport) -> dict[int, dict]:
        """Title, type, metadata and the legacy id mapping; ``{legacy id: document row}`` of the
        seeded documents still at their paths (the others go to ``report.not_adopted``)."""
        ws = self.workspace_id
        params = []
        for e in seeded:
            uid = (
                unique_identifier_hash(e.document_type, e.path, ws)
                if e.document_type in PATH_KEYED_TYPES
                else e.legacy_uid_hash
            )
            params.append(
                {
                    "workspace_id": ws,
                    "path": e.path,
                    "title": e.title,
                    "document_type": e.document_type,
                    "metadata": json.dumps(e.metadata),
                    "uid_hash": uid,
                }
            )
        with database.transaction(self.stores.database_url) as conn:
            # Lock order (kb.locks): the chunk lock before the document rows, which this updates
            # in the plan's order and a projection of a concurrent revision in path order.
            chunk_lock(conn, ws)
            with conn.cursor() as cur:
                cur.executemany(queries["adopt_document_identity"], params)
            rows = {r["path"]: r for r in conn.execute(queries["seeded_documents"], {"workspace_id": ws})}
            # a writer may have removed or moved a seeded document after the seed revision: it
            # has no row to adopt here; it is reported, and seeding again converges
            present = [e for e in seeded if e.path in rows]
            report.not_adopted = sorted(e.path for e in seeded if e.path not in rows)
            with conn.cursor() as cur:
                cur.executemany(
                    queries["map_legacy_document"],
                    [
                        {
                            "workspace_id": ws,
                            "legacy_id": e.legacy_id,
                            "document_id": rows[e.path]["id"],
                            "path": e.path,
                        }
                        for e in present
                    ],
                )
            conn.execute(
                queries["unmap_legacy_documents"], {"workspace_id": ws, "legacy_ids": [e.legacy_id for e in present]}
            )
        return {e.legacy_id: rows[e.path] for e in present}

    def _text_config(self, text: str) -> str:
        """The document's text-search configuration, as the indexer picks it: ``KB_FTS_CONFIG``,
        or with ``auto`` the one of the language its (legacy chunk) text is written in."""
        if self.stores.settings.fts_config != "auto":
            return self.stores.settings.fts_config
        return text_config(detect_language(text))

    def _adopt_chunks(self, legacy: Connection, report: SeedReport, rows: dict[int, dict]) -> None:
        """Copy legacy vectors of documents not yet indexed at their content; mark them indexed
        and set the stamp to the seed's revision (a writer's later revision is indexed by its job). Documents without legacy chunks stay pending."""
        todo = {
            legacy_id: row
            for legacy_id, row in rows.items()
            if not (row["has_chunks"] and row["indexed_content_id"] == row["content_id"])
        }
        with_chunks: set[int] = set()
        with database.transaction(self.stores.database_url) as conn:
            # Lock order (kb.locks): the chunk lock first. This writes chunks and their statistics
            # and then the documents' rows; a projection of a concurrent revision locks document
            # rows and then chunk statistics (index runs skip: the seed holds the index lock).
            chunk_lock(conn, self.workspace_id)
            if todo:
                conn.execute(queries["delete_chunks_of_documents"], {"ids": [row["id"] for row in todo.values()]})
            conn.execute(queries["create_adopt_staging"])
            with conn.cursor().copy(queries["copy_adopt_staging"]) as copy:
                legacy_chunks = _stream(legacy, queries["legacy_chunks"], {"workspace": self.legacy_workspace})
                for document_id, of_document in itertools.groupby(legacy_chunks, key=lambda c: c["document_id"]):
                    row = todo.get(document_id)
                    if row is None:
                        continue
                    chunks = list(of_document)  # one document's chunks at a time
                    with_chunks.add(row["id"])
                    config = self._text_config("\n\n".join(c["content"] for c in chunks))
                    context = lexical_text(context_line(row["title"], ()))
                    for chunk in chunks:
                        copy.write_row(
                            (
                                row["id"],
                                chunk["position"],
                                chunk["content"],
                                chunk["embedding"],
                                config,
                                context,
                                lexical_text(chunk["content"]),
                            )
                        )
            report.chunks_adopted = conn.execute(
                queries["adopt_staged_chunks"], {"model": report.legacy_model}
            ).rowcount
            conn.execute(queries["refresh_document_terms"], {"document_ids": [row["id"] for row in todo.values()]})
            # the seed's revision, not HEAD: a writer's later revision is not indexed by adopting
            conn.execute(queries["mark_documents_adopted"], {"ids": sorted(with_chunks), "revision_id": report.head})
            conn.execute(queries["set_index_stamp"], {"workspace_id": self.workspace_id, "revision_id": report.head})
        report.documents_adopted = len(with_chunks)
        report.documents_to_index = sum(1 for row in todo.values() if row["id"] not in with_chunks)


@contextlib.contextmanager
def _phase(report: SeedReport, name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        report.phases[name] = report.phases.get(name, 0.0) + time.perf_counter() - started


def set_authority(stores: Stores, workspace_id: int, *, flipped: bool) -> bool:
    """Flip (kb becomes the authority) or unflip a seeded workspace (design §10); True when changed.

    Raises SeedRefused when the workspace was never seeded, or (flip) its last seed failed parity.
    """
    with database.transaction(stores.database_url) as conn:
        seed_row = conn.execute(queries["get_seed"], {"workspace_id": workspace_id}).fetchone()
        if seed_row is None:
            raise SeedRefused(
                f"workspace {workspace_id} was never seeded; run seed(…, yes=True) first",
                cli=f"workspace {workspace_id} was never seeded; run `kb seed --yes` first",
            )
        if flipped and seed_row["flipped"]:
            return False
        changed = conn.execute(
            queries["flip_seed" if flipped else "unflip_seed"], {"workspace_id": workspace_id}
        ).fetchone()
        if flipped and changed is None:
            raise SeedRefused(f"workspace {workspace_id}'s last seed did not pass byte parity; seed again")
        return changed is not None
