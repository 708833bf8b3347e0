"""Moving a workspace to another node: ``kb workspace move N --to NODE`` (design §15).

The procedure, after GitLab's repository-storage moves (read-only window, copy, checksum, flip):

1. **window** — under the workspace write lock, a row of ``kb.workspace_moves`` is written: from
   its commit on, every writer is refused with WorkspaceMoving (``kb.db.locks.locked_pipeline``
   reads the row in the round trip that takes the lock), reads go on. A write that held the lock
   first has committed before the window opens, so it is in the copy.
2. **copy** — the target node pulls the archive of the repository and artifact files from the home
   node's ``kb serve`` (``kb.workspace.repository_copy``), over HTTP: the nodes need no shared file
   system. Nodes that name the same storage root share the files: nothing is copied.
3. **verify** — on the target: ``git fsck --strict``, HEAD is the head Postgres records, the
   repository identity is the recorded one (``kb.store.repository_guard``), artifact files hash to
   their names.
4. **flip** — one Postgres transaction under the write lock: the window must still be this move's
   and open, the recorded head and identity must be the verified ones; then the home node becomes
   the target, the window is closed (its row kept as ``flipped`` until the old copy is retired)
   and the workspace's convergence jobs are deferred to the target's queues.
5. **retire** — the old home renames its copy aside (``.moved-{id}-{move}``), never deleting it.

Killable at any step: the old copy stays authoritative until the flip commits. Running the same
command again resumes (the window row names the move; a copy already verified in place is kept),
``abort`` deletes the window, and an abandoned window expires after ``KB_MOVE_WINDOW_SECONDS``
(renewed at each step), letting writers in again; a flip after expiry is refused.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from kb.db import database, nodes
from kb.db.locks import locked_transaction
from kb.db.sql import queries
from kb.errors import InvalidInput, KbError, MoveFailed, WorkspaceBusy, WorkspaceNotFound
from kb.faults import fault_point
from kb.store import homes
from kb.store.job_deferral import defer_convergence
from kb.store.knowledge_store import check_workspace_id
from kb.workspace import repository_copy
from kb.workspace.repository_copy import ReceivedCopy

if TYPE_CHECKING:
    from kb.db.nodes import Node
    from kb.store.stores import Stores

INTERNAL = "/v1/internal/workspaces"
"""Prefix of the node-to-node routes of ``kb serve`` (``kb.adapters.http.moves``)."""
CALL_TIMEOUT = 3600.0
"""Seconds a node-to-node call may take (a receive downloads and checks the whole repository)."""

Progress = Callable[[str], None]


@dataclass
class MoveReport:
    """What ``move`` did: the nodes, the move's id, the head moved, bytes copied, artifact files,
    whether it resumed an earlier attempt, the old copy's new names, seconds taken (in all, and by
    the flip's transaction), and the progress lines it printed (``steps``)."""

    workspace_id: int
    source_node: str | None
    target_node: str
    move_id: str | None = None
    head: str | None = None
    copied_bytes: int = 0
    artifact_files: int = 0
    resumed: bool = False
    retired: list[str] = field(default_factory=list)
    seconds: float = 0.0
    flip_seconds: float = 0.0
    steps: list[str] = field(default_factory=list)


# -- nodes ---------------------------------------------------------------------------------
def this_node(stores: Stores) -> str:
    """The name of the node this process runs as (``KB_NODE``)."""
    return stores.settings.node


def _node(stores: Stores, name: str) -> Node:
    node = nodes.get_node(stores.database_url, name)
    if node is None:
        raise InvalidInput(f"no node named {name!r} is registered; `kb nodes` lists them")
    return node


def _refuse_unless_serving(stores: Stores, workspace_id: int, node: Node, role: str) -> None:
    """Raise MoveFailed (before any window opens) when ``node`` has no heartbeat within
    ``KB_NODE_STALE_SECONDS`` or advertises no URL: its ``kb serve`` must answer for the copy."""
    stale = stores.settings.node_stale_seconds
    if node.is_up(stale) and node.url:
        return
    why = "advertises no URL" if node.is_up(stale) else f"is down (last heartbeat {node.heartbeat_age:.0f} s ago)"
    raise MoveFailed(
        f"workspace {workspace_id} cannot move: its {role} node {node.name!r} {why}; nothing was changed, "
        f"writes go on. Start that node's `kb serve` (`kb nodes` shows it), then move again"
    )


