"""The one error hierarchy of kb.

Every error a user can hit derives from :class:`KbError` and carries a message that says what was
wrong and what to do about it. The CLI prints ``error.cli_message`` as a one-line reason and exits
non-zero; library users catch the class that matches the condition (psycopg style: one class per
condition).

A message that tells the caller what to pass names it the way the caller spells it: ``str(error)``
speaks Python (``pass overwrite=True``), ``error.cli_message`` speaks the command line (``pass
--overwrite``). The code raising such an error gives both (``cli=``); the CLI's error printer uses
``cli_message``, which is ``str(error)`` for the messages that name no argument.
"""

from __future__ import annotations


class KbError(Exception):
    """Base class of every error kb raises on purpose.

    ``cli``: the message as the CLI says it, when it differs from the Python one (the first
    argument) only in how an argument is spelled — ``--overwrite`` for ``overwrite=True``.
    """

    _cli_message: str | None = None

    def __init__(self, *args: object, cli: str | None = None) -> None:
        super().__init__(*args)
        self._cli_message = cli

    @property
    def cli_message(self) -> str:
        """The message with the CLI's spelling of what to pass (``str(self)`` when the same)."""
        return self._cli_message if self._cli_message is not None else str(self)


def kb_command(command: str, repository: object) -> str:
    """``command`` quoted as a kb command line for a message about the git repository at
    ``repository`` (a path): with ``--workspace N`` when that is a workspace's repository, whose
    folder is named by its id (design §2), so the command can be pasted as it stands."""
    name = str(repository).rstrip("/").rsplit("/", 1)[-1]
    return f"`kb {command} --workspace {name}`" if name.isdigit() else f"`kb {command}`"


class ConfigurationError(KbError):
    """A setting is missing or invalid (design §13)."""


class KnowledgeBaseNotFound(ConfigurationError):
    """The storage root holds no knowledge base (design §2.1, §13): with the embedded default, no
    ``postgres/`` folder under ``KB_STORAGE_ROOT`` — a mistyped root, or none made yet. Raised for a
    command that only reads, before anything is created or started there."""


class DatabaseUnavailable(KbError):
    """The configured Postgres server cannot be reached or started."""


class DatabaseInUse(KbError):
    """The embedded Postgres is not stopped while other processes are connected to it (``kb
    db-stop``, design §13): they would lose their connections. ``--force`` stops it anyway."""


class WorkerFailed(KbError):
    """The worker's loop ended with an error that is not the database's (design §7): ``kb serve
    --with-worker`` and ``kb worker`` restart it after a backoff."""


class StatementCanceled(KbError):
    """Postgres canceled a statement of the call (``pg_cancel_backend`` by an administrator, or a
    server-side timeout); the call's transaction was rolled back."""


class DatabaseNotReady(KbError):
    """The database is reachable but lacks something kb needs (pgvector, schema, migrations)."""


class MigrationError(KbError):
    """A migration failed, or an applied migration's checksum no longer matches its file (design §12)."""


class InvalidInput(KbError):
    """An argument cannot be stored as given (e.g. a NUL in a commit message or query)."""


class OffsetOutOfRange(InvalidInput):
    """A windowed read's ``offset`` (lines skipped) is past the end of the document: more than its
    line count (an offset equal to it is the end, an empty window)."""


class InvalidWorkspace(KbError):
    """A workspace id is not a positive integer (design §2.1)."""


class WorkspaceNotFound(KbError):
    """The workspace does not exist yet (import into it first)."""


class InvalidPath(KbError):
    """A caller path violates the path law (design §2.3). ``path`` holds the offending path."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"invalid path {path!r}: {reason}")


class DocumentNotFound(KbError):
    """No document exists at that path (at that revision)."""


class PathExists(KbError):
    """A move or write would replace an existing document without ``overwrite=True`` (``--overwrite``)."""


class RevisionNotFound(KbError):
    """The revision id is unknown in this workspace."""


class MalformedRevision(RevisionNotFound, InvalidInput):
    """The revision argument is not shaped as a revision id (fewer than 4 hex digits, or not hex):
    the caller's input, not a revision missing from the workspace."""


