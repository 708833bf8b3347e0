"""Never converge backwards (design §3): a workspace's repository must be *its* repository and
must hold every revision Postgres recorded for it.

A repository restored from an older backup, or a stale copy put in its place, lacks revisions that
Postgres recorded (the recorded head, the projected revision, the index stamp). Projecting it as it
stands would delete the document rows of the newer files (and their chunks), move the projected
revision and the index stamp back, and give the rows new ids when the files come back. So every
job and every writer checks first, and refuses with HistoryDiverged:

* **identity**: each repository carries a random id in its git config (``kb.repositoryid``,
  written when kb creates it) that ``kb.workspaces.repository_id`` records. Another repository in
  the workspace's folder (a different id) is refused. A repository or row without one adopts an
  identity the first time it is checked (repositories made before identities existed), a
  repository without one only when it holds the recorded revisions.
* **containment**: the recorded head (or, when none is recorded, the projected revision, then the
  index stamp) must be HEAD or an ancestor of it. Git being *ahead* is fine: the store records the
  missing revisions (``record_missing``).

A refusal marks the workspace (``kb.workspaces.diverged`` holds the reason, committed on its own so
that it stays when the caller's transaction rolls back): ``kb status`` and ``kb fsck`` show it, the
sweep skips the workspace with the reason. Nothing is deleted. Once the right repository is back the
next check passes and clears the mark.
"""

from __future__ import annotations

import logging
import shlex
import uuid
from typing import TYPE_CHECKING

from kb.db import database
from kb.db.sql import queries
from kb.errors import HistoryDiverged, KbError

if TYPE_CHECKING:
    from kb.db.database import Connection
    from kb.db.query_names import QueryName
    from kb.git.repository import Repository

log = logging.getLogger(__name__)


def new_identity() -> str:
    """A fresh random repository identity."""
    return uuid.uuid4().hex


def contains(repo: Repository, head: str | None, revision: str) -> bool:
    """True when ``revision`` is ``head`` or a first-parent ancestor of it."""
    if head is None:
        return False
    if head == revision:
        return True
    chain = repo.ancestry(head, stop=revision)
    return bool(chain) and (repo.parents(chain[0]) or [None])[0] == revision


def _missing_revision(repo: Repository, row: dict) -> tuple[str, str] | None:
    """``(what, revision)`` of the newest revision Postgres recorded that the repository lacks."""
    head = repo.head()
    for what, column in (
        ("recorded head", "head_revision"),
        ("projected revision", "last_projected_revision"),
        ("index stamp", "last_indexed_revision"),
    ):
        revision = row.get(column)
        if revision is None:
            continue
        return None if contains(repo, head, revision) else (what, revision)
    return None


def check(conn: Connection, database_url: str | None, repo: Repository, row: dict) -> None:
    """Check that ``repo`` is the workspace's repository and holds what Postgres recorded (``row``:
    its ``kb.workspaces`` row, read in ``conn``'s transaction). Adopts a missing identity (in
    ``conn``'s transaction and the git config); clears a stale mark. Raises HistoryDiverged (after
    marking the workspace on a connection of its own to ``database_url``, when given) when it is
    not."""
    ws = row["id"]
    recorded, found = row.get("repository_id"), repo.identity()
    reason = None
    if recorded is not None and found is not None and recorded != found:
        reason = (
            f"workspace {ws}: the repository at {repo.path} is another repository (identity {found}; "
            f"Postgres records {recorded} for this workspace)"
        )
    elif (missing := _missing_revision(repo, row)) is not None:
        what, revision = missing
        if _holds(repo, revision):  # moved off it, not restored from before it
            raise HistoryDiverged(_branch_moved_by_hand(ws, repo, what, revision, database_url))
        reason = (
            f"workspace {ws}: the repository at {repo.path} lacks the {what} {revision} that "
            f"Postgres recorded (HEAD is {repo.head()}): it was restored from an older backup or "
            "replaced by a stale copy"
        )
    if reason is not None:
        if database_url is not None:
            mark(database_url, ws, reason)
        raise HistoryDiverged(
            f"{reason}. Nothing was changed and nothing is deleted while it stays so. Put the workspace's "
            f"newest repository back in {repo.path} (from a newer backup or a replica's push); or, accepting "
            f"that document rows, ids and the index are rebuilt, delete the rows (`kb workspace delete {ws}` "
            f"keeps nothing; DELETE FROM kb.workspaces WHERE id = {ws} keeps the repository) and run "
            f"`kb fsck --workspace {ws}`. `kb fsck --workspace {ws}` checks again."
        )
    if found is None:
        found = recorded or new_identity()
        repo.set_identity(found)
    if recorded is None:
        _update(conn, database_url, "set_repository_identity", {"workspace_id": ws, "repository_id": found})
    if row.get("diverged") is not None:
        _update(conn, database_url, "clear_workspace_diverged", {"workspace_id": ws})
        log.info("workspace %s: its repository holds what Postgres recorded again; mark cleared", ws)


def _update(conn: Connection, database_url: str | None, query: QueryName, params: dict) -> None:
    """Run an update of the workspace row on a connection of its own (committed at once, and the
    caller's transaction takes no workspace row lock out of the lock order, ``kb.db.locks``), or
    in ``conn``'s transaction when no ``database_url`` is given."""
    if database_url is None:
        conn.execute(queries[query], params)
        return
    with database.connect(database_url, autocommit=True) as own:
        own.execute(queries["short_lock_timeout"])
        own.execute(queries[query], params)


def mark(database_url: str, workspace_id: int, reason: str) -> None:
    """Record why the workspace is diverged, committed at once (best effort: logged if it fails)."""
    log.error("%s", reason)
    try:
        _update(None, database_url, "mark_workspace_diverged", {"workspace_id": workspace_id, "reason": reason})
    except Exception as exc:  # the refusal stands even when the mark cannot be written
        log.warning("workspace %s: could not mark it diverged (%s)", workspace_id, exc)


def _holds(repo: Repository, revision: str) -> bool:
    """Whether ``repo`` still holds the commit ``revision`` (whatever its branch points at)."""
    try:
        repo.commit(revision)
    except KbError:
        return False
    return True


def _branch_moved_by_hand(ws: int, repo: Repository, what: str, revision: str, database_url: str | None) -> str:
    """The HistoryDiverged message (the workspace marked, as any divergence) for a repository
    whose branch no longer leads to the ``what`` ``revision`` Postgres recorded though the
    repository still holds it: a git command run in the repository moved the branch off it (a
    ``git reset``, ``git commit --amend``, a ``git commit`` that raced a kb write, which git's
    own ref check can miss beside ``git pack-refs``), not a restore from an older backup. A
    rebase onto it puts the commits made by hand after it, which kb then records (git ahead of
    Postgres is fine, design §3)."""
    reason = (
        f"workspace {ws}: the branch of the repository at {repo.path} no longer leads to the {what} "
        f"{revision} that Postgres recorded (HEAD is {repo.head()}), though the repository still holds it: "
        "a git command run in the repository moved the branch off it (a `git reset`, `git commit --amend`, "
        "or a `git commit` that raced a kb write)"
    )
    if database_url is not None:
        mark(database_url, ws, reason)
    folder = shlex.quote(str(repo.path))
    return (
        f"{reason}. Nothing was changed and nothing is deleted while it stays so. Put the commits made by "
        f"hand after it: `git -C {folder} rebase {revision}` (`git -C {folder} reflog` shows what moved "
        f"the branch), then `kb fsck --workspace {ws}` records them."
    )