def _workspace(conn, workspace_id: int) -> dict:
    """The workspace's ``kb.workspaces`` row (with ``home_node``); raises WorkspaceNotFound."""
    row = conn.execute(queries["get_workspace"], {"workspace_id": workspace_id}).fetchone()
    if row is None:
        raise WorkspaceNotFound(f"workspace {workspace_id} does not exist; `kb workspaces` lists them")
    return row


def _token(stores: Stores) -> str | None:
    """The API token node-to-node calls send (``KB_TOKEN``: an admin token for the workspace,
    design §16); None when unset (a server run with ``--insecure-no-auth`` needs none)."""
    return stores.settings.token.get_secret_value() if stores.settings.token else None


def _call(
    url: str | None, node: str, path: str, body: dict | None = None, method: str = "POST", token: str | None = None
) -> dict:
    """A node-to-node call to ``node``'s ``kb serve`` at ``url``, with ``token`` as the bearer
    token (its routes need admin scope on the workspace, design §16); returns its JSON. Raises
    MoveFailed naming the node when it has no URL or does not answer, and the node's own error's
    message when it refused."""
    if not url:
        raise MoveFailed(f"node {node!r} advertises no URL (KB_NODE_URL of its `kb serve`); start it with one")
    request = urllib.request.Request(
        url.rstrip("/") + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            refused = json.loads(exc.read())
        except ValueError:
            refused = {}
        message = refused.get("message") or f"node {node!r} ({url}) answered {exc.code} to {path}"
        if refused.get("error") == "WorkspaceBusy":
            raise WorkspaceBusy(message, cli=refused.get("cli_message")) from None
        raise MoveFailed(message) from None
    except OSError as exc:
        raise MoveFailed(f"node {node!r} at {url} does not answer ({exc}); is its `kb serve` running?") from None


# -- the window ----------------------------------------------------------------------------
def window(stores: Stores, workspace_id: int) -> dict | None:
    """The workspace's move window row (``kb.workspace_moves``, with ``expired``), or None."""
    with database.transaction(stores.database_url) as conn:
        return conn.execute(queries["move_window"], {"workspace_id": workspace_id}).fetchone()


def _renew(stores: Stores, workspace_id: int, move_id: str, step: str) -> None:
    with database.transaction(stores.database_url) as conn:
        row = conn.execute(
            queries["renew_move_window"],
            {
                "workspace_id": workspace_id,
                "move_id": move_id,
                "step": step,
                "seconds": stores.settings.move_window_seconds,
            },
        ).fetchone()
    if row is None:
        raise MoveFailed(
            f"workspace {workspace_id}: the move's window closed before {step} (aborted, or expired after "
            f"KB_MOVE_WINDOW_SECONDS); nothing was flipped and the workspace stays on its home node. Run the "
            "move again"
        )


def abort(stores: Stores, workspace_id: int) -> dict | None:
    """Cancel the workspace's move (design §15): under the write lock delete its window, so writes
    go on at once on the home node, then ask the target node to rename its copy aside (best
    effort: the copy is not authoritative). A move already flipped is not undone (move it back).
    Returns the window row (a ``flipped`` one is kept: its old copy waits to be retired), or None
    when there was none."""
    check_workspace_id(workspace_id)
    with locked_transaction(stores.database_url, workspace_id, stores.settings, anywhere=True) as (conn, _):
        home = _workspace(conn, workspace_id)["home_node"]
        row = conn.execute(queries["move_window"], {"workspace_id": workspace_id}).fetchone()
        if row is not None and row["step"] != "flipped":  # a flipped move only waits to retire: kept
            conn.execute(queries["abort_move_window"], {"workspace_id": workspace_id})
    target = None if row is None else nodes.get_node(stores.database_url, row["target_node"])
    if row is not None and row["step"] != "flipped" and target is not None and row["target_node"] != home:
        path = f"{INTERNAL}/{workspace_id}/moves/{quote(row['move_id'])}/discard"
        try:
            if row["target_node"] == this_node(stores):
                discard(stores, workspace_id, row["move_id"])
            else:
                _call(target.url, row["target_node"], path, token=_token(stores))
        except KbError as exc:
            row = {**row, "discard_problem": str(exc)}
    return row


# -- the move ------------------------------------------------------------------------------
def move(
    stores: Stores, workspace_id: int, target: str, *, progress: Progress | None = None, force: bool = False
) -> MoveReport:
    """Move the workspace's home to node ``target`` (see the module docstring). ``progress`` is
    called with one line per step. ``force``: move even while turn worktrees are open on the home
    node (their uncommitted changes stay behind). Returns the MoveReport.

    Raises InvalidWorkspace, WorkspaceNotFound, InvalidInput (unknown node), WorkspaceBusy,
    MoveFailed (the home or target node is down or has no URL: refused before the window opens;
    or a step failed: the workspace stays on its home node and the window is closed, so writes go
    on; run it again — a verified copy already on the target is kept), LockTimeout. A move killed
    midway leaves its window open: run it again to resume, or ``abort``.
    """
    check_workspace_id(workspace_id)
    started = time.monotonic()
    report = MoveReport(workspace_id, None, target)

    def say(line: str) -> None:
        report.steps.append(line)
        if progress is not None:
            progress(line)

    homes.home_of(stores.settings, stores.database_url, workspace_id)  # a workspace from before nodes adopts one
    goal = _node(stores, target)
    with database.transaction(stores.database_url) as conn:
        row = _workspace(conn, workspace_id)
        pending = conn.execute(queries["move_window"], {"workspace_id": workspace_id}).fetchone()
    if pending is not None and pending["step"] == "flipped":  # killed after its flip: retire and finish
        say(f"workspace {workspace_id}: an earlier move to {pending['target_node']!r} flipped; retiring its old copy")
        _retire(stores, workspace_id, pending, report, say)
        report.resumed = True
        if pending["target_node"] == target:
            report.source_node, report.move_id = pending["source_node"], pending["move_id"]
            report.head = row["head_revision"]
            report.seconds = time.monotonic() - started
            return report
        pending = None
    if pending is not None and not pending["expired"] and pending["target_node"] != target:
        raise MoveFailed(
            f"workspace {workspace_id} is already moving to node {pending['target_node']!r} (since "
            f"{pending['opened_at']}); wait for it, run that move again to resume it, or cancel it with "
            f"`kb workspace move {workspace_id} --abort`"
        )
    source = row["home_node"]
    if source is None:
        raise MoveFailed(
            f"workspace {workspace_id} has no home node yet: run a kb command on the node that holds its "
            "repository (it adopts the workspace), then move it"
        )
    report.source_node = source
    if source == target and (pending is None or pending["expired"]):
        say(f"workspace {workspace_id} is already on node {target!r}; nothing to do")
        report.seconds = time.monotonic() - started
        return report
    home = _node(stores, source)
    shared = home.storage_id is not None and home.storage_id == goal.storage_id
    if not shared:  # a node that cannot answer would hold the workspace read-only for nothing
        _refuse_unless_serving(stores, workspace_id, home, "home")
        if target != this_node(stores):
            _refuse_unless_serving(stores, workspace_id, goal, "target")
    resume = pending is not None and not pending["expired"] and pending["step"] != "flipped"
    move_id = pending["move_id"] if resume else uuid.uuid4().hex[:16]
    report.move_id, report.resumed = move_id, report.resumed or resume
    opened = open_window(stores, workspace_id, move_id, source, target)
    opened_at = time.monotonic()
    say(
        f"workspace {workspace_id}: {'resuming move' if resume else 'moving'} from {source!r} to {target!r} "
        f"(move {move_id}); read-only window open until {opened['expires_at']:%H:%M:%S} UTC"
    )
    fault_point("move_window_open")
    try:
        if shared:
            say(f"nodes {source!r} and {target!r} share their storage ({goal.storage_root}): nothing to copy")
            copied = _shared_copy(stores, workspace_id)
        else:
            say(f"copying to {target!r}: it pulls the repository from {source!r} ({home.url})")
            copying = time.monotonic()
            try:
                copied = _copy(stores, workspace_id, move_id, target, goal, home, force)
            except MoveFailed as exc:  # a node refused or went away: writes go on at once
                with contextlib.suppress(KbError):
                    _close_window(stores, workspace_id, move_id)
                raise MoveFailed(
                    f"{exc} (the read-only window is closed again: writes go on at node {source!r})"
                ) from None
            say(
                f"copied {copied.bytes / 1e6:.1f} MB in {time.monotonic() - copying:.1f} s"
                + (" (the copy already in place was kept)" if copied.kept else "")
                + f"; verified on {target!r}: git fsck clean, head {(copied.head or 'none')[:12]}, identity "
                f"{copied.repository_id}, {copied.artifact_files} artifact files"
            )
        report.head, report.copied_bytes, report.artifact_files = copied.head, copied.bytes, copied.artifact_files
        _renew(stores, workspace_id, move_id, "verified")
        fault_point("move_copied")
        flipping = time.monotonic()
        _flip(stores, workspace_id, move_id, source, target, copied)
        report.flip_seconds = time.monotonic() - flipping
    except WorkspaceBusy as exc:  # turns cannot commit while the window is open: close it
        _close_window(stores, workspace_id, move_id)
        say(f"stopped, window closed: {exc.cli_message}")
        raise
    except KbError as exc:  # before the flip (it is one transaction): writes must not wait for an expiry
        try:
            _close_window(stores, workspace_id, move_id)
        except KbError as closing:
            say(
                f"stopped: {exc}; the window could not be closed ({closing}): `kb workspace move {workspace_id} --abort`"
            )
        else:
            say(f"stopped, window closed (writes go on at {source!r}; a verified copy is kept for the next try): {exc}")
        raise
    say(
        f"flipped in {report.flip_seconds:.2f} s: workspace {workspace_id}'s home node is {target!r}; writes go on "
        f"there (the window was open {time.monotonic() - opened_at:.1f} s)"
    )
    fault_point("move_flipped")
    if not shared:
        flipped = {"move_id": move_id, "source_node": source, "target_node": target}
        _retire(stores, workspace_id, flipped, report, say)
    else:
        _finish(stores, workspace_id, move_id)
    report.seconds = time.monotonic() - started
    say(f"done in {report.seconds:.1f} s")
    return report


def open_window(stores: Stores, workspace_id: int, move_id: str, source: str, target: str) -> dict:
    """Open (or renew) move ``move_id``'s read-only window under the write lock, for
    ``KB_MOVE_WINDOW_SECONDS``: writers that held the lock first have committed; every later one
    is refused with WorkspaceMoving. Returns the window row. Raises WorkspaceNotFound, LockTimeout,
    MoveFailed when another move's window is open (two moves of one workspace started at once: the
    second never takes the first's window from under it)."""
    with locked_transaction(stores.database_url, workspace_id, stores.settings, anywhere=True) as (conn, _):
        row = _workspace(conn, workspace_id)
        opened = conn.execute(
            queries["open_move_window"],
            {
                "workspace_id": workspace_id,
                "move_id": move_id,
                "source_node": source,
                "target_node": target,
                "head_revision": row["head_revision"],
                "seconds": stores.settings.move_window_seconds,
            },
        ).fetchone()
        if opened is None:
            other = conn.execute(queries["move_window"], {"workspace_id": workspace_id}).fetchone() or {}
            raise MoveFailed(
                f"workspace {workspace_id} is already moving to node {other.get('target_node')!r} (move "
                f"{other.get('move_id')}, started at the same time as this one); nothing was changed: wait for "
                f"it, or cancel it with `kb workspace move {workspace_id} --abort`"
            )
        return opened


def _close_window(stores: Stores, workspace_id: int, move_id: str) -> None:
    """Delete move ``move_id``'s window (not another move's) under the write lock."""
    with locked_transaction(stores.database_url, workspace_id, stores.settings, anywhere=True) as (conn, _):
        conn.execute(queries["close_move_window"], {"workspace_id": workspace_id, "move_id": move_id})


def _shared_copy(stores: Stores, workspace_id: int) -> ReceivedCopy:
    """Nodes sharing a storage root: the copy is the repository itself; verify it as a target would."""
    with database.transaction(stores.database_url) as conn:
        row = _workspace(conn, workspace_id)
    return ReceivedCopy(workspace_id, row["head_revision"], row["repository_id"], 0, True, 0)


def _copy(
    stores: Stores, workspace_id: int, move_id: str, target: str, goal: Node, home: Node, force: bool
) -> ReceivedCopy:
    """Ask the target node to pull and verify the copy (or do it here when this process is the target)."""
    if target == this_node(stores):
        received = receive(stores, workspace_id, move_id, home.url or "", force=force, token=_token(stores))
    else:
        path = f"{INTERNAL}/{workspace_id}/moves/{quote(move_id)}/receive"
        answer = _call(goal.url, target, path, {"source_url": home.url, "force": force}, token=_token(stores))
        received = ReceivedCopy(**answer)
    _renew(stores, workspace_id, move_id, "copied")
    return received


def _flip(stores: Stores, workspace_id: int, move_id: str, source: str, target: str, copied: ReceivedCopy) -> None:
    """One transaction under the write lock: check the window and what was verified, move the home
    node, mark the window flipped (writers go on), defer the workspace's jobs to the new home."""
    with locked_transaction(stores.database_url, workspace_id, stores.settings, anywhere=True) as (conn, _):
        row = _workspace(conn, workspace_id)
        if row["head_revision"] != copied.head or row["repository_id"] != copied.repository_id:
            raise MoveFailed(
                f"workspace {workspace_id}: Postgres records head {row['head_revision']} and identity "
                f"{row['repository_id']}, the copy holds {copied.head} and {copied.repository_id} (a revision "
                "was recorded after the copy: its writer settled it during the window); nothing was flipped. "
                "Run the move again"
            )
        if (
            conn.execute(queries["flip_move_window"], {"workspace_id": workspace_id, "move_id": move_id}).fetchone()
            is None
        ):
            raise MoveFailed(
                f"workspace {workspace_id}: the move's window closed before the flip (aborted, or expired after "
                "KB_MOVE_WINDOW_SECONDS); nothing was flipped and the workspace stays on its home node. Run the "
                "move again"
            )
        if not nodes.set_home(conn, workspace_id, target, source):
            raise MoveFailed(
                f"workspace {workspace_id}: its home node is no longer {source!r} (changed by someone else); "
                "nothing was flipped"
            )
        defer_convergence(conn, workspace_id)  # routed by the home in SQL: to the target's queues


def _retire(stores: Stores, workspace_id: int, flipped: dict, report: MoveReport, say: Progress) -> None:
    """Ask the old home to rename its copy aside, then delete the flipped window row. A node that
    does not answer leaves the row: running the move again retires it."""
    source, move_id = flipped["source_node"], flipped["move_id"]
    try:
        if source == this_node(stores):
            renamed = retire(stores, workspace_id, move_id)
        else:
            node = _node(stores, source)
            path = f"{INTERNAL}/{workspace_id}/moves/{quote(move_id)}/retire"
            renamed = _call(node.url, source, path, token=_token(stores))["renamed"]
    except KbError as exc:
        say(
            f"the old copy on {source!r} was not renamed aside ({exc}); it is no longer authoritative. Run "
            "the same move again to retire it"
        )
        return
    report.retired = renamed
    say(f"old copy on {source!r} renamed aside: {', '.join(renamed) or 'nothing was left'}")
    _finish(stores, workspace_id, move_id)


def _finish(stores: Stores, workspace_id: int, move_id: str) -> None:
    with database.transaction(stores.database_url) as conn:
        conn.execute(queries["finish_move"], {"workspace_id": workspace_id, "move_id": move_id})


# -- the nodes' sides (called by kb serve's internal routes, or in-process) ----------------
def _expect(stores: Stores, workspace_id: int, move_id: str, role: str) -> dict:
    """The workspace row, after checking that move ``move_id``'s window is open and this node
    plays ``role`` in it (``source``: the home node; ``target``: not the home node, the target)."""
    node = this_node(stores)
    with database.transaction(stores.database_url) as conn:
        row = _workspace(conn, workspace_id)
        moving = conn.execute(queries["move_window"], {"workspace_id": workspace_id}).fetchone()
    if moving is None or moving["move_id"] != move_id or moving["expired"] or moving["step"] == "flipped":
        raise MoveFailed(f"workspace {workspace_id}: move {move_id} has no open window; run the move again")
    if role == "source" and row["home_node"] != node:
        raise MoveFailed(f"workspace {workspace_id}: node {node!r} is not its home ({row['home_node']!r})")
    if role == "target" and (row["home_node"] == node or moving["target_node"] != node):
        raise MoveFailed(
            f"workspace {workspace_id}: node {node!r} is not the target of move {move_id} "
            f"({moving['target_node']!r}), or it is the workspace's home; nothing was changed"
        )
    return row


def export(stores: Stores, workspace_id: int, move_id: str, *, force: bool = False) -> Path:
    """On the home node: the archive of the workspace for move ``move_id`` (a tar file the caller
    streams and then removes). First records any revision git has and Postgres lacks (under the
    write lock), so the copy holds exactly what Postgres records. Refuses (WorkspaceBusy) while
    turn worktrees are open, unless ``force``. Raises MoveFailed (no open window, not the home)."""
    from kb.git.worktree import worktrees_root

    _expect(stores, workspace_id, move_id, "source")
    turns = worktrees_root(stores.settings.knowledge_store, workspace_id)
    if not force and turns.is_dir() and any(turns.iterdir()):
        raise WorkspaceBusy(
            f"workspace {workspace_id} has open turn worktrees on node {this_node(stores)!r} "
            f"({', '.join(sorted(p.name for p in turns.iterdir())[:5])}): commit or abort them first, or pass "
            "force=True (their uncommitted changes stay behind)",
            cli=f"workspace {workspace_id} has open turn worktrees on node {this_node(stores)!r}: commit or "
            "abort them first, or pass --force (their uncommitted changes stay behind)",
        )
    store = stores.store(workspace_id)
    with locked_transaction(stores.database_url, workspace_id, stores.settings, moving_ok=True) as (conn, _):
        store.catch_up(conn)
        row = _workspace(conn, workspace_id)
    meta = {"workspace_id": workspace_id, "head": row["head_revision"], "repository_id": row["repository_id"]}
    return repository_copy.write_archive(stores.settings, workspace_id, store.path, meta)


def receive(
    stores: Stores, workspace_id: int, move_id: str, source_url: str, *, force: bool = False, token: str | None = None
) -> ReceivedCopy:
    """On the target node: pull the archive of move ``move_id`` from the home node's ``kb serve``
    (sending ``token``: the caller's, design §16), verify it against what Postgres records and put
    it in place (``kb.workspace.repository_copy.receive``).

    The URL pulled from is the one the home node registered in ``kb.nodes``, never the caller's:
    ``source_url`` (what the mover believes it is) must name it, so an admin token cannot make this
    node fetch, and send its bearer token to, an address of its choosing. Raises MoveFailed."""
    row = _expect(stores, workspace_id, move_id, "target")
    home = nodes.get_node(stores.database_url, row["home_node"]) if row["home_node"] else None
    registered = (home.url or "").rstrip("/") if home is not None else ""
    if not registered or source_url.rstrip("/") != registered:
        raise MoveFailed(
            f"workspace {workspace_id}: the copy is pulled only from its home node's registered URL "
            f"({registered or 'none registered'}), not from {source_url!r}; nothing was fetched. Run "
            "`kb workspace move` again (it names the URL `kb nodes` shows)"
        )

    def expected() -> tuple[str | None, str | None]:
        with database.transaction(stores.database_url) as conn:
            row = _workspace(conn, workspace_id)
        return row["head_revision"], row["repository_id"]

    url = f"{registered}{INTERNAL}/{workspace_id}/moves/{quote(move_id)}/archive" + ("?force=true" if force else "")
    return repository_copy.receive(stores.settings, workspace_id, move_id, url, expected, token)


def retire(stores: Stores, workspace_id: int, move_id: str) -> list[str]:
    """On the old home after the flip: rename its copy aside. Refused (MoveFailed) while this node
    is still the workspace's home, or unless Postgres holds move ``move_id``'s flipped window with
    this node as its source (the row stays until the old copy is retired), so a stray call never
    renames a copy. Returns the paths renamed."""
    node = this_node(stores)
    with database.transaction(stores.database_url) as conn:
        row = _workspace(conn, workspace_id)
        moving = conn.execute(queries["move_window"], {"workspace_id": workspace_id}).fetchone()
    if row["home_node"] == node:
        raise MoveFailed(f"workspace {workspace_id}: node {node!r} is still its home; nothing renamed")
    if moving is None or moving["move_id"] != move_id or moving["step"] != "flipped" or moving["source_node"] != node:
        raise MoveFailed(
            f"workspace {workspace_id}: move {move_id} has not flipped away from node {node!r} (no such "
            "move waits to retire its old copy); nothing renamed"
        )
    return repository_copy.retire(stores.settings, workspace_id, move_id)


def discard(stores: Stores, workspace_id: int, move_id: str) -> list[str]:
    """On the target of an aborted move: rename its copy aside. Refused (MoveFailed) while this
    node is the workspace's home, or while an open window names this node as a move's target
    (that move will flip onto the copy: an abort deletes the window first). Returns the paths
    renamed."""
    node = this_node(stores)
    with database.transaction(stores.database_url) as conn:
        row = _workspace(conn, workspace_id)
        moving = conn.execute(queries["move_window"], {"workspace_id": workspace_id}).fetchone()
    if row["home_node"] == node:
        raise MoveFailed(f"workspace {workspace_id}: node {node!r} is its home; nothing discarded")
    if moving is not None and moving["target_node"] == node and moving["step"] != "flipped" and not moving["expired"]:
        raise MoveFailed(
            f"workspace {workspace_id}: move {moving['move_id']} to node {node!r} is under way; its copy "
            f"is discarded only after `kb workspace move {workspace_id} --abort`; nothing discarded"
        )
    return repository_copy.discard(stores.settings, workspace_id, move_id)