class LockTimeout(KbError):
    """The workspace write lock was not acquired within the configured wait (design §4)."""

    def __init__(
        self,
        workspace_id: int,
        waited_seconds: float,
        backend: str = "postgres",
        *,
        lock: str = "write",
        holder: str = "another writer holds it. Retry, or raise KB_LOCK_TIMEOUT",
    ) -> None:
        self.workspace_id = workspace_id
        self.waited_seconds = waited_seconds
        self.backend = backend
        super().__init__(
            f"workspace {workspace_id}: {lock} lock ({backend}) not acquired within {waited_seconds:g}s; {holder}."
        )


class HistoryDiverged(KbError):
    """Postgres records a revision that git's branch does not contain (repo replaced or rewritten)."""


class LockUnavailable(KbError):
    """The lock backend (Postgres or Redis) cannot be reached; no write happened (fail closed)."""


class WriteLockLost(LockUnavailable):
    """The branch moved while a write held the write lock: a process moved it without the lock
    (a git command run by hand in the workspace's repository). Raised inside the store only,
    before the write is settled by its idempotency key (design §3): callers see the write's
    revision when it landed, else this error saying so. (A holder whose Postgres session ended
    cannot cause it: its ref update finishes before the next holder reads git's head.)"""


class EmbeddingError(KbError):
    """The embedder failed or returned an unusable vector (NaN/inf, wrong dimension)."""


class DimensionMismatch(EmbeddingError):
    """The database's vector dimension differs from the active embedding model's (design §7)."""


class UnindexableDocument(KbError):
    """A document cannot be indexed (NUL bytes, invalid UTF-8); it stays in git untouched (design §7)."""


class ImportSourceError(KbError):
    """The folder handed to ``kb import`` does not exist or is not a directory."""


class OutputFileError(KbError):
    """A file of the user's that a command was asked to rewrite (``kb cite normalize --in-place``)
    cannot be written, or there is no file to rewrite (standard input)."""


# -- turns (design §5) ----------------------------------------------------------------
class InvalidTurn(KbError):
    """A turn id is empty or has characters that cannot name a worktree directory (design §5)."""


class TurnBusy(KbError):
    """Another process holds the same turn open (its worktree is locked); retry when it is done."""


class AuthorConflict(KbError):
    """A request names another author than the one an earlier writing request of the same turn
    named for its next revision (design §5): commit or abort the turn first, or use another turn."""


class EditMismatch(KbError):
    """``edit``'s ``old`` text is absent from the document, or ambiguous without ``replace_all``."""


class EditorFailed(KbError):
    """The editor ``kb edit`` runs (``$EDITOR``) could not be started or exited with an error: the
    edit's turn is discarded and nothing is recorded (design §5)."""


class DocumentGone(KbError):
    """A writer edited a document that another revision removed after the writer's base: the edit
    is not recorded (it would bring the document back). ``paths`` holds the virtual paths."""

    def __init__(self, message: str, paths: list[str]) -> None:
        self.paths = paths
        super().__init__(message)


class IdempotencyKeyReused(KbError):
    """A turn's commit named an idempotency key that another write — with other changes — was
    recorded with: the key's revision does not hold the turn's changes. Nothing of the turn was
    recorded and the turn is kept, to commit with a new key (design §3, §5). ``revision`` is the
    key's revision."""

    def __init__(self, message: str, revision: str) -> None:
        self.revision = revision
        super().__init__(message)


class FolderNotEmpty(KbError):
    """``rmdir`` of a folder that still holds documents, without ``recursive=True``."""


class UnsafeWorktreeEntry(KbError):
    """A symlink or non-regular file inside a turn's worktree; it is refused, the turn is kept."""


class IsAFolder(KbError):
    """A document operation (read, write, remove) named a folder; use ``ls``/``rmdir`` instead."""


class InvalidPattern(KbError):
    """A ``grep`` regular expression or ``glob`` pattern does not compile."""


class ArtifactReadOnly(KbError):
    """A plain transaction, a turn commit or an editor save would change an ARTIFACT document's
    file; artifacts are revised through ``KnowledgeBase.artifacts(workspace).revise`` (``kb artifact
    revise``; ``kb.workspace.artifacts``, design §11)."""


