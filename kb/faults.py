"""A documented test hook for crash tests (design §14: "kill -9 at any step of a commit").

Set ``KB_FAULT_POINT`` to a point name and the process SIGKILLs itself when it reaches that point,
exactly as ``kill -9`` from outside would, at a deterministic step. It is read from the environment
at each call (not from Settings) so a test can arm it in a subprocess only. Unset → no effect.

Points of the store commit (``kb.store.KnowledgeStore.commit_draft``), in order:

* ``draft_ready`` — the draft is complete and keyed; nothing is staged, queued or locked yet;
* ``objects_written`` — tree and commit objects are in the object store, the ref is not moved;
* ``ref_renamed`` — inside ``Repository.advance``: its lock file was just renamed over the branch
  ref, so the ref points at the new revision and the lock is free for others;
* ``ref_advanced`` — the branch ref points at the new revision, the working tree is not refreshed
  and Postgres has not committed the revision rows;
* ``before_pg_commit`` — the last step before Postgres commits (the working tree is refreshed only
  after that commit, outside the write lock, design §14).
* ``refresh_owed`` — after the write lock (Postgres committed or failed), before the writer
  refreshes the working tree it owes (its marker stays: ``Repository.lost_refreshes``).

With group commit (``kb.store.group_commit``) the holder reaches each point but the first once for
its whole group.

Points of a workspace move (``kb.workspace.moves.move``, design §15), in order:

* ``move_window_open`` — the read-only window is committed, nothing is copied;
* ``move_copied`` — the target holds the verified copy, the home has not flipped;
* ``move_flipped`` — the home node flipped in Postgres, the old copy is not renamed aside.

Point of creating a workspace's repository (``kb.git.repository.Repository.create``):

* ``repository_init`` — the ``.git`` folder is complete under its temporary name, not yet renamed
  into place.

``KB_FAULT_SIGNAL=INT`` sends SIGINT instead (Ctrl-C: KeyboardInterrupt at that point, for the
interrupted-import tests); ``STOP`` sends SIGSTOP (the process halts there until a test sends
SIGCONT: another writer is run in the gap); unset or ``KILL`` → SIGKILL.
"""

from __future__ import annotations

import os
import signal

COMMIT_POINTS = ("objects_written", "ref_advanced", "before_pg_commit")
"""The points of a commit past which the kill tests kill a writer (``draft_ready`` comes before them)."""
MOVE_POINTS = ("move_window_open", "move_copied", "move_flipped")


def fault_point(name: str) -> None:
    """Send this process ``KB_FAULT_SIGNAL`` (SIGKILL by default, or SIGINT, or SIGSTOP) if
    ``KB_FAULT_POINT`` equals ``name``; otherwise return at once."""
    if os.environ.get("KB_FAULT_POINT") == name:
        kind = os.environ.get("KB_FAULT_SIGNAL", "KILL").upper()
        sent = {"INT": signal.SIGINT, "STOP": signal.SIGSTOP}.get(kind, signal.SIGKILL)
        os.kill(os.getpid(), sent)
