"""Revision history in Postgres (design §3): recording revisions, catching up with git, reading.

Every revision gets a ``kb.revisions`` row and one ``kb.path_changes`` row per changed path,
written in the Postgres transaction that holds the workspace write lock. ``history(path)`` reads
those rows and follows recorded moves, so it never walks git (dulwich's path-filtered log is
~900× slower than ``git log`` at 20k files).

A revision git has and Postgres lacks (a writer killed between the ref update and the Postgres
commit) is recorded by :func:`record_missing`, which rebuilds its path changes from git: the tree
diff against its parent, with a removed and an added path holding the *same blob* paired as a move
(the moves the crashed writer would have recorded are exact, content-preserving ones in the common
case; a move combined with an edit is recorded as a removal and an addition); files of one content
moved together are told apart by the folder renames and file names (:func:`pair_moves`).
"""

from __future__ import annotations

import json
import posixpath
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from kb.db.sql import queries
from kb.errors import HistoryDiverged
from kb.store import write_keys

if TYPE_CHECKING:  # annotations only: the revision dataclasses stay importable without psycopg/dulwich
    from kb.db.database import Connection
    from kb.git.repository import Repository


@dataclass(frozen=True)
class PathChange:
    """One path's change in a revision.

    ``change``: ``added`` | ``modified`` | ``removed`` | ``moved`` (``path`` is the destination,
    ``old_path`` the source) | ``moved_away`` (``path`` is the source, ``new_path`` the
    destination). A ``modified`` row with ``new_path`` set means the path's former document moved
    to ``new_path`` and a new document was written in its place. Paths are virtual
    (``/documents/...``) when returned by the store, repo paths inside this module.
    """

    path: str
    change: str
    content_id: str | None = None
    old_path: str | None = None
    new_path: str | None = None

    def virtual(self) -> PathChange:
        """The same change with repo paths turned into ``/documents/...`` paths."""

        def v(p: str | None) -> str | None:
            return None if p is None else (p if p.startswith("/") else "/" + p)

        return PathChange(v(self.path), self.change, self.content_id, v(self.old_path), v(self.new_path))


@dataclass(frozen=True)
class Revision:
    """A recorded revision (git commit): id, 1-based ``seq`` in the workspace, parent, author,
    committer, message, commit time (UTC) and the path changes (all, or the one asked about)."""

    id: str
    seq: int
    parent_id: str | None
    author: str
    committer: str
    message: str
    committed_at: datetime | None
    changes: tuple[PathChange, ...] = ()


def record_revision(conn: Connection, workspace_id: int, revision: Revision, commit_time: int) -> None:
    """Insert the revision row, its path-change rows, and advance the workspace's recorded head.

    ``revision.changes`` carry repo paths; ``commit_time`` is seconds since the epoch. Runs in the
    caller's transaction (the one holding the write lock, design §3).
    """
    record_revisions(conn, workspace_id, [(revision, commit_time)])


def json_column(values: list) -> str:
    """One column of many rows as one JSON array text, which SQL unpacks with
    ``json_array_elements_text`` (``None`` becomes NULL). A folder rename records two path changes
    per document under the write lock, and psycopg dumps a Python list into a Postgres array value
    by value in Python (~170 ms for a rename of 4,600 documents); ``json.dumps`` is C and escapes
    any path — commas, quotes, braces, backslashes, newlines, any Unicode — so no separator can
    collide (design §14)."""
    return json.dumps(values, ensure_ascii=False, separators=(",", ":"))


def record_changes_ahead(conn: Connection, workspace_id: int, revision: Revision) -> None:
    """Insert ``revision``'s path-change rows alone, in the caller's transaction before it takes
    the write lock (design §14: a folder rename's thousands of rows are then written while the
    writer waits for the lock, not while it holds it). Under the lock the caller either records
    the revision with ``record_revisions(…, changes_recorded={revision.id})`` or removes them
    with :func:`forget_changes`; an error rolls them back with everything else."""
    conn.execute(
        queries["record_path_changes_ahead"],
        {
            "workspace_id": workspace_id,
            "revision_id": revision.id,
            "seq": revision.seq,
            "paths": json_column([c.path for c in revision.changes]),
            "changes": json_column([c.change for c in revision.changes]),
            "old_paths": json_column([c.old_path for c in revision.changes]),
            "new_paths": json_column([c.new_path for c in revision.changes]),
            "content_ids": json_column([c.content_id for c in revision.changes]),
        },
    )


def forget_changes(conn: Connection, workspace_id: int, revision_id: str) -> None:
    """Delete the rows :func:`record_changes_ahead` inserted for ``revision_id`` (not recorded)."""
    conn.execute(queries["forget_path_changes"], {"workspace_id": workspace_id, "revision_id": revision_id})