# -- store under contention and crashes (design §3, §14) -------------------------------
class CommitOutcomeUnknown(KbError):
    """Postgres went away while a write was being recorded and could not be asked since: the write
    may have landed (design §3).

    ``idempotency_key`` is the write's key and ``workspace_id`` its workspace: once Postgres is
    back, ``KnowledgeBase.write_outcome(workspace_id, idempotency_key)`` (HTTP ``GET
    /v1/workspaces/{ws}/writes/{key}``, CLI ``kb write-outcome KEY --workspace WS``) returns the
    revision if it landed and None if it did not; retrying the write with the same key applies it
    at most once. ``revision`` is the revision id that may have landed, when known.
    """

    def __init__(self, workspace_id: int, idempotency_key: str, reason: str, revision: str | None = None) -> None:
        self.workspace_id = workspace_id
        self.idempotency_key = idempotency_key
        self.revision = revision
        maybe = f" as revision {revision}" if revision else ""
        super().__init__(
            f"workspace {workspace_id}: the outcome of this write is unknown: Postgres went away while "
            f"recording it{maybe} ({reason}) and could not be asked since. Once it is back, settle it with "
            f"write_outcome({workspace_id}, {idempotency_key!r}) (`kb write-outcome {idempotency_key} "
            f"--workspace {workspace_id}`): it gives the revision if the write landed, none if it did not; "
            f"or retry the write with idempotency key {idempotency_key!r}, which applies it at most once."
        )


class StorageError(KbError):
    """The file system refused an operation on kb's storage (disk full, permissions, name too long)."""


# -- citations (design §8) ------------------------------------------------------------
class InvalidCitation(KbError):
    """A citation is not written as ``[n]``, ``[n:Lx]`` or ``[n:Lx-Ly]``, or names bad lines."""


class UnknownHandle(KbError):
    """A citation names a handle this conversation was never shown (or that expired or was forgotten)."""


class UnknownChat(KbError):
    """A chat has no handles in this workspace (never shown a document, forgotten, or expired), so
    its citations cannot be checked; nothing was changed."""


class InvalidChat(KbError):
    """A chat id is empty, too long, or holds characters a chat id cannot hold."""


class TooManyChats(KbError):
    """An API token (or, without tokens, the server's one anonymous caller) already holds the most
    open MCP conversations kb serve keeps for one token (``KB_MCP_CHATS_PER_TOKEN``): a new one is
    refused until one ends (HTTP DELETE of its session) or is closed idle
    (``KB_MCP_CHAT_IDLE_SECONDS``). Nothing was changed."""


class TooManyTurns(KbError):
    """An API token already holds the most open HTTP API turns kb serve keeps for one token
    (``KB_TURNS_PER_TOKEN``): a new turn is refused until one is committed, aborted or released
    idle (``KB_TURN_IDLE_SECONDS``). Nothing was changed."""


# -- seeding from legacy rows (design §10) ---------------------------------------------
class LegacySourceError(KbError):
    """The legacy database cannot be read: unreachable, no ``legacy`` schema, or no such workspace."""


class SeedRefused(KbError):
    """A seed step was refused: re-seeding a flipped workspace without ``--force``, or ``--flip``
    without byte parity in the same run."""


# -- artifacts (design §11) -------------------------------------------------------------
class ArtifactNotFound(KbError):
    """No artifact with that id in the workspace (deleted, or never saved)."""


class StaleGeneration(KbError):
    """``Artifacts.revise``/``Artifacts.delete`` named an older generation than the artifact's current
    one: someone revised it meanwhile. ``current`` holds the current generation; reload and retry.
    ``verb`` is what was refused (``revise`` or ``delete``), ``workspace_id`` the artifact's
    workspace (the CLI hint names both commands with their ``-w``)."""

    def __init__(
        self, artifact_id: int, expected: int, current: int, workspace_id: int | None = None, verb: str = "revise"
    ) -> None:
        self.artifact_id, self.expected, self.current = artifact_id, expected, current
        self.workspace_id = workspace_id
        stale = (
            f"artifact {artifact_id} is at generation {current}, not {expected}: it was revised meanwhile; reload it"
        )
        workspace = f" -w {workspace_id}" if workspace_id is not None else ""
        retry = (
            f"kb artifact revise {artifact_id} --generation {current} FILE"
            if verb == "revise"
            else f"kb artifact {verb} {artifact_id} --generation {current}"
        )
        super().__init__(
            f"{stale} (artifacts.get({artifact_id})) and {verb} generation {current}",
            cli=(
                f"{stale} (`kb artifact show {artifact_id}{workspace}`) and {verb} generation {current}: "
                f"`{retry}{workspace}`"
            ),
        )


class BlobStoreError(KbError):
    """The artifact blob store could not write or read a file (disk full, permissions, missing)."""