def record_revisions(
    conn: Connection,
    workspace_id: int,
    revisions: list[tuple[Revision, int]],
    changes_recorded: frozenset[str] = frozenset(),
) -> None:
    """``record_revision`` for consecutive revisions ``[(revision, commit_time), …]`` (oldest
    first) in one statement; the recorded head becomes the last one. Nothing for an empty list.
    The path changes travel as JSON columns (:func:`json_column`); those of the revisions whose
    ids are in ``changes_recorded`` were inserted by :func:`record_changes_ahead`."""
    if not revisions:
        return
    changes = [(r, c) for r, _ in revisions if r.id not in changes_recorded for c in r.changes]
    last = revisions[-1][0]
    conn.execute(
        queries["record_revisions"],
        {
            "workspace_id": workspace_id,
            "ids": [r.id for r, _ in revisions],
            "seqs": [r.seq for r, _ in revisions],
            "parent_ids": [r.parent_id for r, _ in revisions],
            "authors": [r.author for r, _ in revisions],
            "committers": [r.committer for r, _ in revisions],
            "messages": [r.message for r, _ in revisions],
            "committed_ats": [t for _, t in revisions],
            "change_revisions": json_column([r.id for r, _ in changes]),
            "change_seqs": json_column([r.seq for r, _ in changes]),
            "paths": json_column([c.path for _, c in changes]),
            "changes": json_column([c.change for _, c in changes]),
            "old_paths": json_column([c.old_path for _, c in changes]),
            "new_paths": json_column([c.new_path for _, c in changes]),
            "content_ids": json_column([c.content_id for _, c in changes]),
            "head": last.id,
            "head_seq": last.seq,
        },
    )


def changes_from_git(repo: Repository, revision: str) -> list[PathChange]:
    """Path changes of ``revision`` against its first parent, from git alone (repo paths).

    Exact-content moves are inferred: a removed path and an added path with the same blob become
    ``moved``/``moved_away`` (:func:`pair_moves`).
    """
    parents = repo.parents(revision)
    old_tree = repo.tree_id(parents[0]) if parents else None
    diff = repo.diff(old_tree, repo.tree_id(revision))
    removed: dict[str, list[str]] = defaultdict(list)
    added: dict[str, list[str]] = defaultdict(list)
    for change in diff:
        if change.kind == "removed":
            removed[change.old_id].append(change.path)
        elif change.kind == "added":
            added[change.new_id].append(change.path)
    pairs = pair_moves(removed, added)
    sources = {old: new for new, old in pairs.items()}
    result = []
    for change in diff:
        if change.path in pairs:
            result.append(PathChange(change.path, "moved", change.new_id, old_path=pairs[change.path]))
        elif change.path in sources:
            result.append(PathChange(change.path, "moved_away", None, new_path=sources[change.path]))
        else:
            result.append(PathChange(change.path, change.kind, change.new_id))
    return sorted(result, key=lambda c: c.path)


def pair_moves(removed: dict[str, list[str]], added: dict[str, list[str]]) -> dict[str, str]:
    """The moves a revision made, inferred from git (design §3: a revision recorded after a crash):
    ``removed``/``added`` map a blob id to the paths that lost/gained it; returns ``{new path: old
    path}``. A blob removed once and added once is a move. Where a blob was removed or added more
    than once (a folder moved with several files of one content: empty notes, templates), each of
    its removed paths is paired with the added path the folder renames of the unambiguous moves
    give it (its nearest folder that such moves renamed to a single folder), else with the one
    added path of its file name when that name is left once on each side; the rest stay removals
    and additions."""
    pairs = {}
    for blob, olds in removed.items():
        news = added.get(blob, [])
        if len(olds) == 1 and len(news) == 1:
            pairs[news[0]] = olds[0]
    targets: dict[str, set[str]] = defaultdict(set)
    for new, old in pairs.items():
        targets[posixpath.dirname(old)].add(posixpath.dirname(new))
    for blob, olds in removed.items():
        news = added.get(blob, [])
        if not news or (len(olds) == 1 and len(news) == 1):
            continue
        free_new, free_old = set(news), []
        for old in sorted(olds):
            target = _renamed_path(old, targets)
            if target in free_new:
                pairs[target] = old
                free_new.discard(target)
            else:
                free_old.append(old)
        old_names, new_names = defaultdict(list), defaultdict(list)
        for old in free_old:
            old_names[posixpath.basename(old)].append(old)
        for new in free_new:
            new_names[posixpath.basename(new)].append(new)
        for name, same_name in old_names.items():
            if len(same_name) == 1 and len(new_names.get(name, ())) == 1:
                pairs[new_names[name][0]] = same_name[0]
    return pairs