# -- git remotes (design §13) -----------------------------------------------------------
class RemoteError(KbError):
    """A workspace's git remote cannot be configured or pushed to (messages are redacted)."""


class RemoteNotFound(RemoteError):
    """The workspace has no remote; add one with ``kb remote add``."""


class RemoteExists(RemoteError):
    """The workspace already has a remote (one per workspace); remove it first."""


class RemoteDiverged(RemoteError):
    """The remote branch holds commits HEAD does not contain; kb never merges or force-pushes."""


class RemoteUnreachable(RemoteError):
    """The remote could not be reached or refused the credentials."""


class PushFailed(RemoteError):
    """A push did not update the remote branch (recorded in ``kb.workspace.remotes.last_push_error``)."""


class ServerUnavailable(KbError):
    """``KB_SERVER_URL`` names a ``kb serve`` that does not answer (design §13)."""


# -- listing and deleting workspaces (design §3) ----------------------------------------------
class WorkspaceBusy(KbError):
    """A workspace cannot be deleted while a turn or job uses it (``force=True``, ``--force``, does it anyway)."""


class WrongThread(KbError):
    """An object that belongs to one thread was used from another: a transaction's ``Draft`` is
    used by the thread that opened the transaction only (docs/python-api.md, "Threads")."""


# -- nodes (design §15) -------------------------------------------------------------------------
class NodeUnavailable(KbError):
    """A workspace's home node is down (no heartbeat for ``KB_NODE_STALE_SECONDS``) or does not
    answer; ``node`` names it. Nothing was done — unless the home went away after a forwarded write
    reached it: then kb serve's answer carries ``"outcome": "unknown"`` and names the call that
    settles it. Retry when it is back (its workspaces are never re-homed silently). Other nodes'
    workspaces are unaffected."""

    def __init__(self, message: str, *, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


class WrongNode(KbError):
    """The workspace is homed on another node (design §15): its repository is there, not under this
    process's storage root. ``node`` names it; use that node's ``kb serve`` (any node's server
    forwards) or run the command on that node."""

    def __init__(self, message: str, *, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


class NodeInUse(KbError):
    """A node cannot be forgotten (``kb nodes forget``) while workspaces are homed on it or it is up;
    ``node`` names it. Move its workspaces (``kb workspace move N --to OTHER``) or stop it first."""

    def __init__(self, message: str, *, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


# -- access: API tokens of kb serve and MCP over HTTP (design §16) -----------------------------
class PermissionDenied(KbError):
    """kb's database role lacks a privilege the call needs (Postgres 42501), e.g. a kb_reader
    asked to write (sql/roles.sql, design §16); connect as a role that has it."""


class TokenError(KbError):
    """Base of the API-token errors (design §16)."""


class TokenRefused(TokenError):
    """A request carried no API token, or one that is unknown, revoked or expired (HTTP 401)."""


class ScopeRefused(TokenError):
    """The token reaches the workspace but its scope is too small for the call (HTTP 403); e.g. a
    read token asked to commit. A workspace the token does not name is WorkspaceNotFound (404)."""


class TokenNotFound(TokenError):
    """``kb token revoke`` named no live token (by id or name)."""


class TokenExists(TokenError):
    """A live token already has that name (names identify a token's revisions); revoke it or choose another."""


# -- moving a workspace between nodes (design §15) ------------------------------------------
class WorkspaceMoving(KbError):
    """The workspace is being moved to another node: its read-only window is open, so this write was
    refused and nothing was written (reads go on). Retry after the move: ``retry_after`` seconds at
    most (the window's expiry), usually much sooner. ``target_node`` names the node it moves to."""

    def __init__(self, workspace_id: int, target_node: str, expires_at: object, retry_after: int) -> None:
        self.workspace_id = workspace_id
        self.target_node = target_node
        self.expires_at = expires_at
        self.retry_after = retry_after
        super().__init__(
            f"workspace {workspace_id} is moving to node {target_node!r}: writes are refused until the move "
            f"ends, and nothing was written. Retry after the move (its window closes by {expires_at} at the "
            f"latest, in {retry_after} s; `kb workspace move {workspace_id} --abort` cancels it)"
        )


class MoveFailed(KbError):
    """A workspace move stopped before its flip: the workspace stays on its home node, unchanged
    (design §15). The message says which step failed and why; re-running the same
    ``kb workspace move`` resumes, ``--abort`` cancels it."""