def _renamed_path(path: str, targets: dict[str, set[str]]) -> str | None:
    """``path`` under the folder its nearest folder in ``targets`` moved to (None: that folder
    moved to several folders, or no folder of the path is there)."""
    folder = posixpath.dirname(path)
    while True:
        if folder in targets:
            if len(targets[folder]) != 1:
                return None
            return posixpath.join(next(iter(targets[folder])), path[len(folder) :].lstrip("/"))
        if not folder:
            return None
        folder = posixpath.dirname(folder)


def _identity(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    return text[:-3] if text.endswith(" <>") else text


def record_missing(conn: Connection, repo: Repository, workspace: dict) -> list[Revision]:
    """Record every revision between the workspace's recorded head and git HEAD (oldest first).

    ``workspace`` is the ``kb.workspaces`` row, read under the write lock. Returns the revisions
    recorded (repo paths in their changes); the caller defers projection/index jobs and refreshes
    the working tree. Raises HistoryDiverged when the recorded head is not in git's history.
    """
    head, recorded = repo.head(), workspace["head_revision"]
    if head == recorded:
        return []
    chain = repo.ancestry(head, stop=recorded)
    if recorded is not None and (not chain or (repo.parents(chain[0]) or [None])[0] != recorded):
        raise HistoryDiverged(
            f"workspace {workspace['id']}: Postgres records head {recorded} but git's branch "
            f"(head {head}) does not contain it; the repository was replaced or rewritten. "
            "Restore the repository from a backup; or, accepting that document rows and the index are "
            f"rebuilt, delete the rows (DELETE FROM kb.workspaces WHERE id = {workspace['id']}) and run "
            f"`kb fsck --workspace {workspace['id']}` to record git's history again."
        )
    seq, parent, recorded_revisions, keys = workspace["revision_count"], recorded, [], []
    for revision_id in chain:
        commit = repo.commit(revision_id)
        if (key := write_keys.key_of_commit(commit)) is not None:
            keys.append((key, revision_id))  # design §3: the key travels in the commit object
        seq += 1
        revision = Revision(
            revision_id,
            seq,
            parent,
            _identity(commit.author),
            _identity(commit.committer),
            commit.message.decode("utf-8", errors="replace").rstrip("\n"),
            datetime.fromtimestamp(commit.commit_time, UTC),
            tuple(changes_from_git(repo, revision_id)),
        )
        record_revision(conn, workspace["id"], revision, commit.commit_time)
        recorded_revisions.append(revision)
        parent = revision_id
    write_keys.record(conn, workspace["id"], keys)
    return recorded_revisions


def _revision(row: dict, changes: tuple[PathChange, ...]) -> Revision:
    return Revision(
        row["id"],
        row["seq"],
        row["parent_id"],
        row["author"],
        row["committer"],
        row["message"],
        row["committed_at"],
        changes,
    )


def read_history(conn: Connection, workspace_id: int, path: str | None, limit: int) -> list[Revision]:
    """Revisions newest first from Postgres (design §3). ``path`` is a repo path or None (all).

    With a path, each revision carries the one change of that path, and a ``moved`` row continues
    the walk at its ``old_path`` below the move (so a moved document keeps its history). Changes
    carry virtual paths. ``limit`` ≥ 1.
    """
    params = {"workspace_id": workspace_id, "limit": limit}
    if path is None:
        rows = conn.execute(queries["workspace_history"], params).fetchall()
        return [
            _revision(
                r,
                tuple(
                    PathChange(p, k, c, o, n).virtual()
                    for p, k, c, o, n in zip(
                        r["paths"], r["kinds"], r["content_ids"], r["old_paths"], r["new_paths"], strict=True
                    )
                ),
            )
            for r in rows
        ]
    current, max_seq = path, 2**62
    result: list[Revision] = []
    while current and len(result) < limit:
        rows = conn.execute(
            queries["path_history"], {**params, "path": current, "max_seq": max_seq, "limit": limit - len(result)}
        ).fetchall()
        current = None
        for r in rows:
            change = PathChange(r["path"], r["change"], r["content_id"], r["old_path"], r["new_path"]).virtual()
            result.append(_revision(r, (change,)))
            if r["change"] == "moved" and r["old_path"]:
                current, max_seq = r["old_path"], r["seq"] - 1
                break
    return result


MAX_MOVES_FOLLOWED = 1000
"""A bound on the move chains walked here (a cycle of moves cannot loop for ever)."""


def _follow_moves(conn: Connection, workspace_id: int, path: str, seq: int) -> tuple[str, int, bool]:
    """Follow the document at repo path ``path`` through the revisions recorded after the one
    numbered ``seq`` (its place in the workspace's history): ``(last path, moves followed,
    still there)``. Edits in place are stepped over; the first change that is more than one
    decides — a move goes on from its new path, a removal (or another document put in its place)
    ends the walk with ``still there`` False. The one walker behind :func:`moved_to`,
    :func:`current_path_after` and :func:`moved_away_to` (design §3)."""
    moves = 0
    for _ in range(MAX_MOVES_FOLLOWED):
        rows = conn.execute(
            queries["document_changes_after"], {"workspace_id": workspace_id, "path": path, "after_seq": seq}
        ).fetchall()
        decisive = next((r for r in rows if r["new_path"] or r["change"] != "modified"), None)
        if decisive is None:
            return path, moves, True
        if not decisive["new_path"]:
            return path, moves, False
        path, seq, moves = decisive["new_path"], decisive["seq"], moves + 1
    return path, moves, False


def _revision_seq(conn: Connection, workspace_id: int, revision_id: str) -> int | None:
    row = conn.execute(queries["revision_seq"], {"workspace_id": workspace_id, "revision_id": revision_id}).fetchone()
    return None if row is None else row["seq"]


def moved_to(conn: Connection, workspace_id: int, path: str, since_revision: str) -> str | None:
    """Where the document at repo path ``path`` in ``since_revision`` was moved by the revisions
    recorded after it, following a chain of recorded moves (design §3) — the last place a move
    took it, even if a later revision removed it there; None when no recorded revision moved it
    (it was removed, or is still there). An unrecorded ``since_revision`` has no recorded moves to
    follow: None."""
    seq = _revision_seq(conn, workspace_id, since_revision)
    if seq is None:
        return None
    last, moves, _there = _follow_moves(conn, workspace_id, path, seq)
    return last if moves else None


def path_in_revision(conn: Connection, workspace_id: int, path: str, revision_id: str) -> str | None:
    """The repo path that the document at repo path ``path`` now had in ``revision_id``: its
    history (:func:`read_history`, which goes on below a move at the old path) walked back
    through the moves recorded after that revision (design §3). ``path`` itself when none moved
    it since; None when ``revision_id`` is not recorded or the document now there was created
    after it (added since, e.g. at a path another one left). ``kb restore`` takes a document's path
    now with an older revision (``log`` and ``blame`` follow moves the same way)."""
    seq = _revision_seq(conn, workspace_id, revision_id)
    if seq is None:
        return None
    current = path
    for revision in read_history(conn, workspace_id, path, 2**31 - 1):  # newest first, down to it
        if revision.seq <= seq:
            break
        change = revision.changes[0]
        if change.change in ("added", "removed"):
            # the document there now was created since (a path reused after a removal): it had
            # no path in ``revision``, whatever stood there before it is another document
            return None
        if change.change == "moved" and change.old_path:
            current = change.old_path.removeprefix("/")
    return current


def current_path(conn: Connection, workspace_id: int, path: str, since_revision: str) -> str | None:
    """Where the document at repo path ``path`` in ``since_revision`` is now by the revisions
    recorded after it: ``path`` itself when they only edited it there, where a chain of recorded
    moves took it (edits on the way kept), None when one removed it or put another document in
    its place, or ``since_revision`` is not recorded (design §3; ``revert`` undoes a move from
    there)."""
    seq = _revision_seq(conn, workspace_id, since_revision)
    return None if seq is None else current_path_after(conn, workspace_id, path, seq)


def moved_away_to(conn: Connection, workspace_id: int, path: str) -> str | None:
    """Where the document that last stood at repo path ``path`` is now, when recorded moves took
    it away (and nothing stands at ``path`` since): its repo path, else None (design §3; a read
    of the old path says where it went)."""
    rows = conn.execute(
        queries["document_changes_after"], {"workspace_id": workspace_id, "path": path, "after_seq": 0}
    ).fetchall()
    if not rows or not rows[-1]["new_path"]:
        return None
    return current_path_after(conn, workspace_id, rows[-1]["new_path"], rows[-1]["seq"])


def moved_away(conn: Connection, workspace_id: int, paths: list[str]) -> dict[str, str]:
    """:func:`moved_away_to` for many repo paths at once: ``{path: where its document is now}`` for
    each of ``paths`` whose last recorded change is a move that took its document away, to a path
    it still holds (chains of moves followed; a document removed since is left out). One query for
    all of ``paths``, then a walk per moved one (design §3; ``kb import`` follows kb's moves)."""
    rows = conn.execute(queries["last_changes_of_paths"], {"workspace_id": workspace_id, "paths": paths}).fetchall()
    found: dict[str, str] = {}
    for row in rows:
        if row["new_path"]:
            now = current_path_after(conn, workspace_id, row["new_path"], row["seq"])
            if now is not None:
                found[row["path"]] = now
    return found


def current_path_after(conn: Connection, workspace_id: int, path: str, seq: int) -> str | None:
    """``current_path`` from the revision numbered ``seq`` (its place in the workspace's history)."""
    last, _moves, there = _follow_moves(conn, workspace_id, path, seq)
    return last if there else None
